package api_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/coder/websocket"

	"github.com/agentbox/agentbox/internal/api"
	"github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/egress"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/fake"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/store/sqlite"
	"github.com/agentbox/agentbox/internal/wire"
)

// TestNetworkRoutesEndToEnd drives the network routes and a preview URL through real HTTP, the
// REST client, a real control plane over SQLite and the fake runtime, whose in-process agent
// dials the sandbox's loopback — here the test's own 127.0.0.1, where the "sandbox's server"
// listens.
func TestNetworkRoutesEndToEnd(t *testing.T) {
	ctx := t.Context()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "agentbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	rt, err := fake.New(fake.Config{Name: "runc"})
	if err != nil {
		t.Fatal(err)
	}
	var serverPort int
	svc, err := sandbox.NewService(st, []runtime.Runtime{rt}, sandbox.Config{
		PreviewURL: func(id string, port int) string { return api.PreviewURL(id, port, serverPort) },
		Egress: sandbox.EgressConfig{ProxyPort: -1, DNSPort: -1,
			NewProxy: func(rec egress.Recorder) (sandbox.EgressProxy, error) {
				return egress.New(egress.Config{Recorder: rec})
			}},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	h := api.New(svc, api.Options{Token: testToken})
	hs := httptest.NewServer(h)
	t.Cleanup(func() {
		h.Close()
		hs.Close()
		svc.Close()
		rt.Shutdown(context.Background())
		st.Close()
	})
	_, ps, _ := net.SplitHostPort(hs.Listener.Addr().String())
	fmt.Sscan(ps, &serverPort)
	c := client.New(hs.URL, testToken)

	// A sandbox with a policy: the reply says it; a live change replaces it.
	eg, err := c.Create(ctx, wire.CreateRequest{Network: &wire.Network{Policy: &wire.Policy{Allow: []string{"example.com"}}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Destroy(context.Background(), eg.ID) })
	if p := eg.Network.Policy; p == nil || len(p.Allow) != 1 || p.Allow[0] != "example.com" {
		t.Fatalf("created with %+v", eg.Network)
	}
	up, err := c.UpdateNetwork(ctx, eg.ID, wire.Policy{Allow: []string{"pypi.org", "*.github.com"}, Deny: []string{"evil.github.com"}})
	if err != nil || up.Network.Policy == nil || len(up.Network.Policy.Allow) != 2 || up.Network.Policy.Deny[0] != "evil.github.com" {
		t.Fatalf("update: %+v %v", up.Network, err)
	}
	if raw, err := c.Network(ctx, eg.ID); err != nil || !strings.Contains(string(raw), "pypi.org") {
		t.Fatalf("network: %s %v", raw, err)
	}
	if _, err := c.UpdateNetwork(ctx, eg.ID, wire.Policy{Allow: []string{"http://x/"}}); !errcode.Is(err, errcode.InvalidArgument) {
		t.Fatalf("a bad entry: %v", err)
	}
	l, err := c.Connections(ctx, eg.ID, 0, 10)
	if err != nil || l.SandboxID != eg.ID || l.Connections == nil {
		t.Fatalf("connections: %+v %v", l, err)
	}
	if sl, err := c.SecretCalls(ctx, eg.ID, 0, 0); err != nil || sl.Calls == nil {
		t.Fatalf("secret calls: %+v %v", sl, err)
	}

	// A sandbox with network none cannot be changed; its ports can still be exposed.
	none, err := c.Create(ctx, wire.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Destroy(context.Background(), none.ID) })
	if none.Network.Policy != nil {
		t.Fatalf("default network %+v", none.Network)
	}
	if _, err := c.UpdateNetwork(ctx, none.ID, wire.Policy{Allow: []string{"pypi.org"}}); !errcode.Is(err, errcode.Conflict) {
		t.Fatalf("update of a none sandbox: %v", err)
	}

	// The sandbox's server (on the loopback the fake agent dials).
	mux := http.NewServeMux()
	mux.HandleFunc("/ws", func(w http.ResponseWriter, r *http.Request) {
		ws, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true})
		if err != nil {
			return
		}
		defer ws.CloseNow()
		typ, b, err := ws.Read(r.Context())
		if err == nil {
			ws.Write(r.Context(), typ, append([]byte("echo: "), b...))
		}
		ws.Close(websocket.StatusNormalClosure, "")
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello from the sandbox; auth=%q cookie=%q query=%q", r.Header.Get("Authorization"), r.Header.Get("Cookie"), r.URL.RawQuery)
	})
	app := httptest.NewServer(mux)
	t.Cleanup(app.Close)
	_, aps, _ := net.SplitHostPort(app.Listener.Addr().String())
	var appPort int
	fmt.Sscan(aps, &appPort)

	e, err := c.Expose(ctx, none.ID, appPort, false)
	if err != nil {
		t.Fatal(err)
	}
	if e.URL != api.PreviewURL(none.ID, appPort, serverPort) || e.AccessToken == "" || e.Public || e.Port != appPort {
		t.Fatalf("expose: %+v", e)
	}
	list, err := c.Exposures(ctx, none.ID)
	if err != nil || len(list) != 1 || list[0].AccessToken != "" || list[0].URL != e.URL {
		t.Fatalf("exposures: %+v %v", list, err)
	}
	host := fmt.Sprintf("%d-%s.localhost:%d", appPort, none.ID, serverPort)
	hc := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	get := func(path string, hdr http.Header) (int, http.Header, string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, "GET", hs.URL+path, nil)
		req.Host = host
		for k, v := range hdr {
			req.Header[k] = v
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, resp.Header, string(b)
	}
	if code, _, body := get("/", nil); code != 401 {
		t.Fatalf("no credential: %d %s", code, body)
	}
	code, hdr, _ := get("/?agentbox_token="+e.AccessToken, nil)
	if code != 302 || hdr.Get("Location") != "/" {
		t.Fatalf("access token: %d %v", code, hdr)
	}
	cookie := strings.Split(hdr.Get("Set-Cookie"), ";")[0]
	code, _, body := get("/?a=b", http.Header{"Cookie": {cookie}})
	if code != 200 || !strings.Contains(body, "hello from the sandbox") || strings.Contains(body, e.AccessToken) || !strings.Contains(body, `auth="" cookie="" query="a=b"`) {
		t.Fatalf("cookie: %d %s", code, body)
	}
	code, _, body = get("/", http.Header{"Authorization": {"Bearer " + testToken}})
	if code != 200 || strings.Contains(body, testToken) {
		t.Fatalf("bearer: %d %s", code, body)
	}
	// This sandbox's token opens nothing of the other sandbox.
	if _, err := c.Expose(ctx, eg.ID, appPort, false); err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequestWithContext(ctx, "GET", hs.URL+"/", nil)
	req.Host = fmt.Sprintf("%d-%s.localhost:%d", appPort, eg.ID, serverPort)
	req.Header.Set("Cookie", cookie)
	if resp, err := hc.Do(req); err != nil || resp.StatusCode != 401 {
		t.Fatalf("another sandbox's token: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	// A WebSocket through the agent.
	ws, _, err := websocket.Dial(ctx, "ws://"+hs.Listener.Addr().String()+"/ws", &websocket.DialOptions{Host: host, HTTPHeader: http.Header{"Cookie": {cookie}}})
	if err != nil {
		t.Fatalf("websocket: %v", err)
	}
	ws.Write(ctx, websocket.MessageText, []byte("hi"))
	if _, b, err := ws.Read(ctx); err != nil || string(b) != "echo: hi" {
		t.Fatalf("websocket echo %q %v", b, err)
	}
	ws.CloseNow()
	// Nothing listening on an exposed port: 502 naming it.
	dead, _ := net.Listen("tcp", "127.0.0.1:0")
	_, dps, _ := net.SplitHostPort(dead.Addr().String())
	dead.Close()
	var deadPort int
	fmt.Sscan(dps, &deadPort)
	if _, err := c.Expose(ctx, none.ID, deadPort, true); err != nil {
		t.Fatal(err)
	}
	req, _ = http.NewRequestWithContext(ctx, "GET", hs.URL+"/", nil)
	req.Host = fmt.Sprintf("%d-%s.localhost:%d", deadPort, none.ID, serverPort)
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 502 || !strings.Contains(string(b), fmt.Sprintf("nothing listens on port %d in %s", deadPort, none.ID)) {
		t.Fatalf("nothing listening: %d %s", resp.StatusCode, b)
	}
	// Unexpose: the URL is gone; again: SANDBOX_NOT_FOUND.
	if err := c.Unexpose(ctx, none.ID, appPort); err != nil {
		t.Fatal(err)
	}
	if code, _, body := get("/", http.Header{"Cookie": {cookie}}); code != 404 {
		t.Fatalf("after unexpose: %d %s", code, body)
	}
	if err := c.Unexpose(ctx, none.ID, appPort); !errcode.Is(err, errcode.SandboxNotFound) {
		t.Fatalf("unexpose twice: %v", err)
	}
}
