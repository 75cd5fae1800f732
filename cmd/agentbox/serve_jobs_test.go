package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/testenv"
	"github.com/agentbox/agentbox/internal/wire"
)

// TestServeJobFlags: `serve --max-jobs-per-sandbox 0` (or 65) and `--job-retention 0` are
// refused at start with what to change; `--max-jobs-per-sandbox 2` makes a real sandbox's third
// running job JOB_LIMIT_EXCEEDED.
func TestServeJobFlags(t *testing.T) {
	bin := testenv.Binary(t)
	state := filepath.Join(t.TempDir(), "state")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--max-jobs-per-sandbox", "0"}, "max jobs per sandbox 0 must be between 1 and 64"},
		{[]string{"--max-jobs-per-sandbox", "65"}, "max jobs per sandbox 65 must be between 1 and 64"},
		{[]string{"--job-retention", "0s"}, "job retention 0s must be at least 1m"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		cmd := exec.CommandContext(ctx, bin, append([]string{"serve", "--listen", "127.0.0.1:0", "--state-dir", state}, tc.args...)...)
		cmd.Env = append(os.Environ(), "AGENTBOX_TOKEN="+testToken)
		out, err := cmd.CombinedOutput()
		cancel()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(string(out), "INVALID_ARGUMENT") || !strings.Contains(string(out), tc.want) {
			t.Errorf("serve %v: %v\n%s\nwant exit 1 with %q", tc.args, err, out, tc.want)
		}
	}

	testenv.RequireRoot(t)
	srv := testenv.StartServer(t, testenv.ShortTempDir(t, "abjflag"), testToken, "--max-jobs-per-sandbox", "2", "--job-retention", "1h")
	c := srv.Client()
	ctx := context.Background()
	sb, err := c.Create(ctx, wire.CreateRequest{})
	if err != nil {
		t.Fatalf("create: %v\n%s", err, srv.Logs)
	}
	for i := range 2 {
		if _, err := c.StartJob(ctx, sb.ID, wire.ExecRequest{Command: []string{"sleep", "60"}}); err != nil {
			t.Fatalf("job %d: %v", i+1, err)
		}
	}
	_, err = c.StartJob(ctx, sb.ID, wire.ExecRequest{Command: []string{"sleep", "60"}})
	if e, ok := errcode.As(err); !ok || e.Code != errcode.JobLimitExceeded {
		t.Fatalf("third job with --max-jobs-per-sandbox 2: %v, want JOB_LIMIT_EXCEEDED", err)
	}
}
