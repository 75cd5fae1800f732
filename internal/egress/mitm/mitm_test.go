package mitm

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/agentbox/agentbox/internal/egress"
	"github.com/agentbox/agentbox/internal/errcode"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type recorder struct {
	mu    sync.Mutex
	calls []egress.SecretCall
}

func (r *recorder) RecordConnection(egress.Connection) {}
func (r *recorder) RecordSecretCall(c egress.SecretCall) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, c)
}
func (r *recorder) take() []egress.SecretCall {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := r.calls
	r.calls = nil
	return c
}

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// seen is what the upstream server received.
type seen struct {
	Host, Auth, Key, Body string
	Len                   int64
}

// env is one sandbox's interceptor between a sandbox-side HTTP client and an upstream
// HTTPS server with its own CA, all on loopback.
type env struct {
	t        testing.TB
	ca       *CA
	upCA     *CA
	up       *httptest.Server
	upConns  atomic.Int64 // upstream connections accepted
	accepted atomic.Int64 // sandbox-side connections intercepted
	icpt     *Interceptor
	rec      *recorder
	logs     *syncBuf
	target   *egress.Target
	handler  atomic.Value // http.HandlerFunc override
	dialTo   atomic.Value // string: an upstream address other than up's (raw test servers)

	vmu  sync.Mutex
	vars map[string]string

	smu   sync.Mutex
	seen  []seen
	errs  []error
	ctx   context.Context
	stop  context.CancelFunc
	wg    sync.WaitGroup
	lns   []net.Listener
	trs   []*http.Transport
	plain bool
	once  sync.Once
}

func newEnv(t testing.TB, secrets []egress.Secret, plain bool) *env {
	e := &env{t: t, rec: &recorder{}, logs: &syncBuf{}, vars: map[string]string{}, plain: plain}
	var err error
	if e.ca, err = LoadOrCreateCA(t.TempDir()); err != nil {
		t.Fatal(err)
	}
	if e.upCA, err = LoadOrCreateCA(t.TempDir()); err != nil {
		t.Fatal(err)
	}
	e.up = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if h, ok := e.handler.Load().(http.HandlerFunc); ok && h != nil {
			h(w, r)
			return
		}
		b, _ := io.ReadAll(r.Body)
		e.smu.Lock()
		e.seen = append(e.seen, seen{Host: r.Host, Auth: r.Header.Get("Authorization"), Key: r.Header.Get("X-Api-Key"), Body: string(b), Len: r.ContentLength})
		e.smu.Unlock()
		io.WriteString(w, "hello from upstream")
	}))
	e.up.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			e.upConns.Add(1)
		}
	}
	e.up.Config.ErrorLog = nil
	if plain {
		e.up.Start()
	} else {
		e.up.TLS = &tls.Config{GetCertificate: func(h *tls.ClientHelloInfo) (*tls.Certificate, error) { return e.upCA.Leaf(h.ServerName) }}
		e.up.StartTLS()
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(e.upCA.CertPEM())
	e.icpt = New(Config{
		CA: e.ca,
		Sources: Sources{EnvAllow: []string{"TEST_*"}, Getenv: func(k string) (string, bool) {
			e.vmu.Lock()
			defer e.vmu.Unlock()
			v, ok := e.vars[k]
			return v, ok
		}},
		UpstreamRoots: roots,
		Recorder:      e.rec,
		Logger:        slog.New(slog.NewTextHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	e.target = &egress.Target{SandboxID: "sb-test", Secrets: secrets}
	e.ctx, e.stop = context.WithCancel(context.Background())
	t.Cleanup(e.close)
	return e
}

func (e *env) setVar(k, v string) {
	e.vmu.Lock()
	defer e.vmu.Unlock()
	if v == "" {
		delete(e.vars, k)
	} else {
		e.vars[k] = v
	}
}

func (e *env) close() { e.once.Do(e.doClose) }

func (e *env) doClose() {
	for _, tr := range e.trs {
		tr.CloseIdleConnections()
	}
	for _, ln := range e.lns {
		ln.Close()
	}
	e.stop()
	e.wg.Wait()
	e.up.Close()
}

// listen starts intercepting connections as host; it returns the listener's address.
func (e *env) listen(host string) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		e.t.Fatal(err)
	}
	e.lns = append(e.lns, ln)
	port := 443
	if e.plain {
		port = 80
	}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			e.accepted.Add(1)
			e.wg.Add(1)
			go func() {
				defer e.wg.Done()
				_, _, err := e.icpt.Intercept(e.ctx, e.target, c, host, port, !e.plain, func(ctx context.Context) (net.Conn, error) {
					upAddr := e.up.Listener.Addr().String()
					if a, ok := e.dialTo.Load().(string); ok && a != "" {
						upAddr = a
					}
					var d net.Dialer
					return d.DialContext(ctx, "tcp", upAddr)
				})
				if err != nil {
					e.smu.Lock()
					e.errs = append(e.errs, err)
					e.smu.Unlock()
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// client returns a sandbox-side client whose every connection is intercepted as host and
// which trusts only roots (nil: the egress CA).
func (e *env) client(host string, roots *x509.CertPool) *http.Client {
	addr := e.listen(host)
	if roots == nil {
		roots = x509.NewCertPool()
		if !roots.AppendCertsFromPEM(e.ca.CertPEM()) {
			e.t.Fatal("CertPEM is not PEM")
		}
	}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", addr)
		},
		TLSClientConfig: &tls.Config{RootCAs: roots},
	}
	e.trs = append(e.trs, tr)
	return &http.Client{Transport: tr, Timeout: 20 * time.Second}
}

func (e *env) takeSeen() []seen {
	e.smu.Lock()
	defer e.smu.Unlock()
	s := e.seen
	e.seen = nil
	return s
}

func do(t testing.TB, c *http.Client, method, url string, body io.Reader, hdr map[string]string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

const (
	phA = "agentbox-secret-0123456789abcdef0123456789abcdef"
	phB = "agentbox-secret-fedcba9876543210fedcba9876543210"
)

func secretsAB(bodyA bool) []egress.Secret {
	return []egress.Secret{
		{Name: "OPENAI_API_KEY", Placeholder: phA, From: "env:TEST_OPENAI", Hosts: []string{"api.example.com"}, Body: bodyA},
		{Name: "OTHER_KEY", Placeholder: phB, From: "env:TEST_OTHER", Hosts: []string{"*.other.example"}},
	}
}

// assertNoValue fails if value appears in any record, log line or error of e.
func (e *env) assertNoValue(t *testing.T, calls []egress.SecretCall, values ...string) {
	t.Helper()
	js, _ := json.Marshal(calls)
	logs := e.logs.String()
	e.smu.Lock()
	var errs []string
	for _, err := range e.errs {
		errs = append(errs, err.Error())
	}
	e.smu.Unlock()
	for _, v := range values {
		if strings.Contains(string(js), v) {
			t.Errorf("value %q is in a recorded SecretCall: %s", v, js)
		}
		if strings.Contains(logs, v) {
			t.Errorf("value %q is in the log:\n%s", v, logs)
		}
		if strings.Contains(strings.Join(errs, "\n"), v) {
			t.Errorf("value %q is in an error: %v", v, errs)
		}
	}
}

func TestInterceptSwapsHeader(t *testing.T) {
	e := newEnv(t, secretsAB(false), false)
	e.setVar("TEST_OPENAI", "sk-real-value-1")
	e.setVar("TEST_OTHER", "other-real-value")
	c := e.client("api.example.com", nil)

	resp, body := do(t, c, "GET", "https://api.example.com/v1/models?limit=3&key=x", nil,
		map[string]string{"Authorization": "Bearer " + phA, "X-Api-Key": phB})
	if resp.StatusCode != 200 || body != "hello from upstream" {
		t.Fatalf("status %d body %q", resp.StatusCode, body)
	}
	// the sandbox's client verified a leaf of the egress CA for the host
	leaf := resp.TLS.PeerCertificates[0]
	if leaf.Issuer.CommonName != e.ca.Certificate().Subject.CommonName || len(leaf.DNSNames) != 1 || leaf.DNSNames[0] != "api.example.com" {
		t.Fatalf("leaf issuer %q names %v", leaf.Issuer.CommonName, leaf.DNSNames)
	}
	got := e.takeSeen()
	if len(got) != 1 {
		t.Fatalf("upstream saw %d requests", len(got))
	}
	if got[0].Auth != "Bearer sk-real-value-1" {
		t.Fatalf("upstream Authorization = %q, want the real value", got[0].Auth)
	}
	// OTHER_KEY does not list api.example.com: its placeholder stays as it was
	if got[0].Key != phB || got[0].Host != "api.example.com" {
		t.Fatalf("upstream X-Api-Key = %q host %q", got[0].Key, got[0].Host)
	}
	calls := e.rec.take()
	if len(calls) != 2 {
		t.Fatalf("calls = %+v", calls)
	}
	byName := map[string]egress.SecretCall{}
	for _, c := range calls {
		byName[c.Secret] = c
	}
	a, b := byName["OPENAI_API_KEY"], byName["OTHER_KEY"]
	if !a.Replaced || a.Host != "api.example.com" || a.Method != "GET" || a.Path != "/v1/models" || a.SandboxID != "sb-test" || a.Time.IsZero() {
		t.Fatalf("OPENAI_API_KEY call = %+v", a)
	}
	if b.Replaced || b.Reason != "host not listed for this secret" {
		t.Fatalf("OTHER_KEY call = %+v", b)
	}
	if !strings.Contains(e.logs.String(), "OPENAI_API_KEY") {
		t.Fatalf("the swap is not logged at debug:\n%s", e.logs.String())
	}

	// a client that trusts only the system's roots refuses the leaf
	sys, _ := x509.SystemCertPool()
	if sys == nil {
		sys = x509.NewCertPool()
	}
	if _, err := e.client("api.example.com", sys).Get("https://api.example.com/"); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("a client without the egress CA: err = %v", err)
	}
	e.close()
	e.assertNoValue(t, calls, "sk-real-value-1", "other-real-value")
}

func TestInterceptRotationAndKeepAlive(t *testing.T) {
	e := newEnv(t, secretsAB(false), false)
	c := e.client("api.example.com", nil)
	for i, v := range []string{"sk-first", "sk-second", "sk-third"} {
		e.setVar("TEST_OPENAI", v)
		resp, _ := do(t, c, "GET", "https://api.example.com/v1/chat", nil, map[string]string{"Authorization": "Bearer " + phA})
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: %d", i, resp.StatusCode)
		}
		if got := e.takeSeen(); len(got) != 1 || got[0].Auth != "Bearer "+v {
			t.Fatalf("request %d: upstream saw %+v, want %q", i, got, v)
		}
	}
	if a, u := e.accepted.Load(), e.upConns.Load(); a != 1 || u != 1 {
		t.Fatalf("connections: sandbox side %d, upstream %d; want one each, kept alive", a, u)
	}
	if calls := e.rec.take(); len(calls) != 3 {
		t.Fatalf("calls = %+v", calls)
	}
	e.close()
	e.assertNoValue(t, nil, "sk-first", "sk-second", "sk-third")
}

func TestInterceptBodyOnlyWhenOptedIn(t *testing.T) {
	for _, optIn := range []bool{false, true} {
		t.Run(fmt.Sprint("body=", optIn), func(t *testing.T) {
			e := newEnv(t, secretsAB(optIn), false)
			e.setVar("TEST_OPENAI", "sk-body-value")
			e.setVar("TEST_OTHER", "other-value")
			c := e.client("api.example.com", nil)
			payload := `{"key":"` + phA + `","other":"` + phB + `"}`
			// a known length, then chunked (unknown length)
			for _, r := range []io.Reader{strings.NewReader(payload), io.MultiReader(strings.NewReader(payload))} {
				resp, _ := do(t, c, "POST", "https://api.example.com/v1/x", r, nil)
				if resp.StatusCode != 200 {
					t.Fatalf("status %d", resp.StatusCode)
				}
				got := e.takeSeen()
				if len(got) != 1 {
					t.Fatalf("seen %+v", got)
				}
				want := payload
				if optIn {
					want = `{"key":"sk-body-value","other":"` + phB + `"}`
				}
				if got[0].Body != want {
					t.Fatalf("upstream body %q, want %q", got[0].Body, want)
				}
				calls := e.rec.take()
				if !optIn {
					if len(calls) != 0 {
						t.Fatalf("a body nobody opted in to was scanned: %+v", calls)
					}
					continue
				}
				if len(calls) != 2 {
					t.Fatalf("calls %+v", calls)
				}
				for _, c := range calls {
					if c.Secret == "OPENAI_API_KEY" && !c.Replaced || c.Secret == "OTHER_KEY" && (c.Replaced || c.Reason != "host not listed for this secret") {
						t.Fatalf("call %+v", c)
					}
				}
			}
			if !optIn {
				return
			}
			// over 1 MiB: streamed unchanged, and the call says it was not scanned
			big := strings.Repeat("x", MaxScannedBody) + phA
			resp, _ := do(t, c, "POST", "https://api.example.com/v1/upload", strings.NewReader(big), nil)
			if resp.StatusCode != 200 {
				t.Fatalf("status %d", resp.StatusCode)
			}
			if got := e.takeSeen(); len(got) != 1 || got[0].Body != big {
				t.Fatalf("the large body was changed (%d requests)", len(got))
			}
			calls := e.rec.take()
			if len(calls) != 1 || calls[0].Replaced || !strings.Contains(calls[0].Reason, "not scanned") {
				t.Fatalf("calls %+v", calls)
			}
			e.close()
			e.assertNoValue(t, calls, "sk-body-value")
		})
	}
}

func TestInterceptUnresolvable(t *testing.T) {
	e := newEnv(t, secretsAB(false), false)
	c := e.client("api.example.com", nil)
	resp, body := do(t, c, "GET", "https://api.example.com/v1/models", nil, map[string]string{"Authorization": "Bearer " + phA})
	if resp.StatusCode != http.StatusBadGateway || !strings.Contains(body, "OPENAI_API_KEY") || !strings.Contains(body, "TEST_OPENAI is not set") {
		t.Fatalf("status %d body %q", resp.StatusCode, body)
	}
	if got := e.takeSeen(); len(got) != 0 {
		t.Fatalf("the request reached upstream: %+v", got)
	}
	calls := e.rec.take()
	if len(calls) != 1 || calls[0].Replaced || !strings.Contains(calls[0].Reason, "could not be resolved") {
		t.Fatalf("calls %+v", calls)
	}
	// a value with a line break is refused, not sent
	e.setVar("TEST_OPENAI", "sk-x\r\nX-Evil: 1")
	resp, body = do(t, c, "GET", "https://api.example.com/v1/models", nil, map[string]string{"Authorization": "Bearer " + phA})
	if resp.StatusCode != http.StatusBadGateway || strings.Contains(body, "sk-x") || len(e.takeSeen()) != 0 {
		t.Fatalf("status %d body %q", resp.StatusCode, body)
	}
	e.close()
	e.assertNoValue(t, e.rec.take(), "sk-x")
}

func basicAuth(user, pass string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+pass))
}

// git sends a token as HTTP Basic credentials: the placeholder is inside base64, in the
// password or the user name, and is swapped there.
func TestInterceptSwapsBasicCredentials(t *testing.T) {
	e := newEnv(t, secretsAB(false), false)
	e.setVar("TEST_OPENAI", "ghp-real-token-1")
	e.setVar("TEST_OTHER", "other-real-value")
	c := e.client("api.example.com", nil)

	cases := []struct{ name, sent, want string }{
		{"password", basicAuth("x-access-token", phA), basicAuth("x-access-token", "ghp-real-token-1")},
		{"user", basicAuth(phA, "x-oauth-basic"), basicAuth("ghp-real-token-1", "x-oauth-basic")},
		{"both, lower-case scheme", "basic " + base64.StdEncoding.EncodeToString([]byte(phA+":"+phA)),
			"basic " + base64.StdEncoding.EncodeToString([]byte("ghp-real-token-1:ghp-real-token-1"))},
		// OTHER_KEY does not list api.example.com: the credentials go unchanged
		{"host not listed", basicAuth("x-access-token", phB), basicAuth("x-access-token", phB)},
		{"no placeholder", basicAuth("alice", "hunter2"), basicAuth("alice", "hunter2")},
		{"not base64", "Basic !!" + phA, "Basic !!ghp-real-token-1"}, // the literal placeholder is a header swap
	}
	for _, tc := range cases {
		resp, body := do(t, c, "GET", "https://api.example.com/lab.git/info/refs?service=git-upload-pack", nil,
			map[string]string{"Authorization": tc.sent})
		if resp.StatusCode != 200 || body != "hello from upstream" {
			t.Fatalf("%s: status %d body %q", tc.name, resp.StatusCode, body)
		}
		got := e.takeSeen()
		if len(got) != 1 || got[0].Auth != tc.want {
			t.Fatalf("%s: upstream saw %+v, want Authorization %q", tc.name, got, tc.want)
		}
		calls := e.rec.take()
		switch tc.name {
		case "host not listed":
			if len(calls) != 1 || calls[0].Secret != "OTHER_KEY" || calls[0].Replaced || calls[0].Reason != "host not listed for this secret" {
				t.Fatalf("%s: calls %+v", tc.name, calls)
			}
		case "no placeholder":
			if len(calls) != 0 {
				t.Fatalf("%s: calls %+v", tc.name, calls)
			}
		default:
			if len(calls) != 1 || calls[0].Secret != "OPENAI_API_KEY" || !calls[0].Replaced || calls[0].Path != "/lab.git/info/refs" {
				t.Fatalf("%s: calls %+v", tc.name, calls)
			}
		}
	}

	// a value with ':' swapped into the user name would move the boundary: refused, not sent
	e.setVar("TEST_OPENAI", "user:injected")
	resp, body := do(t, c, "GET", "https://api.example.com/x", nil, map[string]string{"Authorization": basicAuth(phA, "pw")})
	if resp.StatusCode != http.StatusBadGateway || !strings.Contains(body, "OPENAI_API_KEY") || !strings.Contains(body, "user name") ||
		strings.Contains(body, "injected") {
		t.Fatalf("':' in the user: status %d body %q", resp.StatusCode, body)
	}
	if got := e.takeSeen(); len(got) != 0 {
		t.Fatalf("':' in the user reached upstream: %+v", got)
	}
	if calls := e.rec.take(); len(calls) != 1 || calls[0].Replaced || !strings.Contains(calls[0].Reason, "user name") {
		t.Fatalf("':' in the user: calls %+v", calls)
	}
	// ... while in the password a ':' is only data
	c = e.client("api.example.com", nil)
	resp, _ = do(t, c, "GET", "https://api.example.com/x", nil, map[string]string{"Authorization": basicAuth("x-access-token", phA)})
	if got := e.takeSeen(); resp.StatusCode != 200 || len(got) != 1 || got[0].Auth != basicAuth("x-access-token", "user:injected") {
		t.Fatalf("':' in the password: status %d seen %+v", resp.StatusCode, got)
	}
	e.rec.take()

	// a value with a line break is refused as for any header
	e.setVar("TEST_OPENAI", "tok\r\nX-Evil: 1")
	resp, body = do(t, c, "GET", "https://api.example.com/x", nil, map[string]string{"Authorization": basicAuth("x-access-token", phA)})
	if resp.StatusCode != http.StatusBadGateway || strings.Contains(body, "X-Evil") || len(e.takeSeen()) != 0 {
		t.Fatalf("line break: status %d body %q", resp.StatusCode, body)
	}
	if calls := e.rec.take(); len(calls) != 1 || calls[0].Replaced {
		t.Fatalf("line break: calls %+v", calls)
	}

	// over plain HTTP the credentials are never swapped
	p := newEnv(t, secretsAB(false), true)
	p.setVar("TEST_OPENAI", "ghp-plain")
	resp, _ = do(t, p.client("api.example.com", nil), "GET", "http://api.example.com/x", nil,
		map[string]string{"Authorization": basicAuth("x-access-token", phA)})
	if got := p.takeSeen(); resp.StatusCode != 200 || len(got) != 1 || got[0].Auth != basicAuth("x-access-token", phA) {
		t.Fatalf("plain HTTP: status %d seen %+v", resp.StatusCode, got)
	}
	if calls := p.rec.take(); len(calls) != 1 || calls[0].Replaced || !strings.Contains(calls[0].Reason, "only sent over TLS") {
		t.Fatalf("plain HTTP: calls %+v", calls)
	}
	e.close()
	p.close()
	e.assertNoValue(t, nil, "ghp-real-token-1", "injected", "tok\r")
	p.assertNoValue(t, nil, "ghp-plain")
}

func TestInterceptRefusesOtherHosts(t *testing.T) {
	e := newEnv(t, secretsAB(false), false)
	e.setVar("TEST_OPENAI", "sk-fronted")
	c := e.client("api.example.com", nil)
	// a Host header naming another host on this connection (domain fronting) is refused
	req, _ := http.NewRequest("GET", "https://api.example.com/", nil)
	req.Host = "evil.example.com"
	req.Header.Set("Authorization", phA)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMisdirectedRequest || len(e.takeSeen()) != 0 || len(e.rec.take()) != 0 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	// an SNI naming another host fails the handshake
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(e.ca.CertPEM())
	addr := e.listen("api.example.com")
	conn, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: roots, ServerName: "evil.example.com"})
	if err == nil {
		conn.Close()
		t.Fatal("a handshake with SNI evil.example.com on an api.example.com connection succeeded")
	}
}

func TestInterceptPlainHTTPNeverSwaps(t *testing.T) {
	e := newEnv(t, secretsAB(false), true)
	e.setVar("TEST_OPENAI", "sk-plain")
	c := e.client("api.example.com", nil)
	resp, _ := do(t, c, "GET", "http://api.example.com/v1", nil, map[string]string{"Authorization": phA})
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if got := e.takeSeen(); len(got) != 1 || got[0].Auth != phA {
		t.Fatalf("seen %+v", got)
	}
	if calls := e.rec.take(); len(calls) != 1 || calls[0].Replaced || !strings.Contains(calls[0].Reason, "only sent over TLS") {
		t.Fatalf("calls %+v", calls)
	}
}

func TestInterceptStreamsResponses(t *testing.T) {
	e := newEnv(t, secretsAB(false), false)
	e.setVar("TEST_OPENAI", "sk-stream")
	release := make(chan struct{})
	e.handler.Store(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: first\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		io.WriteString(w, "data: second\n\n")
	}))
	c := e.client("api.example.com", nil)
	req, _ := http.NewRequest("GET", "https://api.example.com/stream", nil)
	req.Header.Set("Authorization", phA)
	resp, err := c.Do(req)
	if err != nil {
		close(release)
		t.Fatal(err)
	}
	defer resp.Body.Close()
	first := make([]byte, len("data: first\n\n"))
	got := make(chan error, 1)
	go func() { _, err := io.ReadFull(resp.Body, first); got <- err }()
	select {
	case err := <-got:
		if err != nil || string(first) != "data: first\n\n" {
			t.Fatalf("first event %q: %v", first, err)
		}
	case <-time.After(10 * time.Second):
		close(release)
		t.Fatal("the first event did not arrive before the response ended: the body is buffered, not streamed")
	}
	close(release)
	rest, _ := io.ReadAll(resp.Body)
	if string(rest) != "data: second\n\n" {
		t.Fatalf("rest %q", rest)
	}
}

// TestInterceptStreamsWholeRecordEvents: an event exactly a TLS record long (a read that
// full puts the flush off, expecting more) still reaches the sandbox while upstream waits,
// scrubbed (chunked) and not.
func TestInterceptStreamsWholeRecordEvents(t *testing.T) {
	for _, secret := range []bool{true, false} {
		t.Run(fmt.Sprint("secret=", secret), func(t *testing.T) {
			var secrets []egress.Secret
			if secret {
				secrets = secretsAB(false)
			}
			e := newEnv(t, secrets, false)
			e.setVar("TEST_OPENAI", "sk-stream")
			event := strings.Repeat("x", 2*fullRead)
			release := make(chan struct{})
			e.handler.Store(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if !secret {
					w.Header().Set("Content-Length", fmt.Sprint(2*len(event)))
				}
				io.WriteString(w, event)
				w.(http.Flusher).Flush()
				select {
				case <-release:
				case <-r.Context().Done():
					return
				}
				io.WriteString(w, event)
			}))
			c := e.client("api.example.com", nil)
			resp, err := c.Get("https://api.example.com/stream")
			if err != nil {
				close(release)
				t.Fatal(err)
			}
			defer resp.Body.Close()
			first := make([]byte, len(event))
			got := make(chan error, 1)
			go func() { _, err := io.ReadFull(resp.Body, first); got <- err }()
			select {
			case err := <-got:
				if err != nil || string(first) != event {
					t.Fatalf("first event: %v", err)
				}
			case <-time.After(10 * time.Second):
				close(release)
				t.Fatal("the first event stayed in the proxy while upstream waited")
			}
			close(release)
			rest, _ := io.ReadAll(resp.Body)
			if string(rest) != event {
				t.Fatalf("rest: %d bytes", len(rest))
			}
		})
	}
}

func TestWants(t *testing.T) {
	i := New(Config{CA: &CA{}})
	tg := &egress.Target{Secrets: secretsAB(false)}
	for host, want := range map[string]bool{
		"api.example.com": true, "API.Example.COM.": true, "x.api.example.com": false,
		"a.other.example": true, "a.b.other.example": true, "other.example": false, "example.com": false,
	} {
		if got := i.Wants(tg, host); got != want {
			t.Errorf("Wants(%q) = %v", host, got)
		}
	}
	if i.Wants(&egress.Target{}, "api.example.com") || i.Wants(nil, "api.example.com") {
		t.Error("a target without secrets wants interception")
	}
}

func BenchmarkInterceptRequest(b *testing.B) {
	e := newEnv(b, secretsAB(false), false)
	e.setVar("TEST_OPENAI", "sk-bench")
	e.handler.Store(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer sk-bench" {
			w.WriteHeader(400)
		}
	}))
	c := e.client("api.example.com", nil)
	req, _ := http.NewRequest("GET", "https://api.example.com/v1/models", nil)
	req.Header.Set("Authorization", "Bearer "+phA)
	b.ResetTimer()
	for b.Loop() {
		resp, err := c.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			b.Fatalf("status %d", resp.StatusCode)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
	if e.accepted.Load() != 1 {
		b.Fatalf("%d connections: not kept alive", e.accepted.Load())
	}
}

var _ = errcode.InvalidArgument

// BenchmarkDirectRequest is BenchmarkInterceptRequest's baseline: the same client and upstream
// with no interceptor between them.
func BenchmarkDirectRequest(b *testing.B) {
	e := newEnv(b, secretsAB(false), false)
	e.handler.Store(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(e.upCA.CertPEM())
	addr := e.up.Listener.Addr().String()
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", addr)
		},
		TLSClientConfig: &tls.Config{RootCAs: roots},
	}
	e.trs = append(e.trs, tr)
	c := &http.Client{Transport: tr}
	req, _ := http.NewRequest("GET", "https://api.example.com/v1/models", nil)
	req.Header.Set("Authorization", "Bearer sk-bench")
	for b.Loop() {
		resp, err := c.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
}

func TestInterceptUpgradeAndHeaderBound(t *testing.T) {
	e := newEnv(t, secretsAB(false), false)
	e.setVar("TEST_OPENAI", "sk-ws")
	e.handler.Store(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "echo" || r.Header.Get("Authorization") != "Bearer sk-ws" {
			w.WriteHeader(400)
			return
		}
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n")
		line, _ := brw.ReadString('\n')
		io.WriteString(c, "echo: "+line)
	}))
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(e.ca.CertPEM())
	addr := e.listen("api.example.com")
	conn, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: roots, ServerName: "api.example.com"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(conn, "GET /realtime HTTP/1.1\r\nHost: api.example.com\r\nUpgrade: echo\r\nConnection: Upgrade\r\nAuthorization: Bearer %s\r\n\r\n", phA)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	io.WriteString(conn, "ping\n")
	if line, err := br.ReadString('\n'); err != nil || line != "echo: ping\n" {
		t.Fatalf("after the upgrade: %q %v", line, err)
	}
	if calls := e.rec.take(); len(calls) != 1 || !calls[0].Replaced || calls[0].Path != "/realtime" {
		t.Fatalf("calls %+v", calls)
	}

	// a request header over 64 KiB is refused with 431 and never reaches upstream
	c2, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: roots, ServerName: "api.example.com"})
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	c2.SetDeadline(time.Now().Add(10 * time.Second))
	go fmt.Fprintf(c2, "GET / HTTP/1.1\r\nHost: api.example.com\r\nX-Big: %s\r\n\r\n", strings.Repeat("a", MaxHeaderBytes+1024))
	resp, err = http.ReadResponse(bufio.NewReader(c2), nil)
	if err != nil || resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("big header: %v %v", resp, err)
	}
	if len(e.takeSeen()) != 0 {
		t.Fatal("the big header reached upstream")
	}
}
