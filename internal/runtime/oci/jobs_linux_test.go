package oci

import (
	"context"
	"encoding/json"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/guest"
	"github.com/agentbox/agentbox/internal/runtime/runtimetest"
)

// TestRuncJobs runs detached jobs in a real runc sandbox (see testJobs); the host sees the
// sandbox's processes themselves, by their cgroup.
func TestRuncJobs(t *testing.T) {
	testJobs(t, newRunc(t), func(t *testing.T, _ *Runtime, id string) []int {
		return slices.Sorted(maps.Keys(runtimetest.HostProcesses(t, id)))
	})
}

// TestGVisorJobs runs detached jobs in a real gVisor sandbox (see testJobs). The host sees only
// the sentry and its platform's stub tasks (kept as a pool, so the host cgroup's task count does
// not fall back: TestGVisorMetrics), so the outside view is the sentry's own task list, `runsc
// ps`, asked on the host.
func TestGVisorJobs(t *testing.T) {
	testJobs(t, newFlavor(t, FlavorGVisor), sentryProcesses)
}

// sentryProcesses returns the pids of the processes gVisor's sentry runs in sandbox id, as
// `runsc ps --format json` lists them on the host (the sentry's task list).
func sentryProcesses(t *testing.T, rt *Runtime, id string) []int {
	t.Helper()
	out, err := rt.command(context.Background(), "ps", "--format", "json", id)
	if err != nil {
		t.Fatalf("runsc ps: %v", err)
	}
	var pids []int // this format is the pids alone
	if err := json.Unmarshal(out, &pids); err != nil {
		t.Fatalf("runsc ps: %v: %q", err, out)
	}
	slices.Sort(pids)
	return pids
}

// treeMark is in the argv of every process of the cancel test's tree: sleep's argument, and the
// script the shells run.
const treeMark = "1000.4242"

// markedProcesses returns the /proc entries of the sandbox whose argv holds treeMark, as a root
// exec in the sandbox finds them (the scan's own argv holds a pattern, not the mark).
func markedProcesses(t *testing.T, c *guest.Client) []string {
	t.Helper()
	scan := `for f in /proc/[0-9]*/cmdline; do tr '\0' ' ' <"$f" 2>/dev/null | grep -q '` + strings.ReplaceAll(treeMark, ".", "[.]") + `' && echo "${f%/cmdline}"; done; true`
	r := runtimetest.ExecRequest(t, c, guest.ExecRequest{Argv: []string{"sh", "-c", scan}, User: "root", TimeoutMs: 60000})
	if r.ExitCode != 0 {
		t.Fatalf("the /proc scan: %s", r)
	}
	return strings.Fields(r.Stdout)
}

// testJobs runs detached jobs in a real sandbox: a job outlives the client that started it (a
// new client finds its status and its whole log, which is on the sandbox's disk), and a cancel
// leaves no process of a tree that ignores SIGTERM and holds a setsid daemon: none in the
// sandbox's /proc (a root exec looks for the tree's mark in every argv), and none as the host
// sees the sandbox (outside: its processes' pids, back to what they were before the job).
func testJobs(t *testing.T, rt *Runtime, outside func(*testing.T, *Runtime, string) []int) {
	id := runtimetest.NewID()
	c := runtimetest.Start(t, rt, runtimetest.DefaultSpec(id))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	baseline := outside(t, rt, id)
	jobID := "job-0123456789ab"
	ji, err := c.StartJob(ctx, guest.JobStartRequest{JobID: jobID, Argv: []string{"sh", "-c", "i=0; while [ $i -lt 200 ]; do echo line $i; i=$((i+1)); sleep 0.005; done; echo bye >&2; exit 5"}})
	if err != nil || ji.State != guest.JobRunning {
		t.Fatalf("StartJob: %+v %v", ji, err)
	}
	c.Close() // the starting client goes away
	c2 := runtimetest.Client(t, rt, id)
	end, err := c2.WaitJob(ctx, jobID, time.Minute)
	if err != nil || end.State != guest.JobExited || end.ExitCode == nil || *end.ExitCode != 5 {
		t.Fatalf("WaitJob: %+v %v", end, err)
	}
	var want strings.Builder
	for i := range 200 {
		want.WriteString("line " + strconv.Itoa(i) + "\n")
	}
	want.WriteString("bye\n")
	var got []byte
	for off := int64(0); ; {
		l, err := c2.JobLogs(ctx, jobID, guest.JobLogsRequest{Offset: off, Max: 1000})
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, l.Data...)
		if l.NextOffset == l.TotalBytes {
			break
		}
		off = l.NextOffset
	}
	if string(got) != want.String() || end.LogBytes != int64(want.Len()) {
		t.Fatalf("log %d bytes (log_bytes %d), want %d:\n%s", len(got), end.LogBytes, want.Len(), got)
	}
	// The log is the file on the sandbox's disk, root's only.
	res := runtimetest.ExecRequest(t, c2, guest.ExecRequest{Argv: []string{"cat", guest.DefaultJobsDir + "/" + jobID + "/output"}, User: "root"})
	if res.Stdout != want.String() {
		t.Fatalf("the output file holds %q", res.Stdout)
	}
	if r := runtimetest.Exec(t, c2, "cat", guest.DefaultJobsDir+"/"+jobID+"/output"); r.ExitCode == 0 {
		t.Fatal("the agent user can read the jobs' files")
	}
	if r := runtimetest.ExecRequest(t, c2, guest.ExecRequest{Argv: []string{"cat", guest.DefaultJobsDir + "/" + jobID + "/exit.json"}, User: "root"}); !strings.Contains(r.Stdout, `"exit_code":5`) {
		t.Fatalf("exit.json: %q", r.Stdout)
	}

	// Cancel: a tree that ignores SIGTERM, with a daemon that left by setsid and a double fork.
	tree := "job-0123456789ac"
	script := `trap "" TERM; ( setsid sh -c 'exec sleep ` + treeMark + `' & ); sleep ` + treeMark + ` & touch /tmp/ready; wait`
	if _, err := c2.StartJob(ctx, guest.JobStartRequest{JobID: tree, Argv: []string{"sh", "-c", script}}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); runtimetest.Exec(t, c2, "test", "-e", "/tmp/ready").ExitCode != 0; {
		if time.Now().After(deadline) {
			t.Fatal("the job did not get ready")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Both views see the tree before the cancel (the main shell, its subshell's daemon, the
	// sleep; the subshell itself may already be gone), so neither can pass by seeing nothing.
	if n := len(outside(t, rt, id)); n < len(baseline)+3 {
		t.Fatalf("the host sees %d processes in the sandbox, %d before the job", n, len(baseline))
	}
	if m := markedProcesses(t, c2); len(m) < 3 {
		t.Fatalf("the sandbox's /proc shows the tree as %v", m)
	}
	got2, err := c2.CancelJob(ctx, tree, 300*time.Millisecond)
	if err != nil || got2.State != guest.JobCanceled {
		t.Fatalf("CancelJob: %+v %v", got2, err)
	}
	if st, err := c2.Job(ctx, tree); err != nil || st.State != guest.JobCanceled {
		t.Fatalf("the status after the cancel: %+v %v", st, err)
	}
	if m := markedProcesses(t, c2); len(m) != 0 {
		t.Errorf("after the cancel the sandbox's /proc still shows %v of the tree", m)
	}
	var left []int
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		left = outside(t, rt, id)
		if slices.Equal(left, baseline) {
			break
		}
	}
	if !slices.Equal(left, baseline) {
		t.Fatalf("after the cancel the host sees processes %v in the sandbox; before the job %v", left, baseline)
	}
	list, err := c2.Jobs(ctx)
	if err != nil || len(list) != 2 || list[0].JobID != tree || list[1].JobID != jobID {
		t.Fatalf("Jobs: %+v %v", list, err)
	}
}

// TestRuncRootTreeEnds: see testRootTreeEnds, in a real runc sandbox.
func TestRuncRootTreeEnds(t *testing.T) {
	testRootTreeEnds(t, newRunc(t), func(t *testing.T, _ *Runtime, id string) []int {
		return slices.Sorted(maps.Keys(runtimetest.HostProcesses(t, id)))
	})
}

// TestGVisorRootTreeEnds: see testRootTreeEnds, in a real gVisor sandbox.
func TestGVisorRootTreeEnds(t *testing.T) {
	testRootTreeEnds(t, newFlavor(t, FlavorGVisor), sentryProcesses)
}

// dropTagProgram, run by python3 as root in a sandbox, drops its supplementary groups (its exec
// tag with them), leaves its session, ignores SIGTERM and becomes a sleep with treeMark: nothing
// but its parent still ties it to the command that started it.
const dropTagProgram = `import os, signal; os.setgroups([]); os.setsid(); signal.signal(signal.SIGTERM, signal.SIG_IGN); os.execvp("sleep", ["sleep", "` + treeMark + `"])`

// testRootTreeEnds: a root job and a root exec whose child dropped its exec tag and left the
// session end whole: the job's cancel (its main shell exits at SIGTERM, handing the child to
// PID 1 during the grace) and the exec's timeout leave no process of them, in the sandbox's
// /proc as soon as the job is reported canceled or the exec returns, and as the host sees the
// sandbox.
func testRootTreeEnds(t *testing.T, rt *Runtime, outside func(*testing.T, *Runtime, string) []int) {
	id := runtimetest.NewID()
	c := runtimetest.Start(t, rt, runtimetest.DefaultSpec(id))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	baseline := outside(t, rt, id)
	backToBaseline := func(what string) {
		t.Helper()
		var left []int
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if left = outside(t, rt, id); slices.Equal(left, baseline) {
				return
			}
		}
		t.Fatalf("after the %s the host sees processes %v in the sandbox; before it %v", what, left, baseline)
	}
	waitMarked := func(n int) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); len(markedProcesses(t, c)) < n; time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the tree never showed: %v", markedProcesses(t, c))
			}
		}
	}

	jobID := "job-0123456789ad"
	script := `trap 'exit 0' TERM; python3 -c '` + dropTagProgram + `' & sleep ` + treeMark + ` & wait`
	if _, err := c.StartJob(ctx, guest.JobStartRequest{JobID: jobID, Argv: []string{"sh", "-c", script}, User: "root"}); err != nil {
		t.Fatal(err)
	}
	waitMarked(3) // the shell, the untagged sleep, the shell's sleep
	got, err := c.CancelJob(ctx, jobID, 300*time.Millisecond)
	if err != nil || got.State != guest.JobCanceled {
		t.Fatalf("CancelJob: %+v %v", got, err)
	}
	if m := markedProcesses(t, c); len(m) != 0 {
		t.Fatalf("the job is reported canceled while the sandbox's /proc still shows %v of it", m)
	}
	backToBaseline("cancel")

	done := make(chan error, 1)
	var res guest.ExecResult
	go func() {
		var err error
		res, err = c.Exec(ctx, guest.ExecRequest{Argv: []string{"sh", "-c", `python3 -c '` + dropTagProgram + `' & sleep ` + treeMark}, User: "root", TimeoutMs: 4000}, nil)
		done <- err
	}()
	waitMarked(2)
	if err := <-done; err != nil || !res.TimedOut {
		t.Fatalf("Exec: %+v %v", res, err)
	}
	if m := markedProcesses(t, c); len(m) != 0 {
		t.Fatalf("the exec returned (timed out) while the sandbox's /proc still shows %v of it", m)
	}
	backToBaseline("exec's timeout")
}
