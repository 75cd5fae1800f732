package client

import (
	"context"
	"github.com/agentbox/agentbox/internal/wire"
	"net/http"
)

// Audit pages the audit log (GET /v1/audit): after 0, the newest limit records
// (0: the server's default, 100); tool matches a record's tool or action.
func (c *Client) Audit(ctx context.Context, after int64, limit int, tool, sandboxID string) (wire.AuditList, error) {
	q := pageQuery(after, limit)
	if tool != "" {
		q.Set("tool", tool)
	}
	if sandboxID != "" {
		q.Set("sandbox_id", sandboxID)
	}
	var l wire.AuditList
	err := c.doJSON(ctx, http.MethodGet, "/v1/audit", q, nil, &l)
	return l, err
}
