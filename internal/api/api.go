// Package api is agentbox's REST API under /v1: a thin adapter that decodes requests, calls the
// sandbox service, and translates typed errors to HTTP status codes and JSON error bodies. It
// also owns the HTTP hardening shared with the MCP endpoint: bearer-token auth, Host checks,
// body bounds and panic recovery.
package api

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/agentbox/agentbox/internal/auth"
	"github.com/agentbox/agentbox/internal/blobs"
	"github.com/agentbox/agentbox/internal/e2b"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/gate"
	"github.com/agentbox/agentbox/internal/lease"
	"github.com/agentbox/agentbox/internal/machine"
	"github.com/agentbox/agentbox/internal/remotejobs"
	"github.com/agentbox/agentbox/internal/remoteops"
	"github.com/agentbox/agentbox/internal/runs"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/sandbox/imageadmin"
	"github.com/agentbox/agentbox/internal/sandbox/jobs"
	"github.com/agentbox/agentbox/internal/sandbox/metrics"
	"github.com/agentbox/agentbox/internal/sandbox/netsession"
	"github.com/agentbox/agentbox/internal/sandbox/pools"
	"github.com/agentbox/agentbox/internal/sandbox/snapshots"
	"github.com/agentbox/agentbox/internal/snippet"
	"github.com/agentbox/agentbox/internal/sqlquery"
	"github.com/agentbox/agentbox/internal/store"
	"github.com/agentbox/agentbox/internal/version"
	"github.com/agentbox/agentbox/internal/watch"
)

// MaxJSONBody bounds JSON request bodies: room for 16 MiB of base64 stdin plus arguments.
const MaxJSONBody = 24 << 20

// Options configures the handler.
type Options struct {
	// Token is required as "Authorization: Bearer <token>" on every request but /health.
	// Empty disables auth (only for --insecure-no-auth on loopback).
	Token string
	// MaxFileBytes bounds one file upload or download (default 1 GiB).
	MaxFileBytes int64
	// AllowAnyHost disables the Host check (for --allow-remote).
	AllowAnyHost bool
	Logger       *slog.Logger
	// Mount adds handlers served behind the same auth (e.g. "/mcp").
	Mount map[string]http.Handler
	// Metrics samples sandboxes' resource use (the metrics routes, watch streams, the
	// Prometheus collector); nil: one made over the service's core.
	Metrics *metrics.Service
	// Network serves sandboxes' connection and secret-call records and preview URLs (the
	// network routes, the connections watch stream, the preview proxy); nil: one made over the
	// service's core.
	Network *netsession.Service
	// Images serves the image routes (/v1/images…, commit); nil: one made over the service's
	// core.
	Images *imageadmin.Service
	// SandboxJobs runs sandbox jobs (the /v1/sandboxes/{id}/jobs routes, the logs watch
	// stream); nil: one made over the service's core (there must be one per core: pass the
	// server's own when it has one).
	SandboxJobs *jobs.Service
	// Pools serves the warm pool routes (/v1/pools) and their Prometheus series; nil: the
	// pools feature of the service's core.
	Pools *pools.Service
	// Snapshots serves the snapshot, fork and diff routes (snapshots.go): the control plane's
	// snapshots feature; nil: the one of svc's core.
	Snapshots *snapshots.Service
	// Prometheus, if set, serves GET /metrics (behind the token) and counts every request
	// by route pattern; Jobs adds agentbox_jobs (prometheus.go).
	Prometheus *Prometheus
	Jobs       JobCounter
	// Preview serves preview URLs ({port}-{id}.localhost; preview.go); nil: the service.
	Preview PreviewBackend
	// MaxImportBytes bounds the body of POST /v1/images/import; 0: DefaultMaxImportBytes.
	MaxImportBytes int64
	// Runs serves /v1/runs and /v1/batches (runs.go); nil: they answer
	// UNSUPPORTED_OPERATION.
	Runs *runs.Service
	// Gate sees every routed call before it acts (scopes, ownership, approvals, the audit
	// log; gate.go), each described by its route's declaration (routetable.go); empty lets
	// every call in.
	Gate gate.Chain
	// Keys, if set, authenticates named API keys ("Authorization: Bearer abk_…" or "X-Api-Key:
	// abk_…") beside Token, and serves /v1/keys (keys.go).
	Keys *auth.Keys
	// SQL serves POST /v1/sql (execute_sql; sql.go); nil: UNSUPPORTED_OPERATION.
	SQL sqlquery.Querier
	// Audit serves GET /v1/audit (audit.go); nil: UNSUPPORTED_OPERATION.
	Audit AuditLister
	// Approvals serves /v1/approvals (approvals.go); nil: UNSUPPORTED_OPERATION.
	Approvals Approvals
	// RemoteExec and Screenshots serve /v1/machines/{ref}/exec and /screenshot (joined machines,
	// remote.go); nil: UNSUPPORTED_OPERATION.
	RemoteExec  *remoteops.Exec
	Screenshots *remoteops.Screenshots
	// Machines serves /v1/machines (machines.go); nil: UNSUPPORTED_OPERATION.
	Machines *machine.Registry
	// RemoteJobs serves /v1/machines/{ref}/jobs (remotejobs.go); nil:
	// UNSUPPORTED_OPERATION.
	RemoteJobs *remotejobs.Service
	// Blobs serves the file relay (blobs.go): /v1/blobs and the machines' pull and
	// push; nil: UNSUPPORTED_OPERATION.
	Blobs *blobs.Service
	// E2B serves the E2B-compatible API (e2b.go; docs/E2B.md); nil: its routes answer that
	// it is off.
	E2B *e2b.Server
	// E2BDomain, if set, also routes {port}-{id}.{E2BDomain} hosts to the E2B surface (TLS
	// deployments with a wildcard name).
	E2BDomain string
	// Conversations serves /v1/conversations (agentbox chat's records; conversations.go); nil:
	// UNSUPPORTED_OPERATION.
	Conversations store.ConversationStore
	// Lease, if set, reports this replica and whether it holds its node's lifecycle lease
	//; GET /health shows it as "replica".
	Lease func() lease.Status
}

// Server is the REST API.
type Server struct {
	svc   *sandbox.Service
	jobs  *jobs.Service
	snaps *snapshots.Service
	opts  Options
	log   *slog.Logger
	mux   *http.ServeMux
	owner string        // the authenticated caller's identity (one token: one owner)
	done  chan struct{} // closed by Close: long polls return
	once  sync.Once
	hub   *watch.Hub             // watch streams (SSE)
	proxy *httputil.ReverseProxy // preview URLs (preview.go)
	// patterns are the routes as registered (Routes; openapi.go).
	patterns []string
}

// TokenOwner is the owner recorded for callers that present token: "token:" and the first 12
// hex digits of its SHA-256 (never the token itself); "" when there is no token
// (--insecure-no-auth).
func TokenOwner(token string) string {
	if token == "" {
		return ""
	}
	sum := sha256.Sum256([]byte(token))
	return "token:" + hex.EncodeToString(sum[:])[:12]
}

// New returns the API handler over svc.
func New(svc *sandbox.Service, opts Options) *Server {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.MaxFileBytes == 0 {
		opts.MaxFileBytes = 1 << 30
	}
	if opts.Metrics == nil && svc != nil {
		opts.Metrics = metrics.New(svc.Core(), svc.Core().Store())
	}
	if opts.Network == nil && svc != nil {
		opts.Network = netsession.New(svc.Core(), svc.Core().Store())
	}
	if opts.Images == nil && svc != nil {
		opts.Images = imageadmin.New(svc.Core(), svc.Core().Store())
	}
	if opts.Pools == nil && svc != nil {
		opts.Pools = pools.New(svc.Core(), svc.Core().Store())
	}
	if opts.SandboxJobs == nil && svc != nil {
		opts.SandboxJobs = jobs.New(svc.Core(), svc.Core().Store())
	}
	if opts.Snapshots == nil && svc != nil {
		opts.Snapshots = snapshots.New(svc.Core(), svc.Core().Store())
	}
	s := &Server{svc: svc, jobs: opts.SandboxJobs, snaps: opts.Snapshots, opts: opts, log: opts.Logger, mux: http.NewServeMux(), owner: TokenOwner(opts.Token), done: make(chan struct{})}
	s.hub = watch.NewHub(svc, watch.Options{Logger: opts.Logger, JobLogs: watch.JobLogsOf(opts.SandboxJobs), Metrics: watch.MetricsOf(opts.Metrics),
		Connections: opts.Network.Connections, ConnectionsWake: opts.Network.ConnectionsChanged})
	if b := s.previewBackend(); b != nil {
		s.proxy = s.newPreviewProxy(b)
	}
	s.routes()
	return s
}

func (s *Server) routes() {
	m := patternMux{s.mux, s} // records the patterns (Routes, openapi.go)
	m.HandleFunc("GET /health", s.health)
	m.HandleFunc("POST /v1/sandboxes", s.createSandbox)
	m.HandleFunc("GET /v1/sandboxes", s.listSandboxes)
	m.HandleFunc("GET /v1/sandboxes/{id}", s.getSandbox)
	m.HandleFunc("DELETE /v1/sandboxes/{id}", s.destroySandbox)
	m.HandleFunc("POST /v1/sandboxes/{id}/extend", s.extendSandbox)
	m.HandleFunc("POST /v1/sandboxes/{id}/exec", s.exec)
	m.HandleFunc("PUT /v1/sandboxes/{id}/files", s.writeFile)
	m.HandleFunc("GET /v1/sandboxes/{id}/files", s.readFile)
	m.HandleFunc("DELETE /v1/sandboxes/{id}/files", s.removeFile)
	m.HandleFunc("GET /v1/sandboxes/{id}/files/stat", s.statFile)
	m.HandleFunc("GET /v1/sandboxes/{id}/files/list", s.listDir)
	m.HandleFunc("POST /v1/sandboxes/{id}/files/mkdir", s.mkdir)
	m.HandleFunc("GET /v1/sandboxes/{id}/events", s.sandboxEvents)
	// jobs (jobs.go)
	m.HandleFunc("POST /v1/sandboxes/{id}/jobs", s.startJob)
	m.HandleFunc("GET /v1/sandboxes/{id}/jobs", s.listJobs)
	m.HandleFunc("GET /v1/sandboxes/{id}/jobs/{job_id}", s.getJob)
	m.HandleFunc("GET /v1/sandboxes/{id}/jobs/{job_id}/logs", s.jobLogs)
	m.HandleFunc("GET /v1/sandboxes/{id}/jobs/{job_id}/wait", s.waitJob)
	m.HandleFunc("POST /v1/sandboxes/{id}/jobs/{job_id}/cancel", s.cancelJob)
	m.HandleFunc("GET /v1/events", s.events)
	m.HandleFunc("GET /v1/sandboxes/{id}/watch", s.watchSandbox)
	m.HandleFunc("GET /v1/capacity", s.capacity)
	m.HandleFunc("GET /v1/runtimes", s.runtimes)
	// Interactive terminal (pty.go): a WebSocket.
	m.HandleFunc("GET /v1/sandboxes/{id}/pty", s.pty)
	// metrics: per-sandbox and fleet samples, Prometheus.
	m.HandleFunc("GET /v1/sandboxes/{id}/metrics", s.sandboxMetrics)
	m.HandleFunc("GET /v1/fleet/metrics", s.fleetMetrics)
	// network (network.go; preview URLs: preview.go)
	m.HandleFunc("PATCH /v1/sandboxes/{id}/network", s.updateNetwork)
	m.HandleFunc("GET /v1/sandboxes/{id}/connections", s.listConnections)
	m.HandleFunc("GET /v1/sandboxes/{id}/secret-calls", s.listSecretCalls)
	m.HandleFunc("POST /v1/sandboxes/{id}/expose", s.expose)
	m.HandleFunc("GET /v1/sandboxes/{id}/expose", s.listExposures)
	m.HandleFunc("DELETE /v1/sandboxes/{id}/expose/{port}", s.unexpose)
	// images (images.go)
	m.HandleFunc("GET /v1/images", s.listImages)
	m.HandleFunc("GET /v1/images/inspect", s.inspectImage)
	m.HandleFunc("POST /v1/images/pull", s.pullImage)
	m.HandleFunc("DELETE /v1/images", s.removeImage)
	m.HandleFunc("POST /v1/images/prune", s.pruneImages)
	m.HandleFunc("POST /v1/images/import", s.importImages)
	m.HandleFunc("POST /v1/images/push", s.pushImage)
	m.HandleFunc("POST /v1/sandboxes/{id}/commit", s.commitSandbox)
	// the REST API's contract (openapi.go)
	// snapshots, fork, sleep, wake and diff (snapshots.go)
	m.HandleFunc("POST /v1/sandboxes/{id}/snapshots", s.createSnapshot)
	m.HandleFunc("GET /v1/sandboxes/{id}/snapshots", s.listSandboxSnapshots)
	m.HandleFunc("GET /v1/snapshots", s.listSnapshots)
	m.HandleFunc("GET /v1/snapshots/{snapshot_id}", s.getSnapshot)
	m.HandleFunc("DELETE /v1/snapshots/{snapshot_id}", s.deleteSnapshot)
	m.HandleFunc("POST /v1/sandboxes/{id}/fork", s.forkSandbox)
	m.HandleFunc("POST /v1/sandboxes/{id}/sleep", s.sleepSandbox)
	m.HandleFunc("POST /v1/sandboxes/{id}/wake", s.wakeSandbox)
	m.HandleFunc("GET /v1/sandboxes/{id}/diff", s.diffSandbox)
	m.HandleFunc("POST /v1/sandboxes/{id}/diff", s.diffSandbox)
	// conversations of agentbox chat (conversations.go)
	m.HandleFunc("POST /v1/conversations", s.createConversation)
	m.HandleFunc("GET /v1/conversations", s.listConversations)
	m.HandleFunc("GET /v1/conversations/{id}", s.getConversation)
	m.HandleFunc("PATCH /v1/conversations/{id}", s.updateConversation)
	m.HandleFunc("POST /v1/conversations/{id}/messages", s.appendConversation)
	m.HandleFunc("DELETE /v1/conversations/{id}", s.deleteConversation)
	m.HandleFunc("GET /v1/openapi.json", s.openAPI)
	// warm pools (pools.go): /v1/pools
	s.poolRoutes()
	s.runRoutes() // durable runs (runs.go): /v1/runs, /v1/batches
	s.keyRoutes() // API keys (keys.go): /v1/keys
	// the audit log (audit.go)
	m.HandleFunc("GET /v1/audit", s.listAudit)

	m.HandleFunc("POST /v1/sql", s.sqlQuery) // execute_sql (sql.go)
	s.approvalRoutes()                       // approvals (approvals.go): /v1/approvals
	s.remoteRoutes()                         // joined machines (remote.go): exec, screenshot
	s.machineRoutes()                        // joined machines (machines.go): /v1/machines
	s.remoteJobRoutes()                      // remote jobs (remotejobs.go): /v1/machines/{ref}/jobs
	s.blobRoutes()                           // the file relay (blobs.go): /v1/blobs, /v1/machines/{ref}/pull|push
	// data-assistant tools (snippet.go)
	m.HandleFunc("POST /v1/run_python", s.runSnippet(snippet.Python))
	m.HandleFunc("POST /v1/run_shell", s.runSnippet(snippet.Shell))
	if p := s.opts.Prometheus; p != nil {
		p.attach(s.svc, s.opts.Metrics, s.opts.Pools, s.opts.Jobs, s.log)
		m.Handle("GET /metrics", p.handler(s.log, s.metricsVisible))
	}
	s.e2bRoutesOn() // the E2B-compatible API (e2b.go)
	m.HandleFunc("/v1/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, errcode.New(errcode.InvalidArgument, "no such endpoint: %s %s (see docs/ARCHITECTURE.md for the REST API)", r.Method, r.URL.Path), http.StatusNotFound)
	})
	for p, h := range s.opts.Mount {
		m.mount(p, h)
	}
}

// ServeHTTP counts the request by route pattern (with Options.Prometheus), then serves it.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p := s.opts.Prometheus
	if p == nil {
		s.serve(w, r, nil)
		return
	}
	began := time.Now()
	rec := &statusRecorder{ResponseWriter: w}
	var route string
	defer func() {
		if route == "" {
			// Refused before routing (Host, auth): the pattern it would have matched.
			_, route = s.mux.Handler(r)
		}
		p.observeHTTP(route, rec.status(), time.Since(began))
	}()
	s.serve(rec, r, &route)
}

// serve applies recovery, the Host check and auth, then routes; route, if not nil, gets the
// pattern the request matched.
func (s *Server) serve(w http.ResponseWriter, r *http.Request, route *string) {
	defer func() {
		if v := recover(); v != nil {
			if v == http.ErrAbortHandler {
				panic(v)
			}
			s.log.Error("panic in handler", "path", r.URL.Path, "panic", v)
			writeError(w, errcode.New(errcode.Internal, "internal error; see the server log"), 0)
		}
	}()
	// E2B's envd and interpreter calls (E2b-Sandbox-Id, or an E2B sandbox host) go to the E2B
	// surface's routes, behind the same auth and gate.
	e2bHost := s.e2bTarget(r)
	// Preview URLs ({port}-{id}.localhost) go to the sandbox, never to the routes below.
	if id, port, match, ok := PreviewHost(r.Host); match && !e2bHost {
		if route != nil {
			*route = "preview"
		}
		if !ok {
			previewError(w, http.StatusNotFound, fmt.Sprintf("agentbox preview: %q is not a preview URL: they look like http://3000-sb-0123456789ab.localhost:PORT/ (port 1–65535, then the sandbox id)", r.Host))
			return
		}
		s.preview(w, r, id, port)
		return
	}
	if !s.opts.AllowAnyHost && !LoopbackHost(r.Host) && !e2bHost {
		writeError(w, errcode.New(errcode.AuthFailed, "Host %q is not a loopback name; agentbox answers only requests addressed to 127.0.0.1, [::1] or localhost", r.Host), http.StatusForbidden)
		return
	}
	// Exempt: /health, and a GET of a run's artifact or a blob with expires and sig, which its
	// handler verifies (runs.go, blobs.go).
	caller, owner, authErr := s.authenticate(r)
	authed := authErr == nil
	if !authed && r.URL.Path != "/health" && !signedArtifactRequest(r) && !machineCredentialRequest(r) && !signedBlobRequest(r) {
		w.Header().Set("WWW-Authenticate", `Bearer realm="agentbox"`)
		if _, pattern := s.mux.Handler(r); routeTable[pattern].E2B {
			e2b.WriteError(w, r, authErr)
		} else {
			writeError(w, authErr, 0)
		}
		if len(s.opts.Gate) > 0 { // the audit log hears of refused requests too (never the credential)
			_, pattern := s.mux.Handler(r)
			args, _ := json.Marshal(map[string]string{"method": r.Method, "path": r.URL.Path})
			s.opts.Gate.Observe(&gate.Call{Surface: gate.SurfaceREST, Tool: pattern, Action: routeTable[pattern].Action, Args: args, Started: time.Now()}, authErr)
		}
		return
	}
	// Every request, mounted handlers included, carries the caller's identity: sandboxes
	// record it as their owner and idempotency keys are scoped to it; the scope gate
	// (internal/auth) checks its scope.
	ctx := withTokenAuth(sandbox.WithOwner(r.Context(), owner), authed)
	if authed && s.opts.E2B != nil {
		ctx = e2b.WithCredential(ctx, credential(r))
	}
	if authed {
		ctx = sandbox.WithPrincipal(gate.WithCaller(ctx, caller), caller.Principal)
	}
	r = r.WithContext(ctx)
	if route != nil {
		defer func() { *route = r.Pattern }() // set by the mux, even if the handler panics
	}
	s.mux.ServeHTTP(w, r) // every route passes the gate chain (decided)
}

// mounted reports whether path is served by one of Options.Mount's handlers.
func (s *Server) mounted(path string) bool {
	for p := range s.opts.Mount {
		if path == p || strings.HasPrefix(path, strings.TrimSuffix(p, "/")+"/") {
			return true
		}
	}
	return false
}

// Close ends the requests that wait for events (GET /v1/events?wait=…), the watch streams
// (GET /v1/sandboxes/{id}/watch) and the waits of run and batch starts, so that a server can
// shut down without waiting them out.
func (s *Server) Close() {
	s.once.Do(func() {
		close(s.done)
		s.hub.Close()
	})
}

// authorized reports whether the request presents the server's token (or none is needed).
func (s *Server) authorized(r *http.Request) bool {
	if s.opts.Token == "" {
		return true
	}
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return ok && constantEq(strings.TrimSpace(tok), s.opts.Token)
}

func constantEq(a, b string) bool { return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1 }

// LoopbackHost reports whether a Host header names a loopback address (DNS-rebinding defence).
func LoopbackHost(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.Trim(host, "[]")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func (s *Server) health(w http.ResponseWriter, r *http.Request) {
	body := map[string]any{"status": "ok", "version": version.Version}
	if s.opts.Lease != nil {
		body["replica"] = s.opts.Lease()
	}
	writeJSON(w, http.StatusOK, body)
}

// errorBody is the JSON error shape of every REST error.
type errorBody struct {
	Error *ErrorDetail `json:"error"`
}

// errorDetail is what a caller is told about err: its code, its message (generic for INTERNAL)
// and its details.
func errorDetail(err error) *ErrorDetail {
	d := &ErrorDetail{Code: errcode.Of(err), Message: errcode.Message(err)}
	if e, ok := errcode.As(err); ok {
		d.Details = e.Details
	}
	return d
}

func writeError(w http.ResponseWriter, err error, status int) {
	if o, ok := w.(interface{ setOutcome(error) }); ok {
		o.setOutcome(err) // the gate's recorder (gate.go): the call's outcome is this error
	}
	b := errorBody{Error: errorDetail(err)}
	if status == 0 {
		status = errcode.HTTPStatus(b.Error.Code)
	}
	if b.Error.Code == errcode.Unavailable && w.Header().Get("Retry-After") == "" {
		after := errcode.RetryAfterSeconds
		if n, ok := b.Error.Details["retry_after_seconds"].(int); ok && n > 0 {
			after = n
		}
		w.Header().Set("Retry-After", strconv.Itoa(after))
	}
	writeJSON(w, status, b)
}

func (s *Server) fail(w http.ResponseWriter, r *http.Request, err error) {
	if errcode.Of(err) == errcode.Internal {
		s.log.Error("request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	}
	writeError(w, err, 0)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	_ = enc.Encode(v)
}

// bodyTooLarge is the error of a JSON body over limit bytes: FILE_TOO_LARGE (413) with the
// limit in its message and details.
func bodyTooLarge(limit int64) error {
	return errcode.New(errcode.FileTooLarge, "request body exceeds %d bytes, this server's bound for a JSON body; send less (large files go through PUT .../files)", limit).With("limit", limit)
}

// readJSONBody reads a whole JSON body of at most MaxJSONBody bytes: one declared over it is
// refused before a byte is read, one that grows over it when it does.
func readJSONBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	if r.ContentLength > MaxJSONBody {
		return nil, bodyTooLarge(MaxJSONBody)
	}
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxJSONBody))
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		return nil, bodyTooLarge(mbe.Limit)
	case err != nil:
		return nil, errcode.New(errcode.InvalidArgument, "request body: %v", err)
	}
	return b, nil
}

// decode reads a bounded JSON body, refusing unknown fields and trailing data. A body
// declared over the bound is refused before a byte of it is read.
func decode(w http.ResponseWriter, r *http.Request, v any) error {
	if r.ContentLength > MaxJSONBody {
		return bodyTooLarge(MaxJSONBody)
	}
	body := http.MaxBytesReader(w, r.Body, MaxJSONBody)
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var mbe *http.MaxBytesError
		var ute *json.UnmarshalTypeError
		var se *json.SyntaxError
		switch {
		case errors.As(err, &mbe):
			return bodyTooLarge(mbe.Limit)
		case errors.Is(err, io.EOF):
			return errcode.New(errcode.InvalidArgument, "request body is empty; send a JSON object")
		case errors.As(err, &ute):
			return errcode.New(errcode.InvalidArgument, "field %q must be %s, not a JSON %s", jsonField(ute.Field), jsonKind(ute.Type.Kind().String()), ute.Value)
		case errors.As(err, &se):
			return errcode.New(errcode.InvalidArgument, "request body is not valid JSON (at byte %d): %v", se.Offset, err)
		case isTyped(err):
			// A field's own decoder (sandbox.Network) refused it, naming it and what it must be.
			return err
		case strings.HasPrefix(err.Error(), "json: unknown field"):
			return errcode.New(errcode.InvalidArgument, "%s; remove it (see docs/ARCHITECTURE.md for the accepted fields)", strings.TrimPrefix(err.Error(), "json: "))
		}
		return errcode.New(errcode.InvalidArgument, "request body is not valid: %v", err)
	}
	if dec.More() {
		return errcode.New(errcode.InvalidArgument, "request body has data after the JSON object")
	}
	return nil
}

// jsonField drops the Go names of embedded structs from a decoder's field path
// ("Spec.command" → "command"): JSON names in this API are lower case.
func jsonField(f string) string {
	parts := strings.Split(f, ".")
	for len(parts) > 1 && parts[0] != "" && parts[0][0] >= 'A' && parts[0][0] <= 'Z' {
		parts = parts[1:]
	}
	return strings.Join(parts, ".")
}

func isTyped(err error) bool {
	_, ok := errcode.As(err)
	return ok
}

func jsonKind(k string) string {
	switch k {
	case "int", "int64", "int32", "uint32", "uint64", "float64":
		return "a number"
	case "string":
		return "a string"
	case "slice":
		return "an array"
	case "map", "struct":
		return "an object"
	case "bool":
		return "true or false"
	}
	return fmt.Sprintf("a %s", k)
}
