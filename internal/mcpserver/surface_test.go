package mcpserver_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentbox/agentbox/internal/api"
	apiclient "github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/mcpserver"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// recorder is the service, remembering the owner and idempotency key of every create.
type recorder struct {
	*sandbox.Service
	mu     sync.Mutex
	owners []string
	keys   []string
}

func (r *recorder) Create(ctx context.Context, req sandbox.CreateRequest) (sandbox.Sandbox, error) {
	r.mu.Lock()
	r.owners = append(r.owners, sandbox.OwnerFrom(ctx))
	r.keys = append(r.keys, req.IdempotencyKey)
	r.mu.Unlock()
	return r.Service.Create(ctx, req)
}

// TestSessionsHoldTheirOwn: over streamable HTTP, each client session is an owner: the
// sandboxes it creates are recorded with it, its list holds only them, and the end of one
// session's sandbox is reported to that session, never consumed by another.
func TestSessionsHoldTheirOwn(t *testing.T) {
	svc := fakeService(t)
	rec := &recorder{Service: svc}
	srv := mcpserver.New(rec, mcpserver.Options{})
	hs := httptest.NewServer(srv.StreamableHTTPHandler(mcpserver.HTTPOptions{}))
	// After the clients' own cleanups: end the sessions (and their event streams), then the
	// HTTP server.
	t.Cleanup(func() { srv.Close(); hs.CloseClientConnections(); hs.Close() })
	dial := func() *client {
		return connectOver(t, &mcp.StreamableClientTransport{Endpoint: hs.URL}, "2025-11-25")
	}
	a, b := dial(), dial()
	var sa, sb mcpserver.SandboxInfo
	a.ok("sandbox_create", obj{"idempotency_key": "k-1"}, &sa)
	b.ok("sandbox_create", nil, &sb)
	rec.mu.Lock()
	owners, keys := slices.Clone(rec.owners), slices.Clone(rec.keys)
	rec.mu.Unlock()
	if len(owners) != 2 || !strings.HasPrefix(owners[0], "mcp-session:") || !strings.HasPrefix(owners[1], "mcp-session:") || owners[0] == owners[1] {
		t.Fatalf("owners %q: want one mcp-session: owner per session", owners)
	}
	if !slices.Equal(keys, []string{"k-1", ""}) {
		t.Fatalf("idempotency keys passed on: %q", keys)
	}
	list := func(c *client) []string {
		var l mcpserver.SandboxList
		c.ok("sandbox_list", nil, &l)
		var out []string
		for _, s := range l.Sandboxes {
			out = append(out, s.SandboxID+":"+s.State)
		}
		return out
	}
	if got := list(a); !slices.Equal(got, []string{sa.SandboxID + ":running"}) {
		t.Fatalf("a's list: %v", got)
	}
	if got := list(b); !slices.Equal(got, []string{sb.SandboxID + ":running"}) {
		t.Fatalf("b's list: %v", got)
	}
	// a's sandbox ends behind the server's back; b reads its list (and health) first.
	if _, err := svc.Destroy(context.Background(), sa.SandboxID); err != nil {
		t.Fatal(err)
	}
	var h mcpserver.HealthOut
	b.ok("health", nil, &h)
	if h.Count != 1 || h.Sandboxes[0].SandboxID != sb.SandboxID {
		t.Fatalf("b's health lists %+v", h.Sandboxes)
	}
	if got := list(a); !slices.Equal(got, []string{sa.SandboxID + ":destroyed"}) {
		t.Fatalf("a is not told its sandbox ended: %v", got)
	}
	if got := list(a); len(got) != 0 {
		t.Fatalf("a's list after the report: %v", got)
	}
}

// TestRESTBackend: over the REST API (api/client.Backend), a subscriber is notified promptly
// of a change made by someone else; env values are never echoed (REST or MCP); output that is
// not UTF-8 keeps its exact bytes.
func TestRESTBackend(t *testing.T) {
	svc := fakeService(t)
	hs := httptest.NewServer(api.New(svc, api.Options{}))
	be := apiclient.NewBackend(apiclient.New(hs.URL, ""))
	srv := mcpserver.New(be, mcpserver.Options{})
	t.Cleanup(func() { srv.Close(); hs.CloseClientConnections(); hs.Close() })
	c := connect(t, srv, protocolVersions[1])
	ctx := context.Background()

	var sb mcpserver.SandboxInfo
	res := c.call("sandbox_create", obj{"env": obj{"SECRET": "hunter2-value", "A": "b"}})
	decode(t, res, &sb)
	raw, _ := json.Marshal(res.StructuredContent)
	if res.IsError || strings.Contains(string(raw), "hunter2") || strings.Contains(text(res), "hunter2") || !slices.Equal(sb.EnvNames, []string{"A", "SECRET"}) {
		t.Fatalf("create echoes env values or lacks env_names: %s %q", raw, text(res))
	}
	get := func(path string) string {
		t.Helper()
		resp, err := http.Get(hs.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	for _, p := range []string{"/v1/sandboxes/" + sb.SandboxID, "/v1/sandboxes"} {
		if body := get(p); strings.Contains(body, "hunter2") || !strings.Contains(body, `"env_names":["A","SECRET"]`) {
			t.Fatalf("GET %s: %s", p, body)
		}
	}
	// The env still reaches commands.
	var ex mcpserver.ExecOut
	c.ok("exec", obj{"sandbox_id": sb.SandboxID, "command": []string{"sh", "-c", `printf '%s' "$SECRET"`}}, &ex)
	if ex.Stdout != "hunter2-value" {
		t.Fatalf("env inside: %+v", ex)
	}

	// Not UTF-8: text with replacement characters, and the exact bytes.
	c.ok("exec", obj{"sandbox_id": sb.SandboxID, "command": []string{"printf", `\377\376ok`}}, &ex)
	if ex.Stdout != "\uFFFD\uFFFDok" || ex.StdoutBase64 != "//5vaw==" || ex.StdoutBytes != 4 || ex.StderrBase64 != "" {
		t.Fatalf("binary output over MCP: %+v", ex)
	}
	var frames []byte
	r, err := be.Exec(ctx, sb.SandboxID, sandbox.ExecRequest{Argv: []string{"printf", `\377\376ok`}}, func(_ string, d []byte) { frames = append(frames, d...) })
	if err != nil || string(frames) != "\xff\xfeok" || string(r.StdoutRaw()) != "\xff\xfeok" || r.StdoutBase64 != "//5vaw==" {
		t.Fatalf("streamed over REST: %q %+v %v", frames, r, err)
	}

	// Subscriptions follow the event bus through a long poll.
	if err := c.cs.Subscribe(ctx, &mcp.SubscribeParams{URI: mcpserver.SandboxURI(sb.SandboxID)}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // the first long poll is waiting
	start := time.Now()
	if _, err := svc.Destroy(ctx, sb.SandboxID); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Second, "a notification over REST", func() bool { return slices.Contains(c.updates(), mcpserver.SandboxURI(sb.SandboxID)) })
	t.Logf("notified %s after the destroy", time.Since(start).Round(time.Millisecond))

	// Backend.Subscribe on its own: every event after the cursor, in order, promptly.
	evs, err := be.Events(ctx, sandbox.EventFilter{})
	if err != nil || len(evs) == 0 {
		t.Fatalf("events: %v %v", evs, err)
	}
	sctx, cancel := context.WithCancel(ctx)
	ch, err := be.Subscribe(sctx, evs[len(evs)-1].Seq)
	if err != nil {
		t.Fatal(err)
	}
	other, err := svc.Create(ctx, sandbox.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case ev := <-ch:
		if ev.SandboxID != other.ID || ev.Seq <= evs[len(evs)-1].Seq {
			t.Fatalf("first event %+v", ev)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("no event within 2s of a create")
	}
	cancel()
	for range ch { // closes when ctx ends
	}

	// The long poll itself: held until the wait passes when nothing happens; bounded.
	last, _ := be.Events(ctx, sandbox.EventFilter{})
	t0 := time.Now()
	body := get("/v1/events?after=" + itoa(last[len(last)-1].Seq) + "&wait=1s")
	if d := time.Since(t0); d < 900*time.Millisecond || body != "{\"events\":[]}\n" {
		t.Fatalf("long poll returned after %s: %s", d, body)
	}
	if body := get("/v1/events?wait=1h"); !strings.Contains(body, "INVALID_ARGUMENT") {
		t.Fatalf("wait=1h: %s", body)
	}
}

func itoa(n int64) string { b, _ := json.Marshal(n); return string(b) }
