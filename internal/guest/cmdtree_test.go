package guest_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/guest"
)

// dropTag is a python program run as root: it drops its supplementary groups (the exec tag
// with them), leaves its session, ignores SIGTERM, writes its pid to argv[1] and becomes
// `sleep 1000`: nothing but its parent still ties it to the command that started it.
const dropTag = `import os, signal, sys
os.setgroups([])
os.setsid()
signal.signal(signal.SIGTERM, signal.SIG_IGN)
open(sys.argv[1] + ".tmp", "w").write(str(os.getpid()))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
os.execvp("sleep", ["sleep", "1000"])`

func needRootPython(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("a command that drops its groups needs root (CI runs as root)")
	}
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		t.Skip("no python3 on this host (make deps installs it)")
	}
}

// untagged checks that pid left everything but its parent: no supplementary group, another
// session and process group than main.
func untagged(t *testing.T, pid, main int) {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if g, ok := strings.CutPrefix(l, "Groups:"); ok && strings.TrimSpace(g) != "" {
			t.Fatalf("process %d still has groups %q", pid, g)
		}
	}
	if sid, _ := unix.Getsid(pid); sid == main {
		t.Fatalf("process %d is in the command's session", pid)
	}
}

// TestJobCancelEndsRootTreeWithoutTag: a root job's child that dropped its exec tag and left
// the job's session, and that its parent's exit during the cancel's grace hands to the reaper,
// is ended by the cancel, and the job is canceled only once it is gone.
func TestJobCancelEndsRootTreeWithoutTag(t *testing.T) {
	needRootPython(t)
	a := startJobsAgent(t, "")
	w := a.workdir
	script := fmt.Sprintf(`trap 'exit 0' TERM
echo $$ > %[1]s/main.pid
python3 -c '%[2]s' %[1]s/child.pid &
wait`, w, dropTag)
	ji := a.start(t, "sh", "-c", script)
	main := readPid(t, filepath.Join(w, "main.pid"))
	child := readPid(t, filepath.Join(w, "child.pid"))
	untagged(t, child, main)
	got, err := a.c.CancelJob(ctxT(t, 30*time.Second), ji.JobID, 300*time.Millisecond)
	if err != nil || got.State != guest.JobCanceled {
		t.Fatalf("cancel: %+v %v", got, err)
	}
	// The job is reported canceled: its child is gone by then, not later.
	if _, err := os.Stat("/proc/" + strconv.Itoa(child)); err == nil {
		t.Errorf("the job's untagged child %d is still there after the cancel (state %s)", child, procState(child))
		_ = unix.Kill(child, unix.SIGKILL)
	}
}

// TestExecTimeoutEndsRootTreeWithoutTag: a root command's child that dropped its exec tag and
// left the command's session is ended by the command's timeout.
func TestExecTimeoutEndsRootTreeWithoutTag(t *testing.T) {
	needRootPython(t)
	t.Parallel()
	a, _ := userAgent(t)
	w := t.TempDir()
	script := fmt.Sprintf(`python3 -c '%[2]s' %[1]s/child.pid & sleep 1000`, w, dropTag)
	done := make(chan guest.ExecResult, 1)
	go func() {
		done <- a.exec(t, guest.ExecRequest{Argv: []string{"sh", "-c", script}, TimeoutMs: 3000, User: "root"})
	}()
	child := readPid(t, filepath.Join(w, "child.pid"))
	res := <-done
	if !res.TimedOut {
		t.Fatalf("result %+v", res)
	}
	if _, err := os.Stat("/proc/" + strconv.Itoa(child)); err == nil {
		t.Errorf("the command's untagged child %d is still there after its timeout (state %s)", child, procState(child))
		_ = unix.Kill(child, unix.SIGKILL)
	}
}
