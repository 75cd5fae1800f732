package api_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/api"
	"github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/testenv/fakecp"
)

// snapServer is the REST API over the fake control plane, with a Go client.
func snapServer(t *testing.T) (*sandbox.Service, *httptest.Server, *client.Client) {
	t.Helper()
	svc := fakecp.Service(t)
	h := api.New(svc, api.Options{Token: testToken})
	hs := httptest.NewServer(h)
	t.Cleanup(func() { h.Close(); hs.CloseClientConnections(); hs.Close() })
	return svc, hs, client.New(hs.URL, testToken)
}

// TestSnapshotRoutesValidation: the snapshot, fork and diff routes refuse bad bodies and
// numbers out of range (never clamped) with 400 INVALID_ARGUMENT naming the argument and its
// range, before the service acts; an unknown sandbox is 404.
func TestSnapshotRoutesValidation(t *testing.T) {
	_, hs, c := snapServer(t)
	sb, err := c.Create(t.Context(), sandbox.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	id := sb.ID
	for _, tc := range []struct {
		method, path, body string
		status             int
		says               []string
	}{
		{"POST", "/v1/sandboxes/" + id + "/fork", `{"count": 21}`, 400, []string{"count must be between 1 and 20", "21"}},
		{"POST", "/v1/sandboxes/" + id + "/fork", `{"count": -1}`, 400, []string{"count must be between 1 and 20"}},
		{"POST", "/v1/sandboxes/" + id + "/fork", `{"ttl_seconds": -5}`, 400, []string{"ttl_seconds"}},
		{"POST", "/v1/sandboxes/" + id + "/fork", `{"snapshot_id": "snap-x", "memory": true}`, 400, []string{"snapshot_id", "memory"}},
		{"POST", "/v1/sandboxes/" + id + "/fork", `{"count": 2, "colour": "red"}`, 400, []string{"colour"}},
		{"POST", "/v1/sandboxes/" + id + "/fork", `{"count": "2"}`, 400, []string{"count"}},
		{"POST", "/v1/sandboxes/" + id + "/snapshots", `{"memory": "yes"}`, 400, []string{"memory"}},
		{"POST", "/v1/sandboxes/" + id + "/snapshots", `{"labels": {"a": "b"}} {}`, 400, []string{"after the JSON object"}},
		{"GET", "/v1/snapshots?limit=0", "", 400, []string{"limit must be an integer between 1 and 1000"}},
		{"GET", "/v1/snapshots?limit=1001", "", 400, []string{"limit must be an integer between 1 and 1000"}},
		{"GET", "/v1/snapshots?cursor=" + strings.Repeat("x", 300), "", 400, []string{"cursor must be at most 256 bytes"}},
		{"GET", "/v1/sandboxes/" + id + "/snapshots?limit=x", "", 400, []string{"limit"}},
		{"GET", "/v1/sandboxes/sb-000000000000/snapshots", "", 404, []string{"SANDBOX_NOT_FOUND"}},
		{"GET", "/v1/sandboxes/" + id + "/diff?limit=10001", "", 400, []string{"limit must be an integer between 1 and 10000"}},
		{"GET", "/v1/sandboxes/" + id + "/diff?max_diff_bytes=0", "", 400, []string{"max_diff_bytes must be an integer between 1 and 1048576"}},
		{"GET", "/v1/sandboxes/" + id + "/diff?no_unified=perhaps", "", 400, []string{"no_unified must be true or false"}},
		{"GET", "/v1/sandboxes/" + id + "/diff?other_sandbox_id=" + id + "&snapshot_id=snap-x", "", 400, []string{"other_sandbox_id or snapshot_id"}},
		{"POST", "/v1/sandboxes/" + id + "/diff", `{"limit": -1}`, 400, []string{"limit must be between 1 and 10000"}},
		{"POST", "/v1/sandboxes/" + id + "/diff", `{"max_diff_bytes": 2000000}`, 400, []string{"max_diff_bytes must be between 1 and 1048576"}},
	} {
		req, _ := http.NewRequest(tc.method, hs.URL+tc.path, strings.NewReader(tc.body))
		req.Header.Set("Authorization", "Bearer "+testToken)
		if tc.body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.status {
			t.Errorf("%s %s %s: %d %s, want %d", tc.method, tc.path, tc.body, resp.StatusCode, body, tc.status)
			continue
		}
		for _, s := range tc.says {
			if !strings.Contains(string(body), s) {
				t.Errorf("%s %s %s: %s does not say %q", tc.method, tc.path, tc.body, body, s)
			}
		}
	}
}

// TestSnapshotRoutesUnsupported: an operation the control plane refuses is 501
// UNSUPPORTED_OPERATION with its message, on every route and through the Go client (whose
// paths are thereby checked against the routes: a wrong path would be 404 INVALID_ARGUMENT).
func TestSnapshotRoutesUnsupported(t *testing.T) {
	_, _, c := snapServer(t)
	ctx := t.Context()
	sb, err := c.Create(ctx, sandbox.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	id := sb.ID
	calls := map[string]func(context.Context) error{
		"snapshot": func(ctx context.Context) error {
			_, err := c.Snapshot(ctx, id, sandbox.SnapshotRequest{Memory: true})
			return err
		},
		"list": func(ctx context.Context) error {
			_, err := c.ListSnapshots(ctx, sandbox.SnapshotFilter{SandboxID: id, Limit: 5})
			return err
		},
		"get":    func(ctx context.Context) error { _, err := c.GetSnapshot(ctx, "snap-0123456789ab"); return err },
		"delete": func(ctx context.Context) error { return c.DeleteSnapshot(ctx, "snap-0123456789ab") },
		"fork": func(ctx context.Context) error {
			_, err := c.Fork(ctx, id, sandbox.ForkRequest{Count: 2})
			return err
		},
		"sleep": func(ctx context.Context) error { _, err := c.Sleep(ctx, id); return err },
		"wake":  func(ctx context.Context) error { _, err := c.Wake(ctx, id); return err },
		"diff": func(ctx context.Context) error {
			_, err := c.Diff(ctx, id, sandbox.DiffRequest{Limit: 10})
			return err
		},
		"create from a snapshot": func(ctx context.Context) error {
			_, err := c.Create(ctx, sandbox.CreateRequest{Snapshot: "snap-0123456789ab", AutoWake: true})
			return err
		},
	}
	for name, call := range calls {
		err := call(ctx)
		if errcode.Of(err) != errcode.UnsupportedOp || errcode.HTTPStatus(errcode.Of(err)) != http.StatusNotImplemented {
			t.Errorf("%s: %v, want UNSUPPORTED_OPERATION (501)", name, err)
		}
	}
}
