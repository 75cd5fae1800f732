package main

import (
	"context"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/mcpserver"
	"github.com/agentbox/agentbox/internal/testenv"
)

// TestMCPRelay: with `agentbox serve` running, `agentbox mcp` relays stdio to the server's /mcp.
// A sandbox created through stdio is the server's, owned by the relay's HTTP session: REST shows
// that owner, the relay's sandbox_list holds it, another /mcp session sees it but does not hold
// it. Progress, a tool error and the server's unsolicited resource updates come through; stdin's
// end ends the relay cleanly and closes the server session.
func TestMCPRelay(t *testing.T) {
	testenv.RequireRoot(t)
	dir := testenv.ShortTempDir(t, "abmcp")
	url, _ := serve(t, dir)
	rest := client.New(url, testToken)
	ctx := context.Background()
	sessionLog := regexp.MustCompile(`mcp session opened on the server"? session=(\S+)`)

	for _, v := range []string{"2025-06-18", "2026-07-28"} {
		t.Run(v, func(t *testing.T) {
			stderr := &testenv.SyncBuffer{}
			cmd := exec.Command(testenv.Binary(t), "mcp", "--state-dir", dir, "--log-level", "info")
			cmd.Env = append(os.Environ(), "AGENTBOX_TOKEN="+testToken)
			cmd.Stderr = stderr
			var mu sync.Mutex
			var progress []string
			updated := make(chan string, 64)
			c := mcp.NewClient(&mcp.Implementation{Name: "agentbox-relay-test", Version: "1"}, &mcp.ClientOptions{
				ProgressNotificationHandler: func(_ context.Context, r *mcp.ProgressNotificationClientRequest) {
					mu.Lock()
					progress = append(progress, r.Params.Message)
					mu.Unlock()
				},
				ResourceUpdatedHandler: func(_ context.Context, r *mcp.ResourceUpdatedNotificationRequest) {
					select {
					case updated <- r.Params.URI:
					default:
					}
				},
			})
			cs, err := c.Connect(ctx, &mcp.CommandTransport{Command: cmd}, &mcp.ClientSessionOptions{ProtocolVersion: v})
			if err != nil {
				t.Fatalf("connect: %v\n%s", err, stderr)
			}
			closed := false
			t.Cleanup(func() {
				if !closed {
					cs.Close()
				}
			})
			s := &session{t: t, cs: cs}

			var h mcpserver.HealthOut
			s.ok("health", nil, &h)
			if h.ControlPlane != "agentbox serve (state dir "+dir+")" {
				t.Fatalf("health through the relay: control plane %q", h.ControlPlane)
			}
			if err := cs.Subscribe(ctx, &mcp.SubscribeParams{URI: mcpserver.URISandboxes}); err != nil {
				t.Fatalf("subscribe: %v", err)
			}

			var sb mcpserver.SandboxInfo
			s.ok("sandbox_create", map[string]any{"ttl_seconds": 300}, &sb)
			id := sb.SandboxID
			got, err := rest.Get(ctx, id)
			if err != nil || got.State != "running" {
				t.Fatalf("REST does not see %s running: %+v %v", id, got, err)
			}
			var sessionID string
			if v < "2026-07-28" {
				// A session-based protocol: the relay's HTTP session is the owner.
				m := sessionLog.FindStringSubmatch(stderr.String())
				if m == nil {
					t.Fatalf("the relay did not log its session:\n%s", stderr)
				}
				sessionID = m[1]
				if got.Owner != "mcp-session:"+sessionID {
					t.Fatalf("owner %q, want the relay's session %s", got.Owner, sessionID)
				}
			} else if got.Owner == "" || strings.HasPrefix(got.Owner, "mcp-process:") {
				// Per-request protocol: the HTTP identity (the token's owner), as for any /mcp client.
				t.Fatalf("owner %q, want the token's", got.Owner)
			}
			select {
			case <-updated:
			case <-time.After(10 * time.Second):
				t.Fatal("no resource update for the create came through the relay")
			}

			var l mcpserver.SandboxList
			s.ok("sandbox_list", nil, &l)
			if l.Count != 1 || l.Sandboxes[0].SandboxID != id {
				t.Fatalf("sandbox_list through the relay: %+v", l)
			}
			// Another /mcp session on the server sees the sandbox, but holds none.
			other := open(t, &mcp.StreamableClientTransport{Endpoint: url + "/mcp", HTTPClient: authClient()}, "2025-06-18")
			var info mcpserver.SandboxInfo
			other.ok("sandbox_get", map[string]any{"sandbox_id": id}, &info)
			if info.State != "running" {
				t.Fatalf("sandbox_get over /mcp: %+v", info)
			}
			var ol mcpserver.SandboxList
			other.ok("sandbox_list", nil, &ol)
			if ol.Count != 0 {
				t.Fatalf("another session holds %+v", ol)
			}

			// Progress and a tool error pass through.
			p := &mcp.CallToolParams{Name: "exec", Arguments: map[string]any{"sandbox_id": id, "command": []string{"sh", "-c", "echo one; sleep 0.2; echo two"}}}
			p.SetProgressToken("relay-exec")
			res, err := cs.CallTool(ctx, p)
			if err != nil || res.IsError {
				t.Fatalf("exec: %v %v", res, err)
			}
			// The relay writes the notifications before the result, in order; the SDK client
			// hands notifications to their handler apart from the call's reply, so the last
			// one may be handled just after CallTool returns.
			var streamed string
			waitFor(t, "the exec's output as progress through the relay", func() bool {
				mu.Lock()
				defer mu.Unlock()
				streamed = strings.Join(progress, "")
				return len(streamed) >= len("one\ntwo\n")
			})
			if streamed != "one\ntwo\n" {
				t.Fatalf("progress through the relay: %q", streamed)
			}
			res = s.call("sandbox_get", map[string]any{"sandbox_id": "sb-000000000000"}, nil)
			if !res.IsError || !strings.Contains(textOf(res), "SANDBOX_NOT_FOUND") {
				t.Fatalf("a tool error through the relay: %+v", res)
			}
			s.ok("sandbox_destroy", map[string]any{"sandbox_id": id}, nil)

			// stdin's end: the relay exits 0 and the server session is gone.
			closed = true
			if err := cs.Close(); err != nil {
				t.Fatalf("close: %v\n%s", err, stderr)
			}
			if cmd.ProcessState == nil || !cmd.ProcessState.Success() {
				t.Fatalf("agentbox mcp exit: %v\n%s", cmd.ProcessState, stderr)
			}
			if sessionID != "" {
				req, _ := http.NewRequest(http.MethodPost, url+"/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"ping"}`))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Accept", "application/json, text/event-stream")
				req.Header.Set("Mcp-Session-Id", sessionID)
				req.Header.Set("Mcp-Protocol-Version", v)
				resp, err := authClient().Do(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if resp.StatusCode != http.StatusNotFound {
					t.Fatalf("the relay's session after stdin ended: %s, want 404 Not Found", resp.Status)
				}
			}
		})
	}
}

// textOf is a tool result's text content.
func textOf(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}
