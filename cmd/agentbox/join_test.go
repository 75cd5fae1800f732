package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestJoinInstallWritesUnit: `join --install` with an identity in the state dir writes a
// systemd unit that runs this binary's `join URL --state-dir DIR` (no token), restarts it
// except on exit 3 (removed), and refuses paths that cannot go into ExecStart as they are.
func TestJoinInstallWritesUnit(t *testing.T) {
	dir, units := t.TempDir(), t.TempDir()
	st := map[string]any{"server_url": "https://10.0.0.5:8765", "machine_id": "mc-0123456789ab", "name": "box", "private_key": make([]byte, 32)}
	b, _ := json.Marshal(st)
	if err := os.WriteFile(filepath.Join(dir, "machine.json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	if code := cmdJoin([]string{"https://10.0.0.5:8765", "--state-dir", dir, "--install", "--unit-dir", units, "--fingerprint", strings.Repeat("ab", 32)}); code != 0 {
		t.Fatalf("exit %d", code)
	}
	unit, err := os.ReadFile(filepath.Join(units, "agentbox-machine.service"))
	if err != nil {
		t.Fatal(err)
	}
	exe, _ := os.Executable()
	want := "ExecStart=" + exe + " join https://10.0.0.5:8765 --state-dir " + dir + " --fingerprint " + strings.Repeat("ab", 32) + "\n"
	if !strings.Contains(string(unit), want) || !strings.Contains(string(unit), "RestartPreventExitStatus=3") || strings.Contains(string(unit), "--token") {
		t.Fatalf("unit:\n%s\nwant a line %q", unit, want)
	}
	// A state dir of another server is refused; a path with a space cannot go into ExecStart.
	if code := cmdJoin([]string{"https://other:1", "--state-dir", dir, "--install", "--unit-dir", units}); code != 2 {
		t.Fatalf("another server's state dir: exit %d", code)
	}
	spaced := filepath.Join(t.TempDir(), "a b")
	if err := os.MkdirAll(spaced, 0o700); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(spaced, "machine.json"), b, 0o600)
	if code := cmdJoin([]string{"https://10.0.0.5:8765", "--state-dir", spaced, "--install", "--unit-dir", units}); code == 0 {
		t.Fatal("a state dir with a space went into ExecStart")
	}
	// Without an identity and without a token: told to pass --token.
	if code := cmdJoin([]string{"https://10.0.0.5:8765", "--state-dir", t.TempDir()}); code != 2 {
		t.Fatalf("no identity, no token: exit %d", code)
	}
}
