package api_test

import (
	"context"
	"encoding/json"
	"fmt"
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
	"github.com/agentbox/agentbox/internal/wire"
)

// snapServer is the REST API over the fake control plane (no snapshot directory: snapshots
// are UNSUPPORTED_OPERATION), with a Go client.
func snapServer(t *testing.T) (*sandbox.Service, *httptest.Server, *client.Client) {
	return snapServerWith(t, sandbox.Config{})
}

// snapServerWith is snapServer with cfg (SnapshotDir: snapshots on the fake runtime).
func snapServerWith(t *testing.T, cfg sandbox.Config) (*sandbox.Service, *httptest.Server, *client.Client) {
	t.Helper()
	svc := fakecp.New(t, cfg).Service
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
	sb, err := c.Create(t.Context(), wire.CreateRequest{})
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

// TestSnapshotRoutesUnsupported: on a server that keeps no snapshots (no snapshot directory)
// every snapshot operation is 501 UNSUPPORTED_OPERATION with its message, on every route and
// through the Go client (whose paths are thereby checked against the routes: a wrong path
// would be 404 INVALID_ARGUMENT).
func TestSnapshotRoutesUnsupported(t *testing.T) {
	_, _, c := snapServer(t)
	ctx := t.Context()
	sb, err := c.Create(ctx, wire.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	id := sb.ID
	calls := map[string]func(context.Context) error{
		"snapshot": func(ctx context.Context) error {
			_, err := c.Snapshot(ctx, id, wire.SnapshotRequest{Memory: true})
			return err
		},
		"list": func(ctx context.Context) error {
			_, err := c.ListSnapshots(ctx, wire.SnapshotFilter{SandboxID: id, Limit: 5})
			return err
		},
		"get":    func(ctx context.Context) error { _, err := c.GetSnapshot(ctx, "snap-0123456789ab"); return err },
		"delete": func(ctx context.Context) error { return c.DeleteSnapshot(ctx, "snap-0123456789ab") },
		"fork": func(ctx context.Context) error {
			_, err := c.Fork(ctx, id, wire.ForkRequest{Count: 2})
			return err
		},
		"sleep": func(ctx context.Context) error { _, err := c.Sleep(ctx, id); return err },
		"create from a snapshot": func(ctx context.Context) error {
			_, err := c.Create(ctx, wire.CreateRequest{Snapshot: "snap-0123456789ab", AutoWake: true})
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

// TestSnapshotForkDiffREST drives the real control plane on the fake runtime through the REST
// API and its Go client: exec with changes and checkpoint, snapshot (201, kind files), list
// (paged with next_cursor), get, fork into two (independent files), diff against the snapshot,
// another sandbox and the image, delete, and SNAPSHOT_NOT_FOUND (404) after.
func TestSnapshotForkDiffREST(t *testing.T) {
	_, hs, c := snapServerWith(t, sandbox.Config{SnapshotDir: t.TempDir()})
	ctx := t.Context()
	sb, err := c.Create(ctx, wire.CreateRequest{Labels: map[string]string{"src": "yes"}})
	if err != nil {
		t.Fatal(err)
	}
	id := sb.ID
	sh := func(id, script string, changes, checkpoint bool) wire.ExecResult {
		t.Helper()
		res, err := c.Exec(ctx, id, wire.ExecRequest{Command: []string{"sh", "-c", script}, Changes: changes, Checkpoint: checkpoint}, nil)
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("exec %q in %s: %+v %v", script, id, res, err)
		}
		return res
	}
	res := sh(id, "echo one > a.txt && printf 'x\\000y' > bin", true, true)
	if len(res.Changes) != 2 || res.Changes[0].Path != "/workspace/a.txt" || res.Changes[0].Change != sandbox.ChangeAdded || res.SnapshotID == "" {
		t.Fatalf("exec changes/checkpoint: %+v", res)
	}
	// An explicit snapshot, with labels; the body is optional.
	snap, err := c.Snapshot(ctx, id, wire.SnapshotRequest{Labels: map[string]string{"at": "one"}})
	if err != nil || snap.Kind != "files" || snap.State != wire.SnapshotReady || snap.SandboxID != id || snap.Labels["at"] != "one" {
		t.Fatalf("snapshot: %+v %v", snap, err)
	}
	// Memory on a runtime without it: refused with the reason, never a files-only snapshot.
	if _, err := c.Snapshot(ctx, id, wire.SnapshotRequest{Memory: true}); errcode.Of(err) != errcode.UnsupportedOp {
		t.Fatalf("memory snapshot on the fake: %v, want UNSUPPORTED_OPERATION", err)
	}
	// Pages: two snapshots of this sandbox (the checkpoint and this one), one per page.
	p1, err := c.ListSnapshots(ctx, wire.SnapshotFilter{SandboxID: id, Limit: 1})
	if err != nil || p1.Count != 1 || p1.NextCursor == "" {
		t.Fatalf("page 1: %+v %v", p1, err)
	}
	p2, err := c.ListSnapshots(ctx, wire.SnapshotFilter{SandboxID: id, Limit: 1, After: p1.NextCursor})
	if err != nil || p2.Count != 1 || p2.Snapshots[0].ID == p1.Snapshots[0].ID {
		t.Fatalf("page 2: %+v %v", p2, err)
	}
	var viaSandbox api.SnapshotList
	if err := getJSON(hs.URL+"/v1/sandboxes/"+id+"/snapshots", &viaSandbox); err != nil || viaSandbox.Count != 2 {
		t.Fatalf("GET /v1/sandboxes/{id}/snapshots: %+v %v", viaSandbox, err)
	}
	if got, err := c.GetSnapshot(ctx, snap.ID); err != nil || got.ID != snap.ID {
		t.Fatalf("get: %+v %v", got, err)
	}

	sh(id, "echo two > a.txt && rm bin && echo new > c.txt", false, false) // after the snapshot
	fr, err := c.Fork(ctx, id, wire.ForkRequest{Count: 2, SnapshotID: snap.ID, Labels: map[string]string{"fork": "1"}})
	if err != nil || len(fr.Sandboxes) != 2 || fr.SnapshotID != snap.ID || fr.Kind != "files" {
		t.Fatalf("fork: %+v %v", fr, err)
	}
	f1, f2 := fr.Sandboxes[0], fr.Sandboxes[1]
	if f1.ID == f2.ID || f1.FromSnapshot != snap.ID || f1.State != wire.StateRunning || f1.Labels["src"] != "yes" || f1.Labels["fork"] != "1" {
		t.Fatalf("forks: %+v", fr.Sandboxes)
	}
	if out := sh(f1.ID, "cat a.txt", false, false); out.Stdout != "one\n" {
		t.Fatalf("fork's a.txt %q, want the snapshot's", out.Stdout)
	}
	sh(f1.ID, "echo f1 > a.txt", false, false)
	if out := sh(f2.ID, "cat a.txt", false, false); out.Stdout != "one\n" {
		t.Fatalf("a write in one fork shows in the other: %q", out.Stdout)
	}

	// The source against its snapshot: a.txt modified, bin deleted, c.txt added; paged.
	d, err := c.Diff(ctx, id, wire.DiffRequest{SnapshotID: snap.ID})
	if err != nil || d.Against != "snapshot:"+snap.ID {
		t.Fatalf("diff: %+v %v", d, err)
	}
	got := map[string]string{}
	for _, ch := range d.Changes {
		got[ch.Path] = ch.Change
	}
	if got["/workspace/a.txt"] != sandbox.ChangeModified || got["/workspace/bin"] != sandbox.ChangeDeleted || got["/workspace/c.txt"] != sandbox.ChangeAdded || !strings.Contains(d.Diff, "+two") {
		t.Fatalf("diff against the snapshot: %+v", d)
	}
	var page sandbox.DiffResult
	if err := getJSON(hs.URL+"/v1/sandboxes/"+id+"/diff?snapshot_id="+snap.ID+"&limit=1&no_unified=true", &page); err != nil || len(page.Changes) != 1 || page.NextCursor == "" || page.Diff != "" {
		t.Fatalf("GET diff page: %+v %v", page, err)
	}
	if d, err := c.Diff(ctx, f1.ID, wire.DiffRequest{OtherSandboxID: f2.ID}); err != nil || d.Against != "sandbox:"+f2.ID || len(d.Changes) != 1 || d.Changes[0].Path != "/workspace/a.txt" {
		t.Fatalf("diff of two forks: %+v %v", d, err)
	}
	if d, err := c.Diff(ctx, f2.ID, wire.DiffRequest{}); err != nil || !strings.HasPrefix(d.Against, "image:") {
		t.Fatalf("diff against the image: %+v %v", d, err)
	}

	if err := c.DeleteSnapshot(ctx, snap.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.GetSnapshot(ctx, snap.ID); errcode.Of(err) != errcode.SnapshotNotFound || errcode.HTTPStatus(errcode.Of(err)) != 404 {
		t.Fatalf("get after delete: %v, want SNAPSHOT_NOT_FOUND (404)", err)
	}
	if _, err := c.Fork(ctx, id, wire.ForkRequest{SnapshotID: snap.ID}); errcode.Of(err) != errcode.SnapshotNotFound {
		t.Fatalf("fork of a deleted snapshot: %v", err)
	}
	// The forks outlive their snapshot.
	if out := sh(f2.ID, "cat a.txt", false, false); out.Stdout != "one\n" {
		t.Fatalf("fork after its snapshot's delete: %q", out.Stdout)
	}
}

// getJSON GETs url with the test token and decodes a 200 reply.
func getJSON(url string, out any) error {
	req, _ := http.NewRequest("GET", url, nil)
	req.Header.Set("Authorization", "Bearer "+testToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		return fmt.Errorf("%d %s", resp.StatusCode, b)
	}
	return json.Unmarshal(b, out)
}
