//go:build linux

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentbox/agentbox/internal/api"
	"github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/config"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/gate"
	"github.com/agentbox/agentbox/internal/mcpserver"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/sqlquery"
	"github.com/agentbox/agentbox/internal/statedir"
)

// Both control planes the MCP server can drive.
var (
	_ mcpserver.Backend = (*sandbox.Service)(nil)
	_ mcpserver.Backend = (*client.Backend)(nil)
)

// cmdMCP serves MCP over stdio: JSON-RPC on stdout, logs on stderr. It uses the running server
// of the state dir when there is one, else runs the control plane in-process (holding the
// state-dir lock, so two clients never run two control planes on one state dir).
func cmdMCP(args []string) int {
	cfg := config.Default()
	fs := flag.NewFlagSet("mcp", flag.ContinueOnError)
	fs.StringVar(&cfg.StateDir, "state-dir", cfg.StateDir, "state directory: its running server is used, or the control plane runs in this process")
	fs.StringVar(&cfg.CgroupParent, "cgroup-parent", cfg.CgroupParent, "cgroup under which each sandbox gets its own (in-process control plane only)")
	fs.StringVar(&cfg.DefaultRuntime, "runtime", cfg.DefaultRuntime, "default runtime (in-process control plane only)")
	fs.IntVar(&cfg.MaxSandboxes, "max-sandboxes", cfg.MaxSandboxes, "most live sandboxes at once (in-process control plane only)")
	registerEgressFlags(fs, &cfg) // network (issue 12; in-process control plane only)
	registerImageFlags(fs, &cfg)  // images (issue 13, images.go; in-process control plane only)
	registerRunFlags(fs, &cfg)    // durable runs (issue 14, run.go; in-process control plane only)
	var tlsOpts clientTLS
	tlsOpts.register(fs)            // a running server over https (issue 16, tls.go)
	registerAuditFlags(fs, &cfg)    // the audit log (issue 16, audit.go; in-process control plane only)
	registerApprovalFlags(fs, &cfg) // approvals (issue 16, approvals.go; in-process control plane only)
	logLevel := fs.String("log-level", "warn", "debug, info, warn or error (logs go to stderr)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "agentbox mcp: unexpected argument %q (it serves MCP on stdin/stdout)\n", fs.Arg(0))
		return 2
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(*logLevel)); err != nil {
		fmt.Fprintf(os.Stderr, "agentbox mcp: --log-level %q: use debug, info, warn or error\n", *logLevel)
		return 2
	}
	explicitDir := false
	fs.Visit(func(f *flag.Flag) { explicitDir = explicitDir || f.Name == "state-dir" })
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))
	if err := cfg.Validate(); err != nil {
		return fail(err)
	}
	ctx, cancel := signalContext()
	defer cancel()

	backend, runsBE, sqlBE, where, gates, closeFn, err := mcpBackend(ctx, cfg, explicitDir, tlsOpts, log)
	if err != nil {
		return fail(err)
	}
	defer closeFn()
	apiCall, closeAPI := mcpAPICall(backend, runsBE, gates, log) // api_call (issue 16, apicall.go)
	defer closeAPI()
	opts := mcpserver.Options{ControlPlane: where, Logger: log, Runs: runsBE, APICall: apiCall, Gate: gates, SQL: sqlBE}
	if cp := inProcess.Load(); cp != nil {
		cp.prom.Attach(cp.svc, cp.svc, log)  // no REST server attaches it here
		opts.Metrics = cp.metricsSource(ctx) // fetch_metrics (issue 16); over REST: the server's /metrics
	}
	if cb, ok := backend.(*client.Backend); ok { // joined machines (issue 17): the server's registry
		opts.Machines = cb.Machines()
		opts.RemoteJobs = cb.RemoteJobs()
		opts.Remote = cb.Machines() // remote_exec, remote_screenshot through the server
	}
	srv := mcpserver.New(backend, opts)
	defer srv.Close()
	if _, inProcess := backend.(*sandbox.Service); inProcess {
		if err := srv.Adopt(ctx); err != nil {
			return fail(err)
		}
	}
	log.Info("agentbox mcp serving on stdio", "control_plane", where)
	if err := srv.MCP().Run(ctx, &mcp.StdioTransport{}); err != nil && ctx.Err() == nil && !errors.Is(err, mcp.ErrConnectionClosed) {
		log.Warn("mcp session ended", "err", err)
	}
	return 0
}

// mcpBackend finds the control plane: the running server of the state dir; without an explicit
// --state-dir, also the server the CLI would use ($AGENTBOX_URL, else 127.0.0.1:8765 — e.g. one
// run by root for this user); else an in-process control plane.
func mcpBackend(ctx context.Context, cfg config.Config, explicitDir bool, tlsOpts clientTLS, log *slog.Logger) (mcpserver.Backend, mcpserver.RunsBackend, sqlquery.Querier, string, gate.Chain, func(), error) {
	running := func() (*client.Backend, string, error) {
		if info, err := config.ReadServerInfo(cfg.StateDir); err == nil && info.URL != "" {
			if b, err := serverAt(ctx, cfg, info.URL, tlsOpts.forURL(info.URL, cfg.StateDir)); b != nil || err != nil {
				return b, info.URL, err
			}
		}
		if explicitDir {
			return nil, "", nil
		}
		url := config.ServerURL()
		b, err := serverAt(ctx, cfg, url, tlsOpts.forURL(url))
		return b, url, err
	}
	// A running server gates every call itself (its key's scope); in process, the chain is ours.
	use := func(b *client.Backend, url string) (mcpserver.Backend, mcpserver.RunsBackend, sqlquery.Querier, string, gate.Chain, func(), error) {
		log.Info("using the running server", "url", url)
		return b, b.Runs(), b.SQL(), "agentbox serve at " + url, nil, func() {}, nil
	}
	if b, url, err := running(); err != nil {
		return nil, nil, nil, "", nil, nil, err
	} else if b != nil {
		return use(b, url)
	}
	cp, err := buildControlPlane(ctx, cfg, log, nil) // no HTTP server: no preview URLs
	if errors.Is(err, statedir.ErrLocked) {
		// Another process holds the state dir: a server still starting, or another stdio
		// session. Give a starting server a moment to publish its address.
		deadline := time.Now().Add(3 * time.Second)
		for time.Now().Before(deadline) && ctx.Err() == nil {
			time.Sleep(200 * time.Millisecond)
			if b, url, rerr := running(); rerr != nil {
				return nil, nil, nil, "", nil, nil, rerr
			} else if b != nil {
				return use(b, url)
			}
		}
		return nil, nil, nil, "", nil, nil, fmt.Errorf("%w\nanother `agentbox mcp` (or a server that is not answering) is using state dir %s, and two control planes must never share one. "+
			"To let several MCP clients share sandboxes, run `agentbox serve --state-dir %s` and they will all connect to it; or give this one its own --state-dir", err, cfg.StateDir, cfg.StateDir)
	}
	if err != nil {
		return nil, nil, nil, "", nil, nil, err
	}
	// Durable runs (issue 14): no HTTP server in process, so artifact URLs have no address to
	// name (run_artifact returns small files inline).
	if err := cp.startRuns(ctx, cfg, log, func() string { return "" }); err != nil {
		cp.Close()
		return nil, nil, nil, "", nil, nil, err
	}
	cp.startLoop(ctx) // TTLs, destroys, the orphan sweep, the run workers; cp.Close stops it and waits
	closeFn := cp.Close
	inProcess.Store(cp)
	return cp.svc, cp.runsBackend(), cp.store, "in-process (state dir " + cfg.StateDir + ")", cp.gates, closeFn, nil
}

// serverAt returns a backend over the agentbox server at url if it answers /health (nil if
// nobody answers there). A server that answers but refuses our token is an error, not a reason
// to start another control plane.
func serverAt(ctx context.Context, cfg config.Config, url string, trust client.TLS) (*client.Backend, error) {
	hctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	probe, err := client.NewTLS(url, "", trust)
	if err != nil {
		return nil, err
	}
	if err := probe.Health(hctx); err != nil {
		if strings.HasPrefix(url, "https:") && strings.Contains(err.Error(), "certificate") {
			return nil, fmt.Errorf("the agentbox server at %s: %w (trust it with --ca-cert FILE or --fingerprint SHA256)", url, err)
		}
		return nil, nil
	}
	tok := cfg.Token
	if tok == "" {
		var err error
		if tok, err = config.ReadToken(); err != nil {
			return nil, fmt.Errorf("an agentbox server is running at %s, but %w", url, err)
		}
	}
	c, err := client.NewTLS(url, tok, trust)
	if err != nil {
		return nil, err
	}
	if _, err := c.Capacity(hctx); err != nil {
		if errcode.Is(err, errcode.AuthFailed) {
			return nil, fmt.Errorf("the agentbox server at %s refuses this token: run as the user that runs `agentbox serve`, or set AGENTBOX_TOKEN (or AGENTBOX_TOKEN_FILE) to its token", url)
		}
		return nil, fmt.Errorf("the agentbox server at %s answers /health but not the API: %w", url, err)
	}
	return client.NewBackend(c), nil
}

// mcpHandlers returns the MCP HTTP endpoints `agentbox serve` mounts behind its auth, Host check
// and panic recovery.
func mcpHandlers(srv *mcpserver.Server) map[string]http.Handler {
	opts := mcpserver.HTTPOptions{MaxBodyBytes: api.MaxJSONBody}
	return map[string]http.Handler{
		"/mcp": srv.StreamableHTTPHandler(opts),
		"/sse": srv.SSEHandler(opts),
	}
}
