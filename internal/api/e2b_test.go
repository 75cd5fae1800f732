package api_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/api"
	"github.com/agentbox/agentbox/internal/auth"
	"github.com/agentbox/agentbox/internal/authz"
	"github.com/agentbox/agentbox/internal/e2b"
	"github.com/agentbox/agentbox/internal/gate"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/fake"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/store/sqlite"
)

// e2bEnv is the REST server with the E2B surface on, API keys, and the server's scope and
// authorization gates, over the fake runtime.
type e2bEnv struct {
	url                  string
	operate, read, other string
	svc                  *sandbox.Service
	srv                  *api.Server
}

func newE2BEnv(t *testing.T, on bool) *e2bEnv {
	t.Helper()
	dir := t.TempDir()
	st, err := sqlite.Open(t.Context(), filepath.Join(dir, "agentbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	rt, err := fake.New(fake.Config{Name: "runc"})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := sandbox.NewService(st, []runtime.Runtime{rt}, sandbox.Config{SnapshotDir: filepath.Join(dir, "snapshots")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	keys := auth.NewKeys(st, nil)
	var e *e2b.Server
	if on {
		e = e2b.New(svc, e2b.Options{})
	}
	h := api.New(svc, api.Options{Token: testToken, Keys: keys, Gate: gate.Chain{auth.ScopeGate{}, authz.Gate{Store: st, Runs: st}}, E2B: e})
	hs := httptest.NewServer(h)
	t.Cleanup(func() {
		hs.Close()
		h.Close()
		if e != nil {
			e.Close()
		}
		svc.Close()
		rt.Shutdown(context.Background())
		st.Close()
	})
	mk := func(name, scope string) string {
		k, err := keys.Create(t.Context(), auth.CreateRequest{Name: name, Scope: scope})
		if err != nil {
			t.Fatal(err)
		}
		return k.Secret
	}
	return &e2bEnv{url: hs.URL, operate: mk("op", auth.ScopeOperate), read: mk("ro", auth.ScopeRead), other: mk("other", auth.ScopeOperate), svc: svc, srv: h}
}

// do sends a request with headers (X-API-KEY, E2b-Sandbox-Id…) and returns the status and body.
func (e *e2bEnv) do(t *testing.T, method, path, body string, hdr ...string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, e.url+path, strings.NewReader(body))
	for i := 0; i+1 < len(hdr); i += 2 {
		if strings.EqualFold(hdr[i], "Host") {
			req.Host = hdr[i+1]
			continue
		}
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// e2bErr reads E2B's {code, message}.
func e2bErr(t *testing.T, body string) (int, string) {
	t.Helper()
	var e struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil {
		t.Fatalf("not an E2B error body: %q", body)
	}
	return e.Code, e.Message
}

// TestE2BControlPlane: E2B's create, get, list, timeout, connect and kill with E2B's shapes and
// status codes, authenticated by X-API-KEY and gated like any route: a read key cannot create,
// another principal finds nothing, a bad key is 401 — all in E2B's error shape.
func TestE2BControlPlane(t *testing.T) {
	e := newE2BEnv(t, true)
	code, body := e.do(t, "POST", "/v2/sandboxes", `{"templateID":"base","timeout":60,"metadata":{"team":"a"},"envVars":{"FOO":"bar"}}`, "X-API-KEY", e.operate)
	if code != http.StatusCreated {
		t.Fatalf("create: %d %s", code, body)
	}
	var sb struct {
		SandboxID, TemplateID, ClientID, EnvdVersion, EnvdAccessToken string
		TrafficAccessToken                                            *string
	}
	if err := json.Unmarshal([]byte(body), &sb); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(sb.SandboxID, "sb-") || sb.TemplateID != "base" || sb.EnvdVersion != e2b.EnvdVersion || sb.ClientID == "" {
		t.Errorf("create reply %s", body)
	}
	if sb.EnvdAccessToken != e.operate || sb.TrafficAccessToken == nil || *sb.TrafficAccessToken != e.operate {
		t.Errorf("the access tokens are not the caller's key: %s", body)
	}
	rec, err := e.svc.Get(t.Context(), sb.SandboxID)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Env["FOO"] != "bar" || rec.Labels["team"] != "a" || rec.ExpiresAt.Sub(rec.CreatedAt) > 61*time.Second {
		t.Errorf("envVars, metadata or timeout not mapped: env %v labels %v ttl %s", rec.Env, rec.Labels, rec.ExpiresAt.Sub(rec.CreatedAt))
	}

	code, body = e.do(t, "GET", "/sandboxes/"+sb.SandboxID, "", "X-API-KEY", e.operate)
	if code != http.StatusOK || !strings.Contains(body, `"state":"running"`) || !strings.Contains(body, `"metadata":{"team":"a"}`) {
		t.Errorf("get: %d %s", code, body)
	}
	code, body = e.do(t, "GET", "/v2/sandboxes?metadata=team%3Da", "", "X-API-KEY", e.operate)
	if code != http.StatusOK || !strings.Contains(body, sb.SandboxID) {
		t.Errorf("list by metadata: %d %s", code, body)
	}
	if code, body = e.do(t, "GET", "/v2/sandboxes", "", "X-API-KEY", e.other); code != http.StatusOK || strings.Contains(body, sb.SandboxID) {
		t.Errorf("another principal's list shows the sandbox: %d %s", code, body)
	}
	// timeout: the end moves to now + timeout, later or earlier.
	if code, body = e.do(t, "POST", "/sandboxes/"+sb.SandboxID+"/timeout", `{"timeout":600}`, "X-API-KEY", e.operate); code != http.StatusNoContent {
		t.Errorf("timeout: %d %s", code, body)
	}
	if rec, _ = e.svc.Get(t.Context(), sb.SandboxID); time.Until(rec.ExpiresAt) < 590*time.Second {
		t.Errorf("timeout 600 left the end at %s", time.Until(rec.ExpiresAt))
	}
	if code, body = e.do(t, "POST", "/sandboxes/"+sb.SandboxID+"/timeout", `{"timeout":30}`, "X-API-KEY", e.operate); code != http.StatusNoContent {
		t.Errorf("timeout: %d %s", code, body)
	}
	if rec, _ = e.svc.Get(t.Context(), sb.SandboxID); time.Until(rec.ExpiresAt) > 30*time.Second || time.Until(rec.ExpiresAt) < 20*time.Second {
		t.Errorf("timeout 30 left the end at %s", time.Until(rec.ExpiresAt))
	}
	// connect's timeout only extends (E2B's keep-alive).
	if code, body = e.do(t, "POST", "/v2/sandboxes/"+sb.SandboxID+"/connect", `{"timeout":5}`, "X-API-KEY", e.operate); code != http.StatusOK {
		t.Errorf("connect to a running sandbox: %d %s", code, body)
	}
	if rec, _ = e.svc.Get(t.Context(), sb.SandboxID); time.Until(rec.ExpiresAt) < 20*time.Second {
		t.Errorf("connect with timeout 5 moved the end to %s", time.Until(rec.ExpiresAt))
	}
	if code, body = e.do(t, "POST", "/v2/sandboxes/"+sb.SandboxID+"/connect", `{"timeout":60}`, "X-API-KEY", e.operate); code != http.StatusOK || !strings.Contains(body, sb.SandboxID) {
		t.Errorf("connect to a running sandbox: %d %s", code, body)
	}

	// Errors, in E2B's shape.
	for _, c := range []struct {
		name, method, path, body, key string
		want                          int
		msg                           string
	}{
		{"bad key", "POST", "/v2/sandboxes", `{}`, "abk_nope", 401, ""},
		{"no key", "GET", "/v2/sandboxes", "", "", 401, ""},
		{"read scope creates", "POST", "/v2/sandboxes", `{}`, e.read, 403, "scope"},
		{"read scope kills", "DELETE", "/sandboxes/" + sb.SandboxID, "", e.read, 403, "scope"},
		{"other principal gets", "GET", "/sandboxes/" + sb.SandboxID, "", e.other, 404, sb.SandboxID},
		{"other principal kills", "DELETE", "/sandboxes/" + sb.SandboxID, "", e.other, 404, sb.SandboxID},
		{"missing sandbox", "GET", "/sandboxes/sb-000000000000", "", e.operate, 404, "not found"},
		{"bad timeout", "POST", "/sandboxes/" + sb.SandboxID + "/timeout", `{"timeout":"soon"}`, e.operate, 400, "timeout"},
		{"unmapped route", "GET", "/sandboxes/" + sb.SandboxID + "/network", "", e.operate, 501, "agentbox"},
		{"metrics without the metrics feature", "GET", "/sandboxes/" + sb.SandboxID + "/metrics", "", e.operate, 501, "agentbox"},
		{"unknown template", "POST", "/v2/sandboxes", `{"templateID":"no such template!"}`, e.operate, 400, ""},
	} {
		code, body := e.do(t, c.method, c.path, c.body, "X-API-KEY", c.key)
		ec, msg := e2bErr(t, body)
		if code != c.want || ec != c.want || !strings.Contains(msg, c.msg) {
			t.Errorf("%s: %d %s, want %d (E2B shape) mentioning %q", c.name, code, body, c.want, c.msg)
		}
	}

	// envd through the E2b-Sandbox-Id header: a Connect-RPC call, a missing file, the sandbox's
	// health; another principal's key finds no sandbox (502, as E2B's edge answers).
	hdr := []string{"X-Access-Token", e.operate, "E2b-Sandbox-Id", sb.SandboxID, "E2b-Sandbox-Port", "49983", "Content-Type", "application/json"}
	if code, body = e.do(t, "POST", "/process.Process/List", `{}`, hdr...); code != http.StatusOK {
		t.Errorf("process.Process/List: %d %s", code, body)
	}
	if code, body = e.do(t, "GET", "/health", "", hdr...); code != http.StatusNoContent {
		t.Errorf("envd health: %d %s", code, body)
	}
	if code, body = e.do(t, "GET", "/health", "", "E2b-Sandbox-Id", sb.SandboxID, "X-Access-Token", e.other); code != http.StatusBadGateway {
		t.Errorf("envd health with another principal's key: %d %s, want 502", code, body)
	}
	if code, body = e.do(t, "POST", "/process.Process/List", `{}`, "E2b-Sandbox-Id", sb.SandboxID, "Content-Type", "application/json"); code != http.StatusUnauthorized || !strings.Contains(body, `"unauthenticated"`) {
		t.Errorf("an RPC without a key: %d %s, want 401 unauthenticated", code, body)
	}
	if code, body = e.do(t, "POST", "/process.Process/SendSignal", `{"process":{"pid":1},"signal":"SIGNAL_SIGKILL"}`, append(hdr, "X-Access-Token", e.read)...); code != http.StatusForbidden || !strings.Contains(body, `"permission_denied"`) {
		t.Errorf("a signal with a read key: %d %s, want 403 permission_denied", code, body)
	}
	if code, body = e.do(t, "POST", "/process.Process/SendSignal", `{"process":{"pid":4242},"signal":"SIGNAL_SIGKILL"}`, hdr...); code != http.StatusNotFound || !strings.Contains(body, `"not_found"`) {
		t.Errorf("a signal to no process: %d %s, want 404 not_found", code, body)
	}
	// Headers never lift the Host check (a rebound name could send them); an E2B host does.
	if code, body = e.do(t, "GET", "/health", "", append(hdr, "Host", "evil.example")...); code != http.StatusForbidden {
		t.Errorf("an E2B call to a foreign Host: %d %s, want 403", code, body)
	}
	if code, body = e.do(t, "GET", "/health", "", "X-Access-Token", e.operate, "Host", "49983-"+sb.SandboxID+".localhost"); code != http.StatusNoContent {
		t.Errorf("envd by the {port}-{id}.localhost host: %d %s", code, body)
	}

	if code, body = e.do(t, "DELETE", "/sandboxes/"+sb.SandboxID, "", "X-API-KEY", e.operate); code != http.StatusNoContent {
		t.Errorf("kill: %d %s", code, body)
	}
	if code, body = e.do(t, "DELETE", "/sandboxes/"+sb.SandboxID, "", "X-API-KEY", e.operate); code != http.StatusNotFound {
		t.Errorf("kill again: %d %s, want 404", code, body)
	}
	if code, body = e.do(t, "GET", "/sandboxes/"+sb.SandboxID, "", "X-API-KEY", e.operate); code != http.StatusNotFound {
		t.Errorf("get after kill: %d %s, want 404", code, body)
	}
}

// TestE2BOff: with the surface off its routes answer 501 in E2B's shape, and a call carrying
// E2b-Sandbox-Id is not routed to envd.
func TestE2BOff(t *testing.T) {
	e := newE2BEnv(t, false)
	code, body := e.do(t, "POST", "/v2/sandboxes", `{}`, "X-API-KEY", e.operate)
	if ec, msg := e2bErr(t, body); code != http.StatusNotImplemented || ec != 501 || !strings.Contains(msg, "--e2b") {
		t.Errorf("create with the surface off: %d %s", code, body)
	}
	if code, body = e.do(t, "GET", "/health", "", "E2b-Sandbox-Id", "sb-000000000000"); code != http.StatusOK || !strings.Contains(body, `"status":"ok"`) {
		t.Errorf("/health with E2b-Sandbox-Id and the surface off is the server's own: %d %s", code, body)
	}
}
