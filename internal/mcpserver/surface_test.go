package mcpserver_test

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentbox/agentbox/internal/mcpserver"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/sandbox/jobs"
)

// recorder is the service, remembering the owner and idempotency key of every create.
type recorder struct {
	jobs.Sandboxes
	mu     sync.Mutex
	owners []string
	keys   []string
}

func (r *recorder) Create(ctx context.Context, req sandbox.CreateRequest) (sandbox.Sandbox, error) {
	r.mu.Lock()
	r.owners = append(r.owners, sandbox.OwnerFrom(ctx))
	r.keys = append(r.keys, req.IdempotencyKey)
	r.mu.Unlock()
	return r.Sandboxes.Create(ctx, req)
}

// TestSessionsHoldTheirOwn: over streamable HTTP, each client session is an owner: the
// sandboxes it creates are recorded with it, its list holds only them, and the end of one
// session's sandbox is reported to that session, never consumed by another.
func TestSessionsHoldTheirOwn(t *testing.T) {
	svc := fakeService(t)
	rec := &recorder{Sandboxes: svc}
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

func itoa(n int64) string { b, _ := json.Marshal(n); return string(b) }
