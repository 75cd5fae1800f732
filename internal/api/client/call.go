package client

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"github.com/agentbox/agentbox/internal/api"
)

// Call sends one request as it is (the MCP api_call tool over a running serve): a JSON body if
// body is not nil, and returns the reply whatever its status, its body read up to
// api.MaxCallReply+1 bytes (the caller tells a longer reply by its length). err is for a
// request that could not be made.
func (c *Client) Call(ctx context.Context, method, path string, q url.Values, body []byte) (int, http.Header, []byte, error) {
	u := c.base + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	var rd io.Reader = http.NoBody
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return 0, nil, nil, err
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return 0, nil, nil, fmt.Errorf("cannot reach the agentbox server at %s: %w", c.base, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, api.MaxCallReply+1))
	if err != nil && ctx.Err() == nil {
		return 0, nil, nil, fmt.Errorf("reading the reply of %s %s: %w", method, path, err)
	}
	return resp.StatusCode, resp.Header, b, nil
}

// Call is Client.Call with transport failures typed (the MCP api_call tool over a serve).
func (b *Backend) Call(ctx context.Context, method, path string, q url.Values, body []byte) (int, http.Header, []byte, error) {
	status, h, reply, err := b.c.Call(ctx, method, path, q, body)
	return status, h, reply, b.unreachable(err)
}
