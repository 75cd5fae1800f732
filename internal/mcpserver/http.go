package mcpserver

import (
	"encoding/json"
	"log/slog"
	"net/http"

	"github.com/agentbox/agentbox/internal/sameorigin"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// HTTPOptions configures the HTTP transports. Authentication, the Host check and panic
// recovery are the embedding server's job (agentbox serve mounts these behind its REST API's).
type HTTPOptions struct {
	// MaxBodyBytes bounds request bodies (default the SDK's 4 MiB; a file_write of 10 MiB
	// needs about 14 MiB of base64).
	MaxBodyBytes int64
}

// StreamableHTTPHandler serves the streamable HTTP transport (mount it at /mcp).
func (s *Server) StreamableHTTPHandler(opts HTTPOptions) http.Handler {
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s.mcp }, &mcp.StreamableHTTPOptions{
		MaxRequestBodyBytes: opts.MaxBodyBytes,
		// A client that drops the request cancels the call (an exec is killed).
		PropagateRequestCancellation: true,
		Logger:                       s.sdkLogger(),
	})
	return sameOrigin(h)
}

// SSEHandler serves the older HTTP+SSE transport (mount it at /sse; messages are posted to the
// same path with the session id in the query).
func (s *Server) SSEHandler(opts HTTPOptions) http.Handler {
	h := mcp.NewSSEHandler(func(*http.Request) *mcp.Server { return s.mcp }, &mcp.SSEOptions{MaxRequestBodyBytes: opts.MaxBodyBytes})
	return sameOrigin(h)
}

// sameOrigin refuses browser cross-origin requests: any request whose Origin is not the
// server's own — its scheme, host and port (internal/sameorigin) — (every method, so an event stream cannot be opened from a web page either),
// then net/http's CrossOriginProtection (Sec-Fetch-Site) for the unsafe methods. Non-browser
// clients send neither header.
func sameOrigin(next http.Handler) http.Handler {
	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		denyOrigin(w, r.Header.Get("Origin"))
	}))
	protected := cop.Handler(next)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if o := r.Header.Get("Origin"); o != "" {
			if !sameorigin.Same(r, o) { // scheme, host and port
				denyOrigin(w, o)
				return
			}
		}
		protected.ServeHTTP(w, r)
	})
}

func denyOrigin(w http.ResponseWriter, origin string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusForbidden)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]string{
		"code":    "AUTH_FAILED",
		"message": "cross-origin request refused (Origin " + origin + "): agentbox's MCP endpoint does not serve web pages of other origins; connect from an MCP client, not a browser page",
	}})
}

func (s *Server) sdkLogger() *slog.Logger { return slog.New(minLevel{s.log.Handler(), slog.LevelWarn}) }
