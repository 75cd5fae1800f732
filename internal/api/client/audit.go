package client

import (
	"context"
	"net/http"

	"github.com/agentbox/agentbox/internal/audit"
)

// Audit pages the audit log (GET /v1/audit): after 0, the newest limit records
// (0: the server's default, 100); tool matches a record's tool or action.
func (c *Client) Audit(ctx context.Context, after int64, limit int, tool, sandboxID string) (audit.List, error) {
	q := pageQuery(after, limit)
	if tool != "" {
		q.Set("tool", tool)
	}
	if sandboxID != "" {
		q.Set("sandbox_id", sandboxID)
	}
	var l audit.List
	err := c.doJSON(ctx, http.MethodGet, "/v1/audit", q, nil, &l)
	return l, err
}
