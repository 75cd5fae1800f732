package sandbox_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/fake"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/sandbox/jobs"
	"github.com/agentbox/agentbox/internal/sandbox/netsession"
	"github.com/agentbox/agentbox/internal/sandbox/pools"
	"github.com/agentbox/agentbox/internal/sandbox/snapshots"
	"github.com/agentbox/agentbox/internal/store/sqlite"
)

// The control plane's logic on the fake runtime: no root, no containers, runs in -short.

// clock is a settable time for the service.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// fakeEnv is a service over real SQLite and the fake runtime.
type fakeEnv struct {
	svc   *sandbox.Service
	jobs  *jobs.Service       // svc's jobs feature
	net   *netsession.Service // svc's network
	pools *pools.Service      // svc's warm pools
	snaps *snapshots.Service  // svc's snapshots feature
	st    *sqlite.Store
	rt    *fake.Runtime
	clock *clock
	cfg   sandbox.Config
}

func newFakeEnv(t *testing.T, cfg sandbox.Config) *fakeEnv {
	t.Helper()
	return newFakeEnvWith(t, cfg, fake.Config{})
}

// newFakeEnvWith is newFakeEnv with the fake runtime configured by fc (named "runc").
func newFakeEnvWith(t *testing.T, cfg sandbox.Config, fc fake.Config) *fakeEnv {
	t.Helper()
	dir := t.TempDir()
	st, err := sqlite.Open(t.Context(), filepath.Join(dir, "agentbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	fc.Name = "runc"
	rt, err := fake.New(fc)
	if err != nil {
		t.Fatal(err)
	}
	c := &clock{now: time.Now().UTC().Truncate(time.Millisecond)}
	if cfg.Now == nil {
		cfg.Now = c.Now
	}
	e := &fakeEnv{st: st, rt: rt, clock: c, cfg: cfg}
	e.restart(t)
	t.Cleanup(func() {
		e.svc.Close()
		rt.SetFault(nil)
		rt.Shutdown(context.Background())
		st.Close()
	})
	return e
}

// restart replaces the service with a new one over the same store and runtime, as a restarted
// server, and reconciles it.
func (e *fakeEnv) restart(t *testing.T) {
	t.Helper()
	if e.svc != nil {
		e.svc.Close()
	}
	svc, err := sandbox.NewService(e.st, []runtime.Runtime{e.rt}, e.cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The network before the pools: a pool's claim reads the network the create prepared.
	e.svc, e.net = svc, netsession.New(svc.Core(), e.st)
	e.pools, e.jobs = pools.New(svc.Core(), e.st), jobs.New(svc.Core(), e.st)
	e.snaps = snapshots.New(svc.Core(), e.st)
	if err := svc.Reconcile(t.Context()); err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
}

func (e *fakeEnv) create(t *testing.T, req sandbox.CreateRequest) sandbox.Sandbox {
	t.Helper()
	sb, err := e.svc.Create(t.Context(), req)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	return sb
}

func (e *fakeEnv) state(t *testing.T, id string) sandbox.State {
	t.Helper()
	sb, err := e.svc.Get(t.Context(), id)
	if err != nil {
		t.Fatalf("Get %s: %v", id, err)
	}
	return sb.State
}

func (e *fakeEnv) eventsOf(t *testing.T, id, typ string) []sandbox.Event {
	t.Helper()
	evs, err := e.svc.Events(t.Context(), sandbox.EventFilter{SandboxID: id})
	if err != nil {
		t.Fatal(err)
	}
	var out []sandbox.Event
	for _, ev := range evs {
		if ev.Type == typ {
			out = append(out, ev)
		}
	}
	return out
}

var errInjected = errors.New("injected fault")

// failOn makes op fail for id (any id if "") until the returned func clears it.
func failOn(rt *fake.Runtime, op fake.Op, id string) (clear func()) {
	var on atomic.Bool
	on.Store(true)
	rt.SetFault(func(ctx context.Context, o fake.Op, i string) error {
		if on.Load() && o == op && (id == "" || i == id) {
			return errInjected
		}
		return nil
	})
	return func() { on.Store(false) }
}

func TestDestroyWhoseDeleteFailsConverges(t *testing.T) {
	e := newFakeEnv(t, sandbox.Config{})
	sb := e.create(t, sandbox.CreateRequest{})
	other := e.create(t, sandbox.CreateRequest{})
	clear := failOn(e.rt, fake.OpDelete, sb.ID)
	got, err := e.svc.Destroy(t.Context(), sb.ID)
	if err == nil || got.State != sandbox.StateStopping {
		t.Fatalf("Destroy with a failing delete: state %s, err %v; want stopping and an error", got.State, err)
	}
	// The loop retries with backoff: not before the backoff, and the fault is recorded.
	if err := e.svc.Converge(t.Context()); err != nil {
		t.Fatalf("Converge inside the backoff should not retry yet: %v", err)
	}
	e.clock.Add(2 * time.Second)
	if err := e.svc.Converge(t.Context()); err == nil {
		t.Fatal("Converge with the fault still on reported no error")
	}
	if e.state(t, sb.ID) != sandbox.StateStopping {
		t.Fatalf("state %s, want stopping while deletes fail", e.state(t, sb.ID))
	}
	if len(e.eventsOf(t, sb.ID, "error")) == 0 {
		t.Fatal("the failed step left no error event")
	}
	if e.state(t, other.ID) != sandbox.StateRunning {
		t.Fatal("another sandbox was disturbed")
	}
	clear()
	e.clock.Add(10 * time.Second)
	if err := e.svc.Converge(t.Context()); err != nil {
		t.Fatalf("Converge after the fault cleared: %v", err)
	}
	if st := e.state(t, sb.ID); st != sandbox.StateDestroyed {
		t.Fatalf("state %s after the fault cleared, want destroyed", st)
	}
	if slices.Contains(e.rt.Resources(), sb.ID) {
		t.Fatal("the destroyed sandbox still holds runtime resources")
	}
	c, _ := e.svc.Capacity(t.Context())
	if c.Live != 1 {
		t.Fatalf("live = %d, want 1 (the stopping sandbox no longer holds capacity)", c.Live)
	}
}

func TestExpiredSandboxIsDestroyedWithoutSleeping(t *testing.T) {
	e := newFakeEnv(t, sandbox.Config{})
	sb := e.create(t, sandbox.CreateRequest{TTLSeconds: 60})
	keep := e.create(t, sandbox.CreateRequest{TTLSeconds: 3600})
	if err := e.svc.Converge(t.Context()); err != nil || e.state(t, sb.ID) != sandbox.StateRunning {
		t.Fatalf("before the TTL: %v, state %s", err, e.state(t, sb.ID))
	}
	e.clock.Add(61 * time.Second)
	if err := e.svc.Converge(t.Context()); err != nil {
		t.Fatal(err)
	}
	if st := e.state(t, sb.ID); st != sandbox.StateDestroyed {
		t.Fatalf("state %s after the TTL, want destroyed", st)
	}
	if e.state(t, keep.ID) != sandbox.StateRunning {
		t.Fatal("a sandbox within its TTL was destroyed")
	}
	stops := 0
	for _, ev := range e.eventsOf(t, sb.ID, "state") {
		if ev.To == sandbox.StateStopping && ev.Reason == "ttl expired" {
			stops++
		}
	}
	if stops != 1 {
		t.Fatalf("%d 'ttl expired' stopping events, want 1", stops)
	}
}

func TestExtendRecordsAnEvent(t *testing.T) {
	e := newFakeEnv(t, sandbox.Config{})
	sb := e.create(t, sandbox.CreateRequest{TTLSeconds: 60})
	if _, err := e.svc.Extend(t.Context(), sb.ID, 120); err != nil {
		t.Fatal(err)
	}
	if evs := e.eventsOf(t, sb.ID, "extend"); len(evs) != 1 || evs[0].To != sandbox.StateRunning {
		t.Fatalf("extend events = %+v, want one", evs)
	}
}

func TestAbandonedCreateFailsAfterItsDeadline(t *testing.T) {
	e := newFakeEnv(t, sandbox.Config{})
	// A record another process wrote and then abandoned (no lock of this service is held).
	now := e.clock.Now()
	sb := sandbox.Sandbox{ID: sandbox.NewID(), State: sandbox.StateCreating, Image: "host", Runtime: "runc",
		Isolation: "process", CPU: 1, MemoryMB: 512, DiskMB: 1024, Node: sandbox.LocalNode,
		CreatedAt: now, UpdatedAt: now, ExpiresAt: now.Add(time.Hour), Version: 1}
	if err := e.st.CreateSandbox(t.Context(), sb, sandbox.Event{SandboxID: sb.ID, To: sandbox.StateCreating}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.rt.Create(t.Context(), runtime.Spec{ID: sb.ID, Image: "host"}); err != nil {
		t.Fatal(err)
	}
	if err := e.svc.Converge(t.Context()); err != nil || e.state(t, sb.ID) != sandbox.StateCreating {
		t.Fatalf("within the deadline: %v, state %s; want it left creating", err, e.state(t, sb.ID))
	}
	e.clock.Add(5 * time.Minute)
	if err := e.svc.Converge(t.Context()); err != nil {
		t.Fatal(err)
	}
	if st := e.state(t, sb.ID); st != sandbox.StateFailed {
		t.Fatalf("state %s past the deadline, want failed", st)
	}
	if slices.Contains(e.rt.Resources(), sb.ID) {
		t.Fatal("the abandoned create's resources were not deleted")
	}
}

// A caller that hangs up at any step of a create never leaves a record in creating: the
// sandbox ends running or failed, and nothing leaks.
func TestCreateWhoseCallerHangsUpAtEachStep(t *testing.T) {
	for _, op := range []fake.Op{fake.OpRun, fake.OpAgent} {
		t.Run(string(op), func(t *testing.T) {
			e := newFakeEnv(t, sandbox.Config{})
			ctx, cancel := context.WithCancel(t.Context())
			e.rt.SetFault(func(_ context.Context, o fake.Op, _ string) error {
				if o == op {
					cancel()
				}
				return nil
			})
			sb, err := e.svc.Create(ctx, sandbox.CreateRequest{})
			e.rt.SetFault(nil)
			list, lerr := e.svc.List(t.Context(), sandbox.ListFilter{})
			if lerr != nil || len(list) != 1 {
				t.Fatalf("list: %v %v", list, lerr)
			}
			if st := list[0].State; st != sandbox.StateRunning {
				t.Fatalf("after the caller left at %s: state %s (err %v), want running: the host work does not depend on the caller", op, st, err)
			}
			if err == nil && sb.State != sandbox.StateRunning {
				t.Fatalf("reply state %s", sb.State)
			}
		})
	}
	t.Run("admission", func(t *testing.T) {
		e := newFakeEnv(t, sandbox.Config{})
		ctx, cancel := context.WithCancel(t.Context())
		e.svc.Close()
		svc, err := sandbox.NewService(cancelOnAdmit{e.st, cancel}, []runtime.Runtime{e.rt}, e.cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		// The network before the pools: a pool's claim reads the network the create prepared.
		e.svc, e.net = svc, netsession.New(svc.Core(), e.st)
		e.pools, e.jobs = pools.New(svc.Core(), e.st), jobs.New(svc.Core(), e.st)
		e.snaps = snapshots.New(svc.Core(), e.st)
		sb, err := svc.Create(ctx, sandbox.CreateRequest{})
		if err != nil || sb.State != sandbox.StateRunning {
			t.Fatalf("create whose caller left during admission: %v, state %s; want running", err, sb.State)
		}
	})
}

// cancelOnAdmit cancels the caller's context as soon as the store admits the sandbox.
type cancelOnAdmit struct {
	*sqlite.Store
	cancel context.CancelFunc
}

func (c cancelOnAdmit) AdmitSandbox(ctx context.Context, sb sandbox.Sandbox, ev sandbox.Event, a sandbox.Admission) (sandbox.Sandbox, bool, error) {
	got, created, err := c.Store.AdmitSandbox(ctx, sb, ev, a)
	c.cancel()
	return got, created, err
}

func TestReconcileSurvivesAnUnreadableSandbox(t *testing.T) {
	e := newFakeEnv(t, sandbox.Config{})
	bad := e.create(t, sandbox.CreateRequest{})
	good := e.create(t, sandbox.CreateRequest{})
	gone := e.create(t, sandbox.CreateRequest{})
	e.rt.Kill(gone.ID)
	waitState(t, e, gone.ID, sandbox.StateLost)
	clear := failOn(e.rt, fake.OpState, bad.ID)
	e.restart(t) // must not fail
	if e.state(t, bad.ID) != sandbox.StateRunning || !slices.Contains(e.rt.Resources(), bad.ID) {
		t.Fatal("the sandbox whose state could not be read was not left as it was")
	}
	if len(e.eventsOf(t, bad.ID, "error")) == 0 {
		t.Fatal("the unreadable state left no error event")
	}
	if e.state(t, good.ID) != sandbox.StateRunning || e.rt.Calls(fake.OpAdopt) < 1 {
		t.Fatalf("the healthy sandbox was not adopted (adopt calls %d)", e.rt.Calls(fake.OpAdopt))
	}
	if slices.Contains(e.rt.Resources(), gone.ID) {
		t.Fatal("the lost sandbox's resources were not swept")
	}
	clear()
	if _, err := e.svc.Exec(t.Context(), good.ID, sandbox.ExecRequest{Argv: []string{"true"}}, nil); err != nil {
		t.Fatalf("exec on the adopted sandbox: %v", err)
	}
}

// One failing orphan delete stops neither the sweep of the others nor the release of their id
// ranges; the failed one's range stays held (its processes may still hold those ids) until its
// delete succeeds.
func TestSweepGoesOnPastAFailingDelete(t *testing.T) {
	e := newFakeEnvWith(t, sandbox.Config{}, fake.Config{TakesIDRange: true})
	// Orphans of no record, and sandboxes recorded lost (not live) whose resources are left:
	// these hold id ranges, as a runtime with user namespaces makes them.
	var orphans, lost []string
	for range 3 {
		id := sandbox.NewID()
		if _, err := e.rt.Create(t.Context(), runtime.Spec{ID: id, Image: "host", IDMap: runtime.IDMap{UIDBase: 1 << 30, GIDBase: 1 << 30, Count: 1}}); err != nil {
			t.Fatal(err)
		}
		orphans = append(orphans, id)
		sb := e.create(t, sandbox.CreateRequest{})
		if m, ok := e.rt.IDMap(sb.ID); !ok || m.Count == 0 {
			t.Fatalf("sandbox %s was created with id map %+v, want a range", sb.ID, m)
		}
		e.rt.Kill(sb.ID)
		waitState(t, e, sb.ID, sandbox.StateLost)
		lost = append(lost, sb.ID)
	}
	held := func() []string {
		rs, err := e.svc.IDRanges(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, r := range rs {
			ids = append(ids, r.SandboxID)
		}
		slices.Sort(ids)
		return ids
	}
	if got, want := held(), slices.Sorted(slices.Values(lost)); !slices.Equal(got, want) {
		t.Fatalf("ranges held by %v, want %v", got, want)
	}
	var on atomic.Bool
	on.Store(true)
	e.rt.SetFault(func(_ context.Context, op fake.Op, id string) error {
		if on.Load() && op == fake.OpDelete && (id == orphans[0] || id == lost[0]) {
			return errInjected
		}
		return nil
	})
	e.restart(t)
	left := e.rt.Resources()
	slices.Sort(left)
	if want := slices.Sorted(slices.Values([]string{orphans[0], lost[0]})); !slices.Equal(left, want) {
		t.Fatalf("after a sweep where two deletes failed: %v left, want %v", left, want)
	}
	if got := held(); !slices.Equal(got, []string{lost[0]}) {
		t.Fatalf("after a sweep where %s's delete failed: ranges held by %v, want only its own", lost[0], got)
	}
	on.Store(false)
	e.restart(t)
	if left := e.rt.Resources(); len(left) != 0 {
		t.Fatalf("after the fault cleared: %v left", left)
	}
	if got := held(); len(got) != 0 {
		t.Fatalf("after the fault cleared: ranges held by %v", got)
	}
}

func waitState(t *testing.T, e *fakeEnv, id string, want sandbox.State) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if e.state(t, id) == want {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("sandbox %s is %s, want %s", id, e.state(t, id), want)
}

func TestDeathIsNoticedWhenItHappens(t *testing.T) {
	e := newFakeEnv(t, sandbox.Config{})
	sb := e.create(t, sandbox.CreateRequest{})
	events, err := e.svc.Subscribe(t.Context(), 0)
	if err != nil {
		t.Fatal(err)
	}
	e.rt.Kill(sb.ID) // no call to the sandbox follows: only the exit watch can notice
	timeout := time.After(10 * time.Second)
	for {
		select {
		case ev := <-events:
			if ev.SandboxID == sb.ID && ev.To == sandbox.StateLost {
				return
			}
		case <-timeout:
			t.Fatalf("no lost event within 10 s of the sandbox's death (state %s)", e.state(t, sb.ID))
		}
	}
}

func TestSubscribeSeesEveryTransitionInOrder(t *testing.T) {
	e := newFakeEnv(t, sandbox.Config{})
	first := e.create(t, sandbox.CreateRequest{})
	evs, _ := e.svc.Events(t.Context(), sandbox.EventFilter{})
	cursor := evs[len(evs)-1].Seq
	ch, err := e.svc.Subscribe(t.Context(), cursor)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.svc.Extend(t.Context(), first.ID, 60); err != nil {
		t.Fatal(err)
	}
	if _, err := e.svc.Destroy(t.Context(), first.ID); err != nil {
		t.Fatal(err)
	}
	want := []string{"extend running", "state stopping", "state destroyed"}
	var got []string
	last := cursor
	timeout := time.After(5 * time.Second)
	for len(got) < len(want) {
		select {
		case ev := <-ch:
			if ev.Seq <= last {
				t.Fatalf("event %d after %d", ev.Seq, last)
			}
			last = ev.Seq
			got = append(got, ev.Type+" "+string(ev.To))
		case <-timeout:
			t.Fatalf("got %v within 5 s, want %v", got, want)
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("events %v, want %v", got, want)
	}
	if _, err := e.svc.Subscribe(t.Context(), -1); errcode.Of(err) != errcode.InvalidArgument {
		t.Fatalf("Subscribe(-1): %v, want INVALID_ARGUMENT", err)
	}
}

func TestIdempotentCreate(t *testing.T) {
	e := newFakeEnv(t, sandbox.Config{})
	alice := sandbox.WithOwner(t.Context(), "alice")
	a, err := e.svc.Create(alice, sandbox.CreateRequest{IdempotencyKey: "k1", Labels: map[string]string{"x": "1"}})
	if err != nil {
		t.Fatal(err)
	}
	if a.Owner != "alice" || a.IdempotencyKey != "k1" || a.Node != sandbox.LocalNode {
		t.Fatalf("record owner/key/node = %q/%q/%q", a.Owner, a.IdempotencyKey, a.Node)
	}
	again, err := e.svc.Create(alice, sandbox.CreateRequest{IdempotencyKey: "k1", Labels: map[string]string{"x": "1"}})
	if err != nil || again.ID != a.ID {
		t.Fatalf("retried create: %s, %v; want %s", again.ID, err, a.ID)
	}
	if _, err := e.svc.Create(alice, sandbox.CreateRequest{IdempotencyKey: "k1", MemoryMB: 64}); errcode.Of(err) != errcode.Conflict {
		t.Fatalf("same key, different request: %v, want CONFLICT", err)
	}
	bob, err := e.svc.Create(sandbox.WithOwner(t.Context(), "bob"), sandbox.CreateRequest{IdempotencyKey: "k1", Labels: map[string]string{"x": "1"}})
	if err != nil || bob.ID == a.ID {
		t.Fatalf("another owner's key: %s, %v; want a new sandbox", bob.ID, err)
	}
	if list, _ := e.svc.List(t.Context(), sandbox.ListFilter{}); len(list) != 2 {
		t.Fatalf("%d sandboxes, want 2", len(list))
	}
	// Concurrent retries of one key make one sandbox.
	var wg sync.WaitGroup
	ids := make([]string, 8)
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sb, err := e.svc.Create(alice, sandbox.CreateRequest{IdempotencyKey: "k2"})
			if err != nil {
				t.Errorf("concurrent create %d: %v", i, err)
			}
			ids[i] = sb.ID
		}()
	}
	wg.Wait()
	for _, id := range ids {
		if id != ids[0] {
			t.Fatalf("concurrent retries made different sandboxes: %v", ids)
		}
	}
}

// On a 2-core, 4 GiB host the defaults admit the whole live bound of default sandboxes,
// refuse the next one for the bound, and refuse one when the host's real memory runs short.
func TestDefaultsAdmitTheLiveBoundOnALaptop(t *testing.T) {
	if testing.Short() {
		t.Skip("200 sandboxes; the short run covers admission in the store suite")
	}
	const cores, memMB, diskFreeMB, over = 2, 4096, 20 << 10, 128
	var availMB atomic.Int64
	availMB.Store(3000)
	e := newFakeEnv(t, sandbox.Config{
		CPUBudget: cores * over, MemoryBudgetMB: memMB * over, DiskBudgetMB: (diskFreeMB - 2048) * over, Overcommit: over,
		MemoryReserveMB: 256, DiskReserveMB: 2048,
		Headroom: func(context.Context) (sandbox.Headroom, error) {
			return sandbox.Headroom{MemoryAvailableMB: availMB.Load(), DiskFreeMB: diskFreeMB}, nil
		},
	})
	for i := range 200 {
		if _, err := e.svc.Create(t.Context(), sandbox.CreateRequest{}); err != nil {
			t.Fatalf("default sandbox %d of the live bound: %v", i+1, err)
		}
	}
	_, err := e.svc.Create(t.Context(), sandbox.CreateRequest{})
	if errcode.Of(err) != errcode.CapacityUnavailable {
		t.Fatalf("sandbox 201: %v, want CAPACITY_UNAVAILABLE (the live bound)", err)
	}
	list, _ := e.svc.List(t.Context(), sandbox.ListFilter{})
	if _, err := e.svc.Destroy(t.Context(), list[0].ID); err != nil {
		t.Fatal(err)
	}
	availMB.Store(200)
	_, err = e.svc.Create(t.Context(), sandbox.CreateRequest{})
	if errcode.Of(err) != errcode.CapacityUnavailable || errcode.Message(err) == "" {
		t.Fatalf("with 200 MiB available: %v, want CAPACITY_UNAVAILABLE", err)
	}
	if c, _ := e.svc.Capacity(t.Context()); c.Live != 199 || c.MemoryAvailableMB != 200 || c.Overcommit != over {
		t.Fatalf("capacity %+v", c)
	}
}

func TestHardReservations(t *testing.T) {
	e := newFakeEnv(t, sandbox.Config{CPUBudget: 2, MemoryBudgetMB: 4096, Overcommit: 1})
	for i := range 2 {
		if _, err := e.svc.Create(t.Context(), sandbox.CreateRequest{}); err != nil {
			t.Fatalf("create %d: %v", i, err)
		}
	}
	_, err := e.svc.Create(t.Context(), sandbox.CreateRequest{})
	if errcode.Of(err) != errcode.CapacityUnavailable {
		t.Fatalf("third 1-core sandbox on 2 reserved cores: %v, want CAPACITY_UNAVAILABLE", err)
	}
	if list, _ := e.svc.List(t.Context(), sandbox.ListFilter{}); len(list) != 2 {
		t.Fatalf("the refused create left a record: %d sandboxes", len(list))
	}
}

func TestManyLifecyclesLeaveNothing(t *testing.T) {
	e := newFakeEnv(t, sandbox.Config{})
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sb, err := e.svc.Create(t.Context(), sandbox.CreateRequest{Labels: map[string]string{"i": fmt.Sprint(i)}})
			if err != nil {
				t.Errorf("create: %v", err)
				return
			}
			if _, err := e.svc.Destroy(t.Context(), sb.ID); err != nil {
				t.Errorf("destroy: %v", err)
			}
		}()
	}
	wg.Wait()
	if left := e.rt.Resources(); len(left) != 0 {
		t.Fatalf("resources left: %v", left)
	}
}

// A running sandbox whose Adopt at start says it is not the sandbox on record, or is gone, is
// recorded lost (and swept), not kept running and watched; one whose Adopt fails for a reason
// that may pass stays running and is adopted by the control loop once the fault clears.
func TestReconcileConvergesPastARefusedAdopt(t *testing.T) {
	e := newFakeEnv(t, sandbox.Config{})
	mismatch := e.create(t, sandbox.CreateRequest{})
	gone := e.create(t, sandbox.CreateRequest{})
	flaky := e.create(t, sandbox.CreateRequest{})
	good := e.create(t, sandbox.CreateRequest{})
	var flakyOn atomic.Bool
	flakyOn.Store(true)
	e.rt.SetFault(func(_ context.Context, op fake.Op, id string) error {
		if op != fake.OpAdopt {
			return nil
		}
		switch {
		case id == mismatch.ID:
			return errcode.New(errcode.SandboxNotRunning, "sandbox %s is not the sandbox on record (handle differs); destroy it", id)
		case id == gone.ID:
			return errcode.New(errcode.SandboxNotFound, "sandbox %s does not exist", id)
		case id == flaky.ID && flakyOn.Load():
			return errInjected
		}
		return nil
	})
	e.restart(t) // must not fail
	for _, id := range []string{mismatch.ID, gone.ID} {
		if st := e.state(t, id); st != sandbox.StateLost {
			t.Fatalf("sandbox %s whose adopt was refused is %s, want lost", id, st)
		}
		evs := e.eventsOf(t, id, "state")
		if last := evs[len(evs)-1]; last.To != sandbox.StateLost || !strings.Contains(last.Reason, "adopt") {
			t.Fatalf("last state event of %s: %+v, want → lost naming the adopt", id, last)
		}
		if slices.Contains(e.rt.Resources(), id) {
			t.Fatalf("the host resources of %s, refused by adopt, were not swept", id)
		}
	}
	if e.state(t, good.ID) != sandbox.StateRunning || e.state(t, flaky.ID) != sandbox.StateRunning {
		t.Fatal("a sandbox whose adopt succeeded or may succeed later is not running")
	}
	if len(e.eventsOf(t, flaky.ID, "error")) == 0 {
		t.Fatal("the failed adopt left no error event")
	}
	// The loop retries the adopt with backoff, and only the flaky one's.
	calls := e.rt.Calls(fake.OpAdopt)
	if err := e.svc.Converge(t.Context()); err != nil || e.rt.Calls(fake.OpAdopt) != calls {
		t.Fatalf("Converge inside the backoff: %v, %d adopt calls; want none", err, e.rt.Calls(fake.OpAdopt)-calls)
	}
	e.clock.Add(2 * time.Second)
	if err := e.svc.Converge(t.Context()); err == nil || e.rt.Calls(fake.OpAdopt) != calls+1 {
		t.Fatalf("Converge with the fault on: %v, %d adopt calls; want an error and one", err, e.rt.Calls(fake.OpAdopt)-calls)
	}
	flakyOn.Store(false)
	e.clock.Add(10 * time.Second)
	if err := e.svc.Converge(t.Context()); err != nil || e.rt.Calls(fake.OpAdopt) != calls+2 {
		t.Fatalf("Converge after the fault cleared: %v, %d adopt calls; want one more", err, e.rt.Calls(fake.OpAdopt)-calls)
	}
	e.clock.Add(10 * time.Minute)
	if err := e.svc.Converge(t.Context()); err != nil || e.rt.Calls(fake.OpAdopt) != calls+2 {
		t.Fatalf("Converge after the adopt succeeded: %v; adopt retried again", err)
	}
	if e.state(t, flaky.ID) != sandbox.StateRunning {
		t.Fatalf("the adopted sandbox is %s", e.state(t, flaky.ID))
	}
	if _, err := e.svc.Exec(t.Context(), flaky.ID, sandbox.ExecRequest{Argv: []string{"true"}}, nil); err != nil {
		t.Fatalf("exec on the adopted sandbox: %v", err)
	}
}

// TestConvergeGoesOnPastAHungDelete: one sandbox's runtime delete hangs (ignoring its context,
// the worst a runtime can do) while several sandboxes expire. The same pass of the control loop
// still destroys the others, working on them while the hung step is within its deadline, at most
// four at once; the hung step is recorded as a failure (an error event, the sandbox left
// stopping) once its deadline passes; later passes start no second step on it while it hangs;
// and Close waits for it.
func TestConvergeGoesOnPastAHungDelete(t *testing.T) {
	// The deadline must leave the other steps time to finish on a loaded machine (under -race
	// a fake destroy can take seconds there): the hung step's deadline is what the test waits.
	const stepTimeout = 10 * time.Second
	e := newFakeEnv(t, sandbox.Config{StepTimeout: stepTimeout})
	hung := e.create(t, sandbox.CreateRequest{TTLSeconds: 60})
	var others []sandbox.Sandbox
	for range 5 { // more sandboxes than the loop's 4 workers
		e.clock.Add(time.Millisecond) // the store lists by creation: the hung sandbox first
		others = append(others, e.create(t, sandbox.CreateRequest{TTLSeconds: 60}))
	}
	var (
		mu         sync.Mutex
		active     int
		maxActive  int
		hungDelete int
		hungEnded  time.Time // when the hung step's context ended (its deadline)
		deletedAt  = map[string]time.Time{}
	)
	release := make(chan struct{})
	var once sync.Once
	releaseHung := func() { once.Do(func() { close(release) }) }
	t.Cleanup(releaseHung) // before the env's cleanup closes the service, which waits for it
	e.rt.SetFault(func(ctx context.Context, op fake.Op, id string) error {
		if op != fake.OpDelete {
			return nil
		}
		mu.Lock()
		active++
		maxActive = max(maxActive, active)
		if id == hung.ID {
			hungDelete++
		} else {
			deletedAt[id] = time.Now()
		}
		mu.Unlock()
		defer func() {
			mu.Lock()
			active--
			mu.Unlock()
		}()
		if id == hung.ID {
			context.AfterFunc(ctx, func() {
				mu.Lock()
				hungEnded = time.Now()
				mu.Unlock()
			})
			<-release // deaf to ctx
			return nil
		}
		time.Sleep(20 * time.Millisecond) // a delete takes a while: steps overlap
		return nil
	})
	e.clock.Add(61 * time.Second)

	done := make(chan error, 1)
	go func() { done <- e.svc.Converge(t.Context()) }()
	var err error
	select {
	case err = <-done:
	case <-time.After(time.Minute):
		t.Fatal("Converge did not return while one delete hangs")
	}
	if err == nil || !strings.Contains(err.Error(), hung.ID) || !strings.Contains(err.Error(), "did not finish within") {
		t.Fatalf("Converge: %v; want the hung sandbox's step reported as not finished within its deadline", err)
	}
	for _, sb := range others {
		if st := e.state(t, sb.ID); st != sandbox.StateDestroyed {
			t.Errorf("sandbox %s is %s after the pass, want destroyed", sb.ID, st)
		}
	}
	mu.Lock()
	if hungEnded.IsZero() {
		t.Error("the hung step's context never ended: it had no deadline")
	}
	for id, at := range deletedAt {
		if !at.Before(hungEnded) {
			t.Errorf("sandbox %s was deleted %v after the hung step's deadline: the pass waited for it", id, at.Sub(hungEnded))
		}
	}
	if maxActive > 4 {
		t.Errorf("%d runtime deletes ran at once; the loop's bound is 4", maxActive)
	}
	mu.Unlock()
	if st := e.state(t, hung.ID); st != sandbox.StateStopping {
		t.Fatalf("the hung sandbox is %s, want stopping", st)
	}
	evs := e.eventsOf(t, hung.ID, "error")
	if len(evs) != 1 || !strings.Contains(evs[0].Reason, "did not finish within "+stepTimeout.String()) {
		t.Fatalf("error events of the hung sandbox: %+v; want one saying its step did not finish within %v", evs, stepTimeout)
	}

	// Past its backoff, the sandbox is due again, but its step still runs: no second one.
	e.clock.Add(time.Minute)
	if err := e.svc.Converge(t.Context()); err != nil {
		t.Fatalf("Converge while the hung step still runs: %v", err)
	}
	mu.Lock()
	n := hungDelete
	mu.Unlock()
	if n != 1 {
		t.Fatalf("%d deletes of the hung sandbox; want 1 (no second step while the first runs)", n)
	}

	// Close waits for the step in flight.
	closed := make(chan struct{})
	go func() { e.svc.Close(); close(closed) }()
	select {
	case <-closed:
		t.Fatal("Close returned while a control-loop step was still running")
	case <-time.After(100 * time.Millisecond):
	}
	releaseHung()
	select {
	case <-closed:
	case <-time.After(time.Minute):
		t.Fatal("Close did not return once the hung step ended")
	}
}

// TestSlowStepDelaysNoOtherExpiry: while one sandbox's step hangs (its runtime's delete blocks),
// Run's control loop still destroys another sandbox within a few ticks of its expiry: a pass does
// not wait for the slow step before the next one starts (it waited up to the step's deadline).
func TestSlowStepDelaysNoOtherExpiry(t *testing.T) {
	e := newFakeEnv(t, sandbox.Config{StepTimeout: 2 * time.Minute})
	slow := e.create(t, sandbox.CreateRequest{TTLSeconds: 60})
	fast := e.create(t, sandbox.CreateRequest{TTLSeconds: 120})
	release := make(chan struct{})
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	e.rt.SetFault(func(ctx context.Context, op fake.Op, id string) error {
		if op == fake.OpDelete && id == slow.ID {
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { e.svc.Run(ctx); close(done) }()
	defer func() { cancel(); unblock(); <-done }()

	e.clock.Add(61 * time.Second) // slow expires; its destroy hangs in the runtime
	for deadline := time.Now().Add(30 * time.Second); e.state(t, slow.ID) != sandbox.StateStopping; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the expired sandbox is %s, not stopping, after 30 s", e.state(t, slow.ID))
		}
	}
	e.clock.Add(60 * time.Second) // fast expires while slow's step still hangs
	began := time.Now()
	for e.state(t, fast.ID) != sandbox.StateDestroyed {
		if time.Since(began) > 30*time.Second {
			t.Fatalf("30 s after its expiry, with another sandbox's step hanging, the sandbox is %s", e.state(t, fast.ID))
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("destroyed %s after its expiry while the other step hung", time.Since(began).Round(time.Millisecond))
	if st := e.state(t, slow.ID); st != sandbox.StateStopping {
		t.Fatalf("the hanging sandbox is %s; want still stopping", st)
	}
	unblock()
	for deadline := time.Now().Add(30 * time.Second); e.state(t, slow.ID) != sandbox.StateDestroyed; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("released, the slow sandbox is %s after 30 s", e.state(t, slow.ID))
		}
	}
}
