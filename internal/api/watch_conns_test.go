package api_test

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

	"github.com/agentbox/agentbox/internal/api"
	"github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/egress"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/fake"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/store/sqlite"
	"github.com/agentbox/agentbox/internal/watch"
	"github.com/agentbox/agentbox/internal/wire"
)

type mapResolver map[string][]netip.Addr

func (r mapResolver) LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error) {
	if a, ok := r[host]; ok {
		return a, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

// freePort returns a loopback port free a moment ago (the fake runtime's agent binds the
// sandbox's proxy there, on the test's host, so HTTP_PROXY in the sandbox's env names it).
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// egressServer is a REST server over a service with the real egress proxy: the "internet" is
// an httptest server on loopback named allowed.test (opened as --egress-allow-cidr would).
type egressServer struct {
	svc          *sandbox.Service
	c            *client.Client
	upstreamPort int
}

func newEgressServer(t *testing.T) *egressServer {
	t.Helper()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello from upstream") }))
	t.Cleanup(up.Close)
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "agentbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	rt, err := fake.New(fake.Config{Name: "runc"})
	if err != nil {
		t.Fatal(err)
	}
	loop := []netip.Addr{netip.MustParseAddr("127.0.0.1")}
	svc, err := sandbox.NewService(st, []runtime.Runtime{rt}, sandbox.Config{
		Egress: sandbox.EgressConfig{ProxyPort: freePort(t), DNSPort: -1,
			NewProxy: func(rec egress.Recorder) (sandbox.EgressProxy, error) {
				return egress.New(egress.Config{Recorder: rec, AllowCIDRs: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
					Resolver: mapResolver{"allowed.test": loop, "refused.test": loop}, HostAddrs: func() []netip.Addr { return nil }})
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
	return &egressServer{svc: svc, c: client.New(hs.URL, testToken), upstreamPort: up.Listener.Addr().(*net.TCPAddr).Port}
}

// curl runs curl inside the sandbox (the fake runtime runs it on the host with the sandbox's
// env: HTTP_PROXY names its proxy) and returns the HTTP status it got.
func curl(t *testing.T, svc *sandbox.Service, id, url string) string {
	t.Helper()
	res, err := svc.Exec(t.Context(), id, sandbox.ExecRequest{Argv: []string{"curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "10", url}}, nil)
	if err != nil {
		t.Fatalf("exec curl %s: %v", url, err)
	}
	return strings.TrimSpace(res.Stdout)
}

// TestWatchConnectionsSSE: over real HTTP, a connections stream delivers each connection the
// sandbox makes through the real egress proxy (allowed and refused), once, in order, with the
// record's seq as the SSE id; it ends when the sandbox is destroyed, and a stream resumed with
// Last-Event-ID delivers the records after it.
func TestWatchConnectionsSSE(t *testing.T) {
	e := newEgressServer(t)
	allowed := fmt.Sprintf("allowed.test:%d", e.upstreamPort)
	sb, err := e.c.Create(t.Context(), wire.CreateRequest{Network: &wire.Network{Policy: &wire.Policy{Allow: []string{allowed}}}})
	if err != nil {
		t.Fatal(err)
	}
	// A connection before the watch starts is not part of it.
	if code := curl(t, e.svc, sb.ID, "http://refused.test/before"); code != "403" {
		t.Fatalf("refused GET before the watch = %s, want 403", code)
	}
	waitFor(t, 5*time.Second, "the first record", func() bool {
		l, err := e.c.Connections(t.Context(), sb.ID, 0, 10)
		return err == nil && len(l.Connections) == 1
	})

	c := startWatch(t.Context(), e.c, sb.ID, client.WatchOptions{Stream: watch.StreamConnections, DurationSeconds: 60})
	<-c.open
	if code := curl(t, e.svc, sb.ID, "http://"+allowed+"/"); code != "200" {
		t.Fatalf("allowed GET = %s, want 200", code)
	}
	if code := curl(t, e.svc, sb.ID, "http://refused.test/"); code != "403" {
		t.Fatalf("refused GET = %s, want 403", code)
	}
	conns := func() []wire.WatchMessage {
		var out []wire.WatchMessage
		for _, m := range c.get() {
			if m.Kind == wire.WatchConnection {
				out = append(out, m)
			}
		}
		return out
	}
	waitFor(t, 10*time.Second, "2 connection frames", func() bool { return len(conns()) >= 2 })
	got := conns()
	if len(got) != 2 {
		t.Fatalf("frames %+v, want exactly 2 (the one before the watch is not sent)", got)
	}
	a, r := got[0].Connection, got[1].Connection
	if a == nil || r == nil || a.Host != "allowed.test" || a.Decision != egress.Allowed || a.BytesIn == 0 ||
		r.Host != "refused.test" || r.Decision != egress.Denied || r.Reason == "" || got[0].Seq != a.Seq || got[1].Seq <= got[0].Seq {
		t.Fatalf("frames = %+v / %+v: want allowed.test allowed then refused.test denied, seqs increasing", a, r)
	}
	if _, err := e.c.Destroy(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	select {
	case <-c.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the connections watch did not end when the sandbox was destroyed")
	}
	msgs := c.get()
	if c.err != nil || msgs[len(msgs)-1].Kind != wire.WatchEnd || msgs[len(msgs)-1].Reason != watch.EndSandbox || c.last != got[1].Seq {
		t.Fatalf("end: err %v, last id %d, messages %+v", c.err, c.last, msgs)
	}
	// Resumed after the first frame: the second, then the end.
	var resumed []string
	if _, err := e.c.Watch(t.Context(), sb.ID, client.WatchOptions{Stream: watch.StreamConnections, LastEventID: got[0].Seq}, func(m wire.WatchMessage) error {
		resumed = append(resumed, fmt.Sprintf("%s:%d", m.Kind, m.Seq))
		return nil
	}); err != nil || len(resumed) != 2 || resumed[0] != fmt.Sprintf("connection:%d", got[1].Seq) || !strings.HasPrefix(resumed[1], "end") {
		t.Fatalf("resumed: %v %v", resumed, err)
	}
	// A cursor past the newest record is refused before the stream starts.
	_, err = e.c.Watch(t.Context(), sb.ID, client.WatchOptions{Stream: watch.StreamConnections, LastEventID: got[1].Seq + 1000}, func(wire.WatchMessage) error { return nil })
	if !errcode.Is(err, errcode.InvalidArgument) {
		t.Fatalf("resume past the newest record: %v, want INVALID_ARGUMENT", err)
	}
}
