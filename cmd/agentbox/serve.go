//go:build linux

package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/agentbox/agentbox/internal/api"
	"github.com/agentbox/agentbox/internal/config"
	"github.com/agentbox/agentbox/internal/e2b"
	"github.com/agentbox/agentbox/internal/interp"
	"github.com/agentbox/agentbox/internal/machine"
	"github.com/agentbox/agentbox/internal/mcpserver"
	"github.com/agentbox/agentbox/internal/remotejobs"
	"github.com/agentbox/agentbox/internal/remoteops"
	"github.com/agentbox/agentbox/internal/sandbox"
)

func cmdServe(args []string) int {
	cfg := config.Default()
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.StringVar(&cfg.Listen, "listen", cfg.Listen, "address for the REST API (loopback only unless --allow-remote)")
	fs.StringVar(&cfg.StateDir, "state-dir", cfg.StateDir, "state directory (database, runtime state, sandbox dirs)")
	fs.StringVar(&cfg.Store, "store", "", "durable store: postgres://user:password@host/db (or postgresql://…) for Postgres, sqlite://PATH for a SQLite file elsewhere; default the SQLite file agentbox.db in the state dir")
	fs.BoolVar(&cfg.AllowRemote, "allow-remote", false, "allow a non-loopback listen address (anyone who can reach it and has the token controls sandboxes)")
	fs.StringVar(&cfg.DefaultRuntime, "runtime", cfg.DefaultRuntime, "default runtime (default: crun where it works, else runc)")
	fs.IntVar(&cfg.MaxSandboxes, "max-sandboxes", cfg.MaxSandboxes, "most live sandboxes at once")
	fs.DurationVar(&cfg.DefaultTTL, "default-ttl", cfg.DefaultTTL, "TTL of a sandbox created without one")
	fs.DurationVar(&cfg.MaxTTL, "max-ttl", cfg.MaxTTL, "longest TTL a sandbox may have")
	fs.Float64Var(&cfg.Overcommit, "overcommit", cfg.Overcommit, "how far the sums of live sandboxes' cpu, memory_mb and disk_mb may exceed the host's cores, memory and disk (1 = hard reservations); admission also keeps the host's real free memory and disk above a reserve")
	fs.Float64Var(&cfg.CPUBudget, "cpu-budget", 0, "sum of live sandboxes' cpu (default overcommit × host cores)")
	fs.Int64Var(&cfg.MemoryBudgetMB, "memory-budget-mb", 0, "sum of live sandboxes' memory_mb (default overcommit × host memory)")
	fs.Int64Var(&cfg.DiskBudgetMB, "disk-budget-mb", 0, "sum of live sandboxes' disk_mb (default overcommit × (the state dir's free space at start plus what adopted sandboxes' disks hold, less a tenth of its size, at most 4 GiB))")
	fs.Int64Var(&cfg.SnapshotBudgetMB, "snapshot-budget-mb", 0, "what ready snapshots may hold on disk together; the oldest are retired to make room (default 10240)")
	fs.StringVar(&cfg.GuestBinary, "guest-binary", "", "the agent binary sandboxes run (default: agentbox-guest beside this binary, as make build writes it; else this binary)")
	fs.StringVar(&cfg.CgroupParent, "cgroup-parent", cfg.CgroupParent, "cgroup under which each sandbox gets its own (default: agentbox-<8 hex digits of the state dir's path>, or agentbox while sandboxes of an older server are there; two servers never share one)")
	fs.Int64Var(&cfg.UIDPoolBase, "uid-pool-base", 0, fmt.Sprintf("first host uid of the pool sandboxes' user-namespace ranges (%d ids each) come from (default %d)", sandbox.IDRangeSize, sandbox.DefaultIDPoolBase))
	fs.DurationVar(&cfg.JobRetention, "job-retention", cfg.JobRetention, "how long finished job records are kept")
	fs.DurationVar(&cfg.LeaseTTL, "lease-ttl", cfg.LeaseTTL, "several replicas on one store: how long the node's lifecycle lease lasts unless renewed (renewed every third of it); another replica takes a dead holder's lifecycle work (TTLs, reconcile, pool refill, run workers) over within it")
	fs.DurationVar(&cfg.ReadyTimeout, "ready-timeout", 0, fmt.Sprintf("how long a create waits for the new sandbox's agent to answer (default %v; %v with --runtime kubernetes, whose kubelet pulls the image meanwhile)", config.DefaultReadyTimeout, config.KubeReadyTimeout))
	fs.IntVar(&cfg.MaxJobsPerSandbox, "max-jobs-per-sandbox", cfg.MaxJobsPerSandbox, fmt.Sprintf("most running jobs in one sandbox (1–%d)", sandbox.DefaultMaxJobs))
	registerEgressFlags(fs, &cfg) // network (egress.go)
	registerImageFlags(fs, &cfg)  // images (images.go)
	registerRunFlags(fs, &cfg)    // durable runs (run.go)
	registerKubeFlags(fs, &cfg)   // the kubernetes runtime (kube_wire.go)
	registerVMFlags(fs, &cfg)     // the vm runtime (vm_wire.go)
	var tlsFlags serveTLS
	tlsFlags.register(fs)           // TLS and exposure (tls.go)
	registerAuditFlags(fs, &cfg)    // the audit log (audit.go)
	registerApprovalFlags(fs, &cfg) // approvals (approvals.go)
	pools := registerPoolFlags(fs)  // warm pools (pools.go)
	relay := registerRelayFlags(fs) // the file relay (relay.go)
	e2bOn := fs.Bool("e2b", true, "serve the E2B-compatible API (E2B's SDKs with E2B_API_URL and E2B_SANDBOX_URL set to this server; docs/E2B.md): same listener, same keys, scopes and gates; --e2b=false turns it off")
	e2bDomain := fs.String("e2b-domain", "", "also route E2B sandbox hosts {port}-{id}.DOMAIN to the E2B API (a wildcard name for TLS deployments; E2B_DOMAIN on the SDK side)")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	noAuth := fs.Bool("insecure-no-auth", false, "TESTING ONLY: serve without the bearer token (refused unless --listen is a loopback address)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	cfg.MaxPooled = pools.maxPooled // warm pools (pools.go)
	if *noAuth {
		if host, _, err := net.SplitHostPort(cfg.Listen); err != nil || !config.IsLoopback(host) || cfg.AllowRemote {
			fmt.Fprintf(os.Stderr, "agentbox serve: --insecure-no-auth works only on a loopback --listen address and without --allow-remote (got %q)\n", cfg.Listen)
			return 2
		}
	}
	if err := relay.check(); err != nil {
		fmt.Fprintf(os.Stderr, "agentbox serve: %v\n", err)
		return 2
	}
	tlsFlags.allowPrivateNet = cfg.AllowPrivateNetwork
	if err := tlsFlags.checkListen(cfg.Listen, cfg.AllowRemote); err != nil {
		fmt.Fprintf(os.Stderr, "agentbox serve: %v\n", err)
		return 2
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(*logLevel)); err != nil {
		fmt.Fprintf(os.Stderr, "agentbox serve: --log-level %q: use debug, info, warn or error\n", *logLevel)
		return 2
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))
	if err := cfg.Validate(); err != nil {
		return fail(err)
	}
	token, err := config.LoadOrCreateToken(cfg)
	if err != nil {
		return fail(err)
	}
	if *noAuth {
		token = ""
		fmt.Fprint(os.Stderr, "\n"+
			"!!! agentbox serve --insecure-no-auth: THE API AND MCP ENDPOINTS ACCEPT REQUESTS WITHOUT A TOKEN.\n"+
			"!!! Any process on this machine can create sandboxes and run commands through them.\n"+
			"!!! This is for conformance testing only; never use it otherwise.\n\n")
	}
	ctx, cancel := signalContext()
	defer cancel()
	previews := &previewURLs{} // network: http://{port}-{id}.localhost:{server port}/
	cp, err := buildControlPlane(ctx, cfg, log, previews.URL)
	if err != nil {
		return fail(err)
	}
	defer cp.Close()
	if err := pools.apply(ctx, cp.pools); err != nil { // warm pools (pools.go)
		return fail(err)
	}

	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fail(fmt.Errorf("listen on %s: %w", cfg.Listen, err))
	}
	previews.setAddr(ln.Addr())
	url := "http://" + ln.Addr().String()
	info := config.ServerInfo{PID: os.Getpid()}
	if tlsFlags.enabled() { // TLS (tls.go)
		host, _, _ := net.SplitHostPort(cfg.Listen)
		tcfg, fp, certFile, err := tlsFlags.config(cfg.StateDir, host)
		if err != nil {
			ln.Close()
			return fail(err)
		}
		ln = tls.NewListener(ln, tcfg)
		previews.tls.Store(true)
		url = "https://" + ln.Addr().String()
		info.TLSFingerprint, info.TLSCert = fp, certFile
		fmt.Fprintf(os.Stderr, "agentbox serve: TLS certificate SHA-256 fingerprint %s\n", fp)
	}
	info.URL = url
	if err := config.WriteServerInfo(cfg.StateDir, info); err != nil {
		log.Warn("cannot publish server address", "err", err)
	}
	if err := cp.startRuns(ctx, cfg, log, func() string { return url }); err != nil { // durable runs
		return fail(err)
	}
	machines := machine.New(cp.store, machine.Options{Logger: log}) // joined machines
	defer machines.Close()
	// remote jobs: over the registry's connections; a background check releases the GPUs of jobs
	// that ended while nobody asked and settles records a crash left starting. The check is
	// lifecycle work: it runs on the replica holding the lease, and Close waits for it.
	rjobs := remotejobs.New(machines, cp.store, remotejobs.Options{Owner: sandbox.OwnerFrom, Logger: log})
	cp.underLease(func(ctx context.Context) { rjobs.Run(ctx, remoteJobCheckInterval) })
	relaySvc, err := relay.start(ctx, cp.store, cfg.StateDir, machines, func() string { return url }, log) // the file relay
	if err != nil {
		return fail(err)
	}
	defer relaySvc.Close()
	var handler *api.Server           // api_call (apicall.go) calls it in process
	interpreter := interp.New(cp.svc) // the code interpreter: run_code, E2B's runCode
	defer interpreter.Close()
	var e2bSrv *e2b.Server
	if *e2bOn {
		e2bSrv = e2b.New(cp.svc, e2b.Options{Logger: log, Interpreter: interpreter, Domain: *e2bDomain, Metrics: cp.metrics})
		defer e2bSrv.Close()
	}
	mcpSrv := mcpserver.New(cp.sandboxes, mcpserver.Options{ControlPlane: "agentbox serve (state dir " + cfg.StateDir + ")", Logger: log, Runs: cp.runsBackend(), Interpreter: interpreter,
		APICall: apiCallVia(&handler), Gate: cp.gates, Samples: cp.metrics, Network: cp.network, Images: cp.imgs, Snapshots: cp.snaps,
		SQL: cp.store, Metrics: cp.metricsSource(ctx), Machines: mcpserver.RegistryMachines{R: machines}, RemoteJobs: rjobs, // execute_sql, fetch_metrics
		Relay:  relaySvc,                                                                                                      // remote_pull, remote_push
		Remote: mcpserver.RemoteServices{Exec: remoteops.NewExec(machines), Screenshots: remoteops.NewScreenshots(machines)}}) // remote_exec, remote_screenshot
	if err := mcpSrv.Adopt(ctx); err != nil {
		return fail(err)
	}
	defer mcpSrv.Close()
	handler = api.New(cp.svc, api.Options{Token: token, MaxFileBytes: cfg.MaxFileBytes, AllowAnyHost: cfg.AllowRemote, Logger: log,
		Mount: mcpHandlers(mcpSrv), Metrics: cp.metrics, Network: cp.network, Images: cp.imgs, Pools: cp.pools, Prometheus: cp.prom, Jobs: cp.sandboxes.Jobs(), SandboxJobs: cp.sandboxes.Jobs(), Snapshots: cp.snaps, Runs: cp.runs,
		Gate: cp.gates, Keys: cp.keys, Audit: cp.store, SQL: cp.store,
		Approvals: cp.approvals, Machines: machines, RemoteJobs: rjobs, // the gates, API keys, GET /v1/audit; POST /v1/sql; /v1/approvals
		Blobs:      relaySvc,                                                                     // the file relay
		RemoteExec: remoteops.NewExec(machines), Screenshots: remoteops.NewScreenshots(machines), // remote_exec, remote_screenshot
		E2B: e2bSrv, E2BDomain: *e2bDomain, // the E2B-compatible API
		Conversations: cp.store,         // agentbox chat's conversations
		Lease:         cp.owner.Status}) // several replicas: GET /health's "replica"
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second, MaxHeaderBytes: 64 << 10}
	srv.RegisterOnShutdown(mcpSrv.Close)   // ends MCP event streams, which would hold Shutdown up
	srv.RegisterOnShutdown(handler.Close)  // and long polls for events
	srv.RegisterOnShutdown(machines.Close) // and machines' sessions (hijacked, so Shutdown would not end them)
	if e2bSrv != nil {
		srv.RegisterOnShutdown(e2bSrv.Close) // and E2B processes' streams (their processes end with the server)
	}
	// The control loop may be destroying a sandbox: cp.Close (deferred above) stops it and waits
	// for it before the store closes and the state-dir lock is released.
	cp.startLoop(ctx)
	// The lifecycle work stops, and is waited for, before what it uses closes (the machines'
	// registry, deferred above; the store and the sandbox service, in cp.Close): the remote-job
	// checks use the machines, the run workers the sandbox service. Deferred calls run last
	// first: the loop's stop ends the run workers' term, which stopRuns then finds over.
	defer cp.stopRuns()
	defer cp.stopLoop()
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	log.Info("agentbox serving", "replica", cp.replica, "url", url, "mcp", url+"/mcp", "state_dir", cfg.StateDir, "token_file", tokenSource(cfg), "tls_fingerprint", info.TLSFingerprint)
	select {
	case <-ctx.Done():
	case err := <-errc:
		if !errors.Is(err, http.ErrServerClosed) {
			return fail(err)
		}
	}
	log.Info("shutting down; sandboxes keep running and are adopted at the next start")
	sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer scancel()
	_ = srv.Shutdown(sctx)
	_ = os.Remove(config.ServerInfoPath(cfg.StateDir))
	return 0
}

// remoteJobCheckInterval is how often the lease holder checks remote jobs' records against what
// their machines say.
const remoteJobCheckInterval = 30 * time.Second

func tokenSource(cfg config.Config) string {
	if cfg.Token != "" {
		return "$AGENTBOX_TOKEN"
	}
	return cfg.TokenFile
}
