package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/coder/websocket"

	"github.com/agentbox/agentbox/internal/api"
	"github.com/agentbox/agentbox/internal/errcode"
)

// TestPreviewHost: only {port}-{sandbox id}.localhost[:port] is a preview name; a malformed one
// of that shape is recognised (and refused), anything else is left to the Host check.
func TestPreviewHost(t *testing.T) {
	for _, tc := range []struct {
		host      string
		id        string
		port      int
		match, ok bool
	}{
		{"3000-sb-0123456789ab.localhost", "sb-0123456789ab", 3000, true, true},
		{"3000-sb-0123456789ab.localhost:8765", "sb-0123456789ab", 3000, true, true},
		{"3000-SB-0123456789AB.LOCALHOST:8765", "sb-0123456789ab", 3000, true, true},
		{"1-sb-0123456789ab.localhost.", "sb-0123456789ab", 1, true, true},
		{"65535-sb-0123456789ab.localhost", "sb-0123456789ab", 65535, true, true},
		{"65536-sb-0123456789ab.localhost", "", 0, true, false},
		{"0-sb-0123456789ab.localhost", "", 0, true, false},
		{"03000-sb-0123456789ab.localhost", "", 0, true, false},
		{"+300-sb-0123456789ab.localhost", "", 0, true, false},
		{"3000-sb-xyz.localhost", "", 0, true, false},
		{"3000-sb-0123456789ab-x.localhost", "", 0, true, false},
		{"x.3000-sb-0123456789ab.localhost", "", 0, false, false},
		{"3000-sb-0123456789ab.localhost.evil.example", "", 0, false, false},
		{"localhost:8765", "", 0, false, false},
		{"127.0.0.1:8765", "", 0, false, false},
		{"sb-0123456789ab.localhost", "", 0, false, false},
	} {
		id, port, match, ok := api.PreviewHost(tc.host)
		if id != tc.id || port != tc.port || match != tc.match || ok != tc.ok {
			t.Errorf("%s: %q %d %v %v, want %q %d %v %v", tc.host, id, port, match, ok, tc.id, tc.port, tc.match, tc.ok)
		}
	}
	if u := api.PreviewURL("sb-0123456789ab", 3000, 8765); u != "http://3000-sb-0123456789ab.localhost:8765/" {
		t.Fatal(u)
	}
}

// fakePreview is the control plane's side of preview URLs: exposures with per-exposure tokens,
// and DialPort connecting to a listener of the test (the sandbox's server).
type fakePreview struct {
	mu        sync.Mutex
	exposures map[string]fakeExposure // "id:port"
	dials     int
}

type fakeExposure struct {
	public bool
	token  string
	addr   string // where DialPort connects
}

func (f *fakePreview) AuthorizePreview(_ context.Context, id string, port int, tok string, bearer bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	e, ok := f.exposures[fmt.Sprintf("%s:%d", id, port)]
	switch {
	case !ok:
		return errcode.New(errcode.SandboxNotFound, "port %d of %s is not exposed", port, id)
	case e.public || bearer || (tok != "" && tok == e.token):
		return nil
	}
	return errcode.New(errcode.AuthFailed, "wrong access token")
}

func (f *fakePreview) DialPort(ctx context.Context, id string, port int) (net.Conn, error) {
	f.mu.Lock()
	e := f.exposures[fmt.Sprintf("%s:%d", id, port)]
	f.dials++
	f.mu.Unlock()
	var d net.Dialer
	return d.DialContext(ctx, "tcp", e.addr)
}

// seen is what the sandbox's server was sent.
type seen struct {
	Method, Path, RawQuery, Host string
	Header                       http.Header
	BodyBytes                    int64
}

func upstream(t *testing.T) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("/ws", func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true})
		if err != nil {
			return
		}
		defer c.CloseNow()
		for {
			typ, b, err := c.Read(r.Context())
			if err != nil {
				return
			}
			if err := c.Write(r.Context(), typ, append([]byte("echo: "), b...)); err != nil {
				return
			}
		}
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(seen{Method: r.Method, Path: r.URL.Path, RawQuery: r.URL.RawQuery, Host: r.Host, Header: r.Header, BodyBytes: n})
	})
	s := httptest.NewServer(mux)
	t.Cleanup(s.Close)
	return s
}

// TestPreviewRouter: requests to a preview name reach the sandbox's server and never the
// API; private exposures need the bearer token or the exposure's own access token (traded for
// a host-only cookie); neither token reaches the sandbox; 404 for a port not exposed, 401 for
// a wrong token (another exposure's included), 502 naming the port when nothing listens;
// WebSocket upgrades and large request bodies go through.
func TestPreviewRouter(t *testing.T) {
	const tok = "preview-test-server-token"
	up := upstream(t)
	closed, _ := net.Listen("tcp", "127.0.0.1:0")
	deadAddr := closed.Addr().String()
	closed.Close()
	a, b := "sb-00000000000a", "sb-00000000000b"
	fp := &fakePreview{exposures: map[string]fakeExposure{
		a + ":3000": {token: "tok-a", addr: up.Listener.Addr().String()},
		b + ":3000": {token: "tok-b", addr: up.Listener.Addr().String()},
		a + ":8080": {public: true, addr: up.Listener.Addr().String()},
		a + ":9000": {token: "tok-a9", addr: deadAddr},
	}}
	h := api.New(nil, api.Options{Token: tok, Preview: fp})
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	t.Cleanup(h.Close)
	_, sport, _ := net.SplitHostPort(srv.Listener.Addr().String())
	hostOf := func(id string, port int) string { return fmt.Sprintf("%d-%s.localhost:%s", port, id, sport) }
	hc := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	do := func(method, host, path string, hdr map[string]string, body io.Reader) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest(method, srv.URL+path, body)
		req.Host = host
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, string(b)
	}
	got := func(body string) seen {
		t.Helper()
		var s seen
		if err := json.Unmarshal([]byte(body), &s); err != nil {
			t.Fatalf("not the sandbox's server's reply: %s", body)
		}
		return s
	}

	// No credential: 401, and the sandbox's server is not reached.
	resp, body := do("GET", hostOf(a, 3000), "/", nil, nil)
	if resp.StatusCode != 401 || !strings.Contains(body, "private") || !strings.Contains(body, "agentbox_token") {
		t.Fatalf("no credential: %d %s", resp.StatusCode, body)
	}
	// Bearer: forwarded, the Authorization header taken off; the path /v1/... is the app's.
	resp, body = do("GET", hostOf(a, 3000), "/v1/sandboxes?x=1", map[string]string{"Authorization": "Bearer " + tok}, nil)
	if resp.StatusCode != 200 {
		t.Fatalf("bearer: %d %s", resp.StatusCode, body)
	}
	s := got(body)
	if s.Path != "/v1/sandboxes" || s.RawQuery != "x=1" || s.Header.Get("Authorization") != "" || strings.Contains(body, tok) {
		t.Fatalf("bearer: the sandbox saw %+v", s)
	}
	if s.Host != hostOf(a, 3000) || s.Header.Get("X-Forwarded-Host") != hostOf(a, 3000) || s.Header.Get("X-Forwarded-For") == "" || s.Header.Get("X-Forwarded-Proto") != "http" {
		t.Fatalf("forwarded headers: host %q %v", s.Host, s.Header)
	}
	// An app's own Authorization header (not the server's token) is the app's.
	_, body = do("GET", hostOf(a, 8080), "/", map[string]string{"Authorization": "Bearer app-token"}, nil)
	if got(body).Header.Get("Authorization") != "Bearer app-token" {
		t.Fatalf("the app's own Authorization was dropped: %s", body)
	}

	// The access token in the URL: a redirect to the same URL without it, and a cookie.
	resp, body = do("GET", hostOf(a, 3000), "/app/page?agentbox_token=tok-a&q=v", nil, nil)
	if resp.StatusCode != http.StatusFound {
		t.Fatalf("access token: %d %s", resp.StatusCode, body)
	}
	if loc := resp.Header.Get("Location"); loc != "/app/page?q=v" {
		t.Fatalf("redirect to %q", loc)
	}
	sc := resp.Header.Get("Set-Cookie")
	for _, want := range []string{"agentbox_preview=tok-a", "Path=/", "HttpOnly", "SameSite=Strict"} {
		if !strings.Contains(sc, want) {
			t.Fatalf("cookie %q lacks %q", sc, want)
		}
	}
	if strings.Contains(strings.ToLower(sc), "domain=") {
		t.Fatalf("cookie %q must be host-only", sc)
	}
	// The cookie: forwarded, the cookie taken off, the app's own cookies kept.
	resp, body = do("GET", hostOf(a, 3000), "/app/page?q=v", map[string]string{"Cookie": "theme=dark; agentbox_preview=tok-a; sid=42"}, nil)
	if resp.StatusCode != 200 {
		t.Fatalf("cookie: %d %s", resp.StatusCode, body)
	}
	s = got(body)
	if c := s.Header.Get("Cookie"); c != "theme=dark; sid=42" || strings.Contains(body, "tok-a") {
		t.Fatalf("cookie: the sandbox saw Cookie %q (%s)", c, body)
	}
	// A non-GET with the token in the URL is served (no redirect), without the token.
	resp, body = do("POST", hostOf(a, 3000), "/submit?agentbox_token=tok-a", nil, strings.NewReader("x"))
	if resp.StatusCode != 200 || got(body).RawQuery != "" || strings.Contains(body, "tok-a") {
		t.Fatalf("POST with the token in the URL: %d %s", resp.StatusCode, body)
	}

	// Wrong tokens: another exposure's token, a made-up one, in the URL or the cookie.
	for _, c := range []map[string]string{{"Cookie": "agentbox_preview=tok-b"}, {"Cookie": "agentbox_preview=nope"}, {"Authorization": "Bearer tok-a"}} {
		if resp, body := do("GET", hostOf(a, 3000), "/", c, nil); resp.StatusCode != 401 {
			t.Fatalf("%v: %d %s", c, resp.StatusCode, body)
		}
	}
	if resp, body := do("GET", hostOf(b, 3000), "/?agentbox_token=tok-a", nil, nil); resp.StatusCode != 401 {
		t.Fatalf("another sandbox's token: %d %s", resp.StatusCode, body)
	}
	// Public: no credential needed.
	if resp, body := do("GET", hostOf(a, 8080), "/", nil, nil); resp.StatusCode != 200 {
		t.Fatalf("public: %d %s", resp.StatusCode, body)
	}
	// Not exposed: 404; a malformed preview name: 404; neither reaches an upstream.
	fp.mu.Lock()
	dials := fp.dials
	fp.mu.Unlock()
	if resp, body := do("GET", hostOf(a, 4000), "/", map[string]string{"Authorization": "Bearer " + tok}, nil); resp.StatusCode != 404 || !strings.Contains(body, "not exposed") {
		t.Fatalf("not exposed: %d %s", resp.StatusCode, body)
	}
	if resp, body := do("GET", "3000-sb-nope.localhost:"+sport, "/v1/sandboxes", map[string]string{"Authorization": "Bearer " + tok}, nil); resp.StatusCode != 404 || strings.Contains(body, "sandboxes\"") {
		t.Fatalf("malformed preview name: %d %s", resp.StatusCode, body)
	}
	fp.mu.Lock()
	if fp.dials != dials {
		t.Fatalf("refused requests dialed the sandbox")
	}
	fp.mu.Unlock()
	// Nothing listens: 502 naming the port.
	resp, body = do("GET", hostOf(a, 9000), "/", map[string]string{"Authorization": "Bearer " + tok}, nil)
	if resp.StatusCode != 502 || !strings.Contains(body, "nothing listens on port 9000 in "+a) || !strings.Contains(body, "127.0.0.1:9000") {
		t.Fatalf("nothing listening: %d %s", resp.StatusCode, body)
	}
	// The API itself still answers on its own name.
	if resp, _ := do("GET", "127.0.0.1:"+sport, "/health", nil, nil); resp.StatusCode != 200 {
		t.Fatalf("health: %d", resp.StatusCode)
	}

	// A request body larger than the API's JSON bound streams through.
	const big = api.MaxJSONBody + 1<<20
	resp, body = do("PUT", hostOf(a, 8080), "/upload", nil, io.LimitReader(zeros{}, big))
	if resp.StatusCode != 200 || got(body).BodyBytes != big {
		t.Fatalf("large body: %d %s", resp.StatusCode, body)
	}

	// WebSocket through the preview URL, with the cookie.
	ctx := t.Context()
	u := "ws://" + srv.Listener.Addr().String() + "/ws"
	ws, _, err := websocket.Dial(ctx, u, &websocket.DialOptions{Host: hostOf(a, 3000), HTTPHeader: http.Header{"Cookie": {"agentbox_preview=tok-a"}}})
	if err != nil {
		t.Fatalf("websocket: %v", err)
	}
	defer ws.CloseNow()
	for _, m := range []string{"hello", "again"} {
		if err := ws.Write(ctx, websocket.MessageText, []byte(m)); err != nil {
			t.Fatal(err)
		}
		_, got, err := ws.Read(ctx)
		if err != nil || string(got) != "echo: "+m {
			t.Fatalf("websocket echo: %q %v", got, err)
		}
	}
	ws.Close(websocket.StatusNormalClosure, "")
	// Without a credential the upgrade is refused.
	if _, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{Host: hostOf(a, 3000)}); err == nil || resp == nil || resp.StatusCode != 401 {
		t.Fatalf("websocket without a credential: %v %v", resp, err)
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// TestPreviewConfinesTheSandbox: a sandbox's web server behind a preview URL sets cookies for
// Domain=localhost (which a browser would send to the API and to every other preview), for its
// own name with a Domain, and under agentbox's cookie names; and it sends Clear-Site-Data. A
// browser's cookie jar that follows the preview keeps only host-only cookies of that preview
// host: the API host and another sandbox's preview get none, and agentbox's preview cookie
// cannot be set from the sandbox. No agentbox credential (the server's token, an API key in
// Authorization or X-Api-Key, agentbox cookies) reaches the sandbox's server.
func TestPreviewConfinesTheSandbox(t *testing.T) {
	const tok = "preview-test-server-token"
	const apiKey = "abk_0123456789abcdef0123456789abcdef"
	var mu sync.Mutex
	var seenHdr []http.Header
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seenHdr = append(seenHdr, r.Header.Clone())
		mu.Unlock()
		if r.URL.Path == "/login" {
			for _, c := range []string{
				"everywhere=1; Domain=localhost; Path=/",
				"dotted=2; Path=/; domain=.LOCALHOST; HttpOnly",
				"mine=3; Domain=" + strings.Split(r.Host, ":")[0] + "; Path=/",
				"plain=4; Path=/; SameSite=Lax",
				"agentbox_preview=stolen; Domain=localhost; Path=/",
				"Agentbox_Preview=stolen; Path=/",
			} {
				w.Header().Add("Set-Cookie", c)
			}
			w.Header().Set("Clear-Site-Data", `"cookies", "storage"`)
		}
		fmt.Fprintln(w, "ok")
	}))
	t.Cleanup(app.Close)
	a, b := "sb-00000000000a", "sb-00000000000b"
	fp := &fakePreview{exposures: map[string]fakeExposure{
		a + ":8080": {public: true, addr: app.Listener.Addr().String()},
		b + ":8080": {public: true, addr: app.Listener.Addr().String()},
		a + ":3000": {token: "tok-a", addr: app.Listener.Addr().String()},
	}}
	h := api.New(nil, api.Options{Token: tok, Preview: fp})
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	t.Cleanup(h.Close)
	_, sport, _ := net.SplitHostPort(srv.Listener.Addr().String())
	urlOf := func(host string) string { return "http://" + host + ":" + sport + "/" }
	previewA, previewB, apiHost := fmt.Sprintf("8080-%s.localhost", a), fmt.Sprintf("8080-%s.localhost", b), "localhost"

	// A browser: a cookie jar, every name resolving to the server.
	jar, _ := cookiejar.New(nil)
	hc := &http.Client{Jar: jar, Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", srv.Listener.Addr().String())
	}}}
	get := func(u string, hdr http.Header) *http.Response {
		t.Helper()
		req, _ := http.NewRequest("GET", u, nil)
		maps.Copy(req.Header, hdr)
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("GET %s: %d", u, resp.StatusCode)
		}
		return resp
	}
	resp := get(urlOf(previewA)+"login", http.Header{
		"Authorization": {"Bearer " + apiKey},
		"X-Api-Key":     {apiKey},
		"Cookie":        {"app=1; agentbox_other=x; AGENTBOX_PREVIEW=y"},
	})
	for _, sc := range resp.Header.Values("Set-Cookie") {
		if strings.Contains(strings.ToLower(sc), "domain") || strings.HasPrefix(strings.ToLower(sc), "agentbox_") {
			t.Errorf("Set-Cookie %q reached the browser", sc)
		}
	}
	if len(resp.Header.Values("Set-Cookie")) != 4 {
		t.Errorf("Set-Cookie %q: want the sandbox's four own cookies, host-only", resp.Header.Values("Set-Cookie"))
	}
	if v := resp.Header.Get("Clear-Site-Data"); v != "" {
		t.Errorf("Clear-Site-Data %q reached the browser: it clears every preview's cookies", v)
	}
	names := func(host string) []string {
		u, _ := url.Parse(urlOf(host))
		var out []string
		for _, c := range jar.Cookies(u) {
			out = append(out, c.Name)
		}
		slices.Sort(out)
		return out
	}
	if got := names(previewA); !slices.Equal(got, []string{"dotted", "everywhere", "mine", "plain"}) {
		t.Errorf("preview A's own cookies: %v", got)
	}
	for _, host := range []string{apiHost, previewB, "127.0.0.1"} {
		if got := names(host); len(got) != 0 {
			t.Errorf("%s got the sandbox's cookies %v", host, got)
		}
	}
	// Another sandbox's preview is sent none of them.
	get(urlOf(previewB), nil)
	mu.Lock()
	first, second := seenHdr[0], seenHdr[len(seenHdr)-1]
	mu.Unlock()
	if c := second.Get("Cookie"); c != "" {
		t.Errorf("sandbox b was sent sandbox a's cookies: %q", c)
	}
	if first.Get("Authorization") != "" || first.Get("X-Api-Key") != "" || first.Get("Cookie") != "app=1" {
		t.Errorf("the sandbox saw agentbox credentials: Authorization %q, X-Api-Key %q, Cookie %q",
			first.Get("Authorization"), first.Get("X-Api-Key"), first.Get("Cookie"))
	}
	// The server's token in X-Api-Key on a private preview, with the preview cookie: the
	// sandbox sees neither.
	req, _ := http.NewRequest("GET", urlOf(fmt.Sprintf("3000-%s.localhost", a)), nil)
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("X-Api-Key", tok)
	if resp, err := (&http.Client{Transport: hc.Transport}).Do(req); err != nil || resp.StatusCode != 200 {
		t.Fatalf("private preview with the token: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	mu.Lock()
	last := seenHdr[len(seenHdr)-1]
	mu.Unlock()
	if last.Get("Authorization") != "" || last.Get("X-Api-Key") != "" {
		t.Errorf("the sandbox saw the server's token: %v", last)
	}
}
