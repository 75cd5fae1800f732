package agent

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestEnrollRefusals: a bad server URL or a missing host name fails before any key is kept;
// an existing identity is never overwritten.
func TestEnrollRefusals(t *testing.T) {
	dir := t.TempDir()
	if _, err := Enroll(context.Background(), Config{ServerURL: "ftp://x", StateDir: dir}, "t", "n"); err == nil || !strings.Contains(err.Error(), "http://") {
		t.Fatalf("bad URL: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, StateFile)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a state file was written: %v", err)
	}
	st := State{ServerURL: "http://x", MachineID: "mc-1", Name: "n", PrivateKey: make([]byte, 32)}
	if err := saveState(dir, st); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(dir, StateFile)); err != nil || (runtime.GOOS != "windows" && fi.Mode().Perm() != 0o600) {
		t.Fatalf("state file mode: %v %v", fi.Mode(), err)
	}
	if got, err := LoadState(dir); err != nil || got.MachineID != "mc-1" {
		t.Fatalf("load: %+v %v", got, err)
	}
	if _, err := Enroll(context.Background(), Config{ServerURL: "http://127.0.0.1:1", StateDir: dir}, "t", "n"); err == nil || !strings.Contains(err.Error(), "already holds") {
		t.Fatalf("existing identity: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, StateFile), []byte(`{"server_url":"http://x"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadState(dir); err == nil || !strings.Contains(err.Error(), "incomplete") {
		t.Fatalf("incomplete state: %v", err)
	}
}

// TestJitterBounds: the reconnect delay is within [d/2, d].
func TestJitterBounds(t *testing.T) {
	for _, d := range []time.Duration{time.Millisecond, 500 * time.Millisecond, 30 * time.Second} {
		for range 1000 {
			if j := jitter(d); j < d/2 || j > d {
				t.Fatalf("jitter(%v) = %v", d, j)
			}
		}
	}
}
