package client

import (
	"context"
	"net/http"

	"github.com/agentbox/agentbox/internal/sqlquery"
	"github.com/agentbox/agentbox/internal/wire"
)

// Query runs one read-only SQL query over the published views (POST /v1/sql); it is a
// sqlquery.Querier over the REST API.
func (c *Client) Query(ctx context.Context, query string, maxRows int) (sqlquery.Result, error) {
	var res sqlquery.Result
	err := c.doJSON(ctx, http.MethodPost, "/v1/sql", nil, wire.SQLRequest{Query: query, MaxRows: maxRows}, &res)
	return res, err
}

var _ sqlquery.Querier = (*Client)(nil)
