package mcpserver_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentbox/agentbox/internal/egress"
	"github.com/agentbox/agentbox/internal/mcpserver"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/fake"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/sandbox/jobs"
	"github.com/agentbox/agentbox/internal/store/sqlite"
)

type mapResolver map[string][]netip.Addr

func (r mapResolver) LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error) {
	if a, ok := r[host]; ok {
		return a, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

// egressService is the control plane over real SQLite, the fake runtime and the real egress
// proxy. The fake's agent binds the sandbox's proxy on the test's 127.0.0.1 at proxyPort (so
// HTTP_PROXY in a command's env works: commands run on the host with the sandbox's env); the
// "internet" is an httptest server named allowed.test, opened as --egress-allow-cidr would.
func egressService(t *testing.T) (svc *sandbox.Service, upstreamPort int) {
	t.Helper()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello from upstream") }))
	t.Cleanup(up.Close)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	proxyPort := l.Addr().(*net.TCPAddr).Port
	l.Close()
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "agentbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	rt, err := fake.New(fake.Config{Name: "runc"})
	if err != nil {
		t.Fatal(err)
	}
	loop := []netip.Addr{netip.MustParseAddr("127.0.0.1")}
	svc, err = sandbox.NewService(st, []runtime.Runtime{rt}, sandbox.Config{
		PreviewURL: func(id string, port int) string { return fmt.Sprintf("http://%d-%s.localhost:8080/", port, id) },
		Egress: sandbox.EgressConfig{ProxyPort: proxyPort, DNSPort: -1,
			NewProxy: func(rec egress.Recorder) (sandbox.EgressProxy, error) {
				return egress.New(egress.Config{Recorder: rec, AllowCIDRs: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
					Resolver: mapResolver{"allowed.test": loop, "refused.test": loop}, HostAddrs: func() []netip.Addr { return nil }})
			}},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		svc.Close()
		rt.Shutdown(context.Background())
		st.Close()
	})
	return svc, up.Listener.Addr().(*net.TCPAddr).Port
}

// TestNetworkToolsEndToEnd drives the network tools through the real SDK client (which checks
// every structured result against the tool's published output schema) against a real control
// plane with the real egress proxy: create with a policy, with "none" and with bad values;
// a command in the sandbox refused and allowed through its HTTP_PROXY; sandbox_connections and
// its paging; watch's connections stream; sandbox_network_update (and CONFLICT on "none");
// sandbox_expose/unexpose; sandbox_secret_calls' paging arguments.
func TestNetworkToolsEndToEnd(t *testing.T) {
	svc, port := egressService(t)
	svj := jobs.With(svc)
	srv := mcpserver.New(svj, mcpserver.Options{})
	defer srv.Close()
	c := connect(t, srv, protocolVersions[0])
	allowed := fmt.Sprintf("allowed.test:%d", port)

	var sb struct {
		SandboxID string `json:"sandbox_id"`
		Runtime   string `json:"runtime"`
		Network   *struct {
			Allow []string `json:"allow"`
			Deny  []string `json:"deny"`
		} `json:"network"`
	}
	c.ok("sandbox_create", obj{"network": obj{"allow": []string{allowed}, "deny": []string{"evil.test"}}}, &sb)
	if sb.Network == nil || len(sb.Network.Allow) != 1 || sb.Network.Allow[0] != allowed || len(sb.Network.Deny) != 1 {
		t.Fatalf("sandbox_create with a policy: %+v", sb)
	}
	id := sb.SandboxID
	var got struct {
		Network *struct{ Allow []string } `json:"network"`
	}
	c.ok("sandbox_get", obj{"sandbox_id": id}, &got)
	if got.Network == nil || got.Network.Allow[0] != allowed {
		t.Fatalf("sandbox_get network = %+v", got.Network)
	}

	var none struct {
		SandboxID string `json:"sandbox_id"`
		Network   any    `json:"network"`
	}
	c.ok("sandbox_create", obj{"network": "none"}, &none)
	if none.Network != nil {
		t.Fatalf("a none sandbox's reply has network %v, want it absent", none.Network)
	}
	before, _ := svc.List(t.Context(), sandbox.ListFilter{})
	for _, bad := range []any{"all", obj{"allow": "pypi.org"}, obj{"allow": []string{"pypi.org"}, "extra": 1}, 42, obj{"allow": []string{"http://pypi.org/"}}} {
		if msg := c.fails("sandbox_create", obj{"network": bad}, "INVALID_ARGUMENT"); !strings.Contains(msg, "network") {
			t.Errorf("network %v: message %q does not name network", bad, msg)
		}
	}
	if msg := c.fails("sandbox_create", obj{"requirements": obj{"network": "bridge"}}, "INVALID_ARGUMENT"); !strings.Contains(msg, "network") {
		t.Errorf("requirements.network bridge: %q", msg)
	}
	if after, _ := svc.List(t.Context(), sandbox.ListFilter{}); len(after) != len(before) {
		t.Fatalf("refused creates made %d sandboxes", len(after)-len(before))
	}

	// watch's connections stream, with a progressToken, while the sandbox makes connections.
	wctx, stopWatch := context.WithCancel(t.Context())
	defer stopWatch()
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		p := &mcp.CallToolParams{Name: "watch", Arguments: obj{"sandbox_id": id, "stream": "connections", "duration_seconds": 30}}
		p.SetProgressToken("conns")
		c.cs.CallTool(wctx, p) // ended by stopWatch: its error is the cancellation
	}()
	eventually(t, 5*time.Second, "the watch to start", func() bool { return srv.Watchers() > 0 })

	curl := func(url string) string {
		var ex struct {
			Stdout string `json:"stdout"`
		}
		c.ok("exec", obj{"sandbox_id": id, "command": []string{"curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "10", url}}, &ex)
		return strings.TrimSpace(ex.Stdout)
	}
	if code := curl("http://refused.test/x"); code != "403" {
		t.Fatalf("refused GET from inside = %s, want 403", code)
	}
	if code := curl("http://" + allowed + "/"); code != "200" {
		t.Fatalf("allowed GET from inside = %s, want 200", code)
	}
	type connList struct {
		Connections []egress.Connection `json:"connections"`
		Next        int64               `json:"next"`
		Omitted     int64               `json:"omitted"`
	}
	var conns connList
	eventually(t, 5*time.Second, "2 connection records", func() bool {
		c.ok("sandbox_connections", obj{"sandbox_id": id}, &conns)
		return len(conns.Connections) == 2
	})
	r, a := conns.Connections[0], conns.Connections[1]
	if r.Host != "refused.test" || r.Decision != egress.Denied || !strings.Contains(r.Reason, "no allow rule") ||
		a.Host != "allowed.test" || a.Decision != egress.Allowed || a.BytesIn == 0 || conns.Next != a.Seq {
		t.Fatalf("sandbox_connections = %+v", conns)
	}
	var page connList
	c.ok("sandbox_connections", obj{"sandbox_id": id, "limit": 1}, &page)
	if len(page.Connections) != 1 || page.Connections[0].Seq != a.Seq || page.Omitted != 1 {
		t.Fatalf("newest 1: %+v", page)
	}
	c.ok("sandbox_connections", obj{"sandbox_id": id, "after": r.Seq}, &page)
	if len(page.Connections) != 1 || page.Connections[0].Seq != a.Seq {
		t.Fatalf("after %d: %+v", r.Seq, page)
	}
	c.fails("sandbox_connections", obj{"sandbox_id": id, "limit": 1001}, "INVALID_ARGUMENT")
	c.fails("sandbox_connections", obj{"sandbox_id": id, "after": -1}, "INVALID_ARGUMENT")
	c.fails("sandbox_connections", obj{"sandbox_id": "sb-000000000000"}, "SANDBOX_NOT_FOUND")

	eventually(t, 5*time.Second, "2 connection progress messages", func() bool {
		n := 0
		for _, m := range c.progressMessages() {
			if strings.Contains(m, id+" connection ") {
				n++
			}
		}
		return n == 2
	})
	var msgs []string
	for _, m := range c.progressMessages() {
		if strings.Contains(m, " connection ") {
			msgs = append(msgs, m)
		}
	}
	if !strings.Contains(msgs[0], "refused.test:80 denied") || !strings.Contains(msgs[1], "allowed.test") || !strings.Contains(msgs[1], "allowed") {
		t.Fatalf("watch connections progress = %q", msgs)
	}
	stopWatch()
	<-watched

	// A live change: refused.test becomes reachable, allowed.test not.
	var upd struct {
		Network struct {
			Allow []string `json:"allow"`
			Deny  []string `json:"deny"`
		} `json:"network"`
	}
	c.ok("sandbox_network_update", obj{"sandbox_id": id, "allow": []string{fmt.Sprintf("refused.test:%d", port)}}, &upd)
	if len(upd.Network.Allow) != 1 || upd.Network.Allow[0] != fmt.Sprintf("refused.test:%d", port) || len(upd.Network.Deny) != 0 {
		t.Fatalf("sandbox_network_update = %+v", upd)
	}
	if code := curl(fmt.Sprintf("http://refused.test:%d/", port)); code != "200" {
		t.Fatalf("after the update, refused.test = %s", code)
	}
	if code := curl("http://" + allowed + "/"); code != "403" {
		t.Fatalf("after the update, allowed.test = %s, want 403", code)
	}
	if msg := c.fails("sandbox_network_update", obj{"sandbox_id": none.SandboxID, "allow": []string{"pypi.org"}}, "CONFLICT"); !strings.Contains(msg, "none") {
		t.Errorf("update of a none sandbox: %q", msg)
	}
	c.fails("sandbox_network_update", obj{"sandbox_id": id, "allow": []string{"http://x/"}}, "INVALID_ARGUMENT")

	// Preview URLs.
	var ex sandbox.Exposure
	c.ok("sandbox_expose", obj{"sandbox_id": id, "port": 8000}, &ex)
	if ex.URL != fmt.Sprintf("http://8000-%s.localhost:8080/", id) || ex.Port != 8000 || ex.Public || len(ex.AccessToken) < 20 {
		t.Fatalf("sandbox_expose = %+v", ex)
	}
	var pub sandbox.Exposure
	c.ok("sandbox_expose", obj{"sandbox_id": none.SandboxID, "port": 9000, "public": true}, &pub)
	if !pub.Public || pub.AccessToken != "" || pub.URL != fmt.Sprintf("http://9000-%s.localhost:8080/", none.SandboxID) {
		t.Fatalf("public expose = %+v", pub)
	}
	c.fails("sandbox_expose", obj{"sandbox_id": id, "port": 0}, "INVALID_ARGUMENT")
	c.fails("sandbox_expose", obj{"sandbox_id": id, "port": 65536}, "INVALID_ARGUMENT")
	var un struct{ Port int }
	c.ok("sandbox_unexpose", obj{"sandbox_id": id, "port": 8000}, &un)
	if un.Port != 8000 {
		t.Fatalf("sandbox_unexpose = %+v", un)
	}
	c.fails("sandbox_unexpose", obj{"sandbox_id": id, "port": 8000}, "SANDBOX_NOT_FOUND")

	// sandbox_secret_calls: its paging arguments (no secret here: an empty page).
	var calls struct {
		Calls []egress.SecretCall `json:"calls"`
		Next  int64               `json:"next"`
	}
	c.ok("sandbox_secret_calls", obj{"sandbox_id": id, "after": 5, "limit": 10}, &calls)
	if calls.Calls == nil || len(calls.Calls) != 0 || calls.Next != 5 {
		t.Fatalf("sandbox_secret_calls = %+v", calls)
	}
	c.fails("sandbox_secret_calls", obj{"sandbox_id": id, "limit": 0.5}, "INVALID_ARGUMENT")
	c.fails("sandbox_secret_calls", obj{"sandbox_id": id, "limit": 5000}, "INVALID_ARGUMENT")
}
