// Package e2b makes agentbox answer E2B's API, so that programs written for E2B's SDKs (npm
// e2b, @e2b/code-interpreter) run against agentbox by changing only their environment: the
// control plane (create, connect, list, get, kill, set timeout, pause, resume), envd — the
// in-sandbox API (Connect-RPC process.Process and filesystem.Filesystem, /files) — and the code
// interpreter (/execute, /contexts). It is a surface over the sandbox service, as the REST API
// is: every call maps onto agentbox's own create, exec, PTY, files and sleep paths, and reaches
// this package through the API server's routes, so the one gate chain (scopes, ownership,
// approvals, the audit log) sees E2B callers as it sees everyone else. docs/E2B.md is the
// contract and says what differs from E2B's own service.
package e2b

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"

	"github.com/agentbox/agentbox/internal/interp"
	"github.com/agentbox/agentbox/internal/sandbox"
)

const (
	// EnvdPort is the port E2B's SDKs address envd at (E2b-Sandbox-Port, {port}-{id}.{domain}).
	EnvdPort = 49983
	// CodePort is the port @e2b/code-interpreter addresses its interpreter at.
	CodePort = 49999
	// EnvdVersion is the envd version create and connect report. 0.5.2: stdin may be off or
	// open (then sendStdin and closeStdin reach the command) and the SDK stops forcing a
	// default user; the features of later versions (octet-stream uploads, file metadata) are
	// not offered.
	EnvdVersion = "0.5.2"
	// ClientID is the clientID E2B replies carry.
	ClientID = "agentbox"
	// PathPrefix is where the API server routes envd and interpreter calls, once it has read
	// their target from E2b-Sandbox-Id/E2b-Sandbox-Port or the {port}-{id}.{domain} host:
	// /e2b/envd/{id}/… and /e2b/code/{id}/….
	PathPrefix = "/e2b/"
)

// Templates maps E2B template names to agentbox images. A template not listed is taken as an
// agentbox image reference ("python:3.12-slim"). "" stands for the server's default image.
var Templates = map[string]string{
	"base":                "",
	"code-interpreter-v1": "",
	"code-interpreter":    "",
}

// Options configures the E2B surface.
type Options struct {
	// Logger receives failures; nil discards.
	Logger *slog.Logger
	// Interpreter runs the code interpreter's cells (shared with the MCP tools run_code and
	// code_context_create); nil: one of this surface's own.
	Interpreter *interp.Manager
	// Domain is the sandbox domain create reports ("" reports none: the SDK then uses
	// E2B_DOMAIN).
	Domain string
	// Metrics samples a running sandbox's resource use (getMetrics); nil: getMetrics is 501.
	Metrics Metrics
}

// Metrics samples one running sandbox's resource use (the metrics feature's service).
type Metrics interface {
	Metrics(ctx context.Context, id string) (sandbox.SandboxMetrics, error)
}

// Server serves E2B's API over a sandbox service.
type Server struct {
	svc   *sandbox.Service
	opts  Options
	log   *slog.Logger
	procs *processes
	code  *interpreters
}

// New returns the E2B surface over svc.
func New(svc *sandbox.Service, opts Options) *Server {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{svc: svc, opts: opts, log: opts.Logger, procs: newProcesses()}
	if opts.Interpreter == nil {
		opts.Interpreter = interp.New(svc)
		s.opts.Interpreter = opts.Interpreter
	}
	s.code = &interpreters{m: opts.Interpreter}
	return s
}

// Close ends every process this surface started and forgets the interpreters' connections.
func (s *Server) Close() {
	s.procs.closeAll()
	s.code.close()
}

// Handlers returns the surface's handlers by route pattern (as the API server registers
// them; their declarations are in the API's route table).
func (s *Server) Handlers() map[string]http.HandlerFunc {
	h := map[string]http.HandlerFunc{
		// the control plane
		"POST /sandboxes":                            s.createSandbox,
		"POST /v2/sandboxes":                         s.createSandbox,
		"GET /sandboxes":                             s.listSandboxes,
		"GET /v2/sandboxes":                          s.listSandboxes,
		"GET /sandboxes/{id}":                        s.getSandbox,
		"DELETE /sandboxes/{id}":                     s.killSandbox,
		"POST /sandboxes/{id}/timeout":               s.setTimeout,
		"POST /sandboxes/{id}/pause":                 s.pauseSandbox,
		"POST /sandboxes/{id}/resume":                s.resumeSandbox,
		"POST /sandboxes/{id}/connect":               s.connectSandbox,
		"POST /v2/sandboxes/{id}/connect":            s.connectSandbox,
		"GET /sandboxes/{id}/metrics":                s.sandboxMetrics,
		"/sandboxes/{id}/{rest...}":                  s.unsupportedAPI,
		"GET /e2b/envd/{id}/health":                  s.envdHealth,
		"GET /e2b/envd/{id}/files":                   s.downloadFile,
		"POST /e2b/envd/{id}/files":                  s.uploadFile,
		"/e2b/envd/{id}/{rest...}":                   s.envdUnknown,
		"POST /e2b/code/{id}/execute":                s.execute,
		"POST /e2b/code/{id}/contexts":               s.createContext,
		"GET /e2b/code/{id}/contexts":                s.listContexts,
		"DELETE /e2b/code/{id}/contexts/{ctx}":       s.removeContext,
		"POST /e2b/code/{id}/contexts/{ctx}/restart": s.restartContext,
		"/e2b/code/{id}/{rest...}":                   s.codeUnknown,
	}
	for name, hh := range s.rpcHandlers() {
		h["POST /e2b/envd/{id}/"+name] = hh
	}
	return h
}

// RPCMethods are the envd Connect-RPC methods served, by "service/Method".
var RPCMethods = []string{
	"process.Process/Start", "process.Process/Connect", "process.Process/List",
	"process.Process/SendInput", "process.Process/SendSignal", "process.Process/Update",
	"process.Process/CloseStdin", "process.Process/StreamInput",
	"filesystem.Filesystem/Stat", "filesystem.Filesystem/ListDir", "filesystem.Filesystem/MakeDir",
	"filesystem.Filesystem/Move", "filesystem.Filesystem/Remove", "filesystem.Filesystem/WatchDir",
	"filesystem.Filesystem/CreateWatcher", "filesystem.Filesystem/GetWatcherEvents",
	"filesystem.Filesystem/RemoveWatcher",
}

// Target reads where an envd or interpreter request is addressed: the E2b-Sandbox-Id and
// E2b-Sandbox-Port headers the SDK sends when E2B_SANDBOX_URL is set. ok is false when the
// request carries no E2b-Sandbox-Id.
func Target(h http.Header) (id, port string, ok bool) {
	id = strings.TrimSpace(h.Get("E2b-Sandbox-Id"))
	if id == "" {
		return "", "", false
	}
	port = strings.TrimSpace(h.Get("E2b-Sandbox-Port"))
	if port == "" {
		port = "49983"
	}
	return id, port, true
}

// Rewrite is the path the API server routes an envd or interpreter request to: envd's port to
// /e2b/envd/{id}/…, the interpreter's to /e2b/code/{id}/…; ok is false for any other port.
func Rewrite(id string, port int, path string) (string, bool) {
	switch port {
	case EnvdPort:
		return PathPrefix + "envd/" + id + path, true
	case CodePort:
		return PathPrefix + "code/" + id + path, true
	}
	return "", false
}

// credKey carries the credential the caller presented (create and connect report it as the
// envd and traffic access tokens, which the SDK then sends on its envd calls).
type credKey struct{}

// WithCredential returns ctx carrying the caller's credential.
func WithCredential(ctx context.Context, cred string) context.Context {
	return context.WithValue(ctx, credKey{}, cred)
}

func credentialFrom(ctx context.Context) string {
	c, _ := ctx.Value(credKey{}).(string)
	return c
}

// HostTarget parses E2B's sandbox host, {port}-{id}.{domain}[:serverport], for a configured
// domain ("" matches nothing).
func HostTarget(hostport, domain string) (id string, port int, ok bool) {
	if domain == "" {
		return "", 0, false
	}
	host := strings.ToLower(strings.TrimSuffix(hostport, "."))
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	d := strings.ToLower(strings.TrimSuffix(domain, "."))
	if h, _, err := net.SplitHostPort(d); err == nil {
		d = h
	}
	label, found := strings.CutSuffix(host, "."+d)
	if !found || strings.Contains(label, ".") {
		return "", 0, false
	}
	ps, id, found := strings.Cut(label, "-")
	if !found || id == "" {
		return "", 0, false
	}
	n, err := strconv.Atoi(ps)
	if err != nil || strconv.Itoa(n) != ps || n < 1 || n > 65535 {
		return "", 0, false
	}
	return id, n, true
}
