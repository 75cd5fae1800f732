package api

//go:generate go test -run ^TestOpenAPIDocument$ -update-openapi .

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/gate"
	"github.com/agentbox/agentbox/internal/openapi"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// The REST API's contract is internal/openapi/openapi.json: generated from this package's
// request and reply types by openapi_gen_test.go (`go generate ./internal/api`), which also
// fails when the committed document differs from what it would generate, and kept equal to the
// routes below by TestOpenAPIRoutes (both directions).

// patternMux records the patterns registered on a ServeMux (Server.Routes).
type patternMux struct {
	*http.ServeMux
	s *Server
}

// HandleFunc registers h behind the gate chain with pattern's declaration (routeTable); a
// pattern without one panics, as ServeMux does on a conflicting pattern: a route the gate
// knows nothing of is a programming error, never a route served ungated.
func (m patternMux) HandleFunc(pattern string, h func(http.ResponseWriter, *http.Request)) {
	rt, ok := routeTable[pattern]
	if !ok {
		panic(fmt.Sprintf("api: route %q has no declaration in routeTable (internal/api/routetable.go): declare its action, scope and object", pattern))
	}
	m.s.patterns = append(m.s.patterns, pattern)
	m.ServeMux.HandleFunc(pattern, m.s.decided(pattern, rt, h))
}

// Handle is HandleFunc for a handler.
func (m patternMux) Handle(pattern string, h http.Handler) { m.HandleFunc(pattern, h.ServeHTTP) }

// mount registers a mounted handler (Options.Mount): it gates its own calls (MCP, per tool).
func (m patternMux) mount(pattern string, h http.Handler) {
	m.s.patterns = append(m.s.patterns, pattern)
	m.ServeMux.Handle(pattern, h)
}

// Routes returns the patterns the server routes, as registered ("GET /v1/sandboxes/{id}";
// a pattern without a method serves any), without the mounted handlers (Options.Mount), the
// E2B-compatible API's (E2BRoutes) and the /v1/ catch-all that answers unknown paths.
func (s *Server) Routes() []string {
	var out []string
	for _, p := range s.patterns {
		path := p
		if _, after, ok := strings.Cut(p, " "); ok {
			path = after
		}
		if path == "/v1/" || s.mounted(path) || routeTable[p].E2B {
			continue
		}
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}

// E2BRoutes returns the E2B-compatible API's patterns (e2b.go): declared in the route table
// and gated like the others, but E2B's contract (docs/E2B.md), not this API's OpenAPI
// document's.
func (s *Server) E2BRoutes() []string {
	var out []string
	for _, p := range s.patterns {
		if routeTable[p].E2B {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return out
}

func (s *Server) openAPI(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(openapi.Document())
}

// MaxCallReply bounds the reply Call keeps: MaxCallReply+1 bytes at most, so that a caller
// bounding at MaxCallReply can tell a reply of exactly that size from a longer one.
const MaxCallReply = 1 << 20

// Call serves one request in process, for the MCP api_call tool: method and path (checked
// against the OpenAPI document first), query, and body (JSON, at most MaxJSONBody). The
// request runs as the caller ctx carries (gate.CallerFrom; its sandboxes' owner,
// sandbox.OwnerFrom, else the server's), through Options.Gate and the routes like any REST
// request; the reply is bounded to MaxCallReply+1 bytes, past which the handler's context is
// cancelled. A REST error is a reply (status ≥ 400 and its JSON error body), not an error.
func (s *Server) Call(ctx context.Context, method, path string, query url.Values, body []byte) (int, http.Header, []byte, error) {
	if _, err := openapi.Match(method, path); err != nil {
		return 0, nil, nil, err
	}
	if len(body) > MaxJSONBody {
		return 0, nil, nil, errcode.New(errcode.InvalidArgument, "body is %d bytes; at most %d", len(body), MaxJSONBody).With("argument", "body")
	}
	caller, ok := gate.CallerFrom(ctx)
	if !ok {
		return 0, nil, nil, errcode.New(errcode.AuthFailed, "an in-process API call needs the caller's identity")
	}
	if sandbox.OwnerFrom(ctx) == "" {
		ctx = sandbox.WithOwner(ctx, s.owner)
	}
	if caller.Principal != "" {
		ctx = sandbox.WithPrincipal(ctx, caller.Principal)
	}
	ctx, cancel := context.WithCancel(withTokenAuth(gate.WithCaller(ctx, caller), true))
	defer cancel()
	u := &url.URL{Path: path, RawQuery: query.Encode()}
	var rd io.Reader = http.NoBody
	if body != nil {
		rd = bytes.NewReader(body)
	}
	r, err := http.NewRequestWithContext(ctx, strings.ToUpper(method), u.String(), rd)
	if err != nil {
		return 0, nil, nil, errcode.New(errcode.InvalidArgument, "request: %v", err)
	}
	r.Host = "localhost"
	r.RemoteAddr = "in-process"
	if body != nil {
		r.Header.Set("Content-Type", "application/json")
	}
	w := &callRecorder{header: http.Header{}, limit: MaxCallReply + 1, cancel: cancel}
	func() {
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					return
				}
				s.log.Error("panic in handler (in-process call)", "path", path, "panic", v)
				w.buf.Reset()
				writeError(w, errcode.New(errcode.Internal, "internal error; see the server log"), 0)
			}
		}()
		s.mux.ServeHTTP(w, r) // every route passes the gate chain (decided)
	}()
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.status, w.header, w.buf.Bytes(), nil
}

// callRecorder keeps a reply up to limit bytes, then cancels the handler.
type callRecorder struct {
	header http.Header
	status int
	buf    bytes.Buffer
	limit  int
	cancel func()
}

var errReplyBound = errors.New("api: in-process reply bound reached")

func (w *callRecorder) Header() http.Header { return w.header }

func (w *callRecorder) WriteHeader(status int) {
	if w.status == 0 {
		w.status = status
	}
}

func (w *callRecorder) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	if room := w.limit - w.buf.Len(); len(p) > room {
		w.buf.Write(p[:max(room, 0)])
		w.cancel()
		return max(room, 0), errReplyBound
	}
	return w.buf.Write(p)
}

func (w *callRecorder) Flush() {}
