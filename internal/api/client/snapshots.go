package client

import (
	"context"
	"net/http"
	"net/url"
	"strconv"

	"github.com/agentbox/agentbox/internal/api"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// Snapshots, fork, sleep, wake and diff (issue 15).

// Snapshot snapshots sandbox id.
func (c *Client) Snapshot(ctx context.Context, id string, req sandbox.SnapshotRequest) (sandbox.Snapshot, error) {
	var out sandbox.Snapshot
	err := c.doJSON(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(id)+"/snapshots", nil, req, &out)
	return out, err
}

// ListSnapshots lists one page of snapshots (f.SandboxID: one sandbox's; f.After: the
// previous page's next_cursor).
func (c *Client) ListSnapshots(ctx context.Context, f sandbox.SnapshotFilter) (api.SnapshotList, error) {
	q := url.Values{}
	if f.SandboxID != "" {
		q.Set("sandbox_id", f.SandboxID)
	}
	if f.After != "" {
		q.Set("cursor", f.After)
	}
	if f.Limit != 0 {
		q.Set("limit", strconv.Itoa(f.Limit))
	}
	var out api.SnapshotList
	err := c.doJSON(ctx, http.MethodGet, "/v1/snapshots", q, nil, &out)
	return out, err
}

// GetSnapshot returns one snapshot.
func (c *Client) GetSnapshot(ctx context.Context, id string) (sandbox.Snapshot, error) {
	var out sandbox.Snapshot
	err := c.doJSON(ctx, http.MethodGet, "/v1/snapshots/"+url.PathEscape(id), nil, nil, &out)
	return out, err
}

// DeleteSnapshot deletes a snapshot and its files.
func (c *Client) DeleteSnapshot(ctx context.Context, id string) error {
	return c.doJSON(ctx, http.MethodDelete, "/v1/snapshots/"+url.PathEscape(id), nil, nil, nil)
}

// Fork makes new sandboxes from a snapshot of sandbox id.
func (c *Client) Fork(ctx context.Context, id string, req sandbox.ForkRequest) (sandbox.ForkResult, error) {
	var out sandbox.ForkResult
	err := c.doJSON(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(id)+"/fork", nil, req, &out)
	return out, err
}

// Sleep puts sandbox id to sleep.
func (c *Client) Sleep(ctx context.Context, id string) (sandbox.Sandbox, error) {
	var sb sandbox.Sandbox
	err := c.doJSON(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(id)+"/sleep", nil, nil, &sb)
	return sb, err
}

// Wake wakes sleeping sandbox id.
func (c *Client) Wake(ctx context.Context, id string) (sandbox.Sandbox, error) {
	var sb sandbox.Sandbox
	err := c.doJSON(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(id)+"/wake", nil, nil, &sb)
	return sb, err
}

// Diff returns a page of what changed in sandbox id (POST …/diff with req as the body).
func (c *Client) Diff(ctx context.Context, id string, req sandbox.DiffRequest) (sandbox.DiffResult, error) {
	var out sandbox.DiffResult
	err := c.doJSON(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(id)+"/diff", nil, req, &out)
	return out, err
}

// Snapshot snapshots sandbox id (the Backend's, for the MCP surface).
func (b *Backend) Snapshot(ctx context.Context, id string, req sandbox.SnapshotRequest) (sandbox.Snapshot, error) {
	if err := checkID(id); err != nil {
		return sandbox.Snapshot{}, err
	}
	out, err := b.c.Snapshot(ctx, id, req)
	return out, b.unreachable(err)
}

// ListSnapshots lists one page of snapshots, as the service does.
func (b *Backend) ListSnapshots(ctx context.Context, f sandbox.SnapshotFilter) ([]sandbox.Snapshot, error) {
	if f.SandboxID != "" {
		if err := checkID(f.SandboxID); err != nil {
			return nil, err
		}
	}
	out, err := b.c.ListSnapshots(ctx, f)
	return out.Snapshots, b.unreachable(err)
}

// checkSnapshotID refuses a malformed snapshot id before it is put in a URL path, with the
// service's words.
func checkSnapshotID(id string) error {
	if !sandbox.ValidSnapshotID(id) {
		return errcode.New(errcode.InvalidArgument, "snapshot_id %q is not a snapshot id (snap- and 12 lowercase hex digits); snapshot_list shows them", truncateID(id))
	}
	return nil
}

func truncateID(id string) string {
	if len(id) > 64 {
		return id[:64] + "…"
	}
	return id
}

// GetSnapshot returns one snapshot.
func (b *Backend) GetSnapshot(ctx context.Context, id string) (sandbox.Snapshot, error) {
	if err := checkSnapshotID(id); err != nil {
		return sandbox.Snapshot{}, err
	}
	out, err := b.c.GetSnapshot(ctx, id)
	return out, b.unreachable(err)
}

// DeleteSnapshot deletes a snapshot.
func (b *Backend) DeleteSnapshot(ctx context.Context, id string) error {
	if err := checkSnapshotID(id); err != nil {
		return err
	}
	return b.unreachable(b.c.DeleteSnapshot(ctx, id))
}

// Fork forks sandbox id.
func (b *Backend) Fork(ctx context.Context, id string, req sandbox.ForkRequest) (sandbox.ForkResult, error) {
	if err := checkID(id); err != nil {
		return sandbox.ForkResult{}, err
	}
	out, err := b.c.Fork(ctx, id, req)
	return out, b.unreachable(err)
}

// Sleep puts sandbox id to sleep.
func (b *Backend) Sleep(ctx context.Context, id string) (sandbox.Sandbox, error) {
	if err := checkID(id); err != nil {
		return sandbox.Sandbox{}, err
	}
	sb, err := b.c.Sleep(ctx, id)
	return sb, b.unreachable(err)
}

// Wake wakes sandbox id.
func (b *Backend) Wake(ctx context.Context, id string) (sandbox.Sandbox, error) {
	if err := checkID(id); err != nil {
		return sandbox.Sandbox{}, err
	}
	sb, err := b.c.Wake(ctx, id)
	return sb, b.unreachable(err)
}

// Diff compares sandbox id.
func (b *Backend) Diff(ctx context.Context, id string, req sandbox.DiffRequest) (sandbox.DiffResult, error) {
	if err := checkID(id); err != nil {
		return sandbox.DiffResult{}, err
	}
	out, err := b.c.Diff(ctx, id, req)
	return out, b.unreachable(err)
}
