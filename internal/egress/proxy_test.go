package egress

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/net/dns/dnsmessage"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeResolver answers from a table; a name with a func answers per call.
type fakeResolver struct {
	mu    sync.Mutex
	names map[string][]netip.Addr
	funcs map[string]func(call int) []netip.Addr
	calls map[string]int
}

func newResolver() *fakeResolver {
	return &fakeResolver{names: map[string][]netip.Addr{}, funcs: map[string]func(int) []netip.Addr{}, calls: map[string]int{}}
}

func (r *fakeResolver) set(name string, addrs ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var l []netip.Addr
	for _, a := range addrs {
		l = append(l, netip.MustParseAddr(a))
	}
	r.names[name] = l
}

func (r *fakeResolver) LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls[host]++
	if f, ok := r.funcs[host]; ok {
		return f(r.calls[host]), nil
	}
	if a, ok := r.names[host]; ok {
		return a, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

type memRecorder struct {
	mu      sync.Mutex
	conns   []Connection
	secrets []SecretCall
}

func (m *memRecorder) RecordConnection(c Connection) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.conns = append(m.conns, c)
}

func (m *memRecorder) RecordSecretCall(c SecretCall) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.secrets = append(m.secrets, c)
}

// wait returns the first n connections once recorded (fails after 5 s).
func (m *memRecorder) wait(t *testing.T, n int) []Connection {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		m.mu.Lock()
		got := append([]Connection(nil), m.conns...)
		m.mu.Unlock()
		if len(got) >= n {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("recorded %d connections, want %d: %+v", len(got), n, got)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

type env struct {
	t      *testing.T
	p      *Proxy
	res    *fakeResolver
	rec    *memRecorder
	pol    atomic.Pointer[Compiled]
	target *Target
	ctx    context.Context
}

func newEnv(t *testing.T, allow []string, mod func(*Config)) *env {
	t.Helper()
	e := &env{t: t, res: newResolver(), rec: &memRecorder{}}
	cfg := Config{Resolver: e.res, Recorder: e.rec, AllowCIDRs: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
		HostAddrs: func() []netip.Addr { return nil }, DialTimeout: 2 * time.Second}
	if mod != nil {
		mod(&cfg)
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.p = p
	e.setPolicy(Policy{Allow: allow})
	e.target = &Target{SandboxID: "sb-test", Policy: e.pol.Load}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	e.ctx = ctx
	return e
}

func (e *env) setPolicy(p Policy) {
	e.t.Helper()
	c, err := ParsePolicy(p)
	if err != nil {
		e.t.Fatal(err)
	}
	e.pol.Store(c)
}

func tcpPair(t testing.TB) (client, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ch := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		ch <- c
	}()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server = <-ch
	if server == nil {
		t.Fatal("accept failed")
	}
	return client, server
}

// start serves one stream of kind and returns the sandbox's side.
func (e *env) start(kind Kind, origDst netip.AddrPort) net.Conn {
	cl, sv := tcpPair(e.t)
	done := make(chan struct{})
	go func() {
		defer close(done)
		e.p.Serve(e.ctx, e.target, sv, kind, origDst)
	}()
	e.t.Cleanup(func() {
		cl.Close()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			e.t.Error("Serve did not return after the sandbox side closed")
		}
	})
	cl.SetDeadline(time.Now().Add(20 * time.Second))
	return cl
}

func portOf(t *testing.T, addr string) int {
	_, ps, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(ps)
	return n
}

// countingListener counts accepted connections (to prove nothing reached it).
type countingListener struct {
	net.Listener
	n atomic.Int64
}

func newCountingListener(t *testing.T) *countingListener {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cl := &countingListener{Listener: ln}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			cl.n.Add(1)
			c.Close()
		}
	}()
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	return cl
}

func connect(t *testing.T, c net.Conn, hostport string) (*http.Response, string, *bufio.Reader) {
	t.Helper()
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", hostport, hostport)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		t.Fatalf("CONNECT %s: %v", hostport, err)
	}
	var body string
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		body = string(b)
	}
	return resp, body, br
}

func TestConnectAllowedBytesFlow(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "hello from "+r.Host)
	}))
	defer srv.Close()
	port := portOf(t, srv.Listener.Addr().String())
	e := newEnv(t, []string{"web.test:" + strconv.Itoa(port)}, nil)
	e.res.set("web.test", "127.0.0.1")
	c := e.start(KindProxy, netip.AddrPort{})
	resp, body, br := connect(t, c, fmt.Sprintf("web.test:%d", port))
	if resp.StatusCode != 200 {
		t.Fatalf("CONNECT = %d %s", resp.StatusCode, body)
	}
	fmt.Fprintf(c, "GET /x HTTP/1.1\r\nHost: web.test\r\nConnection: close\r\n\r\n")
	r2, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(r2.Body)
	if string(b) != "hello from web.test" {
		t.Fatalf("body = %q", b)
	}
	c.Close()
	got := e.rec.wait(t, 1)[0]
	if got.Decision != Allowed || got.Kind != KindProxy || got.Host != "web.test" || got.Port != port ||
		got.Addr != srv.Listener.Addr().String() || got.Rule != "web.test:"+strconv.Itoa(port) || got.SandboxID != "sb-test" {
		t.Fatalf("record = %+v", got)
	}
	if got.BytesOut < 40 || got.BytesIn < int64(len("hello from web.test")) || got.Time.IsZero() {
		t.Fatalf("bytes not counted: %+v", got)
	}
}

func TestConnectRefused403NamesRuleAndFix(t *testing.T) {
	ln := newCountingListener(t)
	port := portOf(t, ln.Addr().String())
	e := newEnv(t, []string{"github.com", "*.github.com"}, nil)
	e.res.set("pypi.test", "127.0.0.1")
	c := e.start(KindProxy, netip.AddrPort{})
	resp, body, _ := connect(t, c, "pypi.test:443")
	if resp.StatusCode != 403 || resp.Header.Get("X-Agentbox-Egress-Rule") != "no allow rule matches" ||
		!strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain") {
		t.Fatalf("resp = %d %v", resp.StatusCode, resp.Header)
	}
	for _, want := range []string{"pypi.test:443 refused: no allow rule matches", "allow: [github.com, *.github.com]",
		`sandbox_network_update (MCP) with allow: [..., "pypi.test"]`, "PATCH /v1/sandboxes/{id}/network",
		"agentbox network set {id} --allow pypi.test"} {
		if !strings.Contains(body, want) {
			t.Errorf("403 body lacks %q:\n%s", want, body)
		}
	}
	// The connection stays usable: a denied-by-rule CONNECT on the same connection.
	e.setPolicy(Policy{Allow: []string{"*"}, Deny: []string{"pypi.test"}})
	resp, body, _ = connect(t, c, fmt.Sprintf("pypi.test:%d", port))
	if resp.StatusCode != 403 || resp.Header.Get("X-Agentbox-Egress-Rule") != "pypi.test" ||
		!strings.Contains(body, `denied by deny rule "pypi.test"`) || !strings.Contains(body, fmt.Sprintf("pypi.test:%d refused", port)) {
		t.Fatalf("resp = %d %v\n%s", resp.StatusCode, resp.Header, body)
	}
	recs := e.rec.wait(t, 2)
	if recs[0].Decision != Denied || recs[0].Reason != "no allow rule matches" || recs[1].Rule != "pypi.test" {
		t.Fatalf("records = %+v", recs)
	}
	if ln.n.Load() != 0 {
		t.Fatal("a refused CONNECT reached the upstream")
	}
}

func TestNeverReachableRefusedEvenWithAllowStar(t *testing.T) {
	ln := newCountingListener(t)
	port := portOf(t, ln.Addr().String())
	ps := strconv.Itoa(port)
	// No range opened; the policy allows every name and every address on the port.
	e := newEnv(t, []string{"*:" + ps, "0.0.0.0/0:" + ps, "[::/0]:" + ps}, func(c *Config) {
		c.AllowCIDRs = nil
		c.HostAddrs = func() []netip.Addr { return []netip.Addr{netip.MustParseAddr("8.8.4.4")} }
	})
	e.res.set("lo.test", "127.0.0.1")
	e.res.set("meta.test", "169.254.169.254")
	e.res.set("priv.test", "10.1.2.3")
	e.res.set("mapped.test", "::ffff:127.0.0.1")
	e.res.set("ec2v6.test", "fd00:ec2::254")
	e.res.set("mixed.test", "93.184.216.34", "127.0.0.1")
	e.res.set("self.test", "8.8.4.4")
	e.res.set("cgnat.test", "100.64.1.1")
	cases := []struct{ host, reason string }{
		{"lo.test", "lo.test resolves to 127.0.0.1 (loopback), never reachable"},
		{"meta.test", "resolves to 169.254.169.254 (cloud metadata), never reachable"},
		{"priv.test", "(private (RFC 1918))"},
		{"mapped.test", "resolves to 127.0.0.1 (loopback)"},
		{"ec2v6.test", "(cloud metadata)"},
		{"mixed.test", "resolves to 127.0.0.1 (loopback)"},
		{"self.test", "(the host's own address)"},
		{"cgnat.test", "(shared address space (CGNAT))"},
		{"127.0.0.1", "127.0.0.1 is loopback, never reachable"},
		{"[::1]", "::1 is loopback"},
		{"[::ffff:127.0.0.1]", "127.0.0.1 is loopback"},
		{"169.254.169.254", "cloud metadata"},
		{"localhost", "localhost is a localhost, never reachable"},
		{"a.localhost", "never reachable"},
		{"metadata.google.internal", "internal name"},
		{"metadata", "internal name"},
		{"printer.local", "mDNS name"},
	}
	for _, tc := range cases {
		c := e.start(KindProxy, netip.AddrPort{})
		resp, body, _ := connect(t, c, net.JoinHostPort(strings.Trim(tc.host, "[]"), ps))
		if resp.StatusCode != 403 || !strings.Contains(body, tc.reason) || !strings.Contains(body, "never reachable") {
			t.Errorf("%s: %d %q, want 403 with %q", tc.host, resp.StatusCode, body, tc.reason)
		}
		c.Close()
	}
	if ln.n.Load() != 0 {
		t.Fatalf("%d refused connections reached the listener", ln.n.Load())
	}
	// An IP literal needs a CIDR rule: allow * alone does not name it.
	e.setPolicy(Policy{Allow: []string{"*"}})
	ck := e.p.check(e.ctx, e.pol.Load(), "93.184.216.34", 443)
	if ck.ok() || !strings.Contains(ck.reason, "needs a CIDR or IP rule") {
		t.Fatalf("IP literal under allow *: %+v", ck)
	}
	// A never-reachable IP literal that no rule names is refused for its class, and the 403
	// does not tell the sandbox to add a rule that could not open it.
	c := e.start(KindProxy, netip.AddrPort{})
	defer c.Close()
	resp, body, _ := connect(t, c, "10.9.8.7:443")
	if resp.StatusCode != 403 || !strings.Contains(body, "10.9.8.7 is private (RFC 1918), never reachable") ||
		strings.Contains(body, "Allow it") || !strings.Contains(body, "never reachable from a sandbox, whatever the policy says") {
		t.Fatalf("private IP literal, no rule: %d\n%s", resp.StatusCode, body)
	}
}

// An --egress-allow-cidr range that holds one of the host's own (non-loopback) addresses does
// not open that address: the server's own ports listen there.
func TestOpenedRangeNeverOpensHostAddress(t *testing.T) {
	e := newEnv(t, []string{"10.9.0.0/16:8080", "*.test:8080"}, func(c *Config) {
		c.AllowCIDRs = []netip.Prefix{netip.MustParsePrefix("10.9.0.0/16")}
		c.HostAddrs = func() []netip.Addr { return []netip.Addr{netip.MustParseAddr("10.9.0.1")} }
	})
	e.res.set("self.test", "10.9.0.1")
	e.res.set("lab.test", "10.9.0.2")
	for _, host := range []string{"10.9.0.1", "self.test"} {
		if ck := e.p.check(e.ctx, e.pol.Load(), host, 8080); ck.ok() || !strings.Contains(ck.reason, "the host's own address") {
			t.Errorf("%s in an opened range: %+v; want refused as the host's own address", host, ck)
		}
	}
	for _, host := range []string{"10.9.0.2", "lab.test"} {
		if ck := e.p.check(e.ctx, e.pol.Load(), host, 8080); !ck.ok() {
			t.Errorf("%s in an opened range: %+v; want allowed", host, ck)
		}
	}
}

func TestRebindingResolverAnswersPublicThenPrivate(t *testing.T) {
	ln := newCountingListener(t)
	port := portOf(t, ln.Addr().String())
	e := newEnv(t, []string{"rebind.test:" + strconv.Itoa(port)}, func(c *Config) { c.AllowCIDRs = nil })
	e.res.funcs["rebind.test"] = func(call int) []netip.Addr {
		if call == 1 {
			return []netip.Addr{netip.MustParseAddr("93.184.216.34")}
		}
		return []netip.Addr{netip.MustParseAddr("127.0.0.1")}
	}
	// The sandbox's lookup sees the public address...
	d := e.start(KindDNS, netip.AddrPort{})
	rcode, addrs := dnsQuery(t, d, 7, "rebind.test.", dnsmessage.TypeA)
	if rcode != dnsmessage.RCodeSuccess || len(addrs) != 1 || addrs[0] != "93.184.216.34" {
		t.Fatalf("first lookup = %v %v", rcode, addrs)
	}
	// ...and its connection is resolved again by agentbox, checked, and refused.
	c := e.start(KindProxy, netip.AddrPort{})
	resp, body, _ := connect(t, c, fmt.Sprintf("rebind.test:%d", port))
	if resp.StatusCode != 403 || !strings.Contains(body, "resolves to 127.0.0.1 (loopback), never reachable") {
		t.Fatalf("rebound CONNECT = %d %s", resp.StatusCode, body)
	}
	if ln.n.Load() != 0 {
		t.Fatal("the rebound name reached loopback")
	}
}

func TestPlainHTTPForwardKeepAliveAndRefusal(t *testing.T) {
	var seen sync.Map
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen.Store("uri", r.RequestURI)
		seen.Store("proxy-auth", r.Header.Get("Proxy-Authorization"))
		seen.Store("x-hop", r.Header.Get("X-Hop"))
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Proxy-Secret", "x")
		fmt.Fprintf(w, "%s %s %s", r.Method, r.URL.Path, body)
	}))
	defer srv.Close()
	port := portOf(t, srv.Listener.Addr().String())
	ps := strconv.Itoa(port)
	e := newEnv(t, []string{"web.test:" + ps}, nil)
	e.res.set("web.test", "127.0.0.1")
	e.target.Secrets = []Secret{{Name: "TOKEN", Placeholder: "agentbox-secret-0123456789abcdef", Hosts: []string{"api.other.test"}}}
	c := e.start(KindProxy, netip.AddrPort{})
	br := bufio.NewReader(c)
	do := func(req string) (*http.Response, string) {
		t.Helper()
		io.WriteString(c, req)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("response: %v", err)
		}
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	resp, body := do(fmt.Sprintf("GET http://web.test:%d/a?q=1 HTTP/1.1\r\nHost: web.test:%d\r\nProxy-Authorization: Basic eA==\r\n"+
		"Connection: X-Hop\r\nX-Hop: 1\r\nAuthorization: Bearer agentbox-secret-0123456789abcdef\r\n\r\n", port, port))
	if resp.StatusCode != 200 || body != "GET /a " || resp.Header.Get("Proxy-Secret") != "" {
		t.Fatalf("first = %d %q %v", resp.StatusCode, body, resp.Header)
	}
	if u, _ := seen.Load("uri"); u != "/a?q=1" {
		t.Fatalf("upstream saw %v", u)
	}
	if a, _ := seen.Load("proxy-auth"); a != "" {
		t.Fatal("Proxy-Authorization was forwarded")
	}
	if h, _ := seen.Load("x-hop"); h != "" {
		t.Fatal("a header named by Connection was forwarded")
	}
	resp, body = do(fmt.Sprintf("POST http://web.test:%d/b HTTP/1.1\r\nHost: web.test\r\nContent-Length: 3\r\n\r\nabc", port))
	if resp.StatusCode != 200 || body != "POST /b abc" {
		t.Fatalf("second (keep-alive) = %d %q", resp.StatusCode, body)
	}
	resp, body = do("GET http://denied.test/ HTTP/1.1\r\nHost: denied.test\r\nContent-Length: 2\r\n\r\nzz")
	if resp.StatusCode != 403 || !strings.Contains(body, "denied.test:80 refused: no allow rule matches") {
		t.Fatalf("refused = %d %q", resp.StatusCode, body)
	}
	resp, body = do(fmt.Sprintf("GET http://web.test:%d/c HTTP/1.1\r\nHost: web.test\r\n\r\n", port))
	if resp.StatusCode != 200 || body != "GET /c " {
		t.Fatalf("after refusal = %d %q", resp.StatusCode, body)
	}
	// An unreachable upstream is a 502 with the reason.
	e.res.set("down.test", "127.0.0.1")
	e.setPolicy(Policy{Allow: []string{"web.test:" + ps, "down.test:1"}})
	resp, body = do("GET http://down.test:1/ HTTP/1.1\r\nHost: down.test\r\n\r\n")
	if resp.StatusCode != 502 || !strings.Contains(body, "cannot connect to down.test:1") {
		t.Fatalf("down = %d %q", resp.StatusCode, body)
	}
	// Origin-form is not a proxy request.
	resp, _ = do("GET /x HTTP/1.1\r\nHost: web.test\r\n\r\n")
	if resp.StatusCode != 400 {
		t.Fatalf("origin-form = %d", resp.StatusCode)
	}
	recs := e.rec.wait(t, 5)
	if recs[0].Decision != Allowed || recs[0].BytesIn == 0 || recs[2].Decision != Denied || recs[4].Decision != Failed {
		t.Fatalf("records = %+v", recs)
	}
	e.rec.mu.Lock()
	secrets := append([]SecretCall(nil), e.rec.secrets...)
	e.rec.mu.Unlock()
	if len(secrets) != 1 || secrets[0].Replaced || secrets[0].Reason != "host not listed for this secret" ||
		secrets[0].Secret != "TOKEN" || secrets[0].Host != "web.test" || secrets[0].Path != "/a" {
		t.Fatalf("secret calls = %+v", secrets)
	}
}

func TestPolicyChangeAppliesToNextConnection(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	defer srv.Close()
	hp := "web.test:" + strconv.Itoa(portOf(t, srv.Listener.Addr().String()))
	e := newEnv(t, nil, nil)
	e.res.set("web.test", "127.0.0.1")
	c1 := e.start(KindProxy, netip.AddrPort{})
	if resp, _, _ := connect(t, c1, hp); resp.StatusCode != 403 {
		t.Fatalf("before = %d", resp.StatusCode)
	}
	e.setPolicy(Policy{Allow: []string{hp}})
	c2 := e.start(KindProxy, netip.AddrPort{})
	if resp, body, _ := connect(t, c2, hp); resp.StatusCode != 200 {
		t.Fatalf("after = %d %s", resp.StatusCode, body)
	}
}

func TestTransparentTLS(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "tls "+r.TLS.ServerName)
	}))
	defer srv.Close()
	port := portOf(t, srv.Listener.Addr().String())
	ps := strconv.Itoa(port)
	// Where the program dialed: an address nobody serves; the name decides where it goes.
	orig := netip.MustParseAddrPort("93.184.216.34:" + ps)
	e := newEnv(t, []string{"tls.test:" + ps}, nil)
	e.res.set("tls.test", "127.0.0.1")
	e.res.set("evil.test", "127.0.0.1")
	get := func(c net.Conn, sni string) (string, error) {
		defer c.Close()
		tc := tls.Client(c, &tls.Config{ServerName: sni, InsecureSkipVerify: true})
		if err := tc.Handshake(); err != nil {
			return "", err
		}
		fmt.Fprintf(tc, "GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", sni)
		resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
		if err != nil {
			return "", err
		}
		b, err := io.ReadAll(resp.Body)
		return string(b), err
	}
	if body, err := get(e.start(KindTransparent, orig), "tls.test"); err != nil || body != "tls tls.test" {
		t.Fatalf("allowed SNI: %q %v", body, err)
	}
	if _, err := get(e.start(KindTransparent, orig), "evil.test"); err == nil {
		t.Fatal("an SNI the policy does not allow got through")
	}
	if _, err := get(e.start(KindTransparent, orig), ""); err == nil {
		t.Fatal("a ClientHello without SNI got through")
	}
	recs := e.rec.wait(t, 3)
	for i, r := range recs {
		if r.Host == "tls.test" {
			recs[0], recs[i] = recs[i], recs[0]
		}
	}
	if recs[0].Decision != Allowed || recs[0].Kind != KindTransparent || recs[0].Host != "tls.test" || recs[0].BytesIn == 0 {
		t.Fatalf("allowed record = %+v", recs[0])
	}
	var sawMismatch, sawNoSNI bool
	for _, r := range recs[1:] {
		sawMismatch = sawMismatch || r.Decision == Denied && strings.Contains(r.Reason, "TLS SNI evil.test: no allow rule matches")
		sawNoSNI = sawNoSNI || r.Decision == Denied && strings.Contains(r.Reason, "no TLS SNI, so only a CIDR rule could allow")
	}
	if !sawMismatch || !sawNoSNI {
		t.Fatalf("refusal records = %+v", recs[1:])
	}
	// Without SNI, a CIDR rule naming the original destination allows it.
	e.setPolicy(Policy{Allow: []string{"127.0.0.1/32:" + ps}})
	if body, err := get(e.start(KindTransparent, netip.MustParseAddrPort("127.0.0.1:"+ps)), ""); err != nil || body != "tls " {
		t.Fatalf("no SNI with a CIDR rule: %q %v", body, err)
	}
}

func TestTransparentHTTPHost(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "plain "+r.Host) }))
	defer srv.Close()
	ps := strconv.Itoa(portOf(t, srv.Listener.Addr().String()))
	orig := netip.MustParseAddrPort("93.184.216.34:" + ps)
	e := newEnv(t, []string{"web.test:" + ps}, nil)
	e.res.set("web.test", "127.0.0.1")
	c := e.start(KindTransparent, orig)
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: web.test\r\nConnection: close\r\n\r\n")
	b, _ := io.ReadAll(c)
	c.Close()
	if !strings.HasSuffix(string(b), "plain web.test") {
		t.Fatalf("allowed Host: %q", b)
	}
	c = e.start(KindTransparent, orig)
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: other.test\r\n\r\n")
	if b, _ := io.ReadAll(c); len(b) != 0 {
		t.Fatalf("refused Host got %q", b)
	}
	recs := e.rec.wait(t, 2)
	if recs[0].Host != "web.test" {
		recs[0], recs[1] = recs[1], recs[0]
	}
	if recs[0].Decision != Allowed || recs[0].Addr != srv.Listener.Addr().String() || recs[1].Decision != Denied ||
		!strings.Contains(recs[1].Reason, "HTTP Host other.test") {
		t.Fatalf("records = %+v", recs)
	}
}

// dnsQuery sends one framed query and returns the rcode and A answers.
func dnsQuery(t *testing.T, c net.Conn, id uint16, name string, typ dnsmessage.Type) (dnsmessage.RCode, []string) {
	t.Helper()
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: id, RecursionDesired: true})
	b.StartQuestions()
	b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(name), Type: typ, Class: dnsmessage.ClassINET})
	msg, err := b.Finish()
	if err != nil {
		t.Fatal(err)
	}
	return dnsExchange(t, c, id, msg)
}

func dnsExchange(t *testing.T, c net.Conn, id uint16, msg []byte) (dnsmessage.RCode, []string) {
	t.Helper()
	out := binary.BigEndian.AppendUint16(nil, uint16(len(msg)))
	if _, err := c.Write(append(out, msg...)); err != nil {
		t.Fatal(err)
	}
	var lb [2]byte
	if _, err := io.ReadFull(c, lb[:]); err != nil {
		t.Fatalf("reading the reply: %v", err)
	}
	reply := make([]byte, binary.BigEndian.Uint16(lb[:]))
	if _, err := io.ReadFull(c, reply); err != nil {
		t.Fatal(err)
	}
	var m dnsmessage.Message
	if err := m.Unpack(reply); err != nil {
		t.Fatal(err)
	}
	if m.Header.ID != id || !m.Header.Response {
		t.Fatalf("reply header = %+v", m.Header)
	}
	var addrs []string
	for _, a := range m.Answers {
		if ar, ok := a.Body.(*dnsmessage.AResource); ok {
			if a.Header.TTL != DNSTTL {
				t.Fatalf("TTL = %d", a.Header.TTL)
			}
			addrs = append(addrs, netip.AddrFrom4(ar.A).String())
		}
	}
	if len(m.Answers) != len(addrs) {
		t.Fatalf("non-A answers: %+v", m.Answers)
	}
	return m.Header.RCode, addrs
}

func TestDNS(t *testing.T) {
	e := newEnv(t, []string{"pypi.test", "*.github.test:443"}, func(c *Config) { c.AllowCIDRs = nil })
	e.res.set("pypi.test", "151.101.0.223", "151.101.64.223", "2a04:4e42::223")
	e.res.set("api.github.test", "140.82.112.6", "10.0.0.1")
	e.res.set("lo.github.test", "127.0.0.1")
	c := e.start(KindDNS, netip.AddrPort{})
	if rc, a := dnsQuery(t, c, 1, "PyPI.test.", dnsmessage.TypeA); rc != dnsmessage.RCodeSuccess || strings.Join(a, ",") != "151.101.0.223,151.101.64.223" {
		t.Fatalf("allowed A = %v %v", rc, a)
	}
	if rc, a := dnsQuery(t, c, 2, "api.github.test.", dnsmessage.TypeA); rc != dnsmessage.RCodeSuccess || strings.Join(a, ",") != "140.82.112.6" {
		t.Fatalf("mixed A (private filtered) = %v %v", rc, a)
	}
	if rc, _ := dnsQuery(t, c, 3, "lo.github.test.", dnsmessage.TypeA); rc != dnsmessage.RCodeRefused {
		t.Fatalf("loopback-only A = %v", rc)
	}
	if rc, _ := dnsQuery(t, c, 4, "evil.test.", dnsmessage.TypeA); rc != dnsmessage.RCodeRefused {
		t.Fatalf("denied A = %v", rc)
	}
	if rc, a := dnsQuery(t, c, 5, "pypi.test.", dnsmessage.TypeAAAA); rc != dnsmessage.RCodeSuccess || len(a) != 0 {
		t.Fatalf("AAAA = %v %v", rc, a)
	}
	if rc, _ := dnsQuery(t, c, 6, "pypi.test.", dnsmessage.TypeTXT); rc != dnsmessage.RCodeRefused {
		t.Fatalf("TXT = %v", rc)
	}
	if rc, _ := dnsQuery(t, c, 7, "localhost.", dnsmessage.TypeA); rc != dnsmessage.RCodeRefused {
		t.Fatalf("localhost = %v", rc)
	}
	// Garbage with an ID: FORMERR; the stream goes on.
	if rc, _ := dnsExchange(t, c, 0x4142, []byte("AB garbage")); rc != dnsmessage.RCodeFormatError {
		t.Fatalf("garbage = %v", rc)
	}
	if rc, _ := dnsQuery(t, c, 8, "pypi.test.", dnsmessage.TypeA); rc != dnsmessage.RCodeSuccess {
		t.Fatalf("after garbage = %v", rc)
	}
	// One byte: no ID to answer to; the stream is closed.
	c.Write([]byte{0, 1, 'x'})
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("the stream stayed open after a message without an ID")
	}
	recs := e.rec.wait(t, 8)
	if recs[0].Kind != KindDNS || recs[0].Port != 53 || recs[0].Host != "pypi.test" || recs[0].Decision != Allowed ||
		recs[0].Addr != "151.101.0.223,151.101.64.223" || recs[0].Rule != "pypi.test" {
		t.Fatalf("record = %+v", recs[0])
	}
	if recs[3].Decision != Denied || recs[3].Reason != "no allow rule matches" {
		t.Fatalf("denied record = %+v", recs[3])
	}
}

func TestServeSurvivesGarbageAndCancel(t *testing.T) {
	e := newEnv(t, []string{"*"}, nil)
	for _, kind := range []Kind{KindProxy, KindTransparent, KindDNS, "bogus"} {
		c := e.start(kind, netip.MustParseAddrPort("93.184.216.34:443"))
		c.Write([]byte("\x16\x03\x01\xff\xff garbage \r\n\r\n\x00\x00"))
		c.(*net.TCPConn).CloseWrite()
		io.Copy(io.Discard, c)
	}
	// Cancellation closes an idle stream.
	ctx, cancel := context.WithCancel(context.Background())
	cl, sv := tcpPair(t)
	defer cl.Close()
	done := make(chan struct{})
	go func() { defer close(done); e.p.Serve(ctx, e.target, sv, KindProxy, netip.AddrPort{}) }()
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Serve ignored the cancellation")
	}
	// A header larger than the bound is 431.
	c := e.start(KindProxy, netip.AddrPort{})
	go func() {
		io.WriteString(c, "GET http://a.test/ HTTP/1.1\r\nX: "+strings.Repeat("a", MaxRequestHeader+10))
	}()
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil || resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("oversized header: %v %v", resp, err)
	}
}

func TestNewRejectsBadCIDR(t *testing.T) {
	if _, err := New(Config{AllowCIDRs: []netip.Prefix{{}}}); err == nil || !strings.Contains(err.Error(), "--egress-allow-cidr[0]") {
		t.Fatalf("err = %v", err)
	}
	var re *RefusedError
	e := newEnv(t, nil, nil)
	if _, err := e.p.DialGuarded(e.ctx, e.pol.Load(), "x.test", 443); !errors.As(err, &re) || re.Reason != "no allow rule matches" {
		t.Fatalf("DialGuarded = %v", err)
	}
}

// TestPlainHTTPForwardLargeBodySpliced: a large body of known length is forwarded exactly
// (splice(2) past the header), bytes the upstream sends past it never reach the sandbox, the
// connection serves the next request, and the record counts the bytes.
func TestPlainHTTPForwardLargeBodySpliced(t *testing.T) {
	body := make([]byte, 3<<20+17)
	for i := range body {
		body[i] = byte(i * 7)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				http.ReadRequest(bufio.NewReader(c))
				fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\nX-Up: 1\r\n\r\n", len(body))
				c.Write(body)
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nextra") // past the body
			}()
		}
	}()
	port := portOf(t, ln.Addr().String())
	e := newEnv(t, []string{"big.test:" + strconv.Itoa(port)}, nil)
	e.res.set("big.test", "127.0.0.1")
	c := e.start(KindProxy, netip.AddrPort{})
	br := bufio.NewReader(c)
	for i := range 2 {
		fmt.Fprintf(c, "GET http://big.test:%d/ HTTP/1.1\r\nHost: big.test\r\n\r\n", port)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("response %d: %v", i, err)
		}
		got, err := io.ReadAll(resp.Body)
		if err != nil || resp.StatusCode != 200 || resp.Header.Get("X-Up") != "1" || resp.ContentLength != int64(len(body)) || !bytes.Equal(got, body) {
			t.Fatalf("response %d: %d, %d of %d bytes, equal %v, %v", i, resp.StatusCode, len(got), len(body), bytes.Equal(got, body), err)
		}
	}
	recs := e.rec.wait(t, 2)
	if recs[0].BytesIn < int64(len(body)) || recs[0].Decision != Allowed {
		t.Fatalf("record %+v", recs[0])
	}
}

// countingConn counts the writes to the sandbox's side.
type countingConn struct {
	net.Conn
	writes atomic.Int32
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// A small response read whole with its header reaches the sandbox in one write (not a segment
// per header part), and a body still arriving is passed on as it comes, not held in a buffer.
func TestPlainHTTPForwardOneWriteAndStreaming(t *testing.T) {
	next := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/stream" {
			io.WriteString(w, "first\n")
			w.(http.Flusher).Flush()
			select {
			case <-next:
			case <-time.After(10 * time.Second):
			}
			io.WriteString(w, "second\n")
			return
		}
		w.Header().Set("X-One", "1")
		w.Header().Set("X-Two", "2")
		io.WriteString(w, "hello\n")
	}))
	defer srv.Close()
	port := portOf(t, srv.Listener.Addr().String())
	e := newEnv(t, []string{"web.test:" + strconv.Itoa(port)}, nil)
	e.res.set("web.test", "127.0.0.1")

	cl, sv := tcpPair(t)
	defer cl.Close()
	cc := &countingConn{Conn: sv}
	done := make(chan struct{})
	go func() { defer close(done); e.p.Serve(e.ctx, e.target, cc, KindProxy, netip.AddrPort{}) }()
	defer func() { cl.Close(); <-done }()
	cl.SetDeadline(time.Now().Add(20 * time.Second))
	br := bufio.NewReader(cl)
	fmt.Fprintf(cl, "GET http://web.test:%d/hello HTTP/1.1\r\nHost: web.test:%d\r\n\r\n", port, port)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || string(b) != "hello\n" || resp.Header.Get("X-Two") != "2" {
		t.Fatalf("got %d %q %v", resp.StatusCode, b, resp.Header)
	}
	if n := cc.writes.Load(); n != 1 {
		t.Fatalf("the response took %d writes to the sandbox, want 1", n)
	}

	fmt.Fprintf(cl, "GET http://web.test:%d/stream HTTP/1.1\r\nHost: web.test:%d\r\n\r\n", port, port)
	cl.SetReadDeadline(time.Now().Add(5 * time.Second)) // the upstream holds the rest 10 s
	resp, err = http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	close(next)
	if err != nil || line != "first\n" {
		t.Fatalf("first line %q, %v", line, err)
	}
}

// bufConn keeps io.Copy's fast paths: copying from it to a TCP connection splices.
var _ io.WriterTo = (*bufConn)(nil)

// TestPeekedBytesThenUpload: bytes read before the relay starts (sent with the CONNECT before
// its 200; a transparent connection's peeked HTTP Host) reach the upstream first, then 4 MiB
// more in order, and the record counts them all.
func TestPeekedBytesThenUpload(t *testing.T) {
	const size = 4 << 20
	payload := make([]byte, size)
	for i := range payload {
		payload[i] = byte(i * 7)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // reads everything until EOF, answers with its length and SHA-256
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			h := sha256.New()
			n, _ := io.Copy(h, c)
			fmt.Fprintf(c, "%d %x", n, h.Sum(nil))
			c.Close()
		}
	}()
	defer wg.Wait()
	defer ln.Close()
	ps := strconv.Itoa(portOf(t, ln.Addr().String()))
	for _, tc := range []struct {
		name   string
		kind   Kind
		prefix string // what the upstream sees before the payload
		send   string // what the sandbox sends before the payload
	}{
		{"connect-pipelined", KindProxy, "first bytes with the CONNECT\n",
			"CONNECT web.test:" + ps + " HTTP/1.1\r\nHost: web.test:" + ps + "\r\n\r\nfirst bytes with the CONNECT\n"},
		{"transparent", KindTransparent, "POST / HTTP/1.1\r\nHost: web.test\r\n\r\n", "POST / HTTP/1.1\r\nHost: web.test\r\n\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, []string{"web.test:" + ps}, nil)
			e.res.set("web.test", "127.0.0.1")
			c := e.start(tc.kind, netip.MustParseAddrPort("93.184.216.34:"+ps))
			if _, err := io.WriteString(c, tc.send); err != nil {
				t.Fatal(err)
			}
			br := bufio.NewReader(c)
			if tc.kind == KindProxy {
				resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
				if err != nil || resp.StatusCode != 200 {
					t.Fatalf("CONNECT: %v %v", resp, err)
				}
			}
			if _, err := c.Write(payload); err != nil {
				t.Fatal(err)
			}
			c.(*net.TCPConn).CloseWrite()
			got, _ := io.ReadAll(br)
			h := sha256.New()
			io.WriteString(h, tc.prefix)
			h.Write(payload)
			want := fmt.Sprintf("%d %x", len(tc.prefix)+size, h.Sum(nil))
			if string(got) != want {
				t.Fatalf("upstream got %q, want %q", got, want)
			}
			c.Close()
			rec := e.rec.wait(t, 1)[0]
			if rec.Decision != Allowed || rec.BytesOut != int64(len(tc.prefix)+size) || rec.BytesIn != int64(len(want)) {
				t.Fatalf("record %+v; want bytes out %d, in %d", rec, len(tc.prefix)+size, len(want))
			}
		})
	}
}
