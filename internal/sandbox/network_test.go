package sandbox_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/egress"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/runtime/fake"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// The network's control plane on the fake runtime: its embedded agent binds real listeners on
// 127.0.0.1 (any free port) and the real egress proxy serves them; the "internet" is an
// httptest server on loopback, opened to the proxy with AllowCIDRs as --egress-allow-cidr
// would, and named by a fake resolver.

type testResolver map[string][]netip.Addr

func (r testResolver) LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error) {
	if a, ok := r[host]; ok {
		return a, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

var loopback = []netip.Addr{netip.MustParseAddr("127.0.0.1")}

// netConfig is a service configuration with the real egress proxy.
func netConfig(sources func(string) error) sandbox.Config {
	return sandbox.Config{
		Egress: sandbox.EgressConfig{
			NewProxy: func(rec egress.Recorder) (sandbox.EgressProxy, error) {
				return egress.New(egress.Config{
					AllowCIDRs: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
					Resolver:   testResolver{"allowed.test": loopback, "other.test": loopback},
					HostAddrs:  func() []netip.Addr { return []netip.Addr{} },
					Recorder:   rec,
				})
			},
			CABundle:          []byte("-----BEGIN CERTIFICATE-----\nnot really\n-----END CERTIFICATE-----\n"),
			CheckSecretSource: sources,
			ProxyPort:         -1,
			DNSPort:           -1,
		},
		PreviewURL: func(id string, port int) string { return fmt.Sprintf("http://%d-%s.localhost:8080/", port, id) },
	}
}

func policy(allow ...string) *sandbox.Network {
	return &sandbox.Network{Policy: &egress.Policy{Allow: allow}}
}

// upstream is the test's "internet": it answers every request with "hello from upstream".
func upstream(t *testing.T) (port int) {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "hello from upstream")
	}))
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().(*net.TCPAddr).Port
}

// viaProxy sends GET http://host:port/ through the sandbox's proxy at proxyAddr, as a
// program in the sandbox that honours HTTP_PROXY does, and returns the status and body.
func viaProxy(t *testing.T, proxyAddr, host string, port int) (int, string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", proxyAddr, 5*time.Second)
	if err != nil {
		t.Fatalf("dial the sandbox's proxy %s: %v", proxyAddr, err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c, "GET http://%s:%d/ HTTP/1.1\r\nHost: %s:%d\r\nConnection: close\r\n\r\n", host, port, host, port)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("read the proxy's reply: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, string(b)
}

// connectVia sends CONNECT host:port through the proxy and returns the status.
func connectVia(t *testing.T, proxyAddr, host string, port int) int {
	t.Helper()
	c, err := net.DialTimeout("tcp", proxyAddr, 5*time.Second)
	if err != nil {
		t.Fatalf("dial the sandbox's proxy %s: %v", proxyAddr, err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c, "CONNECT %s:%d HTTP/1.1\r\nHost: %s:%d\r\n\r\n", host, port, host, port)
	resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: http.MethodConnect})
	if err != nil {
		t.Fatalf("read the proxy's reply: %v", err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

func wantCode(t *testing.T, err error, code errcode.Code, substr string) {
	t.Helper()
	if errcode.Of(err) != code {
		t.Fatalf("err = %v, want %s", err, code)
	}
	if substr != "" && !strings.Contains(errcode.Message(err), substr) {
		t.Fatalf("message %q does not say %q", errcode.Message(err), substr)
	}
}

func TestNetworkJSON(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		n    sandbox.Network
		want string
	}{
		{sandbox.Network{}, `"none"`},
		{sandbox.Network{Policy: &egress.Policy{}}, `{"allow":[],"deny":[]}`},
		{sandbox.Network{Policy: &egress.Policy{Allow: []string{"pypi.org"}}}, `{"allow":["pypi.org"],"deny":[]}`},
	} {
		b, err := json.Marshal(tc.n)
		if err != nil || string(b) != tc.want {
			t.Errorf("Marshal = %s, %v; want %s", b, err, tc.want)
		}
	}
	for in, allow := range map[string][]string{`"none"`: nil, `null`: nil, `{"allow":["a.example"]}`: {"a.example"}, `{}`: {}} {
		var n sandbox.Network
		if err := json.Unmarshal([]byte(in), &n); err != nil {
			t.Errorf("Unmarshal(%s): %v", in, err)
			continue
		}
		if (allow == nil) != (n.Policy == nil) || n.Policy != nil && (len(n.Policy.Allow) != len(allow) || n.Policy.Deny == nil) {
			t.Errorf("Unmarshal(%s) = %+v", in, n.Policy)
		}
	}
	for _, in := range []string{`"all"`, `"None"`, `42`, `["a"]`, `{"allow":["a"],"extra":1}`, `{"allow":"a"}`} {
		var n sandbox.Network
		err := json.Unmarshal([]byte(in), &n)
		if errcode.Of(err) != errcode.InvalidArgument || !strings.Contains(errcode.Message(err), `"none"`) {
			t.Errorf("Unmarshal(%s) = %v, want INVALID_ARGUMENT saying what network must be", in, err)
		}
	}
	sb := sandbox.Sandbox{ID: "sb-000000000001", Env: map[string]string{"A": "x"},
		Secrets: []egress.Secret{{Name: "TOKEN", Placeholder: "agentbox-secret-00", From: "env:TOKEN", Hosts: []string{"a.example"}}}}
	b, _ := json.Marshal(sb)
	if s := string(b); !strings.Contains(s, `"network":"none"`) || !strings.Contains(s, `"secret_names":["TOKEN"]`) ||
		strings.Contains(s, "agentbox-secret-00") || strings.Contains(s, "env:TOKEN") {
		t.Errorf("sandbox reply = %s: want network none and secret_names, no placeholder or source", s)
	}
}

func TestCreateNetworkRefusedBeforeAnything(t *testing.T) {
	t.Parallel()
	sources := func(from string) error {
		if from == "env:OPENAI_KEY" {
			return nil
		}
		return errcode.New(errcode.InvalidArgument, "%s is not allowed; start the server with --secret-env", from)
	}
	e := newFakeEnv(t, netConfig(sources))
	good := map[string]sandbox.SecretSpec{"OPENAI_API_KEY": {From: "env:OPENAI_KEY", Hosts: []string{"api.openai.com"}}}
	for _, tc := range []struct {
		name string
		req  sandbox.CreateRequest
		code errcode.Code
		says string
	}{
		{"bad policy entry", sandbox.CreateRequest{Network: policy("pypi.org", "http://x/y")}, errcode.InvalidArgument, "network.allow[1]"},
		{"secrets without network", sandbox.CreateRequest{Secrets: good}, errcode.InvalidArgument, "secrets need network: {allow: [...]}"},
		{"secrets with network none", sandbox.CreateRequest{Network: &sandbox.Network{}, Secrets: good}, errcode.InvalidArgument, "secrets need network"},
		{"env names the proxy", sandbox.CreateRequest{Network: policy(), Env: map[string]string{"HTTPS_PROXY": "x"}}, errcode.InvalidArgument, "HTTPS_PROXY"},
		{"env names the CA bundle", sandbox.CreateRequest{Network: policy(), Env: map[string]string{"SSL_CERT_FILE": "x"}}, errcode.InvalidArgument, "SSL_CERT_FILE"},
		{"secret collides with env", sandbox.CreateRequest{Network: policy(), Env: map[string]string{"OPENAI_API_KEY": "x"}, Secrets: good}, errcode.InvalidArgument, "secrets.OPENAI_API_KEY"},
		{"secret named like the proxy", sandbox.CreateRequest{Network: policy(), Secrets: map[string]sandbox.SecretSpec{"http_proxy": {From: "env:OPENAI_KEY", Hosts: []string{"a.example"}}}}, errcode.InvalidArgument, "secrets.http_proxy"},
		{"secret bad name", sandbox.CreateRequest{Network: policy(), Secrets: map[string]sandbox.SecretSpec{"1X": {From: "env:OPENAI_KEY", Hosts: []string{"a.example"}}}}, errcode.InvalidArgument, "not a valid variable name"},
		{"secret bad from", sandbox.CreateRequest{Network: policy(), Secrets: map[string]sandbox.SecretSpec{"K": {From: "http://x", Hosts: []string{"a.example"}}}}, errcode.InvalidArgument, "secrets.K.from"},
		{"secret from not allowed", sandbox.CreateRequest{Network: policy(), Secrets: map[string]sandbox.SecretSpec{"K": {From: "env:HOME", Hosts: []string{"a.example"}}}}, errcode.InvalidArgument, "--secret-env"},
		{"secret without hosts", sandbox.CreateRequest{Network: policy(), Secrets: map[string]sandbox.SecretSpec{"K": {From: "env:OPENAI_KEY"}}}, errcode.InvalidArgument, "secrets.K.hosts"},
		{"secret host with a port", sandbox.CreateRequest{Network: policy(), Secrets: map[string]sandbox.SecretSpec{"K": {From: "env:OPENAI_KEY", Hosts: []string{"a.example:443"}}}}, errcode.InvalidArgument, "secrets.K.hosts[0]"},
		{"secret host an address", sandbox.CreateRequest{Network: policy(), Secrets: map[string]sandbox.SecretSpec{"K": {From: "env:OPENAI_KEY", Hosts: []string{"10.0.0.1"}}}}, errcode.InvalidArgument, "secrets.K.hosts[0]"},
	} {
		_, err := e.svc.Create(t.Context(), tc.req)
		if errcode.Of(err) != tc.code || !strings.Contains(errcode.Message(err), tc.says) {
			t.Errorf("%s: Create = %v; want %s saying %q", tc.name, err, tc.code, tc.says)
		}
	}
	many := map[string]sandbox.SecretSpec{}
	for i := range sandbox.MaxSecrets + 1 {
		many[fmt.Sprintf("S%d", i)] = sandbox.SecretSpec{From: "env:OPENAI_KEY", Hosts: []string{"a.example"}}
	}
	if _, err := e.svc.Create(t.Context(), sandbox.CreateRequest{Network: policy(), Secrets: many}); errcode.Of(err) != errcode.InvalidArgument {
		t.Errorf("Create with %d secrets = %v, want INVALID_ARGUMENT", len(many), err)
	}
	list, err := e.svc.List(t.Context(), sandbox.ListFilter{States: []sandbox.State{sandbox.StateCreating, sandbox.StateRunning, sandbox.StateFailed, sandbox.StateDestroyed}})
	if err != nil || len(list) != 0 {
		t.Errorf("after refused creates: %d records (%v), want none", len(list), err)
	}
	if n := e.rt.Calls(fake.OpCreate) + e.rt.Calls(fake.OpRun); n != 0 {
		t.Errorf("the runtime was asked to create %d times", n)
	}
}

func TestCreateNetworkWithoutProxyUnsupported(t *testing.T) {
	t.Parallel()
	e := newFakeEnv(t, sandbox.Config{})
	_, err := e.svc.Create(t.Context(), sandbox.CreateRequest{Network: policy("pypi.org")})
	wantCode(t, err, errcode.UnsupportedOp, "network")
	sb := e.create(t, sandbox.CreateRequest{Network: &sandbox.Network{}})
	if sb.Network.Policy != nil {
		t.Errorf("network none came back as %+v", sb.Network.Policy)
	}
}

func TestEgressEndToEnd(t *testing.T) {
	t.Parallel()
	port := upstream(t)
	e := newFakeEnv(t, netConfig(func(string) error { return nil }))
	sb := e.create(t, sandbox.CreateRequest{Network: policy(fmt.Sprintf("allowed.test:%d", port)),
		Env:     map[string]string{"MINE": "1"},
		Secrets: map[string]sandbox.SecretSpec{"API_KEY": {From: "env:API_KEY_SRC", Hosts: []string{"allowed.test"}}}})
	if sb.Network.Policy == nil || len(sb.Network.Policy.Allow) != 1 || len(sb.Secrets) != 1 {
		t.Fatalf("created sandbox network = %+v, secrets = %+v", sb.Network.Policy, sb.Secrets)
	}
	placeholder := sb.Secrets[0].Placeholder
	if !strings.HasPrefix(placeholder, "agentbox-secret-") || len(placeholder) != len("agentbox-secret-")+32 {
		t.Errorf("placeholder = %q", placeholder)
	}
	// Create returned once the session was up: the proxy answers at once.
	reply, err := e.net.SessionReply(t.Context(), sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if code, body := viaProxy(t, reply.ProxyAddr, "allowed.test", port); code != 200 || body != "hello from upstream" {
		t.Errorf("allowed GET = %d %q", code, body)
	}
	code, body := viaProxy(t, reply.ProxyAddr, "other.test", port)
	if code != http.StatusForbidden || !strings.Contains(body, "other.test") || !strings.Contains(body, "allow") {
		t.Errorf("refused GET = %d %q, want 403 naming the host and the rule", code, body)
	}
	if code := connectVia(t, reply.ProxyAddr, "other.test", 443); code != http.StatusForbidden {
		t.Errorf("refused CONNECT = %d, want 403", code)
	}

	// The sandbox's commands see the proxy, the CA bundle and the placeholder, and the user's env.
	res, err := e.svc.Exec(t.Context(), sb.ID, sandbox.ExecRequest{Argv: []string{"env"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"HTTP_PROXY=http://127.0.0.1:", "https_proxy=http://127.0.0.1:", "NO_PROXY=localhost,127.0.0.1,::1",
		"SSL_CERT_FILE=/etc/agentbox/ca-bundle.pem", "NODE_EXTRA_CA_CERTS=", "GIT_SSL_CAINFO=", "REQUESTS_CA_BUNDLE=", "CURL_CA_BUNDLE=",
		"API_KEY=" + placeholder, "MINE=1"} {
		if !strings.Contains(res.Stdout, want) {
			t.Errorf("the sandbox's env lacks %q", want)
		}
	}

	// Every connection is recorded; the refused CONNECT is an event too.
	if err := e.net.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	list, err := e.net.Connections(t.Context(), sb.ID, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var allowed, denied int
	for _, c := range list.Connections {
		switch {
		case c.Decision == egress.Allowed && c.Host == "allowed.test" && c.Port == port && c.BytesIn > 0:
			allowed++
		case c.Decision == egress.Denied && c.Host == "other.test":
			denied++
		}
	}
	if allowed != 1 || denied != 2 || list.Next != list.Connections[len(list.Connections)-1].Seq {
		t.Errorf("connections = %+v: want 1 allowed, 2 denied", list)
	}
	if evs := e.eventsOf(t, sb.ID, "egress_denied"); len(evs) == 0 || !strings.Contains(evs[0].Reason, "other.test") ||
		!strings.Contains(evs[0].Reason, "sandbox_network_update") {
		t.Errorf("egress_denied events = %+v; want the host and how to allow it", evs)
	}
	// A refused connection's record says how to lift the refusal, as the 403 body does.
	for _, c := range list.Connections {
		if c.Decision == egress.Denied && !strings.Contains(c.Reason, `add "`+c.Host+`" to the policy's allow list with sandbox_network_update`) {
			t.Errorf("denied record %+v: its reason does not say how to allow it", c)
		}
	}

	// A live change applies to the next connection.
	upd, err := e.net.UpdateNetwork(t.Context(), sb.ID, egress.Policy{Allow: []string{fmt.Sprintf("other.test:%d", port)}})
	if err != nil {
		t.Fatal(err)
	}
	if upd.Version != sb.Version+1 || upd.Network.Policy.Allow[0] != fmt.Sprintf("other.test:%d", port) {
		t.Errorf("UpdateNetwork = %+v", upd)
	}
	if code, _ := viaProxy(t, reply.ProxyAddr, "other.test", port); code != 200 {
		t.Errorf("after the update, other.test = %d", code)
	}
	if code, _ := viaProxy(t, reply.ProxyAddr, "allowed.test", port); code != http.StatusForbidden {
		t.Errorf("after the update, allowed.test = %d, want 403", code)
	}
	if got, _ := e.svc.Get(t.Context(), sb.ID); got.Network.Policy == nil || got.Network.Policy.Allow[0] != fmt.Sprintf("other.test:%d", port) {
		t.Errorf("stored network = %+v", got.Network.Policy)
	}
	if evs := e.eventsOf(t, sb.ID, "network_updated"); len(evs) != 1 {
		t.Errorf("network_updated events = %+v", evs)
	}

	// A restarted server reopens the session (the agent kept its listeners) with the stored policy.
	e.restart(t)
	again, err := e.net.SessionReply(t.Context(), sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if again.ProxyAddr != reply.ProxyAddr {
		t.Errorf("after restart the proxy is at %s, was %s", again.ProxyAddr, reply.ProxyAddr)
	}
	if code, _ := viaProxy(t, again.ProxyAddr, "other.test", port); code != 200 {
		t.Errorf("after restart, other.test = %d", code)
	}
	if code, _ := viaProxy(t, again.ProxyAddr, "allowed.test", port); code != http.StatusForbidden {
		t.Errorf("after restart, allowed.test = %d, want 403", code)
	}

	// Destroy ends the session.
	if _, err := e.svc.Destroy(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := e.net.SessionReply(t.Context(), sb.ID); errcode.Of(err) != errcode.SandboxNotRunning {
		t.Errorf("after destroy NetSessionReply = %v", err)
	}
	_, err = e.net.UpdateNetwork(t.Context(), sb.ID, egress.Policy{})
	wantCode(t, err, errcode.SandboxNotRunning, "")
}

func TestUpdateNetworkRefusals(t *testing.T) {
	t.Parallel()
	e := newFakeEnv(t, netConfig(nil))
	none := e.create(t, sandbox.CreateRequest{})
	_, err := e.net.UpdateNetwork(t.Context(), none.ID, egress.Policy{Allow: []string{"pypi.org"}})
	wantCode(t, err, errcode.Conflict, "created with network none; create it with a network policy, e.g. network: {allow: []}")
	sb := e.create(t, sandbox.CreateRequest{Network: policy()})
	_, err = e.net.UpdateNetwork(t.Context(), sb.ID, egress.Policy{Allow: []string{"ok.example", "http://bad/"}})
	wantCode(t, err, errcode.InvalidArgument, "allow[1]")
	if got, _ := e.svc.Get(t.Context(), sb.ID); got.Version != sb.Version {
		t.Errorf("a refused update changed the record: version %d → %d", sb.Version, got.Version)
	}
	_, err = e.net.UpdateNetwork(t.Context(), "sb-nope", egress.Policy{})
	wantCode(t, err, errcode.InvalidArgument, "sandbox_id")
	_, err = e.net.UpdateNetwork(t.Context(), "sb-0123456789ab", egress.Policy{})
	wantCode(t, err, errcode.SandboxNotFound, "")
}

func TestCreateFailsWhenSessionCannotOpen(t *testing.T) {
	t.Parallel()
	cfg := netConfig(nil)
	// A port taken on the (shared) loopback: the agent cannot bind it, so the session fails.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	cfg.Egress.ProxyPort = l.Addr().(*net.TCPAddr).Port
	e := newFakeEnv(t, cfg)
	_, err = e.svc.Create(t.Context(), sandbox.CreateRequest{Network: policy()})
	if errcode.Of(err) != errcode.RuntimeUnavailable || !strings.Contains(errcode.Message(err), "network session") {
		t.Fatalf("Create = %v, want RUNTIME_UNAVAILABLE about the network session", err)
	}
	list, _ := e.svc.List(t.Context(), sandbox.ListFilter{States: []sandbox.State{sandbox.StateFailed}})
	if len(list) != 1 {
		t.Fatalf("failed records = %d, want 1", len(list))
	}
	if res := e.rt.Resources(); len(res) != 0 {
		t.Errorf("the failed create left %v", res)
	}
}

func TestNetRecordsPagingAndEvents(t *testing.T) {
	t.Parallel()
	e := newFakeEnv(t, netConfig(nil))
	sb := e.create(t, sandbox.CreateRequest{Network: policy()})
	if _, err := e.net.SessionReply(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	const n = 250
	for i := range n {
		c := egress.Connection{SandboxID: sb.ID, Kind: egress.KindProxy, Host: fmt.Sprintf("h%d.example", i), Port: 443,
			Decision: egress.Denied, Rule: "no allow rule matches", Reason: "not allowed"}
		e.net.RecordConnection(c)
		e.net.RecordSecretCall(egress.SecretCall{SandboxID: sb.ID, Secret: "K", Host: c.Host, Method: "GET", Path: "/", Replaced: i%2 == 0})
	}
	// DNS refusals are records only, never events.
	e.net.RecordConnection(egress.Connection{SandboxID: sb.ID, Kind: egress.KindDNS, Host: "x.example", Decision: egress.Denied})
	if err := e.net.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	page, err := e.net.Connections(t.Context(), sb.ID, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Connections) != sandbox.DefaultNetList || page.Omitted != n+1-sandbox.DefaultNetList {
		t.Fatalf("newest page: %d records, omitted %d", len(page.Connections), page.Omitted)
	}
	for i := 1; i < len(page.Connections); i++ {
		if page.Connections[i].Seq <= page.Connections[i-1].Seq {
			t.Fatalf("page not ascending at %d", i)
		}
	}
	if last := page.Connections[len(page.Connections)-1]; last.Kind != egress.KindDNS || page.Next != last.Seq {
		t.Errorf("the newest record is %+v, next %d", last, page.Next)
	}
	// Paging by cursor from the first record on sees every later record once (after 0 is no
	// cursor: the newest page).
	seen, after := 0, int64(0)
	first, err := e.net.Connections(t.Context(), sb.ID, 0, 1000)
	if err != nil || len(first.Connections) != n+1 || first.Omitted != 0 {
		t.Fatalf("limit 1000: %d records, omitted %d, %v", len(first.Connections), first.Omitted, err)
	}
	after = first.Connections[0].Seq
	for {
		p, err := e.net.Connections(t.Context(), sb.ID, after, 64)
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Connections) == 0 {
			if p.Next != after {
				t.Errorf("an empty page's next = %d, want %d", p.Next, after)
			}
			break
		}
		seen += len(p.Connections)
		after = p.Next
	}
	if seen != n {
		t.Errorf("paging by cursor saw %d records, want %d", seen, n)
	}
	calls, err := e.net.SecretCalls(t.Context(), sb.ID, 0, 10)
	if err != nil || len(calls.Calls) != 10 || calls.Omitted != n-10 || calls.Calls[9].Host != fmt.Sprintf("h%d.example", n-1) {
		t.Errorf("secret calls page = %+v, %v", calls, err)
	}
	// The clock does not move: 250 refusals in one second are 5 events.
	if evs := e.eventsOf(t, sb.ID, "egress_denied"); len(evs) != 5 {
		t.Errorf("egress_denied events = %d, want 5 (rate-limited)", len(evs))
	}
	e.clock.Add(time.Second)
	e.net.RecordConnection(egress.Connection{SandboxID: sb.ID, Kind: egress.KindTransparent, Host: "late.example", Port: 443, Decision: egress.Denied})
	e.net.Flush(t.Context())
	if evs := e.eventsOf(t, sb.ID, "egress_denied"); len(evs) != 6 || !strings.Contains(evs[5].Reason, "late.example:443") {
		t.Errorf("a second later: egress_denied events = %+v", evs)
	}

	for _, tc := range []struct {
		after int64
		limit int
	}{{-1, 10}, {0, -1}, {0, 1001}} {
		_, err := e.net.Connections(t.Context(), sb.ID, tc.after, tc.limit)
		wantCode(t, err, errcode.InvalidArgument, "")
		_, err = e.net.SecretCalls(t.Context(), sb.ID, tc.after, tc.limit)
		wantCode(t, err, errcode.InvalidArgument, "")
	}
	_, err = e.net.Connections(t.Context(), "sb-0123456789ab", 0, 0)
	wantCode(t, err, errcode.SandboxNotFound, "")
}

// TestEgressRunc is the control plane's path on a real runc sandbox: the create opens the
// session, commands reach an allowed host by name through HTTP_PROXY (curl, unchanged), a
// refused one gets the 403, and nothing of the host's network is reachable directly.
func TestEgressRunc(t *testing.T) {
	cfg := netConfig(nil)
	cfg.Egress.ProxyPort, cfg.Egress.DNSPort = 0, 0 // 3128 and 53 in the sandbox's own netns
	e := newEnv(t, cfg)
	port := upstream(t)
	sb, err := e.svc.Create(t.Context(), sandbox.CreateRequest{Network: policy(fmt.Sprintf("allowed.test:%d", port))})
	if err != nil {
		t.Fatal(err)
	}
	run := func(argv ...string) sandbox.ExecResult {
		t.Helper()
		res, err := e.svc.Exec(t.Context(), sb.ID, sandbox.ExecRequest{Argv: argv, Timeout: 30 * time.Second}, nil)
		if err != nil {
			t.Fatalf("%v: %v", argv, err)
		}
		return res
	}
	if res := run("curl", "-sS", "--max-time", "10", fmt.Sprintf("http://allowed.test:%d/", port)); res.ExitCode != 0 || res.Stdout != "hello from upstream" {
		t.Errorf("curl to the allowed host: exit %d, %q %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	res := run("curl", "-sS", "--max-time", "10", fmt.Sprintf("http://other.test:%d/", port))
	if !strings.Contains(res.Stdout, "other.test") || !strings.Contains(res.Stdout, "refused") {
		t.Errorf("curl to a refused host: exit %d, %q %q; want the proxy's 403 body", res.ExitCode, res.Stdout, res.Stderr)
	}
	if res := run("curl", "-sS", "--noproxy", "*", "--max-time", "5", fmt.Sprintf("http://127.0.0.1:%d/", port)); res.ExitCode == 0 {
		t.Errorf("the host's loopback was reachable without the proxy: %q", res.Stdout)
	}
	if err := e.net.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	list, err := e.net.Connections(t.Context(), sb.ID, 0, 0)
	if err != nil || len(list.Connections) < 2 {
		t.Errorf("connections = %+v, %v", list, err)
	}
}

// TestRefusalRecordedBeforeItArrives: a refused request's connection record is in the store
// by the time the refusal reaches the sandbox — read at once, with no flush, it is there (for a
// plain request and a CONNECT alike).
func TestRefusalRecordedBeforeItArrives(t *testing.T) {
	t.Parallel()
	e := newFakeEnv(t, netConfig(nil))
	sb := e.create(t, sandbox.CreateRequest{Network: policy("allowed.test")})
	reply, err := e.net.SessionReply(t.Context(), sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	for i, refused := range []func() int{
		func() int { code, _ := viaProxy(t, reply.ProxyAddr, "refused-get.test", 80); return code },
		func() int { return connectVia(t, reply.ProxyAddr, "refused-connect.test", 443) },
	} {
		if code := refused(); code != http.StatusForbidden {
			t.Fatalf("refusal %d: HTTP %d, want 403", i, code)
		}
		list, err := e.net.Connections(t.Context(), sb.ID, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		if denied := countDenied(list.Connections); denied != i+1 {
			t.Fatalf("right after refusal %d the records show %d refusals: %+v", i, denied, list.Connections)
		}
	}
}

func countDenied(cs []egress.Connection) int {
	n := 0
	for _, c := range cs {
		if c.Decision == egress.Denied {
			n++
		}
	}
	return n
}
