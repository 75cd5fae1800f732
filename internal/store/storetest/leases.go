package storetest

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/store"
)

// leaseTests cover store.Leases: who holds a piece of lifecycle work across replicas.
var leaseTests = []struct {
	name string
	run  func(t *testing.T, s store.Store)
}{
	{"LeaseAcquireRenewRefuse", testLeaseAcquireRenewRefuse},
	{"LeaseExpiredTakenOver", testLeaseExpiredTakenOver},
	{"LeaseRelease", testLeaseRelease},
	{"LeaseConcurrentOneHolder", testLeaseConcurrentOneHolder},
	{"LeaseList", testLeaseList},
	{"LeaseBadArguments", testLeaseBadArguments},
}

func mustAcquire(t *testing.T, s store.Store, name, holder string, ttl time.Duration) (bool, time.Time) {
	t.Helper()
	held, exp, err := s.AcquireLease(t.Context(), name, holder, ttl)
	if err != nil {
		t.Fatalf("AcquireLease(%s, %s): %v", name, holder, err)
	}
	return held, exp
}

// testLeaseAcquireRenewRefuse: a free lease is taken; its holder renews it (later expiry, same
// acquired_at); another holder is refused and told when it expires.
func testLeaseAcquireRenewRefuse(t *testing.T, s store.Store) {
	ctx := t.Context()
	if _, found, err := s.GetLease(ctx, "sandbox/sb-1"); err != nil || found {
		t.Fatalf("GetLease of none: found %v, %v", found, err)
	}
	before := time.Now()
	held, exp := mustAcquire(t, s, "sandbox/sb-1", "replica-a", time.Minute)
	if !held {
		t.Fatal("a free lease was not taken")
	}
	// The database's clock is this host's here: the expiry is about a minute from now.
	if d := exp.Sub(before); d < 59*time.Second || d > 61*time.Second+5*time.Second {
		t.Errorf("expires in %s, want about 1m", d)
	}
	l, found, err := s.GetLease(ctx, "sandbox/sb-1")
	if err != nil || !found || l.Holder != "replica-a" || !l.Live || !l.ExpiresAt.Equal(exp) {
		t.Fatalf("GetLease: %+v, %v, %v; want replica-a's, live, expiring %s", l, found, err, exp)
	}
	time.Sleep(20 * time.Millisecond)
	held, exp2 := mustAcquire(t, s, "sandbox/sb-1", "replica-a", time.Minute)
	if !held || !exp2.After(exp) {
		t.Fatalf("renewal: held %v, expiry %s after %s", held, exp2, exp)
	}
	l2, _, _ := s.GetLease(ctx, "sandbox/sb-1")
	if !l2.AcquiredAt.Equal(l.AcquiredAt) {
		t.Errorf("a renewal moved acquired_at from %s to %s", l.AcquiredAt, l2.AcquiredAt)
	}
	held, other := mustAcquire(t, s, "sandbox/sb-1", "replica-b", time.Minute)
	if held || !other.Equal(exp2) {
		t.Fatalf("another holder: held %v, expiry %s; want refused, told %s", held, other, exp2)
	}
	if l3, _, _ := s.GetLease(ctx, "sandbox/sb-1"); l3.Holder != "replica-a" || !l3.ExpiresAt.Equal(exp2) {
		t.Fatalf("a refused acquire changed the lease: %+v", l3)
	}
}

// testLeaseExpiredTakenOver: once a holder stops renewing, another takes the lease after its
// ttl (a dead replica's work moves within the lease time), and the old holder is then refused.
func testLeaseExpiredTakenOver(t *testing.T, s store.Store) {
	ctx := t.Context()
	if held, _ := mustAcquire(t, s, "reconcile", "replica-a", 300*time.Millisecond); !held {
		t.Fatal("not taken")
	}
	if held, _ := mustAcquire(t, s, "reconcile", "replica-b", time.Minute); held {
		t.Fatal("taken over while live")
	}
	time.Sleep(400 * time.Millisecond)
	if l, _, err := s.GetLease(ctx, "reconcile"); err != nil || l.Live || l.Holder != "replica-a" {
		t.Fatalf("after its ttl: %+v, %v; want replica-a's, not live", l, err)
	}
	held, _ := mustAcquire(t, s, "reconcile", "replica-b", time.Minute)
	if !held {
		t.Fatal("an expired lease was not taken over")
	}
	if held, _ := mustAcquire(t, s, "reconcile", "replica-a", time.Minute); held {
		t.Fatal("the old holder took it back from a live holder")
	}
	if l, _, _ := s.GetLease(ctx, "reconcile"); l.Holder != "replica-b" || !l.Live {
		t.Fatalf("after the takeover: %+v", l)
	}
}

// testLeaseRelease: a holder's release frees the lease at once; a release by another holder
// changes nothing.
func testLeaseRelease(t *testing.T, s store.Store) {
	ctx := t.Context()
	mustAcquire(t, s, "pool/warm", "replica-a", time.Hour)
	if ok, err := s.ReleaseLease(ctx, "pool/warm", "replica-b"); err != nil || ok {
		t.Fatalf("release by another holder: %v, %v", ok, err)
	}
	if held, _ := mustAcquire(t, s, "pool/warm", "replica-b", time.Hour); held {
		t.Fatal("a release by another holder freed the lease")
	}
	if ok, err := s.ReleaseLease(ctx, "pool/warm", "replica-a"); err != nil || !ok {
		t.Fatalf("release by its holder: %v, %v", ok, err)
	}
	if _, found, _ := s.GetLease(ctx, "pool/warm"); found {
		t.Fatal("a released lease is still there")
	}
	if held, _ := mustAcquire(t, s, "pool/warm", "replica-b", time.Hour); !held {
		t.Fatal("a released lease was not free")
	}
	if ok, err := s.ReleaseLease(ctx, "never", "replica-a"); err != nil || ok {
		t.Fatalf("release of no lease: %v, %v", ok, err)
	}
}

// testLeaseConcurrentOneHolder: many holders racing for one free lease: exactly one gets it,
// and every other is told the winner's expiry.
func testLeaseConcurrentOneHolder(t *testing.T, s store.Store) {
	const n = 16
	var wg sync.WaitGroup
	var mu sync.Mutex
	var winners []string
	exps := map[time.Time]int{}
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			holder := fmt.Sprintf("replica-%d", i)
			held, exp, err := s.AcquireLease(t.Context(), "ttl/sb-race", holder, time.Minute)
			if err != nil {
				t.Errorf("%s: %v", holder, err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			exps[exp]++
			if held {
				winners = append(winners, holder)
			}
		}()
	}
	wg.Wait()
	if len(winners) != 1 {
		t.Fatalf("%d holders got the lease: %v", len(winners), winners)
	}
	if len(exps) != 1 {
		t.Errorf("the losers were told different expiries: %v", exps)
	}
	if l, _, _ := s.GetLease(t.Context(), "ttl/sb-race"); l.Holder != winners[0] {
		t.Fatalf("the lease is %s's, the winner was %s", l.Holder, winners[0])
	}
}

// testLeaseList: leases by prefix, in name order, bounded; a prefix's % and _ are literal.
func testLeaseList(t *testing.T, s store.Store) {
	for _, name := range []string{"sandbox/b", "sandbox/a", "sandbox%x", "sandbox_y", "run/a"} {
		mustAcquire(t, s, name, "replica-a", time.Minute)
	}
	names := func(prefix string, limit int) string {
		ls, err := s.ListLeases(t.Context(), prefix, limit)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, l := range ls {
			if !l.Live || l.Holder != "replica-a" {
				t.Errorf("listed %+v", l)
			}
			out = append(out, l.Name)
		}
		return strings.Join(out, ",")
	}
	if got := names("sandbox/", 10); got != "sandbox/a,sandbox/b" {
		t.Errorf("sandbox/: %s", got)
	}
	if got := names("sandbox%", 10); got != "sandbox%x" {
		t.Errorf("sandbox%%: %s", got)
	}
	if got := names("", 2); got != "run/a,sandbox%x" {
		t.Errorf("all, 2: %s", got)
	}
	if _, err := s.ListLeases(t.Context(), "", 0); !errcode.Is(err, errcode.InvalidArgument) {
		t.Errorf("limit 0: %v", err)
	}
}

// testLeaseBadArguments: a nameless or holderless lease, or a ttl out of bounds, is refused
// and writes nothing.
func testLeaseBadArguments(t *testing.T, s store.Store) {
	ctx := t.Context()
	for _, tc := range []struct {
		name, holder string
		ttl          time.Duration
	}{
		{"", "a", time.Minute},
		{"x", "", time.Minute},
		{strings.Repeat("n", store.MaxLeaseName+1), "a", time.Minute},
		{"x", "a", 0},
		{"x", "a", -time.Second},
		{"x", "a", store.MaxLeaseTTL + time.Second},
	} {
		if _, _, err := s.AcquireLease(ctx, tc.name, tc.holder, tc.ttl); !errcode.Is(err, errcode.InvalidArgument) {
			t.Errorf("AcquireLease(%.10q, %q, %s): %v, want INVALID_ARGUMENT", tc.name, tc.holder, tc.ttl, err)
		}
	}
	if _, found, err := s.GetLease(ctx, "x"); err != nil || found {
		t.Errorf("a refused acquire wrote a lease: %v, %v", found, err)
	}
}
