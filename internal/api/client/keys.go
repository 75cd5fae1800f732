package client

import (
	"context"
	"github.com/agentbox/agentbox/internal/wire"
	"net/http"
	"net/url"
)

// CreateKey creates a named API key (admin scope); the result holds its secret, shown once.
func (c *Client) CreateKey(ctx context.Context, req wire.KeyCreateRequest) (wire.CreatedKey, error) {
	var out wire.CreatedKey
	err := c.doJSON(ctx, http.MethodPost, "/v1/keys", nil, req, &out)
	return out, err
}

// ListKeys lists the API keys (admin scope), newest first.
func (c *Client) ListKeys(ctx context.Context) ([]wire.APIKey, error) {
	var out struct {
		Keys []wire.APIKey `json:"keys"`
	}
	err := c.doJSON(ctx, http.MethodGet, "/v1/keys", nil, nil, &out)
	return out.Keys, err
}

// RevokeKey revokes an API key by id or name (admin scope), at once.
func (c *Client) RevokeKey(ctx context.Context, ref string) (wire.APIKey, error) {
	var out wire.APIKey
	err := c.doJSON(ctx, http.MethodDelete, "/v1/keys/"+url.PathEscape(ref), nil, nil, &out)
	return out, err
}
