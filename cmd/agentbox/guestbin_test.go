package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/testenv"
	"github.com/agentbox/agentbox/internal/wire"
)

// TestGuestBinaryLookup: --guest-binary wins (made absolute; a missing file is an error naming
// the flag); without it, agentbox-guest beside the executable is the agent, and without that
// the executable itself is, marked not lean.
func TestGuestBinaryLookup(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	self, _ = filepath.EvalSymlinks(self)
	beside := filepath.Join(filepath.Dir(self), guestBinaryName)
	if _, err := os.Stat(beside); err == nil {
		t.Fatalf("%s exists before the test", beside)
	}
	if got, lean, err := guestBinary(""); err != nil || got != self || lean {
		t.Fatalf("no agent beside: %q %v %v, want %q, not lean", got, lean, err, self)
	}
	if err := os.WriteFile(beside, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(beside) })
	if got, lean, err := guestBinary(""); err != nil || got != beside || !lean {
		t.Fatalf("agent beside: %q %v %v, want %q, lean", got, lean, err, beside)
	}
	t.Chdir(filepath.Dir(beside))
	if got, lean, err := guestBinary(guestBinaryName); err != nil || got != beside || !lean {
		t.Fatalf("--guest-binary %s (relative): %q %v %v, want %q", guestBinaryName, got, lean, err, beside)
	}
	if _, _, err := guestBinary(filepath.Join(t.TempDir(), "missing")); err == nil || !strings.Contains(err.Error(), "--guest-binary") {
		t.Fatalf("a missing --guest-binary: %v, want an error naming the flag", err)
	}
}

// TestServeRunsLeanAgent: a server built as make build builds it runs the lean agent as every
// sandbox's PID 1, and says nothing of a missing one.
func TestServeRunsLeanAgent(t *testing.T) {
	testenv.RequireRoot(t)
	srv := testenv.StartServer(t, testenv.ShortTempDir(t, "ablean"), testToken)
	c := srv.Client()
	ctx := context.Background()
	sb, err := c.Create(ctx, wire.CreateRequest{})
	if err != nil {
		t.Fatalf("create: %v\n%s", err, srv.Logs)
	}
	defer c.Destroy(ctx, sb.ID)
	res, err := c.Exec(ctx, sb.ID, wire.ExecRequest{Command: []string{"sh", "-c", "/.agentbox/agentbox version; tr '\\0' ' ' < /proc/1/cmdline"}, User: "root"}, nil)
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("exec: %+v %v", res, err)
	}
	if out := res.Stdout; !strings.HasPrefix(out, "agentbox-guest ") || !strings.Contains(out, "/.agentbox/agentbox guest ") {
		t.Fatalf("the sandbox's agent: %q, want agentbox-guest's version and PID 1 running it as guest", out)
	}
	if strings.Contains(srv.Logs.String(), "no "+guestBinaryName+" beside") {
		t.Fatalf("serve warned of a missing lean agent:\n%s", srv.Logs)
	}
}
