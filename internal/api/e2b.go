package api

import (
	"net/http"
	"strconv"
	"strings"

	"github.com/agentbox/agentbox/internal/auth"
	"github.com/agentbox/agentbox/internal/e2b"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/gate"
	"github.com/agentbox/agentbox/internal/sandboxid"
)

// The E2B-compatible API (internal/e2b; docs/E2B.md): its control-plane routes at E2B's own
// paths (/sandboxes, /v2/sandboxes…), and envd and the code interpreter under /e2b/envd/{id}/…
// and /e2b/code/{id}/…, where serve routes a request that names its sandbox the E2B way (the
// E2b-Sandbox-Id and E2b-Sandbox-Port headers, or a {port}-{id}.localhost or
// {port}-{id}.{Options.E2BDomain} host). Every route is declared in the route table like any
// other and passes the same gate chain; its errors are written in the shapes E2B's SDKs read.

// e2bRoutes are the E2B surface's route declarations, merged into routeTable.
var e2bRoutes = map[string]Route{
	"POST /sandboxes":                 e2bRoute(act("sandbox_create", auth.ScopeOperate, gate.ObjectNone)),
	"POST /v2/sandboxes":              e2bRoute(act("sandbox_create", auth.ScopeOperate, gate.ObjectNone)),
	"GET /sandboxes":                  e2bRoute(read("sandbox_list", auth.ScopeRead, gate.ObjectNone)),
	"GET /v2/sandboxes":               e2bRoute(read("sandbox_list", auth.ScopeRead, gate.ObjectNone)),
	"GET /sandboxes/{id}":             e2bRoute(read("sandbox_get", auth.ScopeRead, gate.ObjectSandbox)),
	"DELETE /sandboxes/{id}":          e2bRoute(act("sandbox_destroy", auth.ScopeOperate, gate.ObjectSandbox)),
	"POST /sandboxes/{id}/timeout":    e2bRoute(act("sandbox_extend", auth.ScopeOperate, gate.ObjectSandbox)),
	"POST /sandboxes/{id}/pause":      e2bRoute(act("sandbox_sleep", auth.ScopeOperate, gate.ObjectSandbox)),
	"POST /sandboxes/{id}/resume":     e2bRoute(act("sandbox_wake", auth.ScopeOperate, gate.ObjectSandbox)),
	"POST /sandboxes/{id}/connect":    e2bRoute(act("sandbox_wake", auth.ScopeOperate, gate.ObjectSandbox)),
	"POST /v2/sandboxes/{id}/connect": e2bRoute(act("sandbox_wake", auth.ScopeOperate, gate.ObjectSandbox)),
	"GET /sandboxes/{id}/metrics":     e2bRoute(read("sandbox_metrics", auth.ScopeRead, gate.ObjectSandbox)),
	"/sandboxes/{id}/{rest...}":       e2bRoute(read("no_such_endpoint", auth.ScopeRead, gate.ObjectSandbox)),
	// envd
	"GET /e2b/envd/{id}/health": e2bRoute(read("sandbox_get", auth.ScopeRead, gate.ObjectSandbox)),
	"GET /e2b/envd/{id}/files":  e2bRoute(read("file_read", auth.ScopeRead, gate.ObjectSandbox)),
	"POST /e2b/envd/{id}/files": e2bRoute(stream("file_write", auth.ScopeOperate, gate.ObjectSandbox)),
	"/e2b/envd/{id}/{rest...}":  e2bRoute(read("no_such_endpoint", auth.ScopeRead, gate.ObjectSandbox)),
	// Connect-RPC: a stream's request is an enveloped message (shown by length and digest)
	"POST /e2b/envd/{id}/process.Process/Start":                  e2bRoute(stream("exec", auth.ScopeOperate, gate.ObjectSandbox)),
	"POST /e2b/envd/{id}/process.Process/Connect":                e2bRoute(Route{Action: "exec", Scope: auth.ScopeOperate, Object: gate.ObjectSandbox, ReadOnly: true, Body: BodyStream}),
	"POST /e2b/envd/{id}/process.Process/List":                   e2bRoute(read("process_list", auth.ScopeRead, gate.ObjectSandbox)),
	"POST /e2b/envd/{id}/process.Process/SendInput":              e2bRoute(act("exec", auth.ScopeOperate, gate.ObjectSandbox)),
	"POST /e2b/envd/{id}/process.Process/SendSignal":             e2bRoute(act("exec", auth.ScopeOperate, gate.ObjectSandbox)),
	"POST /e2b/envd/{id}/process.Process/Update":                 e2bRoute(act("exec", auth.ScopeOperate, gate.ObjectSandbox)),
	"POST /e2b/envd/{id}/process.Process/CloseStdin":             e2bRoute(act("exec", auth.ScopeOperate, gate.ObjectSandbox)),
	"POST /e2b/envd/{id}/process.Process/StreamInput":            e2bRoute(stream("exec", auth.ScopeOperate, gate.ObjectSandbox)),
	"POST /e2b/envd/{id}/filesystem.Filesystem/Stat":             e2bRoute(read("file_stat", auth.ScopeRead, gate.ObjectSandbox)),
	"POST /e2b/envd/{id}/filesystem.Filesystem/ListDir":          e2bRoute(read("file_list", auth.ScopeRead, gate.ObjectSandbox)),
	"POST /e2b/envd/{id}/filesystem.Filesystem/MakeDir":          e2bRoute(act("file_mkdir", auth.ScopeOperate, gate.ObjectSandbox)),
	"POST /e2b/envd/{id}/filesystem.Filesystem/Move":             e2bRoute(act("file_move", auth.ScopeOperate, gate.ObjectSandbox)),
	"POST /e2b/envd/{id}/filesystem.Filesystem/Remove":           e2bRoute(act("file_remove", auth.ScopeOperate, gate.ObjectSandbox)),
	"POST /e2b/envd/{id}/filesystem.Filesystem/WatchDir":         e2bRoute(Route{Action: "file_watch", Scope: auth.ScopeRead, Object: gate.ObjectSandbox, ReadOnly: true, Body: BodyStream}),
	"POST /e2b/envd/{id}/filesystem.Filesystem/CreateWatcher":    e2bRoute(read("file_watch", auth.ScopeRead, gate.ObjectSandbox)),
	"POST /e2b/envd/{id}/filesystem.Filesystem/GetWatcherEvents": e2bRoute(read("file_watch", auth.ScopeRead, gate.ObjectSandbox)),
	"POST /e2b/envd/{id}/filesystem.Filesystem/RemoveWatcher":    e2bRoute(read("file_watch", auth.ScopeRead, gate.ObjectSandbox)),
	// the code interpreter: the same actions as the MCP tools
	"POST /e2b/code/{id}/execute":                e2bRoute(act("run_code", auth.ScopeOperate, gate.ObjectSandbox)),
	"POST /e2b/code/{id}/contexts":               e2bRoute(act("code_context_create", auth.ScopeOperate, gate.ObjectSandbox)),
	"GET /e2b/code/{id}/contexts":                e2bRoute(read("code_context_list", auth.ScopeRead, gate.ObjectSandbox)),
	"DELETE /e2b/code/{id}/contexts/{ctx}":       e2bRoute(act("code_context_remove", auth.ScopeOperate, gate.ObjectSandbox)),
	"POST /e2b/code/{id}/contexts/{ctx}/restart": e2bRoute(act("code_context_restart", auth.ScopeOperate, gate.ObjectSandbox)),
	"/e2b/code/{id}/{rest...}":                   e2bRoute(read("no_such_endpoint", auth.ScopeRead, gate.ObjectSandbox)),
}

func e2bRoute(r Route) Route { r.E2B = true; return r }

func init() {
	for p, r := range e2bRoutes {
		if _, dup := routeTable[p]; dup {
			panic("api: E2B route " + p + " is declared twice")
		}
		routeTable[p] = r
	}
}

// e2bRoutesOn registers the E2B surface's routes: its handlers with Options.E2B, else each
// answering that the surface is off.
func (s *Server) e2bRoutesOn() {
	m := patternMux{s.mux, s}
	var hs map[string]http.HandlerFunc
	if s.opts.E2B != nil {
		hs = s.opts.E2B.Handlers()
	}
	for p := range e2bRoutes {
		h := hs[p]
		if h == nil {
			h = func(w http.ResponseWriter, r *http.Request) {
				e2b.WriteError(w, r, errcode.New(errcode.UnsupportedOp, "the E2B-compatible API is off on this server: start agentbox serve with --e2b (docs/E2B.md)"))
			}
		}
		m.HandleFunc(p, h)
	}
}

// e2bTarget routes a request that names its sandbox the E2B way to the E2B surface's path:
// the E2b-Sandbox-Id/E2b-Sandbox-Port headers (E2B_SANDBOX_URL set to this server), or a
// {port}-{id}.localhost or {port}-{id}.{E2BDomain} host naming envd's or the interpreter's
// port. byHost reports that the host named the sandbox: such a host is an E2B host, not
// subject to the loopback Host check (headers never lift that check: a page that rebound a
// name to this server could send them).
func (s *Server) e2bTarget(r *http.Request) (byHost bool) {
	if s.opts.E2B == nil {
		return false
	}
	id, port := "", 0
	if hid, hport, ok := e2b.Target(r.Header); ok {
		n, err := strconv.Atoi(hport)
		if err != nil {
			return false
		}
		id, port = hid, n
	} else if pid, pport, _, ok := PreviewHost(r.Host); ok && (pport == e2b.EnvdPort || pport == e2b.CodePort) {
		id, port, byHost = pid, pport, true
	} else if hid, hport, ok := e2b.HostTarget(r.Host, s.opts.E2BDomain); ok {
		id, port, byHost = hid, hport, true
	} else {
		return false
	}
	if !sandboxid.Valid(id) {
		id = "sb-unknown" // routed, then not found (an id is one path segment, never more)
	}
	p, ok := e2b.Rewrite(id, port, r.URL.Path)
	if !ok {
		return false
	}
	r.URL.Path, r.URL.RawPath = p, ""
	return byHost
}

// isE2BPath reports whether path is one of the E2B surface's envd or interpreter paths.
func isE2BPath(path string) bool { return strings.HasPrefix(path, e2b.PathPrefix) }

// e2bCredential is the credential an envd or interpreter call carries: the SDK sends the
// access tokens create answered (the caller's own key) as X-Access-Token or
// E2B-Traffic-Access-Token.
func e2bCredential(r *http.Request) string {
	if v := strings.TrimSpace(r.Header.Get("X-Access-Token")); v != "" {
		return v
	}
	return strings.TrimSpace(r.Header.Get("E2B-Traffic-Access-Token"))
}
