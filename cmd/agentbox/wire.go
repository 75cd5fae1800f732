//go:build linux

package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/agentbox/agentbox/internal/api"
	"github.com/agentbox/agentbox/internal/approval"
	"github.com/agentbox/agentbox/internal/audit"
	"github.com/agentbox/agentbox/internal/auth"
	"github.com/agentbox/agentbox/internal/authz"
	"github.com/agentbox/agentbox/internal/config"
	"github.com/agentbox/agentbox/internal/gate"
	"github.com/agentbox/agentbox/internal/hostinfo"
	"github.com/agentbox/agentbox/internal/hostlock"
	"github.com/agentbox/agentbox/internal/image"
	"github.com/agentbox/agentbox/internal/lease"
	"github.com/agentbox/agentbox/internal/mcpserver"
	"github.com/agentbox/agentbox/internal/metricsnap"
	"github.com/agentbox/agentbox/internal/runs"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/oci"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/sandbox/imageadmin"
	"github.com/agentbox/agentbox/internal/sandbox/jobs"
	"github.com/agentbox/agentbox/internal/sandbox/metrics"
	"github.com/agentbox/agentbox/internal/sandbox/netsession"
	"github.com/agentbox/agentbox/internal/sandbox/pools"
	"github.com/agentbox/agentbox/internal/sandbox/snapshots"
	"github.com/agentbox/agentbox/internal/statedir"
	"github.com/agentbox/agentbox/internal/store"
	"github.com/agentbox/agentbox/internal/store/postgres"
	"github.com/agentbox/agentbox/internal/store/sqlite"
)

// controlPlane is everything a server process owns.
type controlPlane struct {
	svc *sandbox.Service
	// metrics samples the sandboxes' resource use (the REST routes, MCP tools, Prometheus).
	metrics *metrics.Service
	// network serves sandboxes' network records and preview URLs (the REST routes, MCP tools,
	// watch streams, the preview proxy).
	network *netsession.Service
	// imgs is the image calls over the cache (list, pull, push, commit, …).
	imgs *imageadmin.Service
	// pools keeps the warm pools (the REST routes, MCP tools, serve's --pool); built right
	// after the service, so that its create hooks follow the core's own.
	pools *pools.Service
	// snaps takes, lists, deletes, forks from and diffs snapshots (the REST routes, MCP tools).
	snaps *snapshots.Service
	// sandboxes is svc with its jobs feature (the MCP backend, the runs' workers); its Jobs()
	// serves the job routes and tools.
	sandboxes jobs.Sandboxes
	store     store.Store // SQLite (the default) or Postgres (--store)
	// changes tells of other processes' writes to a shared store (Postgres); nil when this
	// process is alone on its store (SQLite).
	changes store.ChangeNotifier
	images  *image.Store // the OCI image cache
	lock    *statedir.Lock
	// hostLock holds the server's cgroup parents (hostclaim.go); nil without cgroups.
	hostLock *hostlock.Lock
	prom     *api.Prometheus // the service's Observer, served at GET /metrics
	// tracing exports the create trace over OTLP (tracing.go); nil when not configured.
	tracing *sdktrace.TracerProvider
	// durable runs (startRuns): nil until started.
	runs     *runs.Service
	runsStop func()
	runsOnce sync.Once
	keys     *auth.Keys // API keys
	// Governance: the gates every REST route and MCP tool call passes, in order —
	// audit (outermost, so refusals are recorded) → scopes → approvals — and the audit log.
	gates gate.Chain
	audit *audit.Recorder
	// approvals: the queue and the chain's last gate.
	approvals *approval.Service
	// Several replicas: this process's replica id and the owner of the node's
	// lifecycle lease, which runs the lifecycle work (startLoop) only while it holds it.
	replica string
	owner   *lease.Owner
	log     *slog.Logger // nil: slog.Default()
	// The lifecycle work (startLoop): its cancel and the channel closed when it has returned
	// (and the lease is released).
	loopStop context.CancelFunc
	loopDone chan struct{}
	// leaseWork is more work that runs with the lifecycle work (underLease): the remote-job
	// checks.
	leaseWork []func(ctx context.Context)
}

// underLease adds work to the node's lifecycle work (startLoop): it runs only on the replica
// that holds the lifecycle lease, is stopped (its ctx ends) when the lease is lost and run again
// on a later term, and Close waits for it to return. Call it before startLoop.
func (cp *controlPlane) underLease(work func(ctx context.Context)) {
	cp.leaseWork = append(cp.leaseWork, work)
}

// startLoop runs the node's lifecycle work in the background until Close, while this replica
// holds the node's lifecycle lease (alone on its store: always, from the start): the service's
// control loop (TTLs, destroys, the orphan sweep, pruning) with the warm pools' refill, the run
// workers (startRuns built them) and the work underLease added. On a takeover — the lease gained after another replica
// may have held it — it first reconciles the store with the runtime (records without a runtime
// object become lost, runtime objects without a record are deleted). Losing the lease stops
// all of it at once. Call startRuns first.
func (cp *controlPlane) startLoop(ctx context.Context) {
	if cp.owner == nil { // alone on its store
		cp.owner = lease.New(lease.Config{Name: lease.Lifecycle(cp.svc.Config().Node), Holder: cp.replica})
		_, _ = cp.owner.TryAcquire(ctx)
	}
	log := cp.log
	if log == nil {
		log = slog.Default()
	}
	rctx, stop := context.WithCancel(ctx)
	cp.loopStop, cp.loopDone = stop, make(chan struct{})
	var follow sync.WaitGroup
	if cn := cp.changes; cn != nil {
		// Every replica: another replica's writes wake this one's event watchers, run and
		// batch waits, the run dispatcher and approval waits at once.
		wake := []func(){cp.svc.StoreChanged}
		if cp.runs != nil {
			wake = append(wake, cp.runs.StoreChanged)
		}
		if cp.approvals != nil {
			wake = append(wake, cp.approvals.StoreChanged)
		}
		follow.Go(func() { sandbox.FollowChanges(rctx, cn, log, wake...) })
	}
	go func() {
		defer close(cp.loopDone)
		defer follow.Wait()
		cp.owner.Run(rctx, func(ctx context.Context, takeover bool) {
			if takeover {
				if err := cp.svc.Reconcile(ctx); err != nil && ctx.Err() == nil {
					log.Warn("reconcile on taking the lifecycle lease; the control loop retries", "err", err)
				}
			}
			var wg sync.WaitGroup
			wg.Go(func() { cp.svc.Run(ctx) })
			if cp.runs != nil {
				wg.Go(func() { cp.runs.Run(ctx) })
			}
			for _, work := range cp.leaseWork {
				wg.Go(func() { work(ctx) })
			}
			wg.Wait()
		})
	}()
}

// Close stops the lifecycle work (run workers, control loop, remote-job checks) and waits for it:
// a destroy it is doing finishes before the store closes and the state-dir lock is released, so
// no other process takes the state dir while this one still works in it; the lease is released,
// so another replica takes the work over at once.
func (cp *controlPlane) Close() {
	cp.stopLoop()
	cp.stopRuns()
	cp.svc.Close()
	if cp.tracing != nil {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := cp.tracing.Shutdown(sctx); err != nil && cp.log != nil {
			cp.log.Warn("create trace: export at shutdown", "err", err)
		}
		cancel()
	}
	if c, ok := any(cp.images).(io.Closer); ok {
		c.Close()
	}
	if cp.audit != nil {
		cp.audit.Close() // writes what is queued before the store closes
	}
	cp.store.Close()
	cp.hostLock.Release()
	cp.lock.Release()
}

// stopLoop stops the lifecycle work and waits for it (and for the lease's release); safe to call
// more than once, and before startLoop.
func (cp *controlPlane) stopLoop() {
	if cp.loopStop != nil {
		cp.loopStop()
		<-cp.loopDone
	}
}

// reservedIDs are the host's own ids, which no sandbox's id range may include.
func reservedIDs() []sandbox.IDRange {
	var out []sandbox.IDRange
	for _, r := range hostinfo.ReservedIDs() {
		out = append(out, sandbox.IDRange{Base: r.First, Count: r.Count})
	}
	return out
}

// openStore opens the store cfg.Store selects (config.ParseStore): SQLite's agentbox.db in the
// state dir by default. It logs the driver and where, never a DSN's password. changes is the
// store's notifier of other processes' writes when the store is shared with other replicas
// (Postgres), nil when this process is alone on it (SQLite).
func openStore(ctx context.Context, cfg config.Config, log *slog.Logger) (_ store.Store, changes store.ChangeNotifier, _ error) {
	spec, err := config.ParseStore(cfg.Store, cfg.StateDir)
	if err != nil {
		return nil, nil, err
	}
	switch spec.Driver {
	case config.StorePostgres:
		st, err := postgres.Open(ctx, spec.DSN)
		if err != nil {
			return nil, nil, fmt.Errorf("open store: %w", err)
		}
		log.Info("store", "driver", "postgres", "dsn", postgres.Redact(spec.DSN))
		return st, st, nil
	default:
		st, err := sqlite.Open(ctx, spec.Path)
		if err != nil {
			return nil, nil, fmt.Errorf("open store: %w", err)
		}
		log.Debug("store", "driver", "sqlite", "path", spec.Path)
		return st, nil, nil
	}
}

// buildControlPlane takes the state-dir lock, opens the store, probes the runtimes, builds the
// service and reconciles it with the host. previewURL makes preview URLs (nil: the process
// serves none). The caller closes the result.
func buildControlPlane(ctx context.Context, cfg config.Config, log *slog.Logger, previewURL func(id string, port int) string) (*controlPlane, error) {
	lock, err := statedir.Acquire(cfg.StateDir)
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			lock.Release()
		}
	}()
	// Refuse now, not at the first create, a state dir that sandboxes could not reach (one
	// under a 0700 mktemp dir or a 0750 home): the runtimes would only be listed unavailable
	// (runc, crun) or fail at create. Not as root, no runtime works and each says why.
	if os.Geteuid() == 0 {
		if err := statedir.CheckSearchable(cfg.StateDir); err != nil {
			return nil, err
		}
	}
	st, changes, err := openStore(ctx, cfg, log)
	if err != nil {
		return nil, err
	}
	defer func() {
		if !ok {
			st.Close()
		}
	}()
	// A runtime's root is <state>/runtimes/<name>. Sandboxes' root users, unprivileged host
	// users in user namespaces, must search every directory above it (statedir makes the state
	// dir 0711); 0711 lets them pass, not list.
	runtimesDir := filepath.Join(cfg.StateDir, "runtimes")
	if err := os.MkdirAll(runtimesDir, 0o711); err != nil {
		return nil, fmt.Errorf("create %s: %w", runtimesDir, err)
	}
	if err := os.Chmod(runtimesDir, 0o711); err != nil {
		return nil, fmt.Errorf("make %s searchable: %w", runtimesDir, err)
	}
	guestBin, lean, err := guestBinary(cfg.GuestBinary)
	if err != nil {
		return nil, err
	}
	if !lean {
		log.Warn(fatGuestWarning, "guest_binary", guestBin)
	}
	var rts []runtime.Runtime
	var hostLock *hostlock.Lock // the cgroup parents' host locks (hostclaim.go)
	defer func() {
		if !ok {
			hostLock.Release()
		}
	}()
	node := ""
	var idClaims sandbox.IDClaimer
	if config.KubeRuntime(cfg.DefaultRuntime) {
		// The kubernetes runtimes only (kube_wire.go): every replica on the same namespace is
		// the same node, so that admission's bounds hold across them.
		rts, err = newKubeRuntimes(ctx, cfg, guestBin, log)
		node = "kube:" + cfg.KubeNamespace
	} else {
		// The cgroup parent is this state dir's, held for the server's life (hostclaim.go).
		var parent string
		if parent, err = cgroupParent(ctx, cfg.CgroupParent, cfg.StateDir, st, log); err != nil {
			return nil, err
		}
		if hostLock, err = lockCgroupParents(parent, cfg.StateDir); err != nil {
			return nil, err
		}
		log.Debug("cgroup parent", "cgroup_parent", parent)
		if idClaims, err = hostIDClaims(cfg.StateDir); err != nil {
			return nil, err
		}
		rts, err = newRuntimes(ctx, cfg.StateDir, parent, guestBin, log)
		if err == nil {
			var vm runtime.Runtime
			if vm, err = newVMRuntime(ctx, cfg, parent, guestBin, log); err == nil {
				rts = append(rts, vm)
			}
		}
	}
	if err != nil {
		return nil, err
	}
	defaultRuntime := cfg.DefaultRuntime
	if defaultRuntime == "" {
		defaultRuntime = pickDefaultRuntime(rts)
		log.Info("default runtime", "runtime", defaultRuntime, "preferred", config.PreferredRuntimes)
	}
	over := cfg.Overcommit
	cpuBudget, memBudget := cfg.CPUBudget, cfg.MemoryBudgetMB
	if cpuBudget == 0 {
		cpuBudget = float64(hostinfo.NumCPU()) * over
	}
	memTotal, err := hostinfo.MemTotalMiB()
	if err != nil {
		return nil, err
	}
	if memBudget == 0 {
		memBudget = int64(float64(memTotal) * over)
	}
	_, diskTotal, err := hostinfo.DiskSpaceMiB(cfg.StateDir)
	if err != nil {
		return nil, err
	}
	diskBudget := cfg.DiskBudgetMB
	if diskBudget == 0 {
		base, err := defaultDiskBudgetMB(ctx, cfg.StateDir, rts)
		if err != nil {
			return nil, err
		}
		diskBudget = int64(float64(base) * over)
	}
	stateDir := cfg.StateDir
	eg, err := egressConfig(cfg, log) // network (egress.go)
	if err != nil {
		return nil, err
	}
	images, err := openImages(cfg, log, st.ImagesInUse) // images (images.go)
	if err != nil {
		return nil, err
	}
	defer func() {
		if c, isCloser := any(images).(io.Closer); !ok && isCloser {
			c.Close()
		}
	}()
	prom := api.NewPrometheus()
	tracing, err := newTracing(ctx, log)
	if err != nil {
		return nil, fmt.Errorf("OpenTelemetry exporter (OTEL_EXPORTER_OTLP_*): %w", err)
	}
	defer func() {
		if !ok && tracing != nil {
			tracing.Shutdown(context.WithoutCancel(ctx))
		}
	}()
	var tracer trace.TracerProvider
	if tracing != nil {
		tracer = tracing
	}
	// A store that tells of other processes' changes (Postgres) is shared with other replicas.
	shared := changes != nil
	headroom := func(context.Context) (sandbox.Headroom, error) {
		mem, err := hostinfo.MemAvailableMiB()
		if err != nil {
			return sandbox.Headroom{}, err
		}
		free, _, err := hostinfo.DiskSpaceMiB(stateDir)
		return sandbox.Headroom{MemoryAvailableMB: mem, DiskFreeMB: free}, err
	}
	readyTimeout := cfg.ReadyTimeout
	if node != "" {
		headroom = nil // pods use the cluster's nodes, not this host's memory and disk
		if readyTimeout == 0 {
			readyTimeout = config.KubeReadyTimeout
		}
	}
	svc, err := sandbox.NewService(st, rts, sandbox.Config{
		Node:           node,
		Shared:         shared,
		Observer:       prom,
		Tracing:        tracer,
		DefaultRuntime: defaultRuntime, DefaultTTL: cfg.DefaultTTL, MaxTTL: cfg.MaxTTL,
		MaxSandboxes: cfg.MaxSandboxes, MaxPooled: cfg.MaxPooled, CPUBudget: cpuBudget, MemoryBudgetMB: memBudget, DiskBudgetMB: diskBudget,
		Overcommit: over, MemoryReserveMB: max(256, memTotal/20), DiskReserveMB: min(diskTotal/10, 4096),
		Headroom:   headroom,
		IDPoolBase: cfg.UIDPoolBase, ReservedIDs: reservedIDs(), IDClaims: idClaims,
		JobRetention: cfg.JobRetention, MaxJobsPerSandbox: cfg.MaxJobsPerSandbox, ReadyTimeout: readyTimeout,
		Egress: eg, PreviewURL: previewURL,
		Images: images,
		// Snapshots: on the runtimes' file system, so a files snapshot can be a
		// reflink or hard link of a disk.
		SnapshotDir: filepath.Join(cfg.StateDir, "snapshots"), SnapshotBudgetBytes: cfg.SnapshotBudgetMB << 20,
	}, log)
	if err != nil {
		return nil, err
	}
	// Every feature registers its hooks before Reconcile runs them: at start it re-arms the
	// adopted sandboxes' job watches and egress sessions (Adopted) and converges and sweeps
	// what a crash left (snapshots). The network feature comes before the pools (a pool's
	// claim reads the network its Prepare hook set).
	core := svc.Core()
	snaps := snapshots.New(core, st)
	network := netsession.New(core, st)
	poolsFeat := pools.New(core, st)
	sandboxes := jobs.With(svc)
	metricsFeat, imgs := metrics.New(core, st), imageadmin.New(core, st)
	// Several replicas: the node's lifecycle lease. Alone on its store (SQLite) a
	// server takes it at once and reconciles before serving, as it always did; a replica whose
	// lease another holds serves at once and leaves reconcile to the holder (or to its own
	// takeover).
	replica := lease.NewReplicaID()
	var leases lease.Store // nil: always held
	if shared {
		// Only a shared store's leases: alone on SQLite (the state-dir lock held) a server
		// restarted after a SIGKILL must not wait for its dead predecessor's lease to expire.
		leases = st
	}
	// The last replica id on this state dir is a dead process's (the state-dir lock is ours):
	// its lease, if still live, is taken over at once.
	idFile := filepath.Join(cfg.StateDir, "replica-id")
	prev, _ := os.ReadFile(idFile)
	if err := os.WriteFile(idFile, []byte(replica+"\n"), 0o600); err != nil {
		return nil, fmt.Errorf("record the replica id: %w", err)
	}
	owner := lease.New(lease.Config{Leases: leases, Name: lease.Lifecycle(svc.Config().Node),
		Holder: replica, TTL: cfg.LeaseTTL, Log: log, OnChange: prom.ObserveLease, Predecessor: strings.TrimSpace(string(prev))})
	held, err := owner.TryAcquire(ctx)
	if err != nil {
		return nil, err
	}
	log.Info("replica", "replica", replica, "lease", lease.Lifecycle(svc.Config().Node), "lease_held", held, "lease_ttl", cfg.LeaseTTL)
	if held {
		if err := svc.Reconcile(ctx); err != nil {
			return nil, fmt.Errorf("reconcile: %w", err)
		}
	}
	rec := audit.New(st, audit.Config{Retention: cfg.AuditRetention, MaxRows: cfg.AuditMaxRows}, log.With("component", "audit"))
	// approvals: the queue (always served) and, when on, the chain's last gate.
	approvals, err := approval.New(st, approval.Config{Required: cfg.ApprovalRequired, Tools: cfg.ApprovalTools,
		Timeout: cfg.ApprovalTimeout, Elicit: cfg.ApprovalElicit, Audit: rec, Log: log.With("component", "approvals")})
	if err != nil {
		rec.Close()
		return nil, err
	}
	ok = true
	cp := &controlPlane{svc: svc, metrics: metricsFeat, network: network, imgs: imgs, pools: poolsFeat, sandboxes: sandboxes, store: st, changes: changes, images: images, lock: lock, hostLock: hostLock, prom: prom, tracing: tracing, approvals: approvals, keys: auth.NewKeys(st, log.With("component", "auth")),
		replica: replica, owner: owner, log: log}
	cp.snaps = snaps
	// Governance: audit (the chain's first gate, so refusals are recorded) → authorization
	// (scopes, and whose objects a call may name) → approvals.
	cp.audit = rec
	cp.gates = append(cp.gates, cp.audit, authz.Gate{Store: st, Runs: st, Approvals: st, Conversations: st})
	if approvals.Enabled() {
		cp.gates = append(cp.gates, approvals) // last, just before the call acts
	}
	return cp, nil
}

// pickDefaultRuntime is the first of config.PreferredRuntimes that rts has usable, else the
// first of them rts has at all (its creates are then refused with its reason).
func pickDefaultRuntime(rts []runtime.Runtime) string {
	var known string
	for _, name := range config.PreferredRuntimes {
		for _, rt := range rts {
			if rt.Name() != name {
				continue
			}
			if rt.Capabilities().Available {
				return name
			}
			if known == "" {
				known = name
			}
		}
	}
	if known == "" {
		known = sandbox.DefaultRuntime
	}
	return known
}

// runtimeFlavors are the runtimes every server registers.
var runtimeFlavors = []oci.Flavor{oci.FlavorRunc, oci.FlavorCrun, oci.FlavorGVisor}

// newRuntimes probes runc, crun and gVisor, each with its own root under
// <state>/runtimes/<name> and its own cgroup parent (parent for runc, parent-<name> for the
// others, so that no runtime lists or sweeps another's sandboxes). An unavailable runtime is
// registered all the same: the server lists it with its reason and refuses creates on it.
func newRuntimes(ctx context.Context, stateDir, cgroupParent, guestBin string, log *slog.Logger) ([]runtime.Runtime, error) {
	var rts []runtime.Runtime
	for _, f := range runtimeFlavors {
		name := string(f)
		rt, err := oci.New(ctx, oci.Config{Name: name, Flavor: f, Root: filepath.Join(stateDir, "runtimes", name),
			GuestBinary: guestBin, CgroupParent: runtimeParent(cgroupParent, f), Subreaper: true, Logger: log})
		if err != nil {
			return nil, fmt.Errorf("runtime %s: %w", name, err)
		}
		if caps := rt.Capabilities(); !caps.Available {
			log.Warn("runtime unavailable; run `agentbox doctor`", "runtime", name, "reason", caps.Reason)
		}
		rts = append(rts, rt)
	}
	return rts, nil
}

// defaultDiskBudgetMB is the disk budget of a server whose state dir is dir: what its file
// system has free now plus what the disks of sandboxes it will adopt already hold (their
// disk_mb counts against the budget in full), less a tenth of its size (at most 4 GiB) kept
// for the host (the database, logs, whatever else lives there), at least one default-sized disk.
// The server multiplies it by the overcommit factor.
func defaultDiskBudgetMB(ctx context.Context, dir string, rts []runtime.Runtime) (int64, error) {
	free, total, err := hostinfo.DiskSpaceMiB(dir)
	if err != nil {
		return 0, err
	}
	for _, rt := range rts {
		if d, ok := rt.(runtime.DiskAccounter); ok {
			n, err := d.DisksMiB(ctx)
			if err != nil {
				return 0, fmt.Errorf("runtime %s: %w", rt.Name(), err)
			}
			free += n
		}
	}
	return max(free-min(total/10, 4096), 1024), nil
}

// startRuns builds the run service over the sandbox service and the store, under
// <state>/runs; its workers run with the lifecycle work (startLoop); baseURL is the server's address as clients reach
// it (artifact URLs).
func (cp *controlPlane) startRuns(ctx context.Context, cfg config.Config, log *slog.Logger, baseURL func() string) error {
	budget := int64(runs.DefaultArtifactBudgetBytes)
	if cfg.ArtifactMB > 0 {
		budget = cfg.ArtifactMB << 20
	}
	svc, err := runs.New(runs.Config{Sandboxes: cp.sandboxes, Store: cp.store, Dir: filepath.Join(cfg.StateDir, "runs"), BaseURL: baseURL,
		Workers: cfg.RunWorkers, CheckoutDirs: cfg.CheckoutDirs, ArtifactBudgetBytes: budget, Retention: cfg.RunRetention,
		Log: log.With("component", "runs"), Shared: cp.svc.Config().Shared})
	if err != nil {
		return fmt.Errorf("run service: %w", err)
	}
	cp.runs = svc // its workers run with the lifecycle work (startLoop)
	cp.runsStop = func() {
		if err := svc.Close(); err != nil {
			log.Warn("run service close", "err", err)
		}
	}
	return nil
}

// stopRuns waits for the run workers to stop (before the sandbox service and the store they use
// close); safe to call more than once.
func (cp *controlPlane) stopRuns() {
	cp.runsOnce.Do(func() {
		if cp.runsStop != nil {
			cp.runsStop()
		}
	})
}

// runsBackend is the run service for the MCP server (nil interface when runs are off).
func (cp *controlPlane) runsBackend() mcpserver.RunsBackend {
	if cp.runs == nil {
		return nil
	}
	return cp.runs
}

// metricsSource is the registry of cp.prom for fetch_metrics, with its history
// (every series but the per-sandbox ones) sampled every 10 s until ctx ends.
func (cp *controlPlane) metricsSource(ctx context.Context) *metricsnap.Source {
	g, h := cp.prom.Gatherer(), cp.prom.HistoryGatherer()
	src := metricsnap.New(func(context.Context) ([]*dto.MetricFamily, error) { return g.Gather() }).
		SampleFrom(func(context.Context) ([]*dto.MetricFamily, error) { return h.Gather() })
	go src.Run(ctx)
	return src
}
