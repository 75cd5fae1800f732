package main

import (
	"context"
	"net/http"
	"net/url"

	"github.com/agentbox/agentbox/internal/api"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/mcpserver"
)

// The MCP api_call tool sends one request to agentbox's own REST API: in `agentbox serve` (which
// `agentbox mcp` relays to when it runs), the server's own handler in process (apiCallVia); in
// `agentbox mcp` without a server, an api handler over the in-process control plane
// (mcpAPICall). Either way the REST gate sees the inner request with the tool's caller.

// apiCallVia calls *h in process once serve has built it.
func apiCallVia(h **api.Server) mcpserver.APICallFunc {
	return func(ctx context.Context, method, path string, q url.Values, body []byte) (int, http.Header, []byte, error) {
		if *h == nil {
			return 0, nil, nil, errcode.New(errcode.Internal, "the REST API is not serving yet")
		}
		return (*h).Call(ctx, method, path, q, body)
	}
}
