package client

import (
	"context"
	"net/http"
	"net/url"
	"strconv"

	"github.com/agentbox/agentbox/internal/wire"
)

// Joined machines: the CLI's remote exec and screenshot over REST.

// RemoteExec calls POST /v1/machines/{machine}/exec.
func (c *Client) RemoteExec(ctx context.Context, machine string, req wire.RemoteExecRequest) (*wire.RemoteExecResult, error) {
	var res wire.RemoteExecResult
	if err := c.doJSON(ctx, http.MethodPost, "/v1/machines/"+url.PathEscape(machine)+"/exec", nil, req, &res); err != nil {
		return nil, err
	}
	return &res, nil
}

// RemoteScreenshot calls GET /v1/machines/{machine}/screenshot.
func (c *Client) RemoteScreenshot(ctx context.Context, machine string, display *int) (*wire.Screenshot, error) {
	q := url.Values{}
	if display != nil {
		q.Set("display", strconv.Itoa(*display))
	}
	var res wire.Screenshot
	if err := c.doJSON(ctx, http.MethodGet, "/v1/machines/"+url.PathEscape(machine)+"/screenshot", q, nil, &res); err != nil {
		return nil, err
	}
	return &res, nil
}
