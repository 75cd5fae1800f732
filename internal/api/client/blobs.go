package client

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"github.com/agentbox/agentbox/internal/wire"
)

// The file relay.

// RemotePull copies a regular file from a joined machine into a blob (POST
// /v1/machines/{ref}/pull).
func (c *Client) RemotePull(ctx context.Context, machine, path string) (wire.Blob, error) {
	var r wire.Blob
	err := c.doJSON(ctx, http.MethodPost, "/v1/machines/"+url.PathEscape(machine)+"/pull", nil, wire.RemotePullRequest{Path: path}, &r)
	return r, err
}

// RemotePush writes a blob to dest on a joined machine (POST /v1/machines/{ref}/push).
func (c *Client) RemotePush(ctx context.Context, machine, blobID, dest string) (wire.BlobPush, error) {
	var r wire.BlobPush
	err := c.doJSON(ctx, http.MethodPost, "/v1/machines/"+url.PathEscape(machine)+"/push", nil, wire.RemotePushRequest{BlobID: blobID, DestPath: dest}, &r)
	return r, err
}

// UploadBlob stores size bytes of r as a blob named name (POST /v1/blobs); size -1 sends it
// chunked (the server cuts it at its per-file limit).
func (c *Client) UploadBlob(ctx context.Context, name string, size int64, r io.Reader) (wire.Blob, error) {
	u := c.base + "/v1/blobs?" + url.Values{"name": {name}}.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, io.NopCloser(r))
	if err != nil {
		return wire.Blob{}, err
	}
	req.ContentLength = size
	if size == 0 {
		req.Body = http.NoBody
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := c.hc.Do(req)
	if err != nil {
		return wire.Blob{}, fmt.Errorf("cannot reach the agentbox server at %s: %w", c.base, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		return wire.Blob{}, decodeError(resp)
	}
	var res wire.Blob
	return res, json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&res)
}

// DownloadBlob opens a blob with the bearer token (GET /v1/blobs/{id}) and returns its body,
// size and SHA-256 (hex).
func (c *Client) DownloadBlob(ctx context.Context, id string) (io.ReadCloser, int64, string, error) {
	resp, err := c.do(ctx, http.MethodGet, "/v1/blobs/"+url.PathEscape(id), nil, nil, "")
	if err != nil {
		return nil, 0, "", err
	}
	return resp.Body, resp.ContentLength, resp.Header.Get("X-Agentbox-SHA256"), nil
}

// DeleteBlob deletes a blob (DELETE /v1/blobs/{id}).
func (c *Client) DeleteBlob(ctx context.Context, id string) error {
	return c.doJSON(ctx, http.MethodDelete, "/v1/blobs/"+url.PathEscape(id), nil, nil, nil)
}
