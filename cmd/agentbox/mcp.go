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
	"github.com/agentbox/agentbox/internal/interp"
	"github.com/agentbox/agentbox/internal/mcprelay"
	"github.com/agentbox/agentbox/internal/mcpserver"
	"github.com/agentbox/agentbox/internal/runs"
	"github.com/agentbox/agentbox/internal/sandbox/jobs"
	"github.com/agentbox/agentbox/internal/statedir"
)

// The in-process control plane the MCP server drives when no server is running.
var _ mcpserver.Backend = jobs.Sandboxes{}

// cmdMCP serves MCP over stdio: JSON-RPC on stdout, logs on stderr. With a running server (the
// state dir's, or the one the CLI would use) it relays stdio to the server's /mcp endpoint, so
// the server's one MCP implementation serves this client too, its session the owner of what it
// creates; else it runs the control plane in-process (holding the state-dir lock, so two
// clients never run two control planes on one state dir).
func cmdMCP(args []string) int {
	cfg := config.Default()
	fs := flag.NewFlagSet("mcp", flag.ContinueOnError)
	fs.StringVar(&cfg.StateDir, "state-dir", cfg.StateDir, "state directory: its running server is used, or the control plane runs in this process")
	fs.StringVar(&cfg.CgroupParent, "cgroup-parent", cfg.CgroupParent, "cgroup under which each sandbox gets its own (in-process control plane only; default: derived from the state dir, as serve's)")
	fs.StringVar(&cfg.DefaultRuntime, "runtime", cfg.DefaultRuntime, "default runtime (in-process control plane only; default: crun where it works, else runc)")
	fs.IntVar(&cfg.MaxSandboxes, "max-sandboxes", cfg.MaxSandboxes, "most live sandboxes at once (in-process control plane only)")
	registerEgressFlags(fs, &cfg) // network (in-process control plane only)
	registerImageFlags(fs, &cfg)  // images (images.go; in-process control plane only)
	registerRunFlags(fs, &cfg)    // durable runs (run.go; in-process control plane only)
	var tlsOpts clientTLS
	tlsOpts.register(fs)            // a running server over https (tls.go)
	registerAuditFlags(fs, &cfg)    // the audit log (audit.go; in-process control plane only)
	registerApprovalFlags(fs, &cfg) // approvals (approvals.go; in-process control plane only)
	serverURL := fs.String("server", "", "relay to the agentbox server at this URL (refused when none answers there); default: the state dir's running server, else $AGENTBOX_URL or the local one, else in-process")
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

	var server *client.Client
	var cp *controlPlane
	var where string
	var err error
	if *serverURL != "" { // this server or none: never a control plane of its own
		if server, err = serverAt(ctx, cfg, *serverURL, tlsOpts.forURL(*serverURL)); err == nil && server == nil {
			err = errcode.New(errcode.Unavailable, "no agentbox server answers at %s (--server): start it, or drop --server", *serverURL)
		}
	} else {
		server, cp, where, err = mcpControlPlane(ctx, cfg, explicitDir, tlsOpts, log)
	}
	if err != nil {
		return fail(err)
	}
	if server != nil {
		return relayMCP(ctx, server, log)
	}
	defer cp.Close()
	apiCall, closeAPI := mcpAPICall(cp, log) // api_call (apicall.go)
	defer closeAPI()
	opts := mcpserver.Options{ControlPlane: where, Logger: log, Runs: cp.runsBackend(), APICall: apiCall, Gate: cp.gates, SQL: cp.store,
		Samples: cp.metrics, Network: cp.network, Images: cp.imgs, Snapshots: cp.snaps} // sandbox_metrics, fetch_metrics' sample; the network, image and snapshot tools
	cp.prom.Attach(cp.svc, cp.metrics, cp.sandboxes.Jobs(), log) // no REST server attaches it here
	opts.Metrics = cp.metricsSource(ctx)                         // fetch_metrics over the process's own registry
	opts.Interpreter = interp.New(cp.svc)                        // run_code, code_context_create
	defer opts.Interpreter.Close()
	srv := mcpserver.New(cp.sandboxes, opts)
	defer srv.Close()
	if err := srv.Adopt(ctx); err != nil {
		return fail(err)
	}
	log.Info("agentbox mcp serving on stdio", "control_plane", where)
	if err := srv.MCP().Run(ctx, &mcp.StdioTransport{}); err != nil && ctx.Err() == nil && !errors.Is(err, mcp.ErrConnectionClosed) {
		log.Warn("mcp session ended", "err", err)
	}
	return 0
}

// mcpAPICall is api_call's transport for `agentbox mcp`'s in-process control plane: an api
// handler over it with its gates; the func returned closes it.
func mcpAPICall(cp *controlPlane, log *slog.Logger) (mcpserver.APICallFunc, func()) {
	rs, _ := cp.runsBackend().(*runs.Service)
	opts := api.Options{Logger: log, Runs: rs, Gate: cp.gates, Metrics: cp.metrics, Network: cp.network, Images: cp.imgs, Pools: cp.pools, SandboxJobs: cp.sandboxes.Jobs(), Snapshots: cp.snaps, // the tools' sampler: one previous CPU sample per sandbox
		Conversations: cp.store} // agentbox chat over stdio records its conversation here
	if cp.approvals != nil {
		opts.Approvals = cp.approvals // the policy, and the chat's decisions in the terminal
	}
	h := api.New(cp.svc, opts)
	return h.Call, h.Close
}

// relayMCP relays stdio to the running server's MCP endpoint until either ends.
func relayMCP(ctx context.Context, server *client.Client, log *slog.Logger) int {
	endpoint := server.BaseURL() + "/mcp"
	log.Info("agentbox mcp relaying stdio to the running server", "url", endpoint)
	err := mcprelay.Run(ctx, &mcp.StdioTransport{}, mcprelay.Options{Endpoint: endpoint, HTTPClient: server.HTTP(), Logger: log,
		OnSession: func(id string) { log.Info("mcp session opened on the server", "session", id) }})
	if err != nil && ctx.Err() == nil {
		fmt.Fprintf(os.Stderr, "agentbox mcp: the MCP session with the agentbox server at %s ended: %v\n", server.BaseURL(), err)
		return 1
	}
	return 0
}

// mcpControlPlane finds the control plane: the running server of the state dir; without an
// explicit --state-dir, also the server the CLI would use ($AGENTBOX_URL, else 127.0.0.1:8765 —
// e.g. one run by root for this user); else an in-process control plane. Exactly one of the
// server and the control plane is non-nil.
func mcpControlPlane(ctx context.Context, cfg config.Config, explicitDir bool, tlsOpts clientTLS, log *slog.Logger) (*client.Client, *controlPlane, string, error) {
	running := func() (*client.Client, error) {
		if info, err := config.ReadServerInfo(cfg.StateDir); err == nil && info.URL != "" {
			if c, err := serverAt(ctx, cfg, info.URL, tlsOpts.forURL(info.URL, cfg.StateDir)); c != nil || err != nil {
				return c, err
			}
		}
		if explicitDir {
			return nil, nil
		}
		url := config.ServerURL()
		return serverAt(ctx, cfg, url, tlsOpts.forURL(url))
	}
	if c, err := running(); err != nil || c != nil {
		return c, nil, "", err
	}
	cp, err := buildControlPlane(ctx, cfg, log, nil) // no HTTP server: no preview URLs
	if errors.Is(err, statedir.ErrLocked) {
		// Another process holds the state dir: a server still starting, or another stdio
		// session. Give a starting server a moment to publish its address.
		deadline := time.Now().Add(3 * time.Second)
		for time.Now().Before(deadline) && ctx.Err() == nil {
			time.Sleep(200 * time.Millisecond)
			if c, rerr := running(); rerr != nil || c != nil {
				return c, nil, "", rerr
			}
		}
		return nil, nil, "", fmt.Errorf("%w\nanother `agentbox mcp` (or a server that is not answering) is using state dir %s, and two control planes must never share one. "+
			"To let several MCP clients share sandboxes, run `agentbox serve --state-dir %s` and they will all connect to it; or give this one its own --state-dir", err, cfg.StateDir, cfg.StateDir)
	}
	if err != nil {
		return nil, nil, "", err
	}
	// Durable runs: no HTTP server in process, so artifact URLs have no address to name
	// (run_artifact returns small files inline).
	if err := cp.startRuns(ctx, cfg, log, func() string { return "" }); err != nil {
		cp.Close()
		return nil, nil, "", err
	}
	cp.startLoop(ctx) // TTLs, destroys, the orphan sweep, the run workers; cp.Close stops it and waits
	return nil, cp, "in-process (state dir " + cfg.StateDir + ")", nil
}

// serverAt returns a client of the agentbox server at url if it answers /health and takes our
// token (nil if nobody answers there). A server that answers but refuses our token is an error,
// not a reason to start another control plane.
func serverAt(ctx context.Context, cfg config.Config, url string, trust client.TLS) (*client.Client, error) {
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
	return c, nil
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
