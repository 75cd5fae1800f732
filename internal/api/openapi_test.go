package api_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/jsonschema-go/jsonschema"

	"github.com/agentbox/agentbox/internal/api"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/gate"
	"github.com/agentbox/agentbox/internal/image"
	"github.com/agentbox/agentbox/internal/openapi"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/testenv/fakecp"
)

// fullServer is the REST handler with every optional route on (Prometheus, a mount).
func fullServer(t *testing.T, g ...gate.Gate) *api.Server {
	t.Helper()
	svc := fakecp.Service(t)
	h := api.New(svc, api.Options{Token: testToken, Prometheus: api.NewPrometheus(), Mount: map[string]http.Handler{"/mcp": http.NotFoundHandler()}, Gate: g})
	t.Cleanup(func() {
		h.Close()
	})
	return h
}

var anyMethod = regexp.MustCompile(`\{([a-z_]+)\.\.\.\}`)

// TestOpenAPIRoutes: every route the server serves is in the document, and every operation of
// the document is served.
func TestOpenAPIRoutes(t *testing.T) {
	h := fullServer(t)
	served := map[string]bool{}
	for _, p := range h.Routes() {
		method, path, ok := strings.Cut(p, " ")
		if !ok {
			// A pattern without a method serves them all; the handler answers only GET
			// (runArtifact: 405 otherwise), which is what the document lists.
			method, path = "GET", p
		}
		served[method+" "+anyMethod.ReplaceAllString(path, "{$1}")] = true
	}
	if len(served) < 55 {
		t.Fatalf("only %d routes: %v", len(served), h.Routes())
	}
	for _, p := range h.Routes() {
		if strings.HasPrefix(p, "/mcp") || p == "/v1/" {
			t.Errorf("Routes lists %q (a mount or the catch-all)", p)
		}
	}
	routes, err := openapi.Parse(openapi.Document())
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	for _, r := range routes {
		documented[r.String()] = true
		if !served[r.String()] {
			t.Errorf("the document lists %s, which the server does not serve", r)
		}
	}
	for r := range served {
		if !documented[r] {
			t.Errorf("the server serves %s, which the document does not list: add it to ops() in openapi_gen_test.go and run go generate ./internal/api", r)
		}
	}
	// And the document is what GET /v1/openapi.json serves, behind the token.
	srv := newTestHTTP(t, h)
	if code, _, _ := call(t, "GET", srv+"/v1/openapi.json", "", ""); code != http.StatusUnauthorized {
		t.Fatalf("openapi.json without the token: %d", code)
	}
	code, body, hdr := call(t, "GET", srv+"/v1/openapi.json", testToken, "")
	if code != 200 || body != string(openapi.Document()) || hdr.Get("Content-Type") != "application/json" {
		t.Fatalf("openapi.json: %d %s %.100s", code, hdr.Get("Content-Type"), body)
	}
}

// docValidator validates replies against the document's response schemas.
type docValidator struct {
	doc     map[string]any
	schemas map[string]any
}

func newDocValidator(t *testing.T) *docValidator {
	var d map[string]any
	if err := json.Unmarshal(openapi.Document(), &d); err != nil {
		t.Fatal(err)
	}
	return &docValidator{doc: d, schemas: d["components"].(map[string]any)["schemas"].(map[string]any)}
}

// validate checks body, the reply of method on the document's path p with status, against the
// schema the document gives for that status (else "default"), and returns the decoded body.
func (v *docValidator) validate(t *testing.T, method, p string, status int, body []byte) any {
	t.Helper()
	inst, err := v.check(t, method, p, status, body)
	if err != nil {
		t.Errorf("%s %s %d: the reply does not fit the document: %v\n%.600s", method, p, status, err, body)
	}
	return inst
}

// check is validate's verdict.
func (v *docValidator) check(t *testing.T, method, p string, status int, body []byte) (any, error) {
	t.Helper()
	item, ok := v.doc["paths"].(map[string]any)[p].(map[string]any)
	if !ok {
		t.Fatalf("%s is not a path of the document", p)
	}
	op, ok := item[strings.ToLower(method)].(map[string]any)
	if !ok {
		t.Fatalf("%s %s is not an operation of the document", method, p)
	}
	resps := op["responses"].(map[string]any)
	resp, ok := resps[fmt.Sprint(status)].(map[string]any)
	if !ok {
		if status < 400 {
			t.Fatalf("%s %s answered %d, which the document does not list (%v): %.300s", method, p, status, keys(resps), body)
		}
		resp = resps["default"].(map[string]any)
	}
	content, _ := resp["content"].(map[string]any)
	mt, ok := content["application/json"].(map[string]any)
	if !ok {
		t.Fatalf("%s %s %d: the document has no JSON schema", method, p, status)
	}
	// The component schemas as $defs, the reply's schema at the root.
	root := map[string]any{"$defs": v.schemas}
	for k, val := range mt["schema"].(map[string]any) {
		root[k] = val
	}
	raw, _ := json.Marshal(root)
	raw = bytes.ReplaceAll(raw, []byte(`"#/components/schemas/`), []byte(`"#/$defs/`))
	var s jsonschema.Schema
	if err := json.Unmarshal(raw, &s); err != nil {
		t.Fatal(err)
	}
	rs, err := s.Resolve(nil)
	if err != nil {
		t.Fatalf("resolve the schema of %s %s %d: %v", method, p, status, err)
	}
	var inst any
	if err := json.Unmarshal(body, &inst); err != nil {
		t.Fatalf("%s %s %d: not JSON: %v: %.300s", method, p, status, err, body)
	}
	return inst, rs.Validate(inst)
}

func keys(m map[string]any) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// TestOpenAPIValidatorRejects: the validation above can fail: replies that do not fit their
// route's schema are refused.
func TestOpenAPIValidatorRejects(t *testing.T) {
	v := newDocValidator(t)
	for _, c := range []struct {
		method, p string
		status    int
		body      string
	}{
		{"GET", "/v1/sandboxes/{id}", 200, `{"sandbox_id": "sb-1"}`},                             // required fields missing
		{"GET", "/v1/sandboxes", 200, `{"sandboxes": [], "count": "0"}`},                         // wrong type
		{"GET", "/v1/capacity", 200, `{"error": {"code": "INTERNAL", "message": "x"}}`},          // an error as a success
		{"GET", "/v1/sandboxes/{id}", 404, `{"error": {"code": "SANDBOX_NOT_FOUND"}}`},           // error without message
		{"GET", "/health", 200, `{"status": "ok", "version": "1", "extra": true}`},               // unknown field
		{"GET", "/v1/sandboxes/{id}/jobs/{job_id}/logs", 200, `{"job_id": "j", "data": [1, 2]}`}, // bytes not base64
	} {
		if _, err := v.check(t, c.method, c.p, c.status, []byte(c.body)); err == nil {
			t.Errorf("%s %s %d accepted %s", c.method, c.p, c.status, c.body)
		}
	}
	if _, err := v.check(t, "GET", "/health", 200, []byte(`{"status": "ok", "version": "1"}`)); err != nil {
		t.Fatalf("a good reply refused: %v", err)
	}
}

// TestOpenAPIImageResponses validates the image routes' replies (over the fake image cache).
func TestOpenAPIImageResponses(t *testing.T) {
	s := newImageServer(t, api.Options{})
	v := newDocValidator(t)
	s.cache.AddRemote("python:3.12-slim", image.Config{Env: []string{"A=1"}})
	do := func(method, p, path, body string, want int) any {
		t.Helper()
		code, reply, _ := call(t, method, s.url+path, testToken, body)
		if code != want {
			t.Fatalf("%s %s: %d, want %d: %.400s", method, path, code, want, reply)
		}
		return v.validate(t, method, p, code, []byte(reply))
	}
	do("POST", "/v1/images/pull", "/v1/images/pull", `{"ref": "python:3.12-slim"}`, 200)
	do("GET", "/v1/images", "/v1/images", "", 200)
	do("GET", "/v1/images/inspect", "/v1/images/inspect?ref=python:3.12-slim", "", 200)
	do("GET", "/v1/images/inspect", "/v1/images/inspect?ref=nosuch:1", "", 404)
	sb := do("POST", "/v1/sandboxes", "/v1/sandboxes", `{"image": "python:3.12-slim"}`, 201).(map[string]any)
	do("POST", "/v1/sandboxes/{id}/commit", "/v1/sandboxes/"+sb["sandbox_id"].(string)+"/commit", `{"name": "mine:1"}`, 201)
	do("POST", "/v1/images/prune", "/v1/images/prune", `{}`, 200)
	do("DELETE", "/v1/images", "/v1/images?ref=mine:1", "", 200)
}

// TestOpenAPIResponses makes real calls to a server over the fake runtime (with the run
// service) and validates every reply against the document's schema for its route and status.
func TestOpenAPIResponses(t *testing.T) {
	e := newRunsEnv(t)
	v := newDocValidator(t)
	// do calls method on path (the concrete path) and validates the reply against route p.
	do := func(method, p, path, body string, want int) any {
		t.Helper()
		code, reply, _ := call(t, method, e.srv.URL+path, runsToken, body)
		if code != want {
			t.Fatalf("%s %s: %d, want %d: %.400s", method, path, code, want, reply)
		}
		return v.validate(t, method, p, code, []byte(reply))
	}
	do("GET", "/health", "/health", "", 200)
	do("GET", "/v1/capacity", "/v1/capacity", "", 200)
	do("GET", "/v1/runtimes", "/v1/runtimes", "", 200)
	sb := do("POST", "/v1/sandboxes", "/v1/sandboxes", `{"ttl_seconds": 600, "labels": {"suite": "openapi"}, "env": {"A": "1"}}`, 201).(map[string]any)
	id := sb["sandbox_id"].(string)
	sp := "/v1/sandboxes/" + id
	do("GET", "/v1/sandboxes", "/v1/sandboxes?label=suite=openapi", "", 200)
	do("GET", "/v1/sandboxes/{id}", sp, "", 200)
	do("POST", "/v1/sandboxes/{id}/extend", sp+"/extend", `{"ttl_seconds": 60}`, 200)
	do("POST", "/v1/sandboxes/{id}/exec", sp+"/exec", `{"command": ["sh", "-c", "echo hi; echo err >&2; exit 3"]}`, 200)
	do("POST", "/v1/sandboxes/{id}/files/mkdir", sp+"/files/mkdir", `{"path": "/workspace/d", "parents": true}`, 200)
	code, reply, _ := callBytes(t, "PUT", e.srv.URL+sp+"/files?path=/workspace/d/a.txt", runsToken, "application/octet-stream", []byte("hello"))
	if code != 200 {
		t.Fatalf("write: %d %s", code, reply)
	}
	v.validate(t, "PUT", "/v1/sandboxes/{id}/files", code, reply)
	do("GET", "/v1/sandboxes/{id}/files/stat", sp+"/files/stat?path=/workspace/d/a.txt", "", 200)
	do("GET", "/v1/sandboxes/{id}/files/list", sp+"/files/list?path=/workspace/d", "", 200)
	job := do("POST", "/v1/sandboxes/{id}/jobs", sp+"/jobs", `{"command": ["sh", "-c", "echo job"]}`, 201).(map[string]any)
	jp := sp + "/jobs/" + job["job_id"].(string)
	do("GET", "/v1/sandboxes/{id}/jobs/{job_id}/wait", jp+"/wait?timeout_seconds=30", "", 200)
	do("GET", "/v1/sandboxes/{id}/jobs/{job_id}", jp, "", 200)
	do("GET", "/v1/sandboxes/{id}/jobs/{job_id}/logs", jp+"/logs", "", 200)
	do("GET", "/v1/sandboxes/{id}/jobs", sp+"/jobs", "", 200)
	do("GET", "/v1/sandboxes/{id}/events", sp+"/events", "", 200)
	do("GET", "/v1/events", "/v1/events?limit=5", "", 200)
	do("GET", "/v1/sandboxes/{id}/expose", sp+"/expose", "", 200)
	do("GET", "/v1/fleet/metrics", "/v1/fleet/metrics", "", 200)
	// Errors fit the document's error schema.
	do("GET", "/v1/sandboxes/{id}", "/v1/sandboxes/sb-000000000000", "", 404)
	do("POST", "/v1/sandboxes/{id}/exec", sp+"/exec", `{"command": []}`, 400)
	do("GET", "/v1/images", "/v1/images", "", 501)
	// Runs and batches.
	run := do("POST", "/v1/runs", "/v1/runs", fmt.Sprintf(`{"dir": %q, "command": ["sh", "-c", "echo run"], "wait": true, "wait_seconds": 60}`, filepath.Join(e.work, "r")), 201).(map[string]any)
	rp := "/v1/runs/" + run["run_id"].(string)
	do("GET", "/v1/runs/{id}", rp, "", 200)
	do("GET", "/v1/runs", "/v1/runs", "", 200)
	do("GET", "/v1/runs/{id}/events", rp+"/events", "", 200)
	do("GET", "/v1/runs/{id}/logs", rp+"/logs", "", 200)
	do("GET", "/v1/batches", "/v1/batches", "", 200)
	do("DELETE", "/v1/sandboxes/{id}", sp, "", 200)
}

func newTestHTTP(t *testing.T, h http.Handler) string {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

func callBytes(t *testing.T, method, u, token, ctype string, body []byte) (int, []byte, http.Header) {
	t.Helper()
	req, _ := http.NewRequest(method, u, bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", ctype)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b, resp.Header
}

// TestServerCall: an in-process call runs as the context's caller, through the gate, and
// refuses what the document does not list before anything runs; its reply is bounded.
func TestServerCall(t *testing.T) {
	g := &gateLog{refuse: "sandbox_destroy"}
	h := fullServer(t, g)
	ctx := gate.WithCaller(t.Context(), gate.Caller{ID: "u1", Name: "test", Scope: "admin"})
	status, hdr, body, err := h.Call(ctx, "POST", "/v1/sandboxes", nil, []byte(`{"ttl_seconds": 60}`))
	if err != nil || status != 201 || !strings.HasPrefix(hdr.Get("Content-Type"), "application/json") {
		t.Fatalf("create: %d %v %s", status, err, body)
	}
	var sb sandbox.Sandbox
	if err := json.Unmarshal(body, &sb); err != nil || sb.ID == "" {
		t.Fatalf("create reply %s: %v", body, err)
	}
	status, _, body, err = h.Call(ctx, "GET", "/v1/sandboxes/"+sb.ID+"/events", url.Values{"limit": {"1"}}, nil)
	if err != nil || status != 200 || !bytes.Contains(body, []byte(sb.ID)) {
		t.Fatalf("events: %d %v %s", status, err, body)
	}
	// A REST error is a reply.
	status, _, body, err = h.Call(ctx, "GET", "/v1/sandboxes/sb-000000000000", nil, nil)
	if err != nil || status != 404 || !bytes.Contains(body, []byte("SANDBOX_NOT_FOUND")) {
		t.Fatalf("missing: %d %v %s", status, err, body)
	}
	// The gate sees the inner request, with the caller: a refusal is the reply, nothing acts.
	status, _, body, err = h.Call(ctx, "DELETE", "/v1/sandboxes/"+sb.ID, nil, nil)
	if err != nil || status != 401 || !bytes.Contains(body, []byte("refused by the test gate")) {
		t.Fatalf("refused destroy: %d %v %s", status, err, body)
	}
	g.mu.Lock()
	last := g.calls[len(g.calls)-1]
	n := len(g.calls)
	g.mu.Unlock()
	if n != 4 || last.Caller.ID != "u1" || last.Tool != "DELETE /v1/sandboxes/{id}" || last.Surface != gate.SurfaceREST {
		t.Fatalf("gate saw %d calls, the last %+v", n, last)
	}
	// Outside the document: refused before anything is sent (the gate sees nothing).
	for _, c := range []struct{ method, path string }{{"POST", "/v1/sandboxes/x/nope"}, {"GET", "/v1/sandboxes/../capacity"}, {"PUT", "/v1/capacity"}, {"GET", "/v1/sandboxes/%2e%2e"}} {
		if _, _, _, err := h.Call(ctx, c.method, c.path, nil, nil); !errcode.Is(err, errcode.InvalidArgument) {
			t.Errorf("%s %s: %v, want INVALID_ARGUMENT", c.method, c.path, err)
		}
	}
	if g.mu.Lock(); len(g.calls) != n {
		t.Errorf("refused calls reached the gate: %d calls", len(g.calls))
	}
	g.mu.Unlock()
	// No identity, no call.
	if _, _, _, err := h.Call(t.Context(), "GET", "/v1/capacity", nil, nil); !errcode.Is(err, errcode.AuthFailed) {
		t.Fatalf("without a caller: %v", err)
	}
	// The reply is bounded: a file of 3 MiB comes back as MaxCallReply+1 bytes.
	big := bytes.Repeat([]byte("0123456789abcdef"), 3<<16)
	if status, _, body, err := h.Call(ctx, "PUT", "/v1/sandboxes/"+sb.ID+"/files", url.Values{"path": {"/workspace/big"}}, big); err != nil || status != 200 {
		t.Fatalf("write big: %d %v %s", status, err, body)
	}
	status, _, body, err = h.Call(ctx, "GET", "/v1/sandboxes/"+sb.ID+"/files", url.Values{"path": {"/workspace/big"}}, nil)
	if err != nil || status != 200 || len(body) != api.MaxCallReply+1 || !bytes.Equal(body, big[:len(body)]) {
		t.Fatalf("read big: %d %v %d bytes", status, err, len(body))
	}
}
