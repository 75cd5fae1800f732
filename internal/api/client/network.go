package client

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"

	"github.com/agentbox/agentbox/internal/wire"
)

// Network: egress policy, connection and secret-swap records, preview URLs.

func sandboxPath(id, rest string) string { return "/v1/sandboxes/" + url.PathEscape(id) + rest }

func pageQuery(after int64, limit int) url.Values {
	q := url.Values{}
	if after > 0 {
		q.Set("after", strconv.FormatInt(after, 10))
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	return q
}

// UpdateNetwork replaces a sandbox's egress policy (PATCH /v1/sandboxes/{id}/network).
func (c *Client) UpdateNetwork(ctx context.Context, id string, p wire.Policy) (wire.Sandbox, error) {
	var sb wire.Sandbox
	err := c.doJSON(ctx, http.MethodPatch, sandboxPath(id, "/network"), nil, p, &sb)
	return sb, err
}

// Connections pages a sandbox's connection records (after 0: the newest limit).
func (c *Client) Connections(ctx context.Context, id string, after int64, limit int) (wire.ConnectionList, error) {
	var l wire.ConnectionList
	err := c.doJSON(ctx, http.MethodGet, sandboxPath(id, "/connections"), pageQuery(after, limit), nil, &l)
	return l, err
}

// SecretCalls pages a sandbox's secret swaps.
func (c *Client) SecretCalls(ctx context.Context, id string, after int64, limit int) (wire.SecretCallList, error) {
	var l wire.SecretCallList
	err := c.doJSON(ctx, http.MethodGet, sandboxPath(id, "/secret-calls"), pageQuery(after, limit), nil, &l)
	return l, err
}

// Expose makes a port of the sandbox a preview URL.
func (c *Client) Expose(ctx context.Context, id string, port int, public bool) (wire.Exposure, error) {
	var e wire.Exposure
	err := c.doJSON(ctx, http.MethodPost, sandboxPath(id, "/expose"), nil, wire.ExposeRequest{Port: port, Public: public}, &e)
	return e, err
}

// Unexpose removes a preview URL.
func (c *Client) Unexpose(ctx context.Context, id string, port int) error {
	return c.doJSON(ctx, http.MethodDelete, sandboxPath(id, "/expose/"+strconv.Itoa(port)), nil, nil, nil)
}

// Exposures lists a sandbox's preview URLs.
func (c *Client) Exposures(ctx context.Context, id string) ([]wire.Exposure, error) {
	var l wire.ExposureList
	err := c.doJSON(ctx, http.MethodGet, sandboxPath(id, "/expose"), nil, nil, &l)
	return l.Exposures, err
}

// Network returns a sandbox's network as its record writes it: "none" or {"allow", "deny"}
// (null from a server without the network feature).
func (c *Client) Network(ctx context.Context, id string) (json.RawMessage, error) {
	var rec struct {
		Network json.RawMessage `json:"network"`
	}
	err := c.doJSON(ctx, http.MethodGet, sandboxPath(id, ""), nil, nil, &rec)
	return rec.Network, err
}
