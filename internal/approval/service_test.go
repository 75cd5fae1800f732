package approval_test

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/approval"
	"github.com/agentbox/agentbox/internal/audit"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/gate"
	"github.com/agentbox/agentbox/internal/store/sqlite"
)

var (
	operator = gate.Caller{ID: "token:abc", Name: "token", Scope: "admin"}
	agent    = gate.Caller{ID: "token:abc", Name: "token", Scope: "admin"}
)

func newService(t *testing.T, cfg approval.Config) (*approval.Service, *sqlite.Store) {
	t.Helper()
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "agentbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	s, err := approval.New(st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s, st
}

func mcpCall(tool, args string) *gate.Call {
	return &gate.Call{Surface: gate.SurfaceMCP, Tool: tool, Action: tool, Args: json.RawMessage(args), Caller: agent, Started: time.Now()}
}

// waitPending returns the one pending approval once there is one.
func waitPending(t *testing.T, s *approval.Service) approval.Approval {
	t.Helper()
	for range 200 {
		l, err := s.List(t.Context(), approval.Filter{State: approval.Pending})
		if err != nil {
			t.Fatal(err)
		}
		if len(l) == 1 {
			return l[0]
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("no pending approval")
	return approval.Approval{}
}

// run enters c and, when let in, counts a side effect and exits.
func run(s *approval.Service, c *gate.Call, ran *atomic.Int32) error {
	exit, err := s.Enter(context.Background(), c)
	if err != nil {
		return err
	}
	ran.Add(1)
	exit(nil)
	return nil
}

// TestGatedSet: with approval required, reads (REST routes declared read-only) are never gated; anything else is (an unknown
// tool too); --approval-tools gates the named tools on both surfaces.
func TestGatedSet(t *testing.T) {
	t.Parallel()
	all, _ := newService(t, approval.Config{Required: true})
	for _, c := range []struct {
		call  *gate.Call
		gated bool
	}{
		{mcpCall("exec", "{}"), true},
		{mcpCall("file_write", "{}"), true},
		{mcpCall("some_new_tool", "{}"), true},
		{mcpCall("file_read", "{}"), false},
		{mcpCall("health", "{}"), false},
		{mcpCall("sandbox_list", "{}"), false},
		{&gate.Call{Surface: gate.SurfaceREST, Tool: "GET /v1/sandboxes/{id}/files", Action: "file_read", ReadOnly: true}, false},
		// A GET that acts (the terminal) is gated: the route's declaration says, not its method.
		{&gate.Call{Surface: gate.SurfaceREST, Tool: "GET /v1/sandboxes/{id}/pty", Action: "exec"}, true},
		{&gate.Call{Surface: gate.SurfaceREST, Tool: "DELETE /v1/sandboxes/{id}/files"}, true},
		{&gate.Call{Surface: gate.SurfaceREST, Tool: "POST /v1/approvals/{id}/approve"}, false},
	} {
		if got := all.Gated(c.call); got != c.gated {
			t.Errorf("required: %s gated %v, want %v", c.call.Tool, got, c.gated)
		}
	}
	some, _ := newService(t, approval.Config{Tools: []string{"exec"}})
	if !some.Gated(&gate.Call{Surface: gate.SurfaceREST, Tool: "POST /v1/sandboxes/{id}/exec", Action: "exec"}) ||
		!some.Gated(mcpCall("exec", "{}")) || some.Gated(mcpCall("file_write", "{}")) {
		t.Error("--approval-tools exec must gate exec on both surfaces and nothing else")
	}
	off, _ := newService(t, approval.Config{})
	if off.Enabled() || off.Gated(mcpCall("exec", "{}")) {
		t.Error("approvals off gates nothing")
	}
}

// TestPolicy: the policy a client reads is what Gated decides by (--approval-tools wins over
// --approval-required, as in Gated), and MayDecide is the queue's own rule.
func TestPolicy(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		cfg      approval.Config
		required bool
		tools    string
	}{
		{approval.Config{}, false, ""},
		{approval.Config{Required: true}, true, ""},
		{approval.Config{Tools: []string{"run_python", " exec"}}, false, "exec,run_python"},
		{approval.Config{Required: true, Tools: []string{"exec"}}, false, "exec"},
	} {
		s, _ := newService(t, c.cfg)
		p := s.Policy()
		if p.Required != c.required || strings.Join(p.Tools, ",") != c.tools || p.Timeout != approval.DefaultTimeout {
			t.Errorf("%+v: policy %+v", c.cfg, p)
		}
	}
	s, _ := newService(t, approval.Config{Required: true})
	if s.MayDecide(gate.Caller{Scope: "admin"}) != nil || s.MayDecide(gate.Caller{Scope: "operate"}) == nil {
		t.Error("MayDecide: admin may, operate may not")
	}
}

// TestQueueNeverShowsContent: file_write's summary has path, length and digest; stdin, env
// values and secrets are digests too.
func TestQueueNeverShowsContent(t *testing.T) {
	t.Parallel()
	s, st := newService(t, approval.Config{Required: true, Timeout: 2 * time.Second})
	const secret = "CONTENT-DO-NOT-SHOW"
	calls := []*gate.Call{
		mcpCall("file_write", `{"sandbox_id":"sb-1","path":"/workspace/a.txt","content":"`+secret+`"}`),
		mcpCall("file_write", `{"sandbox_id":"sb-1","path":"/workspace/b.bin","content_base64":"`+secret+`"}`),
		mcpCall("exec", `{"sandbox_id":"sb-1","command":["cat"],"stdin":"`+secret+`","env":{"K":"`+secret+`"}}`),
		{Surface: gate.SurfaceREST, Tool: "POST /v1/sandboxes/{id}/exec", Action: "exec", Caller: agent,
			Args: json.RawMessage(`{"method":"POST","path":"/v1/sandboxes/sb-1/exec","body":{"command":["cat"],"stdin":"` + secret + `"}}`)},
	}
	for _, c := range calls {
		ctx, cancel := context.WithCancel(t.Context())
		go func() { s.Enter(ctx, c) }()
		a := waitPending(t, s)
		cancel()
		got, err := st.GetApproval(t.Context(), a.ID)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(got.Summary), secret) {
			t.Errorf("%s: summary shows the content: %s", c.Tool, got.Summary)
		}
		if !strings.Contains(string(got.Summary), `"sha256"`) && !strings.Contains(string(got.Summary), "content_sha256") {
			t.Errorf("%s: summary gives no digest of what it hides: %s", c.Tool, got.Summary)
		}
		if _, err := s.Decide(t.Context(), a.ID, false, operator, "done"); err != nil {
			t.Fatal(err)
		}
	}
	var sum map[string]any
	l, _ := s.List(t.Context(), approval.Filter{Limit: 10})
	json.Unmarshal(l[len(l)-1].Summary, &sum)
	if sum["path"] != "/workspace/a.txt" || sum["content_bytes"] != float64(len(secret)) || sum["content_sha256"] == nil {
		t.Fatalf("file_write summary %v", sum)
	}
}

// TestApprovedCallRunsOnce: a call and its concurrent retry share one approval; approved, one
// of them runs and the other is refused as used; a later retry is refused too.
func TestApprovedCallRunsOnce(t *testing.T) {
	t.Parallel()
	s, _ := newService(t, approval.Config{Tools: []string{"exec"}, Timeout: 10 * time.Second})
	var ran atomic.Int32
	args := `{"sandbox_id":"sb-1","command":["touch","x"]}`
	errs := make(chan error, 2)
	for range 2 {
		go func() { errs <- run(s, mcpCall("exec", args), &ran) }()
	}
	a := waitPending(t, s)
	time.Sleep(100 * time.Millisecond) // both are waiting on it
	if l, _ := s.List(t.Context(), approval.Filter{}); len(l) != 1 {
		t.Fatalf("a retry while pending made another approval: %d", len(l))
	}
	if ran.Load() != 0 {
		t.Fatal("a call ran while pending")
	}
	if _, err := s.Decide(t.Context(), a.ID, true, operator, ""); err != nil {
		t.Fatal(err)
	}
	e1, e2 := <-errs, <-errs
	if (e1 == nil) == (e2 == nil) {
		t.Fatalf("exactly one may run: %v, %v", e1, e2)
	}
	refused := e1
	if refused == nil {
		refused = e2
	}
	if e, ok := errcode.As(refused); !ok || e.Code != errcode.ApprovalRefused || e.Details["used"] != true {
		t.Fatalf("the other: %v", refused)
	}
	err := run(s, mcpCall("exec", args), &ran)
	if e, ok := errcode.As(err); !ok || e.Code != errcode.ApprovalRefused || e.Details["approval_id"] != a.ID {
		t.Fatalf("later retry: %v", err)
	}
	if ran.Load() != 1 {
		t.Fatalf("ran %d times", ran.Load())
	}
	got, _ := s.Get(t.Context(), a.ID)
	if got.State != approval.Used || got.Outcome != "ok" {
		t.Fatalf("approval after use: %+v", got)
	}
	// Another argument: its own approval (denied, so that its caller returns before the test ends).
	go func() { errs <- run(s, mcpCall("exec", `{"sandbox_id":"sb-1","command":["touch","y"]}`), &ran) }()
	b := waitPending(t, s)
	if b.ID == a.ID {
		t.Fatal("a different call reused the approval")
	}
	if _, err := s.Decide(t.Context(), b.ID, false, operator, "test over"); err != nil {
		t.Fatal(err)
	}
	if err := <-errs; !errcode.Is(err, errcode.ApprovalRefused) {
		t.Fatalf("the denied call: %v", err)
	}
}

// TestTimeoutUnreachable: nobody decides; progress is reported while waiting; the refusal says
// unreachable and not retryable, and the approval is expired.
func TestTimeoutUnreachable(t *testing.T) {
	t.Parallel()
	s, _ := newService(t, approval.Config{Required: true, Timeout: 1500 * time.Millisecond, ProgressEvery: 300 * time.Millisecond})
	var mu sync.Mutex
	var progress []string
	c := mcpCall("exec", `{"sandbox_id":"sb-1","command":["true"]}`)
	c.Progress = func(m string) { mu.Lock(); progress = append(progress, m); mu.Unlock() }
	start := time.Now()
	var ran atomic.Int32
	err := run(s, c, &ran)
	e, ok := errcode.As(err)
	if !ok || e.Code != errcode.ApprovalRefused || e.Details["unreachable"] != true || e.Details["retryable"] != false || ran.Load() != 0 {
		t.Fatalf("unanswered: %v", err)
	}
	if d := time.Since(start); d < 1400*time.Millisecond || d > 5*time.Second {
		t.Fatalf("returned after %v", d)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(progress) < 3 || !strings.Contains(progress[0], "agentbox approvals approve ap-") {
		t.Fatalf("progress %q", progress)
	}
	a, _ := s.Get(t.Context(), e.Details["approval_id"].(string))
	if a.State != approval.Expired {
		t.Fatalf("state %s", a.State)
	}
	if _, err := s.Decide(t.Context(), a.ID, true, operator, ""); !errcode.Is(err, errcode.Conflict) {
		t.Fatalf("approving an expired approval: %v", err)
	}
}

// TestDenyAndDecideRules: a denial's reason reaches the caller; deciding needs an admin
// caller; a reason is bounded; unknown ids are APPROVAL_NOT_FOUND.
func TestDenyAndDecideRules(t *testing.T) {
	t.Parallel()
	s, _ := newService(t, approval.Config{Required: true, Timeout: 10 * time.Second})
	done := make(chan error, 1)
	var ran atomic.Int32
	go func() { done <- run(s, mcpCall("sandbox_destroy", `{"sandbox_id":"sb-1"}`), &ran) }()
	a := waitPending(t, s)
	if _, err := s.Decide(t.Context(), a.ID, true, gate.Caller{ID: "k1", Name: "ci", Scope: "operate"}, ""); !errcode.Is(err, errcode.PermissionDenied) {
		t.Fatalf("non-admin approve: %v", err)
	}
	if _, err := s.Decide(t.Context(), a.ID, false, operator, strings.Repeat("x", 1025)); !errcode.Is(err, errcode.InvalidArgument) {
		t.Fatalf("long reason: %v", err)
	}
	if _, err := s.Decide(t.Context(), "ap-000000000000", false, operator, ""); !errcode.Is(err, errcode.ApprovalNotFound) {
		t.Fatalf("unknown id: %v", err)
	}
	if _, err := s.Decide(t.Context(), a.ID, false, operator, "too risky"); err != nil {
		t.Fatal(err)
	}
	err := <-done
	if e, ok := errcode.As(err); !ok || e.Code != errcode.ApprovalRefused || !strings.Contains(e.Message, "too risky") || e.Details["reason"] != "too risky" || ran.Load() != 0 {
		t.Fatalf("denied: %v", err)
	}
	if errcode.HTTPStatus(errcode.ApprovalRefused) != 403 {
		t.Fatal("APPROVAL_REFUSED is 403")
	}
}

// TestElicitation: with Elicit on, the client's answer decides; off, the client is never asked.
func TestElicitation(t *testing.T) {
	t.Parallel()
	for _, on := range []bool{true, false} {
		s, _ := newService(t, approval.Config{Required: true, Timeout: 1500 * time.Millisecond, Elicit: on})
		var asked atomic.Int32
		c := mcpCall("exec", `{"sandbox_id":"sb-1","command":["true"]}`)
		c.Elicit = func(ctx context.Context, msg string) (bool, string, error) { asked.Add(1); return false, "", nil }
		var ran atomic.Int32
		err := run(s, c, &ran)
		e, _ := errcode.As(err)
		if on && (e == nil || e.Code != errcode.ApprovalRefused || e.Details["unreachable"] == true || !strings.Contains(e.Message, "declined in the MCP client")) {
			t.Fatalf("elicit on, declined: %v", err)
		}
		if !on && (e == nil || e.Details["unreachable"] != true || asked.Load() != 0) {
			t.Fatalf("elicit off: asked %d, %v", asked.Load(), err)
		}
	}
}

// TestAbandonedCallKeepsApproval: a caller that goes away leaves its approval pending; its
// retry joins it and runs once approved.
func TestAbandonedCallKeepsApproval(t *testing.T) {
	t.Parallel()
	s, _ := newService(t, approval.Config{Required: true, Timeout: 10 * time.Second})
	ctx, cancel := context.WithCancel(t.Context())
	c := mcpCall("exec", `{"sandbox_id":"sb-1","command":["true"]}`)
	done := make(chan error, 1)
	go func() { _, err := s.Enter(ctx, c); done <- err }()
	a := waitPending(t, s)
	cancel()
	if err := <-done; !errcode.Is(err, errcode.ApprovalRefused) {
		t.Fatalf("abandoned: %v", err)
	}
	if _, err := s.Decide(t.Context(), a.ID, true, operator, ""); err != nil {
		t.Fatal(err)
	}
	var ran atomic.Int32
	if err := run(s, mcpCall("exec", `{"command":["true"],"sandbox_id":"sb-1"}`), &ran); err != nil || ran.Load() != 1 {
		t.Fatalf("retry of the approved call: %v", err)
	}
	// A REST call whose body is not in the digest never joins another's approval.
	rest := func() *gate.Call {
		return &gate.Call{Surface: gate.SurfaceREST, Tool: "PUT /v1/sandboxes/{id}/files", Action: "file_write", Caller: agent,
			Args: json.RawMessage(`{"method":"PUT","path":"/v1/sandboxes/sb-1/files","query":{"path":["/a"]},"body_bytes":3}`)}
	}
	ctx2, cancel2 := context.WithCancel(t.Context())
	go s.Enter(ctx2, rest())
	b := waitPending(t, s)
	cancel2()
	s.Decide(t.Context(), b.ID, true, operator, "")
	ctx3, cancel3 := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel3()
	if _, err := s.Enter(ctx3, rest()); err == nil {
		t.Fatal("a streamed-body REST call used another request's approval")
	}
	if got, _ := s.Get(t.Context(), b.ID); got.State != approval.Approved || !got.Bound {
		t.Fatalf("bound approval %+v", got)
	}
}

// TestAuditRecordsTheApproval: with the audit gate outside the approvals gate (as the server
// chains them), the audit record of an approved call names its approval, and so does a denied one.
func TestAuditRecordsTheApproval(t *testing.T) {
	t.Parallel()
	s, st := newService(t, approval.Config{Required: true, Timeout: 10 * time.Second})
	rec := audit.New(st, audit.Config{}, nil)
	defer rec.Close()
	chain := gate.Chain{rec, s}
	enter := func(c *gate.Call) error {
		exit, err := chain.Enter(context.Background(), c)
		if err == nil {
			exit(nil)
		}
		return err
	}
	done := make(chan error, 2)
	go func() { done <- enter(mcpCall("exec", `{"sandbox_id":"sb-1","command":["true"]}`)) }()
	ok := waitPending(t, s)
	if _, err := s.Decide(t.Context(), ok.ID, true, operator, ""); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("approved call: %v", err)
	}
	go func() { done <- enter(mcpCall("exec", `{"sandbox_id":"sb-1","command":["false"]}`)) }()
	no := waitPending(t, s)
	if _, err := s.Decide(t.Context(), no.ID, false, operator, "not that"); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errcode.Is(err, errcode.ApprovalRefused) {
		t.Fatalf("denied call: %v", err)
	}
	if err := rec.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	recs, _, err := st.ListAudit(t.Context(), audit.Filter{Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, r := range recs {
		got[r.ApprovalID] = r.Outcome
	}
	if len(recs) != 2 || got[ok.ID] != "ok" || got[no.ID] != string(errcode.ApprovalRefused) {
		t.Fatalf("audit records %+v, want %s ok and %s refused", recs, ok.ID, no.ID)
	}
}

// TestElicitedDecisionIsAudited: a decision made through elicitation — inside the gated call,
// by no call of its own — is an audit record like an operator's approve, naming the approval,
// the decider and what was decided; it is written before the gated call goes on.
func TestElicitedDecisionIsAudited(t *testing.T) {
	t.Parallel()
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "agentbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	rec := audit.New(st, audit.Config{}, nil)
	defer rec.Close()
	s, err := approval.New(st, approval.Config{Required: true, Timeout: 10 * time.Second, Elicit: true, Audit: rec})
	if err != nil {
		t.Fatal(err)
	}
	c := mcpCall("exec", `{"sandbox_id":"sb-1","command":["true"]}`)
	c.Elicit = func(ctx context.Context, msg string) (bool, string, error) { return true, "", nil }
	exit, err := gate.Chain{rec, s}.Enter(t.Context(), c)
	if err != nil {
		t.Fatalf("elicited approve: %v", err)
	}
	recs, _, err := st.ListAudit(t.Context(), audit.Filter{Tool: approval.ElicitedDecision, Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 || recs[0].ApprovalID != c.ApprovalID || recs[0].Outcome != "ok" ||
		!strings.HasPrefix(recs[0].CallerName, "elicitation:") || !strings.Contains(string(recs[0].Summary), `"approve":true`) {
		t.Fatalf("the elicited decision's audit records (before the call ran): %+v", recs)
	}
	exit(nil)
}
