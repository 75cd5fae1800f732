package runs_test

import (
	"context"
	"errors"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/lease"
	"github.com/agentbox/agentbox/internal/runs"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/fake"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/sandbox/jobs"
	"github.com/agentbox/agentbox/internal/store/postgres"
	"github.com/agentbox/agentbox/internal/testenv/pglab"
)

// Several replicas: the run workers run only on the holder of the node's lifecycle
// lease, as `agentbox serve` wires them (cmd/agentbox wire.go startLoop), and a run started and
// waited on through another replica is executed there and seen settled here.

// countingRuntime is one replica's view of the shared fake runtime, counting its creates.
type countingRuntime struct {
	*fake.Runtime
	creates atomic.Int64
}

func (r *countingRuntime) Create(ctx context.Context, spec runtime.Spec) (runtime.Handle, error) {
	r.creates.Add(1)
	return r.Runtime.Create(ctx, spec)
}

func (r *countingRuntime) Run(ctx context.Context, spec runtime.Spec) (runtime.Handle, error) {
	r.creates.Add(1)
	return r.Runtime.Run(ctx, spec)
}

// deadableLeases fails every lease call once its replica is dead (a SIGKILLed process).
type deadableLeases struct {
	*postgres.Store
	dead *atomic.Bool
}

var errDead = errors.New("replica dead")

func (l deadableLeases) AcquireLease(ctx context.Context, name, holder string, ttl time.Duration) (bool, time.Time, error) {
	if l.dead.Load() {
		return false, time.Time{}, errDead
	}
	return l.Store.AcquireLease(ctx, name, holder, ttl)
}

func (l deadableLeases) ReleaseLease(ctx context.Context, name, holder string) (bool, error) {
	if l.dead.Load() {
		return false, errDead
	}
	return l.Store.ReleaseLease(ctx, name, holder)
}

type runReplica struct {
	rt    *countingRuntime
	sbs   *sandbox.Service
	svc   *runs.Service
	owner *lease.Owner
	dead  atomic.Bool
	stop  func()
}

func startRunReplica(t *testing.T, name, dsn string, shared *fake.Runtime) *runReplica {
	t.Helper()
	st, err := postgres.Open(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	r := &runReplica{rt: &countingRuntime{Runtime: shared}}
	sbs, err := sandbox.NewService(st, []runtime.Runtime{r.rt}, sandbox.Config{Shared: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	svc, err := runs.New(runs.Config{Sandboxes: jobs.With(sbs), Store: st, Dir: filepath.Join(dir, "runs"), Shared: true,
		BaseURL: func() string { return "http://agentbox.test" }})
	if err != nil {
		t.Fatal(err)
	}
	r.sbs, r.svc = sbs, svc
	r.owner = lease.New(lease.Config{Leases: deadableLeases{st, &r.dead}, Name: lease.Lifecycle(sbs.Config().Node), Holder: name, TTL: time.Second})
	if _, err := r.owner.TryAcquire(t.Context()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { sandbox.FollowChanges(ctx, st, nil, sbs.StoreChanged, svc.StoreChanged) })
	wg.Go(func() {
		r.owner.Run(ctx, func(ctx context.Context, takeover bool) {
			if takeover {
				_ = sbs.Reconcile(ctx)
			}
			var w sync.WaitGroup
			w.Go(func() { sbs.Run(ctx) })
			w.Go(func() { svc.Run(ctx) })
			w.Wait()
		})
	})
	var once sync.Once
	r.stop = func() {
		once.Do(func() {
			cancel()
			wg.Wait()
			svc.Close()
			sbs.Close()
			st.Close()
		})
	}
	t.Cleanup(r.stop)
	return r
}

func TestRunWorkersOnTheLeaseHolderOnly(t *testing.T) {
	dsn := pglab.DSN(t)
	rt, err := fake.New(fake.Config{Name: "runc"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Shutdown(context.Background()) })
	a := startRunReplica(t, "a", dsn, rt)
	b := startRunReplica(t, "b", dsn, rt)
	if !a.owner.Held() || b.owner.Held() {
		t.Fatalf("held: a %v, b %v; want a only", a.owner.Held(), b.owner.Held())
	}
	work := t.TempDir()
	// start starts n runs through via, then waits for each there.
	start := func(via *runReplica, name string, n int) {
		t.Helper()
		var ids []string
		for i := range n {
			r, err := via.svc.Start(sandbox.WithOwner(t.Context(), "alice"), runs.Spec{Dir: filepath.Join(work, name, strconv.Itoa(i)),
				Command: []string{"sh", "-c", "echo ran"}})
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, r.ID)
		}
		for _, id := range ids {
			got, err := via.svc.Wait(t.Context(), id, 60*time.Second)
			if err != nil || got.State != runs.Succeeded {
				t.Fatalf("run %s through %s: %s (%s) %v", id, name, got.State, got.Reason, err)
			}
		}
	}
	// Started and waited on through B, executed by A (the holder).
	start(b, "first", 6)
	if na, nb := a.rt.creates.Load(), b.rt.creates.Load(); na == 0 || nb != 0 {
		t.Fatalf("run sandboxes made: %d by A (the holder), %d by B; want A's only", na, nb)
	}
	// A dies: B takes the lease and executes the next run.
	a.dead.Store(true)
	a.stop()
	deadline := time.Now().Add(5 * time.Second)
	for !b.owner.Held() && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if !b.owner.Held() {
		t.Fatal("B did not take the lease over after A died")
	}
	start(b, "second", 2)
	if nb := b.rt.creates.Load(); nb == 0 {
		t.Fatal("B, now the holder, made no run sandbox")
	}
}
