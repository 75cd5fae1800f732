package sandbox_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// oomCounting is a runtime whose host OOM-kill count (runtime.OOMCounter) reads 0 before an
// exec and after before the next.
type oomCounting struct {
	runtime.Runtime
	reads atomic.Int64
	after atomic.Int64
}

func (o *oomCounting) OOMKills(context.Context, string) (int64, bool) {
	if o.reads.Add(1)%2 == 1 {
		return 0, true
	}
	return o.after.Load(), true
}

// newOOMCounting returns an env whose runtime is an oomCounting, that runtime, and a sandbox
// created on it.
func newOOMCounting(t *testing.T) (*env, *oomCounting, string) {
	t.Helper()
	var oc *oomCounting
	e := newEnvWrapped(t, sandbox.Config{}, func(rt runtime.Runtime) runtime.Runtime {
		oc = &oomCounting{Runtime: rt}
		return oc
	})
	h, err := e.svc.Create(context.Background(), sandbox.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return e, oc, h.ID
}

// TestExecOOMKilledFromHostCount: on a runtime whose agents cannot see their memory cgroup
// (gVisor), a SIGKILLed command is oom_killed exactly when the host's count of OOM kills in the
// sandbox's cgroup grew during the exec; a SIGKILL without one stays a plain kill.
func TestExecOOMKilledFromHostCount(t *testing.T) {
	e, oc, id := newOOMCounting(t)
	ctx := context.Background()
	kill := sandbox.ExecRequest{Argv: []string{"sh", "-c", "kill -9 $$"}}
	for _, tc := range []struct {
		after int64
		want  bool
	}{{0, false}, {1, true}} {
		oc.after.Store(tc.after)
		res, err := e.svc.Exec(ctx, id, kill, nil)
		if err != nil {
			t.Fatal(err)
		}
		if res.Signal != "SIGKILL" || res.OOMKilled != tc.want {
			t.Errorf("host OOM kills 0 → %d: %+v, want SIGKILL with oom_killed %v", tc.after, res, tc.want)
		}
	}
	// A command that exits by itself is never oom_killed, whatever the count says.
	res, err := e.svc.Exec(ctx, id, sandbox.ExecRequest{Argv: []string{"true"}}, nil)
	if err != nil || res.ExitCode != 0 || res.OOMKilled {
		t.Errorf("true: %+v %v", res, err)
	}
}

// TestJobOOMKilledFromHostCount: as for an exec, a job such a runtime's agent reports killed by
// SIGKILL is oom_killed exactly when the host's count grew while it ran.
func TestJobOOMKilledFromHostCount(t *testing.T) {
	e, oc, id := newOOMCounting(t)
	ctx := context.Background()
	run := func(argv ...string) sandbox.Job {
		t.Helper()
		j, err := e.jobs.StartJob(ctx, id, sandbox.JobStartRequest{Argv: argv})
		if err != nil {
			t.Fatal(err)
		}
		w, err := e.jobs.WaitJob(ctx, id, j.ID, 30*time.Second)
		if err != nil || w.State.Active() {
			t.Fatalf("WaitJob %s: %+v %v", j.ID, w, err)
		}
		return w
	}
	for _, tc := range []struct {
		after int64
		want  bool
	}{{0, false}, {1, true}} {
		oc.after.Store(tc.after)
		j := run("sh", "-c", "kill -9 $$")
		if j.State != sandbox.JobKilled || j.Signal != "SIGKILL" || j.OOMKilled != tc.want {
			t.Errorf("host OOM kills 0 → %d: %+v, want killed by SIGKILL with oom_killed %v", tc.after, j, tc.want)
		}
		if tc.want && !strings.Contains(j.Message, "ran out of memory") {
			t.Errorf("an oom_killed job's message: %q", j.Message)
		}
	}
	// A job that exits by itself is never oom_killed, whatever the count says.
	if j := run("true"); j.State != sandbox.JobExited || j.OOMKilled {
		t.Errorf("true: %+v", j)
	}
}
