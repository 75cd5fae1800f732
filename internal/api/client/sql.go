package client

import (
	"context"
	"net/http"

	"github.com/agentbox/agentbox/internal/wire"
)

// Query runs one read-only SQL query over the published views (POST /v1/sql); it is a
// the REST twin of the server's sqlquery.Querier.
func (c *Client) Query(ctx context.Context, query string, maxRows int) (wire.SQLResult, error) {
	var res wire.SQLResult
	err := c.doJSON(ctx, http.MethodPost, "/v1/sql", nil, wire.SQLRequest{Query: query, MaxRows: maxRows}, &res)
	return res, err
}
