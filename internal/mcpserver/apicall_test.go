package mcpserver_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentbox/agentbox/internal/api"
	"github.com/agentbox/agentbox/internal/gate"
	"github.com/agentbox/agentbox/internal/mcpserver"
)

// restGate records the REST calls api_call makes in process.
type restGate struct {
	mu    sync.Mutex
	calls []gate.Call
}

func (g *restGate) Enter(_ context.Context, c *gate.Call) (func(error), error) {
	g.mu.Lock()
	g.calls = append(g.calls, *c)
	g.mu.Unlock()
	return func(error) {}, nil
}

func (g *restGate) seen() []gate.Call {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.calls)
}

// TestAPICall: api_call sends allowed requests through the REST API in process (through its
// gate, as the tool's caller), refuses what the OpenAPI document does not list before anything
// is sent, returns REST errors as typed errors and bounds the reply.
func TestAPICall(t *testing.T) {
	svc := fakeService(t)
	rg := &restGate{}
	h := api.New(svc.Service, api.Options{SandboxJobs: svc.Jobs(), Gate: gate.Chain{rg}})
	defer h.Close()
	tg := &toolGate{}
	srv := mcpserver.New(svc, mcpserver.Options{APICall: h.Call, Gate: gate.Chain{tg}})
	defer srv.Close()
	c := connect(t, srv, "2025-11-25")

	// An allowed GET.
	var out mcpserver.APICallOut
	c.ok("api_call", map[string]any{"method": "GET", "path": "/v1/capacity"}, &out)
	body, _ := out.Body.(map[string]any)
	if out.Status != 200 || out.Route != "GET /v1/capacity" || out.BodyEncoding != "json" || body == nil || body["max_sandboxes"] == nil ||
		!strings.HasPrefix(out.Headers["Content-Type"], "application/json") || out.Truncated {
		t.Fatalf("capacity: %+v", out)
	}
	calls := rg.seen()
	if len(calls) != 1 || calls[0].Tool != "GET /v1/capacity" || calls[0].Caller.Name != "stdio" || calls[0].Surface != gate.SurfaceREST {
		t.Fatalf("the REST gate saw %+v", calls)
	}
	// An allowed POST with a body, then one with a query.
	c.ok("api_call", map[string]any{"method": "POST", "path": "/v1/sandboxes", "body": map[string]any{"ttl_seconds": 300, "labels": map[string]string{"via": "api_call"}}}, &out)
	sb, _ := out.Body.(map[string]any)
	if out.Status != 201 || sb["state"] != "running" {
		t.Fatalf("create: %+v", out)
	}
	id := sb["sandbox_id"].(string)
	c.ok("api_call", map[string]any{"method": "POST", "path": "/v1/sandboxes/" + id + "/exec", "body": map[string]any{"command": []string{"sh", "-c", "echo hi"}}}, &out)
	res, _ := out.Body.(map[string]any)
	if out.Status != 200 || out.Route != "POST /v1/sandboxes/{id}/exec" || res["stdout"] != "hi\n" || res["exit_code"] != float64(0) {
		t.Fatalf("exec: %+v", out)
	}
	c.ok("api_call", map[string]any{"method": "GET", "path": "/v1/sandboxes", "query": map[string]any{"label": []string{"via=api_call"}, "limit": 5}}, &out)
	if l, _ := out.Body.(map[string]any); out.Status != 200 || l["count"] != float64(1) {
		t.Fatalf("list by label: %+v", out)
	}
	n := len(rg.seen())

	// Outside the document: refused with the list of routes, nothing sent.
	msg := c.fails("api_call", map[string]any{"method": "GET", "path": "/v1/secrets"}, "INVALID_ARGUMENT")
	if !strings.Contains(msg, "GET /v1/sandboxes/{id}") || !strings.Contains(msg, "POST /v1/sandboxes/{id}/exec") {
		t.Fatalf("the refusal does not list the routes: %.300s", msg)
	}
	res2 := c.call("api_call", map[string]any{"method": "GET", "path": "/v1/secrets"})
	var e struct {
		Error mcpserver.ToolError `json:"error"`
	}
	decode(t, res2, &e)
	if allowed, _ := e.Error.Details["allowed"].([]any); !slices.Contains(allowed, any("GET /v1/capacity")) || len(allowed) < 55 {
		t.Fatalf("details.allowed: %v", e.Error.Details)
	}
	// Path traversal and malformed paths.
	for _, p := range []string{"/v1/sandboxes/../capacity", "/v1/sandboxes/" + id + "/../../capacity", "/v1/sandboxes/%2e%2e", "/v1/sandboxes/a%2fb/exec",
		"/v1//capacity", "/v1/capacity/", "v1/capacity", "/v1/capacity?x=1", "/v1/sandboxes/./" + id} {
		c.fails("api_call", map[string]any{"method": "GET", "path": p}, "INVALID_ARGUMENT")
	}
	// A method the path does not take.
	if msg := c.fails("api_call", map[string]any{"method": "DELETE", "path": "/v1/capacity"}, "INVALID_ARGUMENT"); !strings.Contains(msg, "takes GET") {
		t.Fatalf("method mismatch: %s", msg)
	}
	c.fails("api_call", map[string]any{"method": "CONNECT", "path": "/v1/capacity"}, "INVALID_ARGUMENT")
	if got := len(rg.seen()); got != n {
		t.Fatalf("refused calls reached the REST API: %d calls, want %d", got, n)
	}
	// A REST error is the tool's typed error, with the status.
	c.fails("api_call", map[string]any{"method": "GET", "path": "/v1/sandboxes/sb-000000000000"}, "SANDBOX_NOT_FOUND")

	// The reply is bounded: a 3 MiB file comes back cut at 1 MiB, and says so.
	big := bytes.Repeat([]byte{0, 1, 2, 3, 0xff, 0xfe, 'a', '\n'}, 3<<17)
	if _, err := svc.WriteFile(t.Context(), id, "big.bin", 0o644, bytes.NewReader(big)); err != nil {
		t.Fatal(err)
	}
	c.ok("api_call", map[string]any{"method": "GET", "path": "/v1/sandboxes/" + id + "/files", "query": map[string]any{"path": "big.bin"}}, &out)
	raw, err := base64.StdEncoding.DecodeString(out.Body.(string))
	if err != nil || out.Status != 200 || !out.Truncated || out.Bytes != mcpserver.MaxAPICallReply || out.BodyEncoding != "base64" || !bytes.Equal(raw, big[:mcpserver.MaxAPICallReply]) {
		t.Fatalf("big file: status %d truncated %v bytes %d encoding %s err %v", out.Status, out.Truncated, out.Bytes, out.BodyEncoding, err)
	}
	// The tool itself passed the MCP gate every time.
	tg.mu.Lock()
	nt := len(tg.calls)
	tg.mu.Unlock()
	if nt < 10 {
		t.Fatalf("the tool gate saw %d api_call calls", nt)
	}

	c.ok("api_call", map[string]any{"method": "DELETE", "path": "/v1/sandboxes/" + id}, &out)
	if out.Status != 200 {
		t.Fatalf("destroy: %+v", out)
	}
}

// bearer adds the token to every request.
type bearer struct{ tok string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.tok)
	return http.DefaultTransport.RoundTrip(r)
}

// TestAPICallCarriesTheHTTPCaller: through agentbox serve's wiring (MCP mounted in the REST
// handler, api_call calling that handler in process), the inner REST request runs as the
// identity the HTTP request carried, not as a stdio session.
func TestAPICallCarriesTheHTTPCaller(t *testing.T) {
	svc := fakeService(t)
	rg := &restGate{}
	var h *api.Server
	srv := mcpserver.New(svc, mcpserver.Options{APICall: func(ctx context.Context, method, path string, q url.Values, body []byte) (int, http.Header, []byte, error) {
		return h.Call(ctx, method, path, q, body)
	}})
	h = api.New(svc.Service, api.Options{SandboxJobs: svc.Jobs(), Token: "serve-token", Gate: gate.Chain{rg}, Mount: map[string]http.Handler{"/mcp": srv.StreamableHTTPHandler(mcpserver.HTTPOptions{})}})
	hs := httptest.NewServer(h)
	// After the client's session closes (cleanups run last first): the MCP server's streams
	// end, then the HTTP server.
	t.Cleanup(func() { srv.Close(); hs.Close(); h.Close() })
	c := connectOver(t, &mcp.StreamableClientTransport{Endpoint: hs.URL + "/mcp", HTTPClient: &http.Client{Transport: bearer{"serve-token"}}}, "2025-11-25")
	var out mcpserver.APICallOut
	c.ok("api_call", map[string]any{"method": "GET", "path": "/v1/runtimes"}, &out)
	if out.Status != 200 {
		t.Fatalf("runtimes: %+v", out)
	}
	calls := rg.seen()
	if len(calls) != 1 || calls[0].Tool != "GET /v1/runtimes" || calls[0].Caller.Name != "token" || calls[0].Caller.ID != api.TokenOwner("serve-token") {
		t.Fatalf("the REST gate saw %+v", calls)
	}
}

// TestAPICallWithoutAPI: a server without the REST API answers UNSUPPORTED_OPERATION (after
// the route check).
func TestAPICallWithoutAPI(t *testing.T) {
	srv := mcpserver.New(nil, mcpserver.Options{})
	defer srv.Close()
	c := connect(t, srv, "2025-11-25")
	c.fails("api_call", map[string]any{"method": "GET", "path": "/v1/capacity"}, "UNSUPPORTED_OPERATION")
	c.fails("api_call", map[string]any{"method": "GET", "path": "/v1/nope"}, "INVALID_ARGUMENT")
}
