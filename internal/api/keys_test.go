package api_test

import (
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentbox/agentbox/internal/api"
	"github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/auth"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/gate"
	"github.com/agentbox/agentbox/internal/mcpserver"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/sandbox/jobs"
	"github.com/agentbox/agentbox/internal/store/sqlite"
	"github.com/agentbox/agentbox/internal/wire"
)

type testClock struct {
	mu sync.Mutex
	d  time.Duration
}

func (c *testClock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return time.Now().Add(c.d) }

// keyServer is the REST server (fake runtime) with API keys, the scope gate and /mcp.
func keyServer(t *testing.T) (*imageServer, *testClock) {
	t.Helper()
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "keys.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	clk := &testClock{}
	ks := auth.NewKeys(st, nil).WithClock(clk.now)
	chain := gate.Chain{auth.ScopeGate{}}
	// The MCP server over the same control plane is made after it: mount it through a handler
	// that waits for it.
	var mcpH http.Handler
	var once sync.Once
	ready := make(chan struct{})
	mount := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-ready; mcpH.ServeHTTP(w, r) })
	s := newImageServer(t, api.Options{Keys: ks, Gate: chain, Mount: map[string]http.Handler{"/mcp": mount}})
	srv := mcpserver.New(jobs.With(s.svc), mcpserver.Options{Gate: chain})
	t.Cleanup(srv.Close)
	mcpH = srv.StreamableHTTPHandler(mcpserver.HTTPOptions{})
	once.Do(func() { close(ready) })
	return s, clk
}

func mustKey(t *testing.T, admin *client.Client, name, scope, ttl string) wire.CreatedKey {
	t.Helper()
	k, err := admin.CreateKey(t.Context(), wire.KeyCreateRequest{Name: name, Scope: scope, TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func denied(t *testing.T, what string, err error, need string) {
	t.Helper()
	e, ok := errcode.As(err)
	if !ok || e.Code != errcode.PermissionDenied || e.Details["required_scope"] != need {
		t.Fatalf("%s: %v, want PERMISSION_DENIED needing %s", what, err, need)
	}
}

// TestScopeBoundaries: a read key lists but cannot create, exec or manage keys; an operate
// key creates and execs (owning what it creates) but cannot manage keys; the server token and
// an admin key can; X-Api-Key works as Bearer does; revocation and expiry refuse at once; the
// same boundaries hold for MCP tools over HTTP.
func TestScopeBoundaries(t *testing.T) {
	s, clk := keyServer(t)
	ctx := t.Context()
	admin := s.c // the server's token
	rk := mustKey(t, admin, "reader", auth.ScopeRead, "")
	ok := mustKey(t, admin, "worker", auth.ScopeOperate, "2h")
	ak := mustKey(t, admin, "boss", auth.ScopeAdmin, "")
	reader, worker, boss := client.New(s.url, rk.Secret), client.New(s.url, ok.Secret), client.New(s.url, ak.Secret)

	// operate: create and exec; the sandbox is the key's.
	sb, err := worker.Create(ctx, wire.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := s.svc.Get(ctx, sb.ID); got.Owner != "key:"+ok.Key.ID {
		t.Fatalf("owner %q, want key:%s", got.Owner, ok.Key.ID)
	}
	if _, err := worker.Exec(ctx, sb.ID, wire.ExecRequest{Command: []string{"true"}}, nil); err != nil {
		t.Fatalf("operate exec: %v", err)
	}
	_, err = worker.CreateKey(ctx, wire.KeyCreateRequest{Name: "x"})
	denied(t, "operate creates a key", err, auth.ScopeAdmin)
	_, err = worker.ListKeys(ctx)
	denied(t, "operate lists keys", err, auth.ScopeAdmin)
	_, err = worker.RevokeKey(ctx, "reader")
	denied(t, "operate revokes a key", err, auth.ScopeAdmin)

	// read: gets and lists; no create, exec, destroy, write or keys. Lists show the caller's
	// principal's sandboxes (the reader has none), an admin key's every one.
	if l, err := reader.List(ctx, nil, nil); err != nil || len(l) != 0 {
		t.Fatalf("read lists: %v %v, want none of another key's", l, err)
	}
	if l, err := boss.List(ctx, nil, nil); err != nil || len(l) != 1 {
		t.Fatalf("admin key lists: %v %v, want every key's", l, err)
	}
	if _, err := reader.Get(ctx, sb.ID); err != nil {
		t.Fatalf("read gets: %v", err)
	}
	_, err = reader.Create(ctx, wire.CreateRequest{})
	denied(t, "read creates", err, auth.ScopeOperate)
	_, err = reader.Exec(ctx, sb.ID, wire.ExecRequest{Command: []string{"true"}}, nil)
	denied(t, "read execs", err, auth.ScopeOperate)
	_, err = reader.Destroy(ctx, sb.ID)
	denied(t, "read destroys", err, auth.ScopeOperate)
	_, err = reader.CreateKey(ctx, wire.KeyCreateRequest{Name: "x"})
	denied(t, "read creates a key", err, auth.ScopeAdmin)
	if n, _ := s.svc.List(ctx, sandbox.ListFilter{}); len(n) != 1 {
		t.Fatalf("refused calls acted: %d sandboxes", len(n))
	}

	// admin: keys.
	if l, err := boss.ListKeys(ctx); err != nil || len(l) != 3 {
		t.Fatalf("admin lists keys: %v %v", l, err)
	}

	// X-Api-Key.
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.url+"/v1/sandboxes", nil)
	req.Header.Set("X-Api-Key", rk.Secret)
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("X-Api-Key: %v %v", resp.Status, err)
	}
	resp.Body.Close()
	req, _ = http.NewRequestWithContext(ctx, http.MethodPost, s.url+"/v1/sandboxes", strings.NewReader("{}"))
	req.Header.Set("X-Api-Key", rk.Secret)
	req.Header.Set("Content-Type", "application/json")
	resp, err = http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != http.StatusForbidden {
		t.Fatalf("X-Api-Key read create: %v %v", resp.Status, err)
	}
	resp.Body.Close()

	// MCP over HTTP: the key's scope holds for tools.
	mcpCall := func(key, tool string, args map[string]any) *mcp.CallToolResult {
		t.Helper()
		hc := &http.Client{Transport: headerRT{key}}
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "t", Version: "1"}, nil).Connect(ctx, &mcp.StreamableClientTransport{Endpoint: s.url + "/mcp", HTTPClient: hc}, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer cs.Close()
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	if res := mcpCall(rk.Secret, "sandbox_list", map[string]any{}); res.IsError {
		t.Fatalf("read sandbox_list over MCP: %+v", res.Content)
	}
	res := mcpCall(rk.Secret, "exec", map[string]any{"sandbox_id": sb.ID, "command": []string{"true"}})
	if txt := res.Content[0].(*mcp.TextContent).Text; !res.IsError || !strings.Contains(txt, "PERMISSION_DENIED") {
		t.Fatalf("read exec over MCP: %v %s", res.IsError, txt)
	}
	if res := mcpCall(ok.Secret, "exec", map[string]any{"sandbox_id": sb.ID, "command": []string{"true"}}); res.IsError {
		t.Fatalf("operate exec over MCP: %+v", res.Content)
	}

	// Revocation takes effect at the next request.
	if _, err := admin.RevokeKey(ctx, "reader"); err != nil {
		t.Fatal(err)
	}
	if _, err := reader.List(ctx, nil, nil); !errcode.Is(err, errcode.AuthFailed) || !strings.Contains(err.Error(), "revoked") {
		t.Fatalf("revoked key: %v", err)
	}
	// Expiry likewise (worker expires in 2h).
	clk.mu.Lock()
	clk.d = 2*time.Hour + time.Second
	clk.mu.Unlock()
	if _, err := worker.List(ctx, nil, nil); !errcode.Is(err, errcode.AuthFailed) || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("expired key: %v", err)
	}
	// A key-shaped secret nobody issued.
	if _, err := client.New(s.url, "abk_"+strings.Repeat("x", 43)).List(ctx, nil, nil); !errcode.Is(err, errcode.AuthFailed) {
		t.Fatalf("unknown key: %v", err)
	}
	if _, err := s.c.Destroy(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
}

type headerRT struct{ key string }

func (h headerRT) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("X-Api-Key", h.key)
	return http.DefaultTransport.RoundTrip(r)
}
