package oci

import (
	"context"
	"testing"

	"github.com/agentbox/agentbox/internal/runtime/runtimetest"
)

// TestRegrowth: the guard kills at once, then only for growth after the kill was done. The
// sequence is the one a loaded host produced: the threshold crossed at 201 MiB, the agent
// answering 826 ms later with nothing left to kill (the runaway was dead), the sandbox then
// holding 440 MiB that gVisor had not yet given back — a second kill there took an innocent
// `echo`.
func TestRegrowth(t *testing.T) {
	const mib = 1 << 20
	var rg regrowth
	steps := []struct {
		used   int64
		kill   bool
		killed int64 // usage once the kill is done, when kill
	}{
		{201 * mib, true, 440 * mib},
		{440 * mib, false, 0},
		{445 * mib, false, 0}, // less than oomRegrowth past the post-kill baseline
		{430 * mib, false, 0}, // memory given back: a lower baseline
		{437 * mib, false, 0},
		{439 * mib, true, 300 * mib}, // 9 MiB past the lowest: a runaway again
		{300 * mib, false, 0},
	}
	for i, s := range steps {
		if got := rg.due(s.used); got != s.kill {
			t.Fatalf("step %d (%d MiB): kill %v, want %v", i, s.used/mib, got, s.kill)
		}
		if s.kill {
			rg.killed(s.killed)
		}
	}
}

// TestGVisorOOMAtTheLimit: with no guard acting (as when it is too slow on a loaded host), a
// gVisor sandbox's runaway reaches its cgroup's limit; the host's OOM killer ends a process of
// the sandbox (OOMKills grows), the runaway dies by SIGKILL, and the sandbox lives on.
func TestGVisorOOMAtTheLimit(t *testing.T) {
	t.Parallel()
	rt, id, c := startGuardedGVisor(t)
	rt.unguardMemory(id)
	ctx := context.Background()
	before, ok := rt.OOMKills(ctx, id)
	if !ok {
		t.Fatal("OOMKills cannot read a gVisor sandbox's count")
	}
	res := runtimetest.ExecRequest(t, c, memoryBomb)
	after, _ := rt.OOMKills(ctx, id)
	t.Logf("runaway: %+v; host OOM kills %d → %d", res, before, after)
	if res.Signal != "SIGKILL" || after <= before {
		t.Errorf("at the limit: %+v, host OOM kills %d → %d; want SIGKILL and one more", res, before, after)
	}
	if r := runtimetest.Exec(t, c, "echo", "alive"); r.Stdout != "alive\n" {
		t.Fatalf("after the runaway: %+v", r)
	}
	if n, ok := rt.OOMKills(ctx, runtimetest.NewID()); ok {
		t.Errorf("OOMKills of an unknown sandbox: %d, ok", n)
	}
}
