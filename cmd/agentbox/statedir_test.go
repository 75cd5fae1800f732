package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/testenv"
	"github.com/agentbox/agentbox/internal/wire"
)

// TestStateDirMustBeReachable: a state dir under a directory other users cannot search (a 0700
// mktemp dir) makes `agentbox serve` and `agentbox mcp` refuse at start, naming the directory
// and the fix; under a 0711 one the server starts and sandboxes work.
func TestStateDirMustBeReachable(t *testing.T) {
	testenv.RequireRoot(t)
	bin := testenv.Binary(t)
	parent := testenv.ShortTempDir(t, "abreach")
	closed := filepath.Join(parent, "closed")
	if err := os.Mkdir(closed, 0o700); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(closed, "state")
	for _, args := range [][]string{
		{"serve", "--listen", "127.0.0.1:0", "--state-dir", state, "--cgroup-parent", "abreach-x"},
		{"mcp", "--state-dir", state, "--cgroup-parent", "abreach-x"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Env = append(os.Environ(), "AGENTBOX_TOKEN="+testToken)
		cmd.Stdin = strings.NewReader("")
		out, err := cmd.CombinedOutput()
		cancel()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() == 0 {
			t.Fatalf("agentbox %s under a 0700 dir: %v\n%s", args[0], err, out)
		}
		for _, want := range []string{closed + " (0700)", "chmod o+x " + closed + "`", "--state-dir"} {
			if !strings.Contains(string(out), want) {
				t.Errorf("agentbox %s: the error lacks %q:\n%s", args[0], want, out)
			}
		}
	}
	open := filepath.Join(parent, "open")
	if err := os.Mkdir(open, 0o711); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o711); err != nil {
		t.Fatal(err)
	}
	srv := testenv.StartServer(t, filepath.Join(open, "state"), testToken)
	c := srv.Client()
	ctx := context.Background()
	sb, err := c.Create(ctx, wire.CreateRequest{})
	if err != nil {
		t.Fatalf("create under a 0711 dir: %v\n%s", err, srv.Logs)
	}
	res, err := c.Exec(ctx, sb.ID, wire.ExecRequest{Command: []string{"echo", "ok"}}, nil)
	if err != nil || res.Stdout != "ok\n" {
		t.Fatalf("exec under a 0711 dir: %+v %v", res, err)
	}
	if _, err := c.Destroy(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
}
