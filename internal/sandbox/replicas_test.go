package sandbox_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/lease"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/fake"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/sandbox/netsession"
	"github.com/agentbox/agentbox/internal/sandbox/pools"
)

// Several replicas on the fake runtime: two or three sandbox.Service instances, each
// with its own handle on one shared store and its own Owner of the node's lifecycle lease, over
// one fake runtime (the cluster they share), as `agentbox serve` wires them (cmd/agentbox
// wire.go startLoop).

// replica is one server process.
type replica struct {
	name  string
	svc   *sandbox.Service
	pools *pools.Service // svc's warm pools
	owner *lease.Owner
	dead  *atomic.Bool // its lease calls fail: it died (or lost the database)
	stop  func()
}

// errDown is what a dead replica's lease calls get.
var errDown = errors.New("database unreachable")

// deadableLeases fails every call of a replica marked dead, as the store would never hear from
// a killed process again.
type deadableLeases struct {
	lease.Store
	dead *atomic.Bool
}

func (l deadableLeases) AcquireLease(ctx context.Context, name, holder string, ttl time.Duration) (bool, time.Time, error) {
	if l.dead.Load() {
		return false, time.Time{}, errDown
	}
	return l.Store.AcquireLease(ctx, name, holder, ttl)
}

func (l deadableLeases) ReleaseLease(ctx context.Context, name, holder string) (bool, error) {
	if l.dead.Load() {
		return false, errDown
	}
	return l.Store.ReleaseLease(ctx, name, holder)
}

// startReplica starts a replica as serve does: it takes the lease if free and reconciles
// before serving; its lifecycle work (reconcile on a takeover, then the control loop with the
// pools' refill) runs while it holds the lease.
func startReplica(t *testing.T, name string, st sandbox.Store, rt runtime.Runtime, leases lease.Store, cfg sandbox.Config, ttl time.Duration) *replica {
	t.Helper()
	cfg.Shared = true
	svc, err := sandbox.NewService(st, []runtime.Runtime{rt}, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	netsession.New(svc.Core(), st) // as wired: the network before the pools
	r := &replica{name: name, svc: svc, pools: pools.New(svc.Core(), st), dead: &atomic.Bool{}}
	r.owner = lease.New(lease.Config{Leases: deadableLeases{leases, r.dead}, Name: lease.Lifecycle(svc.Config().Node), Holder: name, TTL: ttl})
	held, err := r.owner.TryAcquire(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if held {
		if err := svc.Reconcile(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.owner.Run(ctx, func(ctx context.Context, takeover bool) {
			if takeover {
				if err := svc.Reconcile(ctx); err != nil && ctx.Err() == nil {
					t.Errorf("%s: reconcile on takeover: %v", name, err)
				}
			}
			svc.Run(ctx)
		})
	}()
	var once sync.Once
	r.stop = func() {
		once.Do(func() {
			cancel()
			<-done
			svc.Close()
		})
	}
	t.Cleanup(r.stop)
	return r
}

// kill stops r as a SIGKILL would: its work ends, its lease stays in the store until it expires.
func (r *replica) kill() {
	r.dead.Store(true)
	r.stop()
}

// waitFor polls cond every 20 ms until it holds or within passes.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > within {
			t.Fatalf("%s: not within %v", what, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return time.Since(start)
}

// countingRuntime is one replica's view of the shared fake runtime, counting the creates that
// replica made (the embedded pointer keeps the fake's optional interfaces: Adopter, Waiter…).
type countingRuntime struct {
	*fake.Runtime
	creates atomic.Int64
	ids     sync.Map // the ids of the sandboxes this replica created
}

func (r *countingRuntime) Create(ctx context.Context, spec runtime.Spec) (runtime.Handle, error) {
	r.creates.Add(1)
	r.ids.Store(spec.ID, true)
	return r.Runtime.Create(ctx, spec)
}

func (r *countingRuntime) Run(ctx context.Context, spec runtime.Spec) (runtime.Handle, error) {
	r.creates.Add(1)
	r.ids.Store(spec.ID, true)
	return r.Runtime.Run(ctx, spec)
}

func (r *countingRuntime) created(id string) bool { _, ok := r.ids.Load(id); return ok }

func newSharedRuntime(t *testing.T) *fake.Runtime {
	t.Helper()
	rt, err := fake.New(fake.Config{Name: "runc"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Shutdown(context.Background()) })
	return rt
}

// 40 creates spread over two replicas at once, with a live bound of 10 (and then a CPU
// budget of 4 cores at 0.5 each): exactly the bound is admitted, every other create is
// CAPACITY_UNAVAILABLE, and nothing more than the bound exists in the store or the runtime.
func TestReplicasAdmissionHoldsAcrossReplicas(t *testing.T) {
	for _, c := range []struct {
		name  string
		cfg   sandbox.Config
		req   sandbox.CreateRequest
		admit int
	}{
		{"live bound", sandbox.Config{MaxSandboxes: 10}, sandbox.CreateRequest{TTLSeconds: 600}, 10},
		{"cpu budget", sandbox.Config{MaxSandboxes: 100, CPUBudget: 4}, sandbox.CreateRequest{TTLSeconds: 600, CPU: 0.5}, 8},
	} {
		t.Run(c.name, func(t *testing.T) {
			stores, leases := openReplicaStores(t, 2)
			rt := newSharedRuntime(t)
			reps := []*replica{
				startReplica(t, "a", stores[0], rt, leases, c.cfg, time.Second),
				startReplica(t, "b", stores[1], rt, leases, c.cfg, time.Second),
			}
			var wg sync.WaitGroup
			var mu sync.Mutex
			var ok []string
			var refused int
			var other []error
			for i := range 40 {
				wg.Go(func() {
					sb, err := reps[i%2].svc.Create(t.Context(), c.req)
					mu.Lock()
					defer mu.Unlock()
					switch {
					case err == nil:
						ok = append(ok, sb.ID)
					case errcode.Of(err) == errcode.CapacityUnavailable:
						refused++
					default:
						other = append(other, err)
					}
				})
			}
			wg.Wait()
			if len(other) > 0 {
				t.Fatalf("creates failed otherwise than for capacity: %v", other)
			}
			if len(ok) != c.admit || refused != 40-c.admit {
				t.Fatalf("%d admitted, %d refused for capacity; want exactly %d and %d", len(ok), refused, c.admit, 40-c.admit)
			}
			for i, st := range stores {
				u, err := st.CountLive(t.Context())
				if err != nil {
					t.Fatal(err)
				}
				if u.Live != c.admit {
					t.Errorf("replica %d's store: %d live; want %d", i, u.Live, c.admit)
				}
			}
			if res := rt.Resources(); len(res) != c.admit {
				t.Errorf("the runtime holds %d sandboxes; want %d", len(res), c.admit)
			}
		})
	}
}

// Replica A holds the lifecycle lease; sandboxes are created on both. A is killed (its lease
// unreleased): B takes the lease over within the lease TTL and reaps the sandboxes whose TTL
// passed — A's too — deleting their runtime objects.
func TestReplicasTTLHandoverAfterHolderDies(t *testing.T) {
	const leaseTTL = time.Second
	stores, leases := openReplicaStores(t, 2)
	rt := newSharedRuntime(t)
	c := &clock{now: time.Now().UTC().Truncate(time.Millisecond)}
	cfg := sandbox.Config{Now: c.Now}
	a := startReplica(t, "a", stores[0], rt, leases, cfg, leaseTTL)
	b := startReplica(t, "b", stores[1], rt, leases, cfg, leaseTTL)
	if !a.owner.Held() || b.owner.Held() {
		t.Fatalf("held: a %v, b %v; want a only", a.owner.Held(), b.owner.Held())
	}
	x, err := a.svc.Create(t.Context(), sandbox.CreateRequest{TTLSeconds: 60})
	if err != nil {
		t.Fatal(err)
	}
	y, err := b.svc.Create(t.Context(), sandbox.CreateRequest{TTLSeconds: 60})
	if err != nil {
		t.Fatal(err)
	}
	// While A holds, B does no lifecycle work: past the TTL with A's loop stopped... A's loop
	// is the one to reap. Kill A first, then let the TTLs pass.
	a.kill()
	killed := time.Now()
	c.Add(2 * time.Minute)
	gone := func(id string) bool {
		sb, err := b.svc.Get(t.Context(), id)
		return err == nil && sb.State == sandbox.StateDestroyed && !slices.Contains(rt.Resources(), id)
	}
	// The lease expires within leaseTTL of A's last renewal; B polls it every leaseTTL/3 and
	// its control loop ticks every second.
	took := waitFor(t, leaseTTL+3*time.Second, "B reaps the expired sandboxes", func() bool { return gone(x.ID) && gone(y.ID) })
	if !b.owner.Held() {
		t.Error("B reaped without holding the lease")
	}
	t.Logf("expired sandboxes reaped by B %v after A was killed (lease TTL %v, control loop tick 1s)", took, leaseTTL)
	if d := time.Since(killed); d > leaseTTL+2*time.Second {
		t.Errorf("reaped %v after the kill; want within the lease TTL and one control-loop tick", d)
	}
	evs, err := stores[1].ListEvents(t.Context(), sandbox.EventFilter{SandboxID: x.ID})
	if err != nil {
		t.Fatal(err)
	}
	if i := slices.IndexFunc(evs, func(e sandbox.Event) bool { return e.To == sandbox.StateStopping && e.Reason == "ttl expired" }); i < 0 {
		t.Errorf("A's sandbox has no \"ttl expired\" stop event: %+v", evs)
	}
}

// On a takeover B reconciles the store with the runtime: a running record whose runtime object
// is gone becomes lost; a runtime object of no record is deleted; a creating record of another
// replica's create in flight (within its deadline) is left creating, with its runtime object.
func TestReplicasTakeoverReconciles(t *testing.T) {
	const leaseTTL = time.Second
	stores, leases := openReplicaStores(t, 2)
	rt := newSharedRuntime(t)
	c := &clock{now: time.Now().UTC().Truncate(time.Millisecond)}
	cfg := sandbox.Config{Now: c.Now}
	a := startReplica(t, "a", stores[0], rt, leases, cfg, leaseTTL)
	b := startReplica(t, "b", stores[1], rt, leases, cfg, leaseTTL)
	gone, err := b.svc.Create(t.Context(), sandbox.CreateRequest{TTLSeconds: 600})
	if err != nil {
		t.Fatal(err)
	}
	kept, err := b.svc.Create(t.Context(), sandbox.CreateRequest{TTLSeconds: 600})
	if err != nil {
		t.Fatal(err)
	}
	a.kill()
	// Behind everyone's back: gone's runtime object is deleted; an object of no record appears.
	if err := rt.Delete(t.Context(), gone.ID); err != nil {
		t.Fatal(err)
	}
	orphan := sandbox.NewID()
	if _, err := rt.Create(t.Context(), runtime.Spec{ID: orphan, Image: "host"}); err != nil {
		t.Fatal(err)
	}
	// A create in flight on a third replica: its record written, its runtime object made.
	now := c.Now()
	inflight := sandbox.Sandbox{ID: sandbox.NewID(), State: sandbox.StateCreating, Image: "host", Runtime: "runc",
		Isolation: "process", CPU: 1, MemoryMB: 512, DiskMB: 1024, Node: sandbox.LocalNode,
		CreatedAt: now, UpdatedAt: now, ExpiresAt: now.Add(time.Hour), Version: 1}
	if err := stores[1].CreateSandbox(t.Context(), inflight, sandbox.Event{SandboxID: inflight.ID, To: sandbox.StateCreating}); err != nil {
		t.Fatal(err)
	}
	if _, err := rt.Create(t.Context(), runtime.Spec{ID: inflight.ID, Image: "host"}); err != nil {
		t.Fatal(err)
	}
	state := func(id string) sandbox.State {
		sb, err := b.svc.Get(t.Context(), id)
		if err != nil {
			t.Fatal(err)
		}
		return sb.State
	}
	waitFor(t, leaseTTL+3*time.Second, "B takes over and reconciles", func() bool {
		return b.owner.Held() && state(gone.ID) == sandbox.StateLost && !slices.Contains(rt.Resources(), orphan)
	})
	if st := state(kept.ID); st != sandbox.StateRunning || !slices.Contains(rt.Resources(), kept.ID) {
		t.Errorf("a sandbox whose runtime object runs: %s (object kept %v); want running", st, slices.Contains(rt.Resources(), kept.ID))
	}
	if st := state(inflight.ID); st != sandbox.StateCreating || !slices.Contains(rt.Resources(), inflight.ID) {
		t.Errorf("another replica's create in flight: %s (object kept %v); want it left creating, its object kept", st, slices.Contains(rt.Resources(), inflight.ID))
	}
	// Past its deadline it is abandoned by the control loop as ever.
	c.Add(5 * time.Minute)
	waitFor(t, 3*time.Second, "the abandoned create fails past its deadline", func() bool {
		return state(inflight.ID) == sandbox.StateFailed && !slices.Contains(rt.Resources(), inflight.ID)
	})
}

// The warm pools' refill runs on exactly one replica: with a pool of 3 and both replicas up,
// the pool holds 3 (never more) and every pooled sandbox was started by the holder; after the
// holder dies, the other refills what the claims took. Concurrent claims on both replicas hand
// each pooled sandbox to one caller only.
func TestReplicasPoolRefillOnOneAndClaimsDoNotRace(t *testing.T) {
	const leaseTTL = time.Second
	stores, leases := openReplicaStores(t, 2)
	rt := newSharedRuntime(t)
	rtA, rtB := &countingRuntime{Runtime: rt}, &countingRuntime{Runtime: rt}
	cfg := sandbox.Config{MaxSandboxes: 20}
	a := startReplica(t, "a", stores[0], rtA, leases, cfg, leaseTTL)
	b := startReplica(t, "b", stores[1], rtB, leases, cfg, leaseTTL)
	if _, err := b.pools.SetPool(t.Context(), sandbox.Pool{Name: "py", Size: 3}); err != nil {
		t.Fatal(err)
	}
	members := func() []sandbox.Sandbox {
		l, err := b.svc.List(t.Context(), sandbox.ListFilter{Pool: "py"})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	ready := func() int {
		n := 0
		for _, sb := range members() {
			if sb.State == sandbox.StateRunning {
				n++
			}
		}
		return n
	}
	waitFor(t, 5*time.Second, "the pool fills", func() bool { return ready() == 3 })
	for range 10 { // 2 s: both replicas' refill ticks pass several times
		if n := len(members()); n != 3 {
			t.Fatalf("the pool holds %d sandboxes; want 3 (a second replica refilling overshoots)", n)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if na, nb := rtA.creates.Load(), rtB.creates.Load(); na != 3 || nb != 0 {
		t.Fatalf("pooled sandboxes started: %d by A (the holder), %d by B; want 3 and 0", na, nb)
	}
	// 6 creates at once, 3 on each replica: 3 claim the 3 ready sandboxes, each a distinct one.
	var wg sync.WaitGroup
	var mu sync.Mutex
	claimed := map[string]int{}
	fresh := 0
	for i := range 6 {
		wg.Go(func() {
			sb, err := []*replica{a, b}[i%2].svc.Create(t.Context(), sandbox.CreateRequest{TTLSeconds: 600})
			if err != nil {
				t.Errorf("create %d: %v", i, err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if sb.FromPool {
				claimed[sb.ID]++
			} else {
				fresh++
			}
		})
	}
	wg.Wait()
	if len(claimed) != 3 || fresh != 3 {
		t.Fatalf("%d pooled sandboxes claimed (%v), %d made fresh; want 3 and 3", len(claimed), claimed, fresh)
	}
	for id, n := range claimed {
		if n != 1 {
			t.Errorf("pooled sandbox %s handed to %d callers", id, n)
		}
	}
	a.kill()
	before := rtB.creates.Load()
	waitFor(t, leaseTTL+6*time.Second, "B refills the pool after A died", func() bool { return b.owner.Held() && ready() == 3 })
	if n := len(members()); n != 3 {
		t.Fatalf("the pool holds %d after B refilled it; want 3", n)
	}
	// A, the holder until it died, may have refilled some of what the claims took first (it
	// refills once it sees them: its 150 ms wait counts from its own claims only); B started the
	// rest, each of them still in the pool.
	fromB := 0
	for _, sb := range members() {
		if rtB.created(sb.ID) {
			fromB++
		}
	}
	if n := rtB.creates.Load() - before; fromB == 0 || n != int64(fromB) {
		t.Errorf("B started %d pooled sandboxes after the takeover, and %d of the pool's 3 are B's; want at least 1, all of them in the pool", n, fromB)
	}
}

func poolStatus(t *testing.T, svc *pools.Service, name string) sandbox.PoolStatus {
	t.Helper()
	pools, err := svc.ListPools(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pools {
		if p.Name == name {
			return p
		}
	}
	t.Fatalf("pool %s not listed", name)
	return sandbox.PoolStatus{}
}

// A watcher on replica B sees replica A's creates and destroys within milliseconds: B follows
// the store's change notifications (Postgres LISTEN/NOTIFY), not only its 2-second recheck.
// Five rounds, each timed from A's call returning to B's watcher receiving the event.
func TestReplicasWatcherSeesOtherReplicasEvents(t *testing.T) {
	stores, leases := openReplicaStores(t, 2)
	rt := newSharedRuntime(t)
	a := startReplica(t, "a", stores[0], rt, leases, sandbox.Config{}, time.Second)
	b := startReplica(t, "b", stores[1], rt, leases, sandbox.Config{}, time.Second)
	ctx, cancel := context.WithCancel(t.Context())
	var follow sync.WaitGroup
	defer follow.Wait()
	defer cancel()
	follow.Go(func() { sandbox.FollowChanges(ctx, stores[1], nil, b.svc.StoreChanged) })
	time.Sleep(200 * time.Millisecond) // the LISTEN connection is up
	evs, err := b.svc.Subscribe(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	// await waits for B's watcher to deliver id's event to state, returning how long it took.
	await := func(id string, to sandbox.State) time.Duration {
		t.Helper()
		start := time.Now()
		timeout := time.After(5 * time.Second)
		for {
			select {
			case ev := <-evs:
				if ev.SandboxID == id && ev.To == to {
					return time.Since(start)
				}
			case <-timeout:
				t.Fatalf("B's watcher did not see %s become %s", id, to)
			}
		}
	}
	var worst time.Duration
	for i := range 5 {
		time.Sleep(time.Duration(300+97*i) * time.Millisecond) // off the recheck's beat
		sb, err := a.svc.Create(t.Context(), sandbox.CreateRequest{TTLSeconds: 600})
		if err != nil {
			t.Fatal(err)
		}
		dc := await(sb.ID, sandbox.StateRunning)
		time.Sleep(time.Duration(250+131*i) * time.Millisecond)
		if _, err := a.svc.Destroy(t.Context(), sb.ID); err != nil {
			t.Fatal(err)
		}
		dd := await(sb.ID, sandbox.StateDestroyed)
		t.Logf("round %d: B saw A's create after %v, its destroy after %v", i, dc, dd)
		worst = max(worst, dc, dd)
	}
	if worst > 500*time.Millisecond {
		t.Errorf("B's watcher saw A's events up to %v late; want within milliseconds (at most 500 ms), not the 2 s recheck", worst)
	}
}

// A destroy through the replica without the lease, whose delete takes a while: the holder's
// control loop leaves the stopping record to it (no two replicas finish one destroy), and the
// destroy returns the sandbox destroyed with its own reason.
func TestReplicasDestroyOnOtherReplicaIsNotRaced(t *testing.T) {
	stores, leases := openReplicaStores(t, 2)
	rt := newSharedRuntime(t)
	a := startReplica(t, "a", stores[0], rt, leases, sandbox.Config{}, time.Second)
	b := startReplica(t, "b", stores[1], rt, leases, sandbox.Config{}, time.Second)
	if !a.owner.Held() {
		t.Fatal("A does not hold the lease")
	}
	sb, err := b.svc.Create(t.Context(), sandbox.CreateRequest{TTLSeconds: 600})
	if err != nil {
		t.Fatal(err)
	}
	var deletes atomic.Int64
	rt.SetFault(func(ctx context.Context, op fake.Op, id string) error {
		if op == fake.OpDelete && id == sb.ID {
			if deletes.Add(1) == 1 {
				time.Sleep(2500 * time.Millisecond) // A's loop ticks twice meanwhile
			}
		}
		return nil
	})
	defer rt.SetFault(nil)
	got, err := b.svc.Destroy(t.Context(), sb.ID)
	if err != nil || got.State != sandbox.StateDestroyed {
		t.Fatalf("Destroy through B = %s, %v; want destroyed", got.State, err)
	}
	if n := deletes.Load(); n != 1 {
		t.Errorf("the sandbox's runtime object was deleted %d times; want once (the holder's loop finished B's destroy too)", n)
	}
	evs, err := stores[1].ListEvents(t.Context(), sandbox.EventFilter{SandboxID: sb.ID})
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range evs {
		if ev.Type == "error" || ev.To == sandbox.StateDestroyed && ev.Reason != "destroy requested" {
			t.Errorf("event %+v: the holder's loop raced B's destroy", ev)
		}
	}
}

// A replica that made a sandbox dies; later the sandbox's init dies too. The holder records it
// lost when it happens (its control loop watches every running sandbox), not at its TTL.
func TestReplicasHolderNoticesDeathOfAnotherReplicasSandbox(t *testing.T) {
	stores, leases := openReplicaStores(t, 2)
	rt := newSharedRuntime(t)
	a := startReplica(t, "a", stores[0], rt, leases, sandbox.Config{}, time.Second)
	b := startReplica(t, "b", stores[1], rt, leases, sandbox.Config{}, time.Second)
	if !a.owner.Held() {
		t.Fatal("A does not hold the lease")
	}
	sb, err := b.svc.Create(t.Context(), sandbox.CreateRequest{TTLSeconds: 600})
	if err != nil {
		t.Fatal(err)
	}
	b.kill()
	time.Sleep(1500 * time.Millisecond) // A's loop passes over the new sandbox
	rt.Kill(sb.ID)
	took := waitFor(t, 5*time.Second, "A records the dead sandbox lost", func() bool {
		got, err := a.svc.Get(t.Context(), sb.ID)
		return err == nil && got.State == sandbox.StateLost
	})
	t.Logf("recorded lost %v after its init died", took)
}
