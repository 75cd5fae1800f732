package storetest

import (
	"encoding/json"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/approval"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/store"
)

// approvalTests cover approval.Store.
var approvalTests = []struct {
	name string
	run  func(t *testing.T, s store.Store)
}{
	{"ApprovalRoundTrip", testApprovalRoundTrip},
	{"ApprovalDecideClaimOnce", testApprovalDecideClaimOnce},
	{"ApprovalFindExpireListPrune", testApprovalFindExpireListPrune},
	{"ApprovalPrincipal", testApprovalPrincipal},
}

func newApproval(i int, created time.Time) approval.Approval {
	return approval.Approval{ID: fmt.Sprintf("ap-%012d", i), State: approval.Pending, Tool: "exec", Action: "exec", Surface: "mcp",
		SandboxID: "sb-1", Digest: fmt.Sprintf("%064d", i), Summary: json.RawMessage(`{"tool":"exec"}`), CallerID: "token:abc",
		CallerName: "token", Principal: "admin", CreatedAt: created, ExpiresAt: created.Add(time.Minute)}
}

// testApprovalPrincipal: an approval keeps its principal ("admin" when none is given), and a
// list filtered to a principal has that principal's only, with the state filter too.
func testApprovalPrincipal(t *testing.T, s store.Store) {
	ctx := t.Context()
	mine := newApproval(1, base())
	mine.CallerID, mine.CallerName, mine.Principal = "k1", "alice", "key:k1"
	other := newApproval(2, base().Add(time.Second))
	other.CallerID, other.CallerName, other.Principal = "k2", "bob", "key:k2"
	none := newApproval(3, base().Add(2*time.Second))
	none.Principal = ""
	for _, a := range []approval.Approval{mine, other, none} {
		if err := s.CreateApproval(ctx, a); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := s.GetApproval(ctx, mine.ID); err != nil || got.Principal != "key:k1" {
		t.Fatalf("get: principal %q, %v", got.Principal, err)
	}
	if got, err := s.GetApproval(ctx, none.ID); err != nil || got.Principal != "admin" {
		t.Fatalf("get of one made without a principal: %q, %v; want admin", got.Principal, err)
	}
	l, err := s.ListApprovals(ctx, approval.Filter{Principal: "key:k1"})
	if err != nil || len(l) != 1 || l[0].ID != mine.ID {
		t.Fatalf("list of key:k1: %+v %v", l, err)
	}
	if l, err := s.ListApprovals(ctx, approval.Filter{Principal: "key:k1", State: approval.Denied}); err != nil || len(l) != 0 {
		t.Fatalf("list of key:k1 denied: %+v %v", l, err)
	}
	if l, err := s.ListApprovals(ctx, approval.Filter{}); err != nil || len(l) != 3 {
		t.Fatalf("list of every principal: %d %v", len(l), err)
	}
}

func testApprovalRoundTrip(t *testing.T, s store.Store) {
	ctx := t.Context()
	a := newApproval(1, base())
	if err := s.CreateApproval(ctx, a); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateApproval(ctx, a); !errcode.Is(err, errcode.Conflict) {
		t.Fatalf("create existing: %v", err)
	}
	got, err := s.GetApproval(ctx, a.ID)
	if err != nil {
		t.Fatal(err)
	}
	want := a
	want.CreatedAt, want.ExpiresAt = a.CreatedAt.UTC(), a.ExpiresAt.UTC()
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("round trip\n got %+v\nwant %+v", got, want)
	}
	if _, err := s.GetApproval(ctx, "ap-none"); !errcode.Is(err, errcode.ApprovalNotFound) {
		t.Fatalf("get unknown: %v", err)
	}
}

func testApprovalDecideClaimOnce(t *testing.T, s store.Store) {
	ctx := t.Context()
	a := newApproval(1, base())
	if err := s.CreateApproval(ctx, a); err != nil {
		t.Fatal(err)
	}
	if ok, err := s.ClaimApproval(ctx, a.ID, base()); err != nil || ok {
		t.Fatalf("claim pending: %v %v", ok, err)
	}
	d, err := s.DecideApproval(ctx, a.ID, approval.Approved, "token", "fine", base().Add(time.Second))
	if err != nil || d.State != approval.Approved || d.Decider != "token" || d.Reason != "fine" || d.DecidedAt == nil || !d.DecidedAt.Equal(base().Add(time.Second)) {
		t.Fatalf("decide: %+v %v", d, err)
	}
	if _, err := s.DecideApproval(ctx, a.ID, approval.Denied, "token", "", base().Add(2*time.Second)); !errcode.Is(err, errcode.Conflict) {
		t.Fatalf("decide twice: %v", err)
	}
	results := make(chan bool, 8)
	for range 8 {
		go func() { ok, _ := s.ClaimApproval(ctx, a.ID, base().Add(3*time.Second)); results <- ok }()
	}
	n := 0
	for range 8 {
		if <-results {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d concurrent claims won, want 1", n)
	}
	if err := s.SetApprovalOutcome(ctx, a.ID, "ok"); err != nil {
		t.Fatal(err)
	}
	got, _ := s.GetApproval(ctx, a.ID)
	if got.State != approval.Used || got.Outcome != "ok" || got.UsedAt == nil {
		t.Fatalf("used: %+v", got)
	}
	// Deciding after the expiry expires it instead.
	b := newApproval(2, base())
	s.CreateApproval(ctx, b)
	if _, err := s.DecideApproval(ctx, b.ID, approval.Approved, "token", "", b.ExpiresAt); !errcode.Is(err, errcode.Conflict) {
		t.Fatalf("decide at expiry: %v", err)
	}
	if got, _ := s.GetApproval(ctx, b.ID); got.State != approval.Expired {
		t.Fatalf("state %s, want expired", got.State)
	}
}

func testApprovalFindExpireListPrune(t *testing.T, s store.Store) {
	ctx := t.Context()
	for i := range 5 {
		a := newApproval(i, base().Add(time.Duration(i)*time.Hour))
		a.Digest = "d"
		if err := s.CreateApproval(ctx, a); err != nil {
			t.Fatal(err)
		}
	}
	if a, ok, err := s.FindApproval(ctx, "token:abc", "d", base()); err != nil || !ok || a.ID != "ap-000000000004" {
		t.Fatalf("find newest: %+v %v %v", a, ok, err)
	}
	if _, ok, _ := s.FindApproval(ctx, "token:other", "d", base()); ok {
		t.Fatal("found another caller's approval")
	}
	if _, ok, _ := s.FindApproval(ctx, "token:abc", "d", base().Add(5*time.Hour)); ok {
		t.Fatal("found one older than since")
	}
	if n, err := s.CountPendingApprovals(ctx); err != nil || n != 5 {
		t.Fatalf("pending %d %v", n, err)
	}
	// expires_at of i is base+i h+1 min: at base+2h+1min, 0..2 expire.
	if n, err := s.ExpireApprovals(ctx, base().Add(2*time.Hour+time.Minute)); err != nil || n != 3 {
		t.Fatalf("expired %d %v", n, err)
	}
	l, err := s.ListApprovals(ctx, approval.Filter{State: approval.Pending})
	if err != nil || len(l) != 2 || l[0].ID != "ap-000000000004" {
		t.Fatalf("pending list %+v %v", l, err)
	}
	if l, _ := s.ListApprovals(ctx, approval.Filter{Limit: 2}); len(l) != 2 || l[1].ID != "ap-000000000003" {
		t.Fatalf("bounded list %+v", l)
	}
	if n, err := s.PruneApprovals(ctx, base().Add(10*time.Hour)); err != nil || n != 3 {
		t.Fatalf("prune %d %v (only expired ones go)", n, err)
	}
	if l, _ := s.ListApprovals(ctx, approval.Filter{}); len(l) != 2 {
		t.Fatalf("after prune %d", len(l))
	}
}
