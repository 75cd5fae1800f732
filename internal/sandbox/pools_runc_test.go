package sandbox_test

import (
	"context"
	"testing"

	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/sandbox/pools"
)

// TestPoolRunc: warm pools on real runc sandboxes. A claim gives a fresh sandbox with the
// claimant's env (an exec sees it) and nothing of another claimant; after the server goes
// away without destroying anything and a new one starts over the same store and runtime, the
// pooled sandboxes are adopted, still count toward the pool and are claimable; deleting the pool
// destroys what it holds, and the host keeps nothing (the env's leak check).
func TestPoolRunc(t *testing.T) {
	e := newEnv(t, sandbox.Config{})
	ctx := context.Background()
	svc := e.svc
	pl := pools.New(svc.Core(), e.st)
	t.Cleanup(func() { // before the env's own cleanup (LIFO): the current service destroys everything
		all, _ := e.st.ListSandboxes(ctx, sandbox.ListFilter{States: []sandbox.State{sandbox.StateCreating, sandbox.StateRunning, sandbox.StateStopping, sandbox.StateFailed, sandbox.StateLost}})
		for _, sb := range all {
			svc.Destroy(ctx, sb.ID)
		}
		if svc != e.svc {
			svc.Close()
		}
	})
	if _, err := pl.SetPool(ctx, sandbox.Pool{Name: "r", Size: 2, MemoryMB: 128, DiskMB: 64}); err != nil {
		t.Fatal(err)
	}
	pl.Refill(ctx)
	ps, err := pl.ListPools(ctx)
	if err != nil || len(ps) != 1 || ps[0].Ready != 2 {
		t.Fatalf("after refill: %+v %v", ps, err)
	}
	a, err := svc.Create(sandbox.WithOwner(ctx, "alice"), sandbox.CreateRequest{MemoryMB: 128, DiskMB: 64, Env: map[string]string{"POOL_SECRET": "alice-1"}})
	if err != nil || !a.FromPool {
		t.Fatalf("claim: %+v %v", a, err)
	}
	res, err := svc.Exec(ctx, a.ID, sandbox.ExecRequest{Argv: []string{"sh", "-c", "echo $POOL_SECRET; echo mark > /workspace/alice; cat /proc/1/environ | tr '\\0' '\\n' | grep -c POOL_SECRET || true"}}, nil)
	if err != nil || res.ExitCode != 0 || res.Stdout != "alice-1\n0\n" {
		t.Fatalf("exec in the claimed sandbox: %q %q %v; want the claimant's env (and the agent's own env without it)", res.Stdout, res.Stderr, err)
	}

	// The server goes away (nothing destroyed); a new one adopts the sandboxes.
	svc.Close()
	svc, err = sandbox.NewService(e.st, []runtime.Runtime{e.rt}, sandbox.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	pl = pools.New(svc.Core(), e.st)
	if err := svc.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	ps, _ = pl.ListPools(ctx)
	if len(ps) != 1 || ps[0].Ready != 1 {
		t.Fatalf("after restart: %+v; want the one left adopted", ps)
	}
	b, err := svc.Create(sandbox.WithOwner(ctx, "bob"), sandbox.CreateRequest{MemoryMB: 128, DiskMB: 64})
	if err != nil || !b.FromPool || b.ID == a.ID {
		t.Fatalf("claim after restart: %+v %v", b, err)
	}
	res, err = svc.Exec(ctx, b.ID, sandbox.ExecRequest{Argv: []string{"sh", "-c", "echo [$POOL_SECRET]; ls -A /workspace"}}, nil)
	if err != nil || res.Stdout != "[]\n" {
		t.Fatalf("bob's sandbox: %q %v; want nothing of alice's", res.Stdout, err)
	}
	res, err = svc.Exec(ctx, a.ID, sandbox.ExecRequest{Argv: []string{"sh", "-c", "echo $POOL_SECRET"}}, nil)
	if err != nil || res.Stdout != "alice-1\n" {
		t.Fatalf("alice's env after the restart: %q %v", res.Stdout, err)
	}
	pl.Refill(ctx) // refills after claims
	if ps, _ = pl.ListPools(ctx); ps[0].Ready != 2 {
		t.Fatalf("refill after restart: %+v", ps)
	}
	if err := pl.DeletePool(ctx, "r"); err != nil {
		t.Fatal(err)
	}
	pl.Refill(ctx) // retires the deleted pool's sandboxes
	if cp, _ := svc.Capacity(ctx); cp.Live != 2 {
		t.Fatalf("after deleting the pool: %d live, want alice's and bob's", cp.Live)
	}
}
