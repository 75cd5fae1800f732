package mcpserver_test

import (
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/api"
	apiclient "github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/mcpserver"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// snapshotBackends runs f against an MCP server over the control plane in process and over
// the REST API (api/client.Backend), each on the fake control plane.
func snapshotBackends(t *testing.T, f func(t *testing.T, c *client, svc *sandbox.Service)) {
	t.Run("in-process", func(t *testing.T) {
		svc := fakeService(t)
		srv := mcpserver.New(svc, mcpserver.Options{})
		t.Cleanup(srv.Close)
		f(t, connect(t, srv, protocolVersions[1]), svc)
	})
	t.Run("rest", func(t *testing.T) {
		svc := fakeService(t)
		h := api.New(svc, api.Options{})
		hs := httptest.NewServer(h)
		srv := mcpserver.New(apiclient.NewBackend(apiclient.New(hs.URL, "")), mcpserver.Options{})
		t.Cleanup(func() { srv.Close(); h.Close(); hs.CloseClientConnections(); hs.Close() })
		f(t, connect(t, srv, protocolVersions[1]), svc)
	})
}

// TestSnapshotToolsValidation: every numeric argument of the snapshot tools is checked against
// its published range and refused (never clamped) with INVALID_ARGUMENT naming it and the
// range; contradictory arguments are refused before the service is asked.
func TestSnapshotToolsValidation(t *testing.T) {
	snapshotBackends(t, func(t *testing.T, c *client, _ *sandbox.Service) {
		var sb mcpserver.SandboxInfo
		c.ok("sandbox_create", nil, &sb)
		id := sb.SandboxID
		for _, tc := range []struct {
			tool string
			args obj
			want []string // in the message
		}{
			{"sandbox_fork", obj{"sandbox_id": id, "count": 0}, []string{"count", "1"}},
			{"sandbox_fork", obj{"sandbox_id": id, "count": 21}, []string{"count", "20"}},
			{"sandbox_fork", obj{"sandbox_id": id, "count": 2.5}, []string{"count"}},
			{"sandbox_fork", obj{"sandbox_id": id, "ttl_seconds": 0}, []string{"ttl_seconds", "1"}},
			{"sandbox_fork", obj{"sandbox_id": id, "snapshot_id": "snap-x", "memory": true}, []string{"snapshot_id", "memory"}},
			{"sandbox_fork", obj{"count": 2}, []string{"sandbox_id"}},
			{"snapshot_list", obj{"limit": 0}, []string{"limit", "1"}},
			{"snapshot_list", obj{"limit": 1001}, []string{"limit", "1000"}},
			{"snapshot_delete", obj{}, []string{"snapshot_id"}},
			{"sandbox_snapshot", obj{"sandbox_id": id, "memory": "yes"}, []string{"memory"}},
			{"sandbox_snapshot", obj{"sandbox_id": id, "bogus": 1}, []string{"bogus"}},
			{"sandbox_sleep", obj{}, []string{"sandbox_id"}},
			{"sandbox_wake", obj{}, []string{"sandbox_id"}},
			{"sandbox_diff", obj{"sandbox_id": id, "limit": 10001}, []string{"limit", "10000"}},
			{"sandbox_diff", obj{"sandbox_id": id, "limit": 0}, []string{"limit"}},
			{"sandbox_diff", obj{"sandbox_id": id, "max_diff_bytes": 0}, []string{"max_diff_bytes"}},
			{"sandbox_diff", obj{"sandbox_id": id, "max_diff_bytes": 1<<20 + 1}, []string{"max_diff_bytes", "1048576"}},
			{"sandbox_diff", obj{"sandbox_id": id, "other_sandbox_id": id, "snapshot_id": "snap-x"}, []string{"other_sandbox_id", "snapshot_id"}},
		} {
			msg := c.fails(tc.tool, tc.args, "INVALID_ARGUMENT")
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("%s(%v): message %q does not name %q", tc.tool, tc.args, msg, w)
				}
			}
		}
	})
}

// TestSnapshotToolsUnsupported: while the control plane refuses an operation
// (UNSUPPORTED_OPERATION: a server or runtime that cannot), every tool passes the typed error
// through, over both Backends, with the code in structured content and text.
func TestSnapshotToolsUnsupported(t *testing.T) {
	snapshotBackends(t, func(t *testing.T, c *client, _ *sandbox.Service) {
		var sb mcpserver.SandboxInfo
		c.ok("sandbox_create", nil, &sb)
		id := sb.SandboxID
		for _, tc := range []struct {
			tool string
			args obj
		}{
			{"sandbox_snapshot", obj{"sandbox_id": id, "memory": true}},
			{"snapshot_list", obj{"sandbox_id": id}},
			{"snapshot_delete", obj{"snapshot_id": "snap-0123456789ab"}},
			{"sandbox_fork", obj{"sandbox_id": id, "count": 2}},
			{"sandbox_sleep", obj{"sandbox_id": id}},
			{"sandbox_wake", obj{"sandbox_id": id}},
			{"sandbox_diff", obj{"sandbox_id": id}},
			{"sandbox_create", obj{"snapshot": "snap-0123456789ab"}},
		} {
			if msg := c.fails(tc.tool, tc.args, "UNSUPPORTED_OPERATION"); msg == "" {
				t.Errorf("%s: no message", tc.tool)
			}
		}
	})
}
