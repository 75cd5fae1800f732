package client

import (
	"context"
	"net/http"
	"net/url"
	"strconv"

	"github.com/agentbox/agentbox/internal/wire"
)

// Snapshots, fork, sleep, wake and diff.

// Snapshot snapshots sandbox id.
func (c *Client) Snapshot(ctx context.Context, id string, req wire.SnapshotRequest) (wire.Snapshot, error) {
	var out wire.Snapshot
	err := c.doJSON(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(id)+"/snapshots", nil, req, &out)
	return out, err
}

// ListSnapshots lists one page of snapshots (f.SandboxID: one sandbox's; f.After: the
// previous page's next_cursor).
func (c *Client) ListSnapshots(ctx context.Context, f wire.SnapshotFilter) (wire.SnapshotList, error) {
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
	var out wire.SnapshotList
	err := c.doJSON(ctx, http.MethodGet, "/v1/snapshots", q, nil, &out)
	return out, err
}

// GetSnapshot returns one snapshot.
func (c *Client) GetSnapshot(ctx context.Context, id string) (wire.Snapshot, error) {
	var out wire.Snapshot
	err := c.doJSON(ctx, http.MethodGet, "/v1/snapshots/"+url.PathEscape(id), nil, nil, &out)
	return out, err
}

// DeleteSnapshot deletes a snapshot and its files.
func (c *Client) DeleteSnapshot(ctx context.Context, id string) error {
	return c.doJSON(ctx, http.MethodDelete, "/v1/snapshots/"+url.PathEscape(id), nil, nil, nil)
}

// Fork makes new sandboxes from a snapshot of sandbox id.
func (c *Client) Fork(ctx context.Context, id string, req wire.ForkRequest) (wire.ForkResult, error) {
	var out wire.ForkResult
	err := c.doJSON(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(id)+"/fork", nil, req, &out)
	return out, err
}

// Sleep puts sandbox id to sleep.
func (c *Client) Sleep(ctx context.Context, id string) (wire.Sandbox, error) {
	var sb wire.Sandbox
	err := c.doJSON(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(id)+"/sleep", nil, nil, &sb)
	return sb, err
}

// Wake wakes sleeping sandbox id.
func (c *Client) Wake(ctx context.Context, id string) (wire.Sandbox, error) {
	var sb wire.Sandbox
	err := c.doJSON(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(id)+"/wake", nil, nil, &sb)
	return sb, err
}

// Diff returns a page of what changed in sandbox id (POST …/diff with req as the body).
func (c *Client) Diff(ctx context.Context, id string, req wire.DiffRequest) (wire.DiffResult, error) {
	var out wire.DiffResult
	err := c.doJSON(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(id)+"/diff", nil, req, &out)
	return out, err
}
