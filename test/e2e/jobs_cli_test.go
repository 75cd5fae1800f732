package e2e

import (
	"context"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/testenv"
	"github.com/agentbox/agentbox/internal/wire"
)

// TestJobCLI: agentbox job start|ls|status|wait|cancel, exec --background and logs -f.
func TestJobCLI(t *testing.T) {
	testenv.RequireRoot(t)
	dir := testenv.ShortTempDir(t, "abjcli")
	s := startServer(t, dir)
	sb, err := s.client().Create(context.Background(), wire.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	out, errOut, code := s.cli("", "job", "start", sb.ID, "--", "sh", "-c", "for i in $(seq 1 5); do echo tick$i; sleep 0.3; done; exit 4")
	job := strings.TrimSpace(out)
	if code != 0 || !sandbox.ValidJobID(job) {
		t.Fatalf("job start: %d %q %q", code, out, errOut)
	}
	out, errOut, code = s.cli("", "logs", "-f", sb.ID, job)
	if code != 0 || out != "tick1\ntick2\ntick3\ntick4\ntick5\n" {
		t.Fatalf("logs -f: %d %q %q", code, out, errOut)
	}
	out, _, code = s.cli("", "job", "wait", sb.ID, job)
	if code != 4 || !strings.Contains(out, "exited 4") {
		t.Fatalf("job wait: exit %d, %q; want the job's 4", code, out)
	}
	out, errOut, code = s.cli("", "exec", "--background", sb.ID, "--", "sleep", "600")
	bg := strings.TrimSpace(out)
	if code != 0 || !sandbox.ValidJobID(bg) {
		t.Fatalf("exec --background: %d %q %q", code, out, errOut)
	}
	out, _, code = s.cli("", "job", "wait", "--timeout", "1", sb.ID, bg)
	if code != 3 || !strings.Contains(out, "running") {
		t.Fatalf("job wait --timeout 1 on a running job: %d %q; want 3 and running", code, out)
	}
	out, _, code = s.cli("", "job", "cancel", "--grace", "0", sb.ID, bg)
	if code != 0 || !strings.Contains(out, "canceled") {
		t.Fatalf("job cancel: %d %q", code, out)
	}
	out, _, code = s.cli("", "job", "ls", sb.ID)
	if code != 0 || !strings.Contains(out, job) || !strings.Contains(out, bg) {
		t.Fatalf("job ls: %d %q", code, out)
	}
	// shell --detach makes the command a job: it outlives the CLI, with no terminal.
	out, errOut, code = s.cli("", "shell", "--detach", sb.ID, "--", "sh", "-c", "sleep 0.5; echo detached-ok")
	det := strings.TrimSpace(out)
	if code != 0 || !strings.HasPrefix(det, "job-") || !strings.Contains(errOut, "logs -f") {
		t.Fatalf("shell --detach: %d %q %q", code, out, errOut)
	}
	out, _, code = s.cli("", "job", "wait", sb.ID, det)
	if code != 0 || !strings.Contains(out, "exited") {
		t.Fatalf("job wait on the detached shell command: %d %q", code, out)
	}
	if out, _, code = s.cli("", "logs", sb.ID, det); code != 0 || out != "detached-ok\n" {
		t.Fatalf("logs of the detached shell command: %d %q", code, out)
	}
	if _, errOut, code = s.cli("", "shell", "--detach", sb.ID); code != 2 || !strings.Contains(errOut, "needs a command") {
		t.Fatalf("shell --detach without a command: %d %q", code, errOut)
	}
	_, errOut, code = s.cli("", "job", "ls", "--limit", "1001", sb.ID)
	if code != 1 || !strings.Contains(errOut, "INVALID_ARGUMENT") || !strings.Contains(errOut, "limit") {
		t.Fatalf("job ls --limit 1001: %d %q", code, errOut)
	}
	if _, err := s.client().Destroy(context.Background(), sb.ID); err != nil {
		t.Fatal(err)
	}
	s.stop()
	assertHostClean(t, dir, []string{sb.ID})
}
