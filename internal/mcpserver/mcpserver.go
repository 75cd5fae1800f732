// Package mcpserver is agentbox's Model Context Protocol surface: tools, resources, prompts,
// completion and subscriptions over a Backend (the sandbox service in-process, or a running
// `agentbox serve` through its REST client), served over stdio, streamable HTTP and SSE with the
// official Go SDK. It is a thin adapter: typed errors become tool results with isError and the
// code, and nothing below it knows MCP exists.
package mcpserver

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"runtime/debug"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/gate"
	"github.com/agentbox/agentbox/internal/interp"
	"github.com/agentbox/agentbox/internal/metricsnap"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/sandbox/netsession"
	"github.com/agentbox/agentbox/internal/sqlquery"
	"github.com/agentbox/agentbox/internal/version"
	"github.com/agentbox/agentbox/internal/watch"
)

// Backend is what the MCP surface needs from the control plane: *sandbox.Service, in `agentbox
// serve` or in an `agentbox mcp` without a server (with one, `agentbox mcp` relays to the
// server's own MCP endpoint). Errors are *errcode.Error where the caller can act on them.
type Backend interface {
	Create(ctx context.Context, req sandbox.CreateRequest) (sandbox.Sandbox, error)
	Get(ctx context.Context, id string) (sandbox.Sandbox, error)
	List(ctx context.Context, f sandbox.ListFilter) ([]sandbox.Sandbox, error)
	Destroy(ctx context.Context, id string) (sandbox.Sandbox, error)
	Extend(ctx context.Context, id string, ttlSeconds int64) (sandbox.Sandbox, error)
	// Exec runs a command; onOutput (if non-nil) gets output while it runs, in order, before
	// Exec returns. Cancelling ctx kills the command.
	Exec(ctx context.Context, id string, req sandbox.ExecRequest, onOutput sandbox.OutputFunc) (sandbox.ExecResult, error)
	WriteFile(ctx context.Context, id, path string, mode uint32, r io.Reader) (sandbox.FileInfo, error)
	// ReadFile opens a byte range (length 0 = to the end), refusing with FILE_TOO_LARGE (details
	// "size") when the range exceeds limit. It returns the body and the file's total size.
	ReadFile(ctx context.Context, id, path string, offset, length, limit int64) (io.ReadCloser, int64, error)
	ListDir(ctx context.Context, id, path string) (sandbox.DirList, error)
	Events(ctx context.Context, f sandbox.EventFilter) ([]sandbox.Event, error)
	// Subscribe delivers every event with a sequence number above after, in order, as it is
	// recorded, until ctx ends (then the channel closes).
	Subscribe(ctx context.Context, after int64) (<-chan sandbox.Event, error)
	Capacity(ctx context.Context) (sandbox.Capacity, error)
	Runtimes() []runtime.Capabilities
	// detached jobs (jobs.go)
	JobBackend
	// sleep and wake (snapshots.go; the snapshot, fork and diff tools use Options.Snapshots)
	SleepBackend
}

// Bounds of the MCP surface (the REST API streams larger files).
const (
	// MaxWriteBytes bounds one file_write (decoded content).
	MaxWriteBytes = 10 << 20
	// MaxReadBytes bounds the bytes one file_read returns.
	MaxReadBytes = 1 << 20
	// MaxProgressBytes bounds the output one exec streams as progress notifications; the
	// result still carries the kept output.
	MaxProgressBytes = 16 << 20
	// maxHeld bounds the sandboxes one server tracks (live ones are bounded by the service).
	maxHeld = 10000
)

// Options configures a Server. Zero values take the documented defaults.
type Options struct {
	// ControlPlane says where the sandboxes live, for health (e.g. "in-process (state dir
	// /var/lib/agentbox)" or "agentbox serve at http://127.0.0.1:8765").
	ControlPlane string
	// Logger receives the server's log (nil = discard). Never stdout: on stdio, stdout is the
	// protocol.
	Logger *slog.Logger
	// Runs serves the run tools (runs.go): *runs.Service in process, or
	// client.RunsBackend over a running serve; nil: they answer UNSUPPORTED_OPERATION.
	Runs RunsBackend
	// Relay serves remote_pull and remote_push (blobs.go): *blobs.Service in
	// agentbox serve; nil: they answer UNSUPPORTED_OPERATION.
	Relay RelayBackend
	// APICall serves the api_call tool (apicall.go): one request to agentbox's own
	// REST API; nil: api_call answers UNSUPPORTED_OPERATION.
	APICall APICallFunc
	// Gate sees every tool call before it acts (scopes, approvals, the audit log);
	// empty lets every call in.
	Gate gate.Chain
	// SQL serves execute_sql (sql.go): the store in process, the REST client over a
	// running serve; nil: it answers UNSUPPORTED_OPERATION.
	SQL sqlquery.Querier
	// Interpreter runs run_code and code_context_create (code.go): the sandboxes' stateful
	// kernels; nil: they answer UNSUPPORTED_OPERATION.
	Interpreter *interp.Manager
	// Samples serves sandbox_metrics and fetch_metrics' sandbox sample (metrics.Service in
	// process, the REST client over a running serve); nil: they answer UNSUPPORTED_OPERATION.
	Samples MetricsBackend
	// Images serves the image tools (images.go): *imageadmin.Service in process; nil: they
	// answer UNSUPPORTED_OPERATION.
	Images ImageBackend
	// Metrics is the server's metrics registry with its history, for fetch_metrics
	// (fetch_metrics.go); nil: the Backend's scrape if it has one (current values only).
	Metrics *metricsnap.Source
	// Remote serves remote_exec and remote_screenshot (remote.go); nil: they answer
	// UNSUPPORTED_OPERATION.
	Remote RemoteBackend
	// Machines serves machine_list and machine_status (machines.go); nil: they
	// answer UNSUPPORTED_OPERATION.
	Machines MachineBackend
	// Network serves the network tools' records and preview URLs (network.go):
	// the control plane's *netsession.Service; nil: one made over the Backend's core (a
	// *sandbox.Service).
	Network NetworkBackend
	// Snapshots serves the snapshot, fork and diff tools (snapshots.go): the control plane's
	// *snapshots.Service; nil: the one of the Backend's core (a *sandbox.Service).
	Snapshots SnapshotBackend
	// RemoteJobs serves the remote job tools (remotejobs.go): *remotejobs.Service in
	// process, client.RemoteJobsBackend over a running serve; nil: UNSUPPORTED_OPERATION.
	RemoteJobs RemoteJobBackend
}

// Server is the MCP server: one per process, shared by every session and transport.
type Server struct {
	b     Backend
	opts  Options
	log   *slog.Logger
	mcp   *mcp.Server
	held  *heldSets
	watch *watcher
	hub   *watch.Hub // the watch and watch_fleet tools' streams
	net   NetworkBackend
	snaps SnapshotBackend // nil: the snapshot tools answer UNSUPPORTED_OPERATION

	processOwner string // the owner of connections without sessions (stdio)
}

// networkOf is Options.Network, else the network feature over b's sandbox core; nil when b
// has none (a Backend without a *sandbox.Service behind it: the network tools then fail).
func networkOf(b Backend, nb NetworkBackend) NetworkBackend {
	if nb != nil {
		return nb
	}
	if c, ok := b.(interface{ Core() *sandbox.Core }); ok {
		core := c.Core()
		return netsession.New(core, core.Store())
	}
	return nil
}

// New returns a Server over b with every tool, resource and prompt registered.
func New(b Backend, opts Options) *Server {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{b: b, opts: opts, log: opts.Logger, held: newHeldSets(), processOwner: newProcessOwner(), net: networkOf(b, opts.Network), snaps: snapshotsOf(b, opts.Snapshots)}
	s.watch = newWatcher(s)
	var metricsOf watch.MetricsSource
	if opts.Samples != nil {
		metricsOf = watch.MetricsOf(opts.Samples)
	}
	wopts := watch.Options{Logger: opts.Logger, JobLogs: watch.JobLogsOf(b), Metrics: metricsOf,
		Connections: func(ctx context.Context, id string, after int64, limit int) (sandbox.ConnectionList, error) {
			return s.net.Connections(ctx, id, after, limit)
		}}
	if w, ok := s.net.(interface {
		ConnectionsChanged(id string) (<-chan struct{}, func())
	}); ok {
		wopts.ConnectionsWake = w.ConnectionsChanged // in process: woken as records are written
	}
	s.hub = watch.NewHub(b, wopts)
	s.mcp = mcp.NewServer(&mcp.Implementation{Name: "agentbox", Title: "agentbox sandboxes", Version: version.Version}, &mcp.ServerOptions{
		Instructions: instructions,
		// The SDK logs every session at info; keep only its warnings and errors.
		Logger:             s.sdkLogger(),
		CompletionHandler:  s.complete,
		SubscribeHandler:   s.watch.subscribe,
		UnsubscribeHandler: s.watch.unsubscribe,
	})
	s.mcp.AddReceivingMiddleware(s.recoverPanics)
	s.addTools()
	s.addResources()
	s.addPrompts()
	return s
}

// MCP returns the SDK server, to run on a transport (Run, NewStreamableHTTPHandler, …).
func (s *Server) MCP() *mcp.Server { return s.mcp }

// Close stops background work (following events for subscriptions) and closes every session, which ends
// their event streams.
func (s *Server) Close() {
	s.watch.close()
	s.hub.Close()
	for ss := range s.mcp.Sessions() {
		_ = ss.Close()
	}
}

const instructions = `agentbox gives you disposable Linux sandboxes (containers with no network unless created with a network policy) to run commands and handle files in, isolated from the user's machine.
The loop: sandbox_create → exec / file_write / file_read / file_list with its sandbox_id → sandbox_destroy when done.
Sandboxes expire after ttl_seconds (default 30 minutes); sandbox_extend keeps one alive. Destroy what you no longer need: capacity is shared.
To explore: sandbox_snapshot saves a point to return to, sandbox_fork makes up to 20 independent copies of a sandbox to try alternatives in parallel, sandbox_diff shows what changed (against a snapshot, another sandbox or the image); sandbox_sleep parks an idle sandbox (memory and CPU released) until sandbox_wake.
For a self-contained task (check out a repository, set up, run a command, validate, collect changed files and artifacts, clean up), run does it all in one call as a durable record the server executes (wait: true to block until it settled); run_batch and run_matrix fan tasks out, agent_compare and agent_test measure coding agents.
Errors come back as {"error": {"code", "message"}}; the message says what to change. A command that exits non-zero is a normal result, not an error.`

// recoverPanics turns a panic in any handler into an error reply; the session goes on.
func (s *Server) recoverPanics(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (res mcp.Result, err error) {
		defer func() {
			v := recover()
			if v == nil {
				return
			}
			s.log.Error("panic in MCP handler; recovered", "method", method, "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
			if method == "tools/call" {
				res, err = errorResult(errcode.New(errcode.Internal, "internal error in the agentbox server (recovered; the session goes on); retrying the same call will likely fail the same way — see the server log")), nil
				return
			}
			res, err = nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "internal error in the agentbox server (recovered); see the server log"}
		}()
		return next(ctx, method, req)
	}
}

// minLevel drops records below a level.
type minLevel struct {
	slog.Handler
	min slog.Level
}

func (h minLevel) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= h.min && h.Handler.Enabled(ctx, l)
}

func (h minLevel) WithAttrs(as []slog.Attr) slog.Handler {
	return minLevel{h.Handler.WithAttrs(as), h.min}
}

func (h minLevel) WithGroup(name string) slog.Handler {
	return minLevel{h.Handler.WithGroup(name), h.min}
}
