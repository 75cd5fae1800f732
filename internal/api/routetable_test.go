package api_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/api"
	"github.com/agentbox/agentbox/internal/approval"
	"github.com/agentbox/agentbox/internal/auth"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/gate"
	"github.com/agentbox/agentbox/internal/openapi"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/store/sqlite"
)

var objectKinds = map[string]bool{gate.ObjectNone: true, gate.ObjectSandbox: true, gate.ObjectJob: true, gate.ObjectExpose: true,
	gate.ObjectRun: true, gate.ObjectBatch: true, gate.ObjectSnapshot: true, gate.ObjectApproval: true, gate.ObjectKey: true,
	gate.ObjectMachine: true, gate.ObjectPool: true, gate.ObjectBlob: true, gate.ObjectImage: true, gate.ObjectConversation: true}

// TestEveryRouteDeclared: every route the server registers, and every operation of the
// OpenAPI document, has a declaration in the route table — an action, a scope and the kind of
// object its path names — and every declaration is a route (none stale). A route whose path
// names a sandbox, run, batch, job or snapshot declares that object, so the authorization gate
// resolves it to its principal.
func TestEveryRouteDeclared(t *testing.T) {
	h := fullServer(t)
	table := api.RouteTable()
	routes := append(h.Routes(), "/v1/") // with the catch-all answering unknown paths
	e2bRoutes := h.E2BRoutes()           // and the E2B-compatible API's
	if len(e2bRoutes) < 30 {
		t.Fatalf("only %d E2B routes: %v", len(e2bRoutes), e2bRoutes)
	}
	for _, p := range e2bRoutes {
		if rt := table[p]; !rt.E2B || rt.Action == "" {
			t.Errorf("E2B route %q: declaration %+v is not marked E2B or has no action", p, rt)
		}
		if strings.Contains(p, "{id}") && table[p].Object != gate.ObjectSandbox {
			t.Errorf("E2B route %q names a sandbox but declares object %q", p, table[p].Object)
		}
	}
	routes = append(routes, e2bRoutes...)
	if len(routes) < 60 {
		t.Fatalf("only %d routes: %v", len(routes), routes)
	}
	registered := map[string]bool{}
	for _, p := range routes {
		registered[p] = true
		rt, ok := table[p]
		if !ok {
			t.Errorf("route %q has no declaration in the route table (internal/api/routetable.go)", p)
			continue
		}
		if rt.Action == "" || (!auth.ValidScope(rt.Scope) && rt.Scope != auth.Public) || !objectKinds[rt.Object] {
			t.Errorf("route %q: declaration %+v needs an action, a scope (read, operate, admin or public) and an object kind", p, rt)
		}
		_, path, _ := strings.Cut(p, " ")
		if path == "" {
			path = p
		}
		for prefix, kind := range map[string]string{"/v1/sandboxes/{id}": gate.ObjectSandbox, "/v1/runs/{id}": gate.ObjectRun,
			"/v1/batches/{id}": gate.ObjectBatch, "/v1/snapshots/{snapshot_id}": gate.ObjectSnapshot} {
			if strings.HasPrefix(path, prefix) && rt.Object != kind && !(kind == gate.ObjectSandbox && (rt.Object == gate.ObjectJob || rt.Object == gate.ObjectExpose)) {
				t.Errorf("route %q names a %s but declares object %q", p, kind, rt.Object)
			}
		}
		if rt.Scope == auth.ScopeRead && !rt.ReadOnly {
			t.Errorf("route %q: scope read but not read-only", p)
		}
	}
	for p := range table {
		if !registered[p] {
			t.Errorf("the route table declares %q, which is no route", p)
		}
	}
	// The OpenAPI document: each operation is a declared route.
	for _, op := range openapi.Routes() {
		if declaredFor(table, op.Method, op.Path) == "" {
			t.Errorf("OpenAPI operation %s has no declared route", op)
		}
	}
	// The terminal and the exec stream are actions (approvals and --approval-tools exec see
	// them), never reads.
	for _, p := range []string{"GET /v1/sandboxes/{id}/pty", "POST /v1/sandboxes/{id}/exec"} {
		if rt := table[p]; rt.ReadOnly || rt.Action != "exec" || rt.Scope != auth.ScopeOperate {
			t.Errorf("%s: %+v, want the exec action, operate, not read-only", p, rt)
		}
	}
}

// declaredFor returns the declared pattern serving method and an OpenAPI path template.
func declaredFor(table map[string]api.Route, method, path string) string {
	segs := strings.Split(path, "/")
	for p := range table {
		m, pp, ok := strings.Cut(p, " ")
		if !ok {
			m, pp = "", p
		}
		if m != "" && m != method {
			continue
		}
		ps := strings.Split(pp, "/")
		if len(ps) != len(segs) {
			continue
		}
		match := true
		for i := range ps {
			wild := strings.HasPrefix(ps[i], "{") && strings.HasPrefix(segs[i], "{")
			if ps[i] != segs[i] && !wild {
				match = false
				break
			}
		}
		if match {
			return p
		}
	}
	return ""
}

// approvalServer is the REST server with API keys, the scope gate and approvals required for
// every call that acts (serve --approval-required).
func approvalServer(t *testing.T, cfg approval.Config) (*imageServer, *approval.Service) {
	t.Helper()
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "approvals.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ap, err := approval.New(st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	s := newImageServer(t, api.Options{Keys: auth.NewKeys(st, nil), Gate: gate.Chain{auth.ScopeGate{}, ap}})
	return s, ap
}

// pending waits for the one pending approval and returns it.
func pending(t *testing.T, ap *approval.Service) approval.Approval {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		l, err := ap.List(t.Context(), approval.Filter{State: approval.Pending})
		if err != nil {
			t.Fatal(err)
		}
		if len(l) == 1 {
			return l[0]
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatal("no approval became pending")
	return approval.Approval{}
}

// TestTerminalNeedsApproval: under --approval-required the terminal (a GET that upgrades to a
// WebSocket) waits for an approval like exec does; denied, no terminal opens. With
// --approval-tools exec the terminal is gated too.
func TestTerminalNeedsApproval(t *testing.T) {
	for _, cfg := range []approval.Config{{Required: true}, {Tools: []string{"exec"}}} {
		s, ap := approvalServer(t, cfg)
		sb, err := s.svc.Create(sandbox.WithOwner(t.Context(), api.TokenOwner(testToken)), sandbox.CreateRequest{})
		if err != nil {
			t.Fatal(err)
		}
		type reply struct {
			status int
			body   string
		}
		done := make(chan reply, 1)
		go func() {
			req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, s.url+"/v1/sandboxes/"+sb.ID+"/pty?user=root", nil)
			req.Header.Set("Authorization", "Bearer "+testToken)
			req.Header.Set("Connection", "Upgrade")
			req.Header.Set("Upgrade", "websocket")
			req.Header.Set("Sec-WebSocket-Version", "13")
			req.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				done <- reply{status: -1, body: err.Error()}
				return
			}
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			resp.Body.Close()
			done <- reply{resp.StatusCode, string(b)}
		}()
		a := pending(t, ap)
		if a.Action != "exec" || !strings.Contains(string(a.Summary), "/pty") {
			t.Errorf("%+v: approval %+v, want the exec action on the terminal's path", cfg, a)
		}
		select {
		case r := <-done:
			t.Fatalf("%+v: the terminal answered %d %s before any decision", cfg, r.status, r.body)
		default:
		}
		if _, err := ap.Decide(t.Context(), a.ID, false, gate.Caller{ID: "op", Name: "op", Scope: auth.ScopeAdmin}, "no"); err != nil {
			t.Fatal(err)
		}
		r := <-done
		if r.status == http.StatusSwitchingProtocols || r.status < 400 || !strings.Contains(r.body, "APPROVAL_REFUSED") {
			t.Fatalf("%+v: denied terminal answered %d %s", cfg, r.status, r.body)
		}
	}
}

// TestGatedBodyShownWhateverItsType: the gate shows the approver the body the handler will
// parse, whatever its Content-Type: a JSON body sent as text/plain is shown whole (and its
// approval's digest covers it); a body that is not JSON on a JSON route is refused before the
// chain (nobody is asked to approve what they cannot see), and nothing runs.
func TestGatedBodyShownWhateverItsType(t *testing.T) {
	g := &gateLog{}
	s := newImageServer(t, api.Options{Gate: gate.Chain{g}})
	code := `{"code":"echo hidden-payload","sandbox_id":"sb-000000000001"}`
	resp := s.post(t, "/v1/run_shell", "", "text/plain", []byte(code))
	resp.Body.Close()
	g.mu.Lock()
	var shown []gate.Call
	shown = append(shown, g.calls...)
	g.mu.Unlock()
	if len(shown) != 1 {
		t.Fatalf("%d calls entered, want 1", len(shown))
	}
	var args struct {
		Body      json.RawMessage `json:"body"`
		BodyBytes *int64          `json:"body_bytes"`
	}
	if err := json.Unmarshal(shown[0].Args, &args); err != nil || !bytes.Equal(args.Body, []byte(code)) || args.BodyBytes != nil {
		t.Fatalf("the gate was shown %s, want the body %s", shown[0].Args, code)
	}
	if shown[0].SandboxID != "sb-000000000001" || shown[0].Action != "run_shell" {
		t.Fatalf("call %+v", shown[0])
	}
	// Not JSON: refused before the chain, with a typed error; the audit observer hears of it.
	for _, ctype := range []string{"text/plain", "application/octet-stream", "application/json"} {
		resp := s.post(t, "/v1/run_shell", "", ctype, []byte("code=echo hidden"))
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), string(errcode.InvalidArgument)) {
			t.Fatalf("%s body that is not JSON: %d %s", ctype, resp.StatusCode, b)
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.calls) != 1 || len(g.observed) != 3 {
		t.Fatalf("entered %d, observed %d; want the refusals observed and never entered", len(g.calls), len(g.observed))
	}
}

// TestStreamedBodyDigest: a streamed upload held for approval is shown by its length and
// SHA-256, and the handler writes exactly those bytes once approved.
func TestStreamedBodyDigest(t *testing.T) {
	s, ap := approvalServer(t, approval.Config{Tools: []string{"file_write"}})
	sb, err := s.svc.Create(sandbox.WithOwner(t.Context(), api.TokenOwner(testToken)), sandbox.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	content := []byte("the bytes the approver saw\n")
	done := make(chan error, 1)
	go func() {
		_, err := s.c.WriteFile(t.Context(), sb.ID, "/tmp/f", 0o644, bytes.NewReader(content))
		done <- err
	}()
	a := pending(t, ap)
	sum := sha256.Sum256(content)
	if !strings.Contains(string(a.Summary), `"body_bytes":27`) || !strings.Contains(string(a.Summary), hex.EncodeToString(sum[:])) || strings.Contains(string(a.Summary), "approver saw") {
		t.Fatalf("approval summary %s: want the length and SHA-256, never the content", a.Summary)
	}
	if _, err := ap.Decide(t.Context(), a.ID, true, gate.Caller{ID: "op", Name: "op", Scope: auth.ScopeAdmin}, ""); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	rc, _, err := s.svc.ReadFile(t.Context(), sb.ID, "/tmp/f", 0, 1<<20, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || !bytes.Equal(got, content) {
		t.Fatalf("written %q %v, want %q", got, err, content)
	}
}

// TestFleetWideReadsAreAdmin: the routes whose replies name every principal's objects — the
// audit log, SQL — need an admin key; a key's own fleet view is GET /v1/fleet/metrics, and its
// Prometheus scrape GET /metrics, both filtered to its sandboxes (TestMetricsAcrossPrincipals).
func TestFleetWideReadsAreAdmin(t *testing.T) {
	table := api.RouteTable()
	for _, p := range []string{"GET /v1/audit", "POST /v1/sql"} {
		if got := table[p].Scope; got != auth.ScopeAdmin {
			t.Errorf("%s needs scope %q, want admin", p, got)
		}
	}
}
