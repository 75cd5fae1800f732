package main

import (
	"encoding/json"
	"io"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/agentbox/agentbox/internal/api"
	"github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/testenv/fakecp"
	"github.com/agentbox/agentbox/internal/wire"
)

// cliServer is the REST API over the fake control plane, with AGENTBOX_URL and AGENTBOX_TOKEN
// set for the CLI run in process.
func cliServer(t *testing.T) (*sandbox.Service, *client.Client) {
	return cliServerWith(t, sandbox.Config{})
}

// cliServerWith is cliServer with cfg (SnapshotDir: snapshots on the fake runtime).
func cliServerWith(t *testing.T, cfg sandbox.Config) (*sandbox.Service, *client.Client) {
	t.Helper()
	svc := fakecp.New(t, cfg).Service
	h := api.New(svc, api.Options{Token: testToken})
	hs := httptest.NewServer(h)
	t.Cleanup(func() { h.Close(); hs.CloseClientConnections(); hs.Close() })
	t.Setenv("AGENTBOX_URL", hs.URL)
	t.Setenv("AGENTBOX_TOKEN", testToken)
	return svc, client.New(hs.URL, testToken)
}

var stdioMu sync.Mutex // os.Stdout and os.Stderr are swapped while a command runs

// runCLI runs `agentbox args...` in process and returns its exit code, stdout and stderr.
func runCLI(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	stdioMu.Lock()
	defer stdioMu.Unlock()
	outR, outW, _ := os.Pipe()
	errR, errW, _ := os.Pipe()
	stdout, stderr := os.Stdout, os.Stderr
	os.Stdout, os.Stderr = outW, errW
	var out, errb []byte
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); out, _ = io.ReadAll(outR) }()
	go func() { defer wg.Done(); errb, _ = io.ReadAll(errR) }()
	code := run(args)
	os.Stdout, os.Stderr = stdout, stderr
	outW.Close()
	errW.Close()
	wg.Wait()
	return code, string(out), string(errb)
}

// TestSnapshotCLIUsage: the snapshot commands refuse bad flags and arguments before asking the
// server (exit 2, naming the flag), and pass the server's typed errors through (exit 1, CODE:
// message), as every client command does.
func TestSnapshotCLIUsage(t *testing.T) {
	_, c := cliServer(t)
	sb, err := c.Create(t.Context(), wire.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		code int
		says string // on stderr
	}{
		{[]string{"fork", "--count", "21", sb.ID}, 2, "--count must be between 1 and 20"},
		{[]string{"fork", "--count", "0", sb.ID}, 2, "--count must be between 1 and 20"},
		{[]string{"fork"}, 2, "usage: agentbox fork"},
		{[]string{"diff", "--with", sb.ID, "--snapshot", "snap-x", sb.ID}, 2, "--with or --snapshot, not both"},
		{[]string{"diff", "--limit", "10001", sb.ID}, 1, "INVALID_ARGUMENT: limit must be between 1 and 10000"},
		{[]string{"snapshots"}, 2, "usage: agentbox snapshots ls|get|rm"},
		{[]string{"snapshots", "frobnicate"}, 2, "unknown subcommand"},
		{[]string{"snapshots", "ls", "--limit", "5000"}, 1, "INVALID_ARGUMENT: limit must be an integer between 1 and 1000"},
		{[]string{"snapshot", sb.ID, "extra"}, 2, "usage: agentbox snapshot"},
		{[]string{"sleep"}, 2, "usage: agentbox sleep"},
		{[]string{"wake", "a", "b"}, 2, "usage: agentbox wake"},
	} {
		code, _, stderr := runCLI(t, tc.args...)
		if code != tc.code || !strings.Contains(stderr, tc.says) {
			t.Errorf("agentbox %s: exit %d, stderr %q; want %d and %q", strings.Join(tc.args, " "), code, stderr, tc.code, tc.says)
		}
	}
}

// TestSnapshotCLIUnsupported: on a server that keeps no snapshots (no snapshot directory), every
// command that needs one says UNSUPPORTED_OPERATION and exits 1; create's new flags reach the
// server.
func TestSnapshotCLIUnsupported(t *testing.T) {
	_, c := cliServer(t)
	sb, err := c.Create(t.Context(), wire.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"snapshot", "--memory", "--label", "k=v", sb.ID},
		{"snapshots", "ls", "--sandbox", sb.ID},
		{"snapshots", "rm", "snap-0123456789ab"},
		{"fork", "--count", "3", sb.ID},
		{"sleep", sb.ID},
		{"sandbox", "create", "--snapshot", "snap-0123456789ab", "--auto-wake", "--ttl-while-sleeping"},
	} {
		code, _, stderr := runCLI(t, args...)
		if code != 1 || !strings.Contains(stderr, "agentbox: UNSUPPORTED_OPERATION: ") {
			t.Errorf("agentbox %s: exit %d, stderr %q; want 1 and UNSUPPORTED_OPERATION", strings.Join(args, " "), code, stderr)
		}
	}
}

// TestSnapshotCLI drives the commands against the real control plane on the fake runtime:
// exec --changes --checkpoint, snapshot, snapshots ls, fork --count 2, diff --snapshot and
// --with (and --json), sleep, wake, create --snapshot, snapshots rm.
func TestSnapshotCLI(t *testing.T) {
	_, c := cliServerWith(t, sandbox.Config{SnapshotDir: t.TempDir()})
	ctx := t.Context()
	sb, err := c.Create(ctx, wire.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	id := sb.ID
	must := func(args ...string) (string, string) {
		t.Helper()
		code, out, errs := runCLI(t, args...)
		if code != 0 {
			t.Fatalf("agentbox %s: exit %d\n%s%s", strings.Join(args, " "), code, out, errs)
		}
		return out, errs
	}
	_, errs := must("exec", "--changes", "--checkpoint", "--no-stdin", id, "--", "sh", "-c", "echo one > a.txt")
	if !strings.Contains(errs, "A 0644 file 4 /workspace/a.txt") || !strings.Contains(errs, "checkpoint snap-") {
		t.Fatalf("exec --changes --checkpoint: stderr %q", errs)
	}
	out, errs := must("snapshot", "--label", "at=one", id)
	snap := strings.TrimSpace(out)
	if !strings.HasPrefix(snap, "snap-") || !strings.Contains(errs, "files, ready") {
		t.Fatalf("snapshot: %q %q", out, errs)
	}
	out, _ = must("snapshots", "ls", "--sandbox", id)
	if !strings.Contains(out, "ID") || !strings.Contains(out, snap) || !strings.Contains(out, "at=one") {
		t.Fatalf("snapshots ls: %q", out)
	}
	must("exec", "--no-stdin", id, "--", "sh", "-c", "echo two > a.txt")
	out, _ = must("fork", "--count", "2", "--snapshot", snap, id)
	forks := strings.Fields(out)
	if len(forks) != 2 || !strings.HasPrefix(forks[0], "sb-") {
		t.Fatalf("fork: %q", out)
	}
	out, errs = must("diff", "--snapshot", snap, id)
	if !strings.Contains(out, "M 0644 file 4 /workspace/a.txt") || !strings.Contains(out, "+two") || !strings.Contains(errs, "against snapshot:"+snap) {
		t.Fatalf("diff --snapshot: %q %q", out, errs)
	}
	out, _ = must("diff", "--json", "--with", forks[1], forks[0])
	var d sandbox.DiffResult
	if err := json.Unmarshal([]byte(out), &d); err != nil || d.Against != "sandbox:"+forks[1] || len(d.Changes) != 0 {
		t.Fatalf("diff --json --with a sibling fork: %q %v", out, err)
	}
	out, _ = must("sleep", id)
	if out != id+" sleeping\n" {
		t.Fatalf("sleep: %q", out)
	}
	if code, _, errs := runCLI(t, "exec", "--no-stdin", id, "--", "true"); code != 1 || !strings.Contains(errs, "SANDBOX_NOT_RUNNING") || !strings.Contains(errs, "wake") {
		t.Fatalf("exec while asleep: %d %q", code, errs)
	}
	out, _ = must("wake", id)
	if out != id+" running\n" {
		t.Fatalf("wake: %q", out)
	}
	out, _ = must("sandbox", "create", "--snapshot", snap, "--auto-wake", "--json")
	var from sandbox.Sandbox
	if err := json.Unmarshal([]byte(out), &from); err != nil || from.FromSnapshot != snap || !from.AutoWake {
		t.Fatalf("create --snapshot: %q %v", out, err)
	}
	out, _ = must("snapshots", "rm", snap)
	if strings.TrimSpace(out) != snap {
		t.Fatalf("snapshots rm: %q", out)
	}
	if code, _, errs := runCLI(t, "snapshots", "get", snap); code != 1 || !strings.Contains(errs, "SNAPSHOT_NOT_FOUND") {
		t.Fatalf("get after rm: %d %q", code, errs)
	}
}
