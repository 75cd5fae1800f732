package storetest

import (
	"sync"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/store"
)

// Warm pools: sandbox.PoolStore.

var poolTests = []struct {
	name string
	run  func(t *testing.T, s store.Store)
}{
	{"PoolPutListDelete", testPoolPutListDelete},
	{"PoolMembersRoundTripAndFilters", testPoolMembers},
	{"PoolClaim", testPoolClaim},
	{"PoolClaimIdempotencyKey", testPoolClaimIdempotencyKey},
	{"PoolConcurrentClaimsNeverShare", testPoolConcurrentClaims},
}

func testPool(name string, size int) sandbox.Pool {
	return sandbox.Pool{Name: name, Image: "host", Runtime: "runc", CPU: 0.5, MemoryMB: 256, DiskMB: 512,
		Network: "none", Size: size, CreatedAt: base(), UpdatedAt: base()}
}

// pooled creates a sandbox held by pool on node "local".
func pooled(t *testing.T, s store.Store, n int, pool string, st sandbox.State) sandbox.Sandbox {
	t.Helper()
	sb := newSandbox(n, st, base().Add(time.Duration(n)*time.Second), nil)
	sb.Env, sb.Pool, sb.Owner, sb.Node = nil, pool, "pool:"+pool, "local"
	return mustCreate(t, s, sb)
}

func testPoolPutListDelete(t *testing.T, s store.Store) {
	ctx := t.Context()
	if got, err := s.ListPools(ctx); err != nil || len(got) != 0 {
		t.Fatalf("empty store: %v %v", got, err)
	}
	b, a := testPool("b", 2), testPool("a", 1)
	for _, p := range []sandbox.Pool{b, a} {
		if err := s.PutPool(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	b2 := b
	b2.Size, b2.MemoryMB, b2.CreatedAt, b2.UpdatedAt = 5, 1024, base().Add(time.Hour), base().Add(time.Hour)
	if err := s.PutPool(ctx, b2); err != nil {
		t.Fatal(err)
	}
	got, err := s.ListPools(ctx)
	if err != nil || len(got) != 2 || got[0].Name != "a" || got[1].Name != "b" {
		t.Fatalf("ListPools: %+v %v; want a, b by name", got, err)
	}
	g := got[1]
	if g.Size != 5 || g.MemoryMB != 1024 || g.CPU != 0.5 || g.Image != "host" || g.Runtime != "runc" || g.DiskMB != 512 || g.Network != "none" {
		t.Fatalf("replaced pool: %+v", g)
	}
	checkTime(t, "created_at (kept by a replace)", b.CreatedAt, g.CreatedAt)
	checkTime(t, "updated_at", b2.UpdatedAt, g.UpdatedAt)
	if err := s.DeletePool(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeletePool(ctx, "a"); errcode.Of(err) != errcode.PoolNotFound {
		t.Fatalf("deleting an unknown pool: %v; want POOL_NOT_FOUND", err)
	}
	if got, _ := s.ListPools(ctx); len(got) != 1 || got[0].Name != "b" {
		t.Fatalf("after delete: %+v", got)
	}
}

func testPoolMembers(t *testing.T, s store.Store) {
	ctx := t.Context()
	r1 := pooled(t, s, 0, "p", sandbox.StateRunning)
	pooled(t, s, 1, "p", sandbox.StateCreating)
	pooled(t, s, 2, "p", sandbox.StateDestroyed)
	pooled(t, s, 3, "q", sandbox.StateRunning)
	other := newSandbox(4, sandbox.StateRunning, base().Add(4*time.Second), nil)
	other.Node = "local"
	mustCreate(t, s, other)

	got := mustGet(t, s, r1.ID)
	if got.Pool != "p" || got.FromPool {
		t.Fatalf("pool fields round trip: pool %q from_pool %v", got.Pool, got.FromPool)
	}
	upd := got
	upd.Pool, upd.FromPool, upd.Version = "", true, got.Version+1
	if err := s.UpdateSandbox(ctx, upd, sandbox.Event{}); err != nil {
		t.Fatal(err)
	}
	if g := mustGet(t, s, r1.ID); g.Pool != "" || !g.FromPool {
		t.Fatalf("pool fields after update: pool %q from_pool %v", g.Pool, g.FromPool)
	}
	if l := mustList(t, s, sandbox.ListFilter{Pool: "p"}); len(l) != 2 {
		t.Fatalf("ListFilter{Pool: p}: %d, want 2 (creating, destroyed)", len(l))
	}
	if l := mustList(t, s, sandbox.ListFilter{NoPooled: true}); len(l) != 2 || !equalIDs(ids(l), []string{r1.ID, other.ID}) {
		t.Fatalf("ListFilter{NoPooled}: %v, want the claimed one and the unpooled one", ids(l))
	}
	counts, err := s.CountPooled(ctx, "local")
	if err != nil {
		t.Fatal(err)
	}
	if len(counts) != 2 || counts["p"] != (sandbox.PoolCount{Ready: 0, Starting: 1}) || counts["q"] != (sandbox.PoolCount{Ready: 1}) {
		t.Fatalf("CountPooled: %+v", counts)
	}
	if counts, _ := s.CountPooled(ctx, "elsewhere"); len(counts) != 0 {
		t.Fatalf("CountPooled of another node: %+v", counts)
	}
}

func testPoolClaim(t *testing.T, s store.Store) {
	ctx := t.Context()
	claim := sandbox.PoolClaim{Pool: "p", Node: "local", Owner: "alice", Env: map[string]string{"K": "v"},
		Labels: map[string]string{"team": "a"}, ExpiresAt: base().Add(2 * time.Hour), At: base().Add(time.Minute)}
	c, prior, err := s.ClaimPooled(ctx, claim)
	if err != nil || c.ID != "" || prior.ID != "" {
		t.Fatalf("claim from an empty pool: %+v %+v %v; want nothing", c, prior, err)
	}
	pooled(t, s, 0, "p", sandbox.StateCreating) // not ready
	oldest := pooled(t, s, 1, "p", sandbox.StateRunning)
	newer := pooled(t, s, 2, "p", sandbox.StateRunning)
	c, _, err = s.ClaimPooled(ctx, claim)
	if err != nil || c.ID != oldest.ID {
		t.Fatalf("claim: %s %v; want the oldest ready %s", c.ID, err, oldest.ID)
	}
	g := mustGet(t, s, c.ID)
	if g.Pool != "" || !g.FromPool || g.Owner != "alice" || g.Version != oldest.Version+1 || g.State != sandbox.StateRunning {
		t.Fatalf("claimed record: %+v", g)
	}
	checkMap(t, "env", claim.Env, g.Env)
	checkMap(t, "labels", claim.Labels, g.Labels)
	checkTime(t, "expires_at", claim.ExpiresAt, g.ExpiresAt)
	checkTime(t, "updated_at", claim.At, g.UpdatedAt)
	if l := mustList(t, s, sandbox.ListFilter{Labels: map[string]string{"team": "a"}}); len(l) != 1 || l[0].ID != c.ID {
		t.Fatalf("the claimant's labels are not indexed: %v", ids(l))
	}
	evs := mustEvents(t, s, sandbox.EventFilter{SandboxID: c.ID})
	if last := evs[len(evs)-1]; last.Type != "claim" || last.To != sandbox.StateRunning {
		t.Fatalf("claim event: %+v", last)
	}
	if c2, _, _ := s.ClaimPooled(ctx, claim); c2.ID != newer.ID {
		t.Fatalf("second claim: %s, want %s", c2.ID, newer.ID)
	}
	if c3, _, _ := s.ClaimPooled(ctx, claim); c3.ID != "" {
		t.Fatalf("third claim got %s; only a creating one is left", c3.ID)
	}
	claim.Pool = "other"
	pooled(t, s, 3, "p", sandbox.StateRunning)
	if c4, _, _ := s.ClaimPooled(ctx, claim); c4.ID != "" {
		t.Fatalf("a claim of pool other took %s of pool p", c4.ID)
	}
}

func testPoolClaimIdempotencyKey(t *testing.T, s store.Store) {
	ctx := t.Context()
	pooled(t, s, 0, "p", sandbox.StateRunning)
	pooled(t, s, 1, "p", sandbox.StateRunning)
	claim := sandbox.PoolClaim{Pool: "p", Node: "local", Owner: "alice", IdempotencyKey: "k", ExpiresAt: base().Add(time.Hour), At: base()}
	c, _, err := s.ClaimPooled(ctx, claim)
	if err != nil || c.ID == "" || c.IdempotencyKey != "k" {
		t.Fatalf("claim with a key: %+v %v", c, err)
	}
	again, prior, err := s.ClaimPooled(ctx, claim)
	if err != nil || again.ID != "" || prior.ID != c.ID {
		t.Fatalf("claim with a used key: claimed %q prior %q %v; want prior %s and no claim", again.ID, prior.ID, err, c.ID)
	}
	if counts, _ := s.CountPooled(ctx, "local"); counts["p"].Ready != 1 {
		t.Fatalf("a key's retry claimed again: %+v", counts)
	}
	claim.Owner = "bob" // keys are per owner
	if c2, prior, err := s.ClaimPooled(ctx, claim); err != nil || c2.ID == "" || prior.ID != "" {
		t.Fatalf("another owner's same key: %+v %+v %v", c2, prior, err)
	}
}

func testPoolConcurrentClaims(t *testing.T, s store.Store) {
	const ready, claimants = 5, 12
	for i := range ready {
		pooled(t, s, i, "p", sandbox.StateRunning)
	}
	var wg sync.WaitGroup
	got := make([]string, claimants)
	errs := make([]error, claimants)
	for i := range claimants {
		wg.Go(func() {
			c, _, err := s.ClaimPooled(t.Context(), sandbox.PoolClaim{Pool: "p", Node: "local", Owner: "o", ExpiresAt: base().Add(time.Hour), At: base()})
			got[i], errs[i] = c.ID, err
		})
	}
	wg.Wait()
	seen := map[string]bool{}
	for i := range claimants {
		if errs[i] != nil {
			t.Fatalf("claimant %d: %v", i, errs[i])
		}
		if got[i] == "" {
			continue
		}
		if seen[got[i]] {
			t.Fatalf("two claimants got %s", got[i])
		}
		seen[got[i]] = true
	}
	if len(seen) != ready {
		t.Fatalf("%d claims succeeded; want %d", len(seen), ready)
	}
}
