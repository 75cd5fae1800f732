package lease_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/lease"
)

// memLeases is an in-memory lease.Store with the store contract's rules (take a free or
// expired lease, renew one's own, refuse another's live one), for the Owner's unit tests; the
// replica tests use the real store's. A holder marked down gets errors, as a replica cut off
// from the database (or dead) would.
type memLeases struct {
	mu   sync.Mutex
	m    map[string]memLease
	down map[string]bool
}

type memLease struct {
	holder string
	exp    time.Time
	ok     time.Time // when holder last took or renewed it
}

func newMemLeases() *memLeases {
	return &memLeases{m: map[string]memLease{}, down: map[string]bool{}}
}

var errDown = errors.New("database unreachable")

func (l *memLeases) AcquireLease(ctx context.Context, name, holder string, ttl time.Duration) (bool, time.Time, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.down[holder] {
		return false, time.Time{}, errDown
	}
	now := time.Now()
	cur := l.m[name]
	if cur.holder != "" && cur.holder != holder && now.Before(cur.exp) {
		return false, cur.exp, nil
	}
	l.m[name] = memLease{holder: holder, exp: now.Add(ttl), ok: now}
	return true, now.Add(ttl), nil
}

func (l *memLeases) ReleaseLease(ctx context.Context, name, holder string) (bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.down[holder] {
		return false, errDown
	}
	if l.m[name].holder == holder {
		delete(l.m, name)
		return true, nil
	}
	return false, nil
}

func (l *memLeases) setDown(holder string, down bool) {
	l.mu.Lock()
	l.down[holder] = down
	l.mu.Unlock()
}

func (l *memLeases) get(name string) memLease {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.m[name]
}

// steal gives the lease to holder at once, whoever held it.
func (l *memLeases) steal(name, holder string, ttl time.Duration) {
	l.mu.Lock()
	l.m[name] = memLease{holder: holder, exp: time.Now().Add(ttl), ok: time.Now()}
	l.mu.Unlock()
}

// terms records the work terms of several owners and fails the test if two ever overlap.
type terms struct {
	t      *testing.T
	mu     sync.Mutex
	active string // the holder whose work runs now
	starts []termStart
	ends   map[string]time.Time // each holder's last end
}

type termStart struct {
	holder   string
	at       time.Time
	takeover bool
}

func newTerms(t *testing.T) *terms { return &terms{t: t, ends: map[string]time.Time{}} }

// work is holder's lifecycle work: it runs until its context ends.
func (r *terms) work(holder string) func(context.Context, bool) {
	return func(ctx context.Context, takeover bool) {
		r.mu.Lock()
		if r.active != "" {
			r.t.Errorf("%s's work started while %s's still ran: two owners at once", holder, r.active)
		}
		r.active = holder
		r.starts = append(r.starts, termStart{holder, time.Now(), takeover})
		r.mu.Unlock()
		<-ctx.Done()
		r.mu.Lock()
		if r.active == holder {
			r.active = ""
		}
		r.ends[holder] = time.Now()
		r.mu.Unlock()
	}
}

// waitStart waits until holder's work has started n times, and returns the last start.
func (r *terms) waitStart(holder string, n int, within time.Duration) termStart {
	r.t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		r.mu.Lock()
		var got []termStart
		for _, s := range r.starts {
			if s.holder == holder {
				got = append(got, s)
			}
		}
		r.mu.Unlock()
		if len(got) >= n {
			return got[n-1]
		}
		time.Sleep(5 * time.Millisecond)
	}
	r.t.Fatalf("%s's work did not start (%d times) within %v", holder, n, within)
	return termStart{}
}

func (r *terms) endOf(holder string) (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	at, ok := r.ends[holder]
	return at, ok
}

// runOwner starts o.Run with work in the background; stop cancels it and waits.
func runOwner(o *lease.Owner, work func(context.Context, bool)) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); o.Run(ctx, work) }()
	return func() { cancel(); <-done }
}

// A server alone on its store (no lease.Store) holds its lease at once, with no start-up wait,
// and its first term follows TryAcquire (no takeover).
func TestOwnerAlone(t *testing.T) {
	o := lease.New(lease.Config{Name: lease.Lifecycle("local"), Holder: "a"})
	start := time.Now()
	if held, err := o.TryAcquire(t.Context()); !held || err != nil {
		t.Fatalf("TryAcquire alone = %v, %v; want held", held, err)
	}
	r := newTerms(t)
	stop := runOwner(o, r.work("a"))
	s := r.waitStart("a", 1, time.Second)
	if d := s.at.Sub(start); d > 100*time.Millisecond {
		t.Errorf("the work started %v after TryAcquire; want at once", d)
	}
	if s.takeover {
		t.Error("the first term after TryAcquire was called a takeover")
	}
	if st := o.Status(); !st.Held || st.Lease != "lifecycle:local" || st.Replica != "a" {
		t.Errorf("Status = %+v", st)
	}
	stop()
	if o.Held() {
		t.Error("still held after Run returned")
	}
	if _, ok := r.endOf("a"); !ok {
		t.Error("Run returned before its work did")
	}
}

// Replica A holds; B waits. A dies without releasing (SIGKILL: its work ends with it, its lease
// stays in the store): B takes over within the TTL of A's last renewal, as a takeover.
func TestOwnerTakeoverAfterHolderDies(t *testing.T) {
	const ttl = 600 * time.Millisecond
	l := newMemLeases()
	name := lease.Lifecycle("kube:ns")
	a := lease.New(lease.Config{Leases: l, Name: name, Holder: "a", TTL: ttl})
	b := lease.New(lease.Config{Leases: l, Name: name, Holder: "b", TTL: ttl})
	if held, err := a.TryAcquire(t.Context()); !held || err != nil {
		t.Fatalf("A's TryAcquire = %v, %v; want held", held, err)
	}
	if held, err := b.TryAcquire(t.Context()); held || err != nil {
		t.Fatalf("B's TryAcquire = %v, %v; want not held (A holds it)", held, err)
	}
	r := newTerms(t)
	stopA := runOwner(a, r.work("a"))
	stopB := runOwner(b, r.work("b"))
	defer stopB()
	r.waitStart("a", 1, time.Second)
	time.Sleep(2 * ttl) // A renews several times; B must not take it
	if b.Held() || !a.Held() {
		t.Fatalf("held: A %v, B %v; want A only", a.Held(), b.Held())
	}
	// A dies: the store hears no more of it (no release either).
	l.setDown("a", true)
	stopA()
	last := l.get(name)
	if last.holder != "a" {
		t.Fatalf("the lease after A died: %+v; want A's, unreleased", last)
	}
	s := r.waitStart("b", 1, 3*ttl)
	if !s.takeover {
		t.Error("B's first term was not a takeover")
	}
	if d := s.at.Sub(last.ok); d > ttl+150*time.Millisecond {
		t.Errorf("B took over %v after A's last renewal; want within the TTL (%v)", d, ttl)
	}
	if d := s.at.Sub(last.ok); d < ttl {
		t.Errorf("B took over %v after A's last renewal, before its lease could expire (%v)", d, ttl)
	}
	t.Logf("takeover %v after the dead holder's last renewal (ttl %v)", s.at.Sub(last.ok), ttl)
}

// A holder cut off from the store (alive, but its renewals fail) stops its work before its
// lease can expire, so the replica that takes over never overlaps it; B takes over within the
// TTL. When A reaches the store again it does not take the lease back from B.
func TestOwnerPartitionedHolderStopsFirst(t *testing.T) {
	const ttl = 600 * time.Millisecond
	l := newMemLeases()
	name := lease.Lifecycle("kube:ns")
	a := lease.New(lease.Config{Leases: l, Name: name, Holder: "a", TTL: ttl})
	b := lease.New(lease.Config{Leases: l, Name: name, Holder: "b", TTL: ttl})
	r := newTerms(t) // fails the test if the two works ever overlap
	stopA := runOwner(a, r.work("a"))
	defer stopA()
	r.waitStart("a", 1, time.Second)
	stopB := runOwner(b, r.work("b"))
	defer stopB()
	time.Sleep(ttl / 2)
	l.setDown("a", true)
	last := l.get(name)
	s := r.waitStart("b", 1, 3*ttl)
	end, ok := r.endOf("a")
	if !ok || !end.Before(s.at) {
		t.Fatalf("A's work ended at %v (ended %v), B's began at %v: they overlapped", end, ok, s.at)
	}
	if d := end.Sub(last.ok); d > ttl-ttl/3+150*time.Millisecond {
		t.Errorf("A stopped %v after its last renewal; want by 2/3 of the TTL (%v)", d, ttl-ttl/3)
	}
	if d := s.at.Sub(last.ok); d > ttl+150*time.Millisecond {
		t.Errorf("B took over %v after A's last renewal; want within the TTL (%v)", d, ttl)
	}
	l.setDown("a", false)
	time.Sleep(ttl)
	if a.Held() || !b.Held() {
		t.Errorf("after A came back: held A %v, B %v; want B only", a.Held(), b.Held())
	}
}

// A clean shutdown releases the lease: the other replica takes over without waiting for it to
// expire (within a third of the TTL, its polling interval).
func TestOwnerReleaseOnShutdown(t *testing.T) {
	const ttl = 3 * time.Second
	l := newMemLeases()
	name := lease.Lifecycle("kube:ns")
	a := lease.New(lease.Config{Leases: l, Name: name, Holder: "a", TTL: ttl})
	b := lease.New(lease.Config{Leases: l, Name: name, Holder: "b", TTL: ttl})
	r := newTerms(t)
	stopA := runOwner(a, r.work("a"))
	r.waitStart("a", 1, time.Second)
	stopB := runOwner(b, r.work("b"))
	defer stopB()
	time.Sleep(100 * time.Millisecond)
	stopA()
	if got := l.get(name); got.holder == "a" {
		t.Fatalf("A's lease still in the store after its clean shutdown: %+v", got)
	}
	released := time.Now()
	s := r.waitStart("b", 1, ttl)
	if d := s.at.Sub(released); d > ttl/3+200*time.Millisecond {
		t.Errorf("B took over %v after A released; want within its polling interval (%v)", d, ttl/3)
	}
}

// A renewal refused (another holder has the lease) stops the work at the next renewal, and
// the Owner goes back to waiting, taking the lease again (a new term, a takeover) once free.
func TestOwnerRenewalRefusedStopsWork(t *testing.T) {
	const ttl = 600 * time.Millisecond
	l := newMemLeases()
	name := lease.Lifecycle("local")
	var changes []bool
	var mu sync.Mutex
	a := lease.New(lease.Config{Leases: l, Name: name, Holder: "a", TTL: ttl,
		OnChange: func(held bool) { mu.Lock(); changes = append(changes, held); mu.Unlock() }})
	r := newTerms(t)
	stop := runOwner(a, r.work("a"))
	defer stop()
	r.waitStart("a", 1, time.Second)
	stolen := time.Now()
	l.steal(name, "c", ttl)
	deadline := time.Now().Add(ttl)
	for a.Held() && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	end, ok := r.endOf("a")
	if a.Held() || !ok {
		t.Fatal("A still works after its renewal was refused")
	}
	if d := end.Sub(stolen); d > ttl/3+150*time.Millisecond {
		t.Errorf("A's work ended %v after the lease went to another; want by its next renewal (%v)", d, ttl/3)
	}
	s := r.waitStart("a", 2, 3*ttl) // c never renews: A takes it back once it expires
	if !s.takeover {
		t.Error("A's second term was not a takeover")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(changes) < 3 || !changes[0] || changes[1] || !changes[2] {
		t.Errorf("OnChange calls %v; want gained, lost, gained", changes)
	}
}

// A server restarted on its state dir after a SIGKILL takes its dead predecessor's live lease
// at once (no wait for it to expire); it never takes another replica's.
func TestOwnerTakesOverItsPredecessorsLease(t *testing.T) {
	const ttl = time.Minute
	l := newMemLeases()
	name := lease.Lifecycle("kube:ns")
	if held, _, _ := l.AcquireLease(t.Context(), name, "old", ttl); !held {
		t.Fatal("setup: the predecessor did not get the lease")
	}
	o := lease.New(lease.Config{Leases: l, Name: name, Holder: "new", TTL: ttl, Predecessor: "old"})
	if held, err := o.TryAcquire(t.Context()); !held || err != nil {
		t.Fatalf("TryAcquire over the predecessor's live lease = %v, %v; want held at once", held, err)
	}
	if got := l.get(name); got.holder != "new" {
		t.Fatalf("the lease is %+v; want the new process's", got)
	}
	// Another replica's live lease stays its own, whatever the predecessor was.
	o2 := lease.New(lease.Config{Leases: l, Name: name, Holder: "newer", TTL: ttl, Predecessor: "old"})
	if held, err := o2.TryAcquire(t.Context()); held || err != nil {
		t.Fatalf("TryAcquire over another replica's lease = %v, %v; want not held", held, err)
	}
	if got := l.get(name); got.holder != "new" {
		t.Fatalf("the lease is %+v; want it left to its holder", got)
	}
}
