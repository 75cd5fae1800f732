package main

import (
	"context"
	"log/slog"
	"net/http"
	"net/url"

	"github.com/agentbox/agentbox/internal/api"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/gate"
	"github.com/agentbox/agentbox/internal/mcpserver"
	"github.com/agentbox/agentbox/internal/runs"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// The MCP api_call tool (issue 16) sends one request to agentbox's own REST API: in `agentbox
// serve`, the server's own handler in process (apiCallVia); in `agentbox mcp`, the running
// serve's REST API through the client, or an api handler over the in-process control plane
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

// mcpAPICall is api_call's transport for `agentbox mcp` over backend (and runsBE, in process)
// with gates g; the func returned closes what it made.
func mcpAPICall(backend mcpserver.Backend, runsBE mcpserver.RunsBackend, g gate.Chain, log *slog.Logger) (mcpserver.APICallFunc, func()) {
	switch b := backend.(type) {
	case interface {
		Call(ctx context.Context, method, path string, q url.Values, body []byte) (int, http.Header, []byte, error)
	}:
		return b.Call, func() {} // a running serve: its REST API applies its own gate
	case *sandbox.Service:
		rs, _ := runsBE.(*runs.Service)
		h := api.New(b, api.Options{Logger: log, Runs: rs, Gate: g})
		return h.Call, h.Close
	}
	return nil, func() {}
}
