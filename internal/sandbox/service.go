package sandbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/guest"
	"github.com/agentbox/agentbox/internal/image"
	"github.com/agentbox/agentbox/internal/runtime"
)

// DefaultReadyTimeout is how long a create waits for the new sandbox's agent to answer when
// Config.ReadyTimeout is zero.
const DefaultReadyTimeout = 15 * time.Second

// Config bounds and defaults the service. Zero values take the documented defaults.
type Config struct {
	DefaultImage   string  // "host"
	DefaultRuntime string  // "runc"
	DefaultCPU     float64 // DefaultCPU: 1 core
	DefaultMemMB   int64   // DefaultMemoryMB: 512
	DefaultDiskMB  int64   // DefaultDiskMB: 1024
	PidsLimit      int64   // DefaultPidsLimit: 1024 processes per sandbox
	DefaultTTL     time.Duration
	MaxTTL         time.Duration // 24h
	MaxSandboxes   int           // 200 live sandboxes
	// The budgets bound the sums of live sandboxes' limits (0 = unbounded). Limits are
	// ceilings, not reservations, so the server's defaults overcommit them (Overcommit × what
	// the host has; wire.go computes them) and admission also checks the host's real headroom.
	CPUBudget      float64 // sum of live sandboxes' cpu
	MemoryBudgetMB int64   // sum of live sandboxes' memory_mb
	// DiskBudgetMB bounds the sum of live sandboxes' disk_mb (their disks are sparse images
	// on the state dir's file system).
	DiskBudgetMB int64
	// Overcommit is the factor the budgets were computed with, reported by Capacity; 1 means
	// hard reservations.
	Overcommit float64
	// Headroom reads what the host really has free; admission keeps MemoryReserveMB of memory
	// and DiskReserveMB of disk for the host whatever the budgets say. nil: not checked.
	Headroom        func(ctx context.Context) (Headroom, error)
	MemoryReserveMB int64
	DiskReserveMB   int64
	// Node names this host on sandbox records; LocalNode.
	Node string
	// Shared says the store is shared with other replicas of this server (Postgres): a create,
	// destroy or snapshot on record may be another replica's, in flight, so Reconcile judges
	// them by the control loop's deadlines rather than as orphans of a process that stopped.
	// Alone on its store (SQLite, the state-dir lock held) it is false.
	Shared bool
	// Now is the service's clock (TTLs, the control loop, pruning); time.Now.
	Now          func() time.Time
	ReadyTimeout time.Duration // create → agent answering; DefaultReadyTimeout
	// Retention is how long finished sandboxes' records are kept; 7 days.
	Retention time.Duration
	// IDPoolBase is the first host id of the pool that sandboxes' id ranges (IDRangeSize ids
	// each, for runtimes with user namespaces) come from; DefaultIDPoolBase. IDPoolRanges is how
	// many ranges the pool holds: twice MaxSandboxes, so ranges still held by sandboxes awaiting
	// the sweep never stop a create within capacity. ReservedIDs are host ids no range may
	// include: the host's own users and groups, and what /etc/subuid and /etc/subgid delegate
	// (ids below 65536 are always left out).
	IDPoolBase int64
	// IDClaims, if not nil, are the host-wide claims on id ranges (internal/idclaim): a range
	// another server on the host claims is never handed out, so two servers' sandboxes never
	// share host ids; the sweep makes them the ranges the store holds.
	IDClaims     IDClaimer
	IDPoolRanges int
	ReservedIDs  []IDRange
	// SweepInterval is how often Run sweeps orphaned host resources; one minute.
	SweepInterval time.Duration
	// StepTimeout bounds one step of the control loop on one sandbox (a destroy's runtime
	// delete and the writes around it, an abandoned create's cleanup, an adopt retried); a
	// step that passes it is recorded as failed and retried with backoff, and the loop goes
	// on with the other sandboxes. DefaultStepTimeout.
	StepTimeout time.Duration
	// MaxJobsPerSandbox bounds the running jobs of one sandbox; DefaultMaxJobs (64).
	MaxJobsPerSandbox int
	// JobRetention is how long finished jobs' records are kept; Retention (7 days).
	JobRetention time.Duration
	// Observer is told how long creates and execs take (metrics.go); nil: nobody.
	Observer Observer
	// Egress configures sandboxes' networks (network.go); zero: every sandbox has network none.
	Egress EgressConfig
	// PreviewURL returns the preview URL of a sandbox's exposed port (Expose); nil: preview
	// URLs are not served (agentbox serve sets it).
	PreviewURL func(id string, port int) string
	// Images is the OCI image cache sandboxes' images come from (images.go); nil: only the
	// "host" image.
	Images image.Cache
	// SnapshotDir holds snapshots' directories (snapshots.go), on the runtimes' file system;
	// "": snapshots are UNSUPPORTED_OPERATION. SnapshotBudgetBytes bounds what ready user
	// snapshots hold together; DefaultSnapshotBudgetBytes (10 GiB).
	SnapshotDir         string
	SnapshotBudgetBytes int64
	// MaxPooled bounds the sum of all warm pools' sizes (internal/sandbox/pools); MaxSandboxes/2.
	MaxPooled int
	// Tracing provides the spans of the create trace and of execs (trace.go); nil: none are
	// recorded.
	Tracing trace.TracerProvider
}

func (c *Config) setDefaults() {
	if c.DefaultImage == "" {
		c.DefaultImage = "host"
	}
	if c.SweepInterval <= 0 {
		c.SweepInterval = time.Minute
	}
	if c.Node == "" {
		c.Node = LocalNode
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.DefaultRuntime == "" {
		c.DefaultRuntime = DefaultRuntime
	}
	if c.DefaultCPU == 0 {
		c.DefaultCPU = DefaultCPU
	}
	if c.DefaultMemMB == 0 {
		c.DefaultMemMB = DefaultMemoryMB
	}
	if c.DefaultDiskMB == 0 {
		c.DefaultDiskMB = DefaultDiskMB
	}
	if c.PidsLimit == 0 {
		c.PidsLimit = DefaultPidsLimit
	}
	if c.DefaultTTL == 0 {
		c.DefaultTTL = DefaultTTL
	}
	if c.MaxTTL == 0 {
		c.MaxTTL = DefaultMaxTTL
	}
	if c.MaxSandboxes == 0 {
		c.MaxSandboxes = DefaultMaxSandboxes
	}
	if c.IDPoolBase == 0 {
		c.IDPoolBase = DefaultIDPoolBase
	}
	if c.IDPoolRanges == 0 {
		c.IDPoolRanges = 2 * c.MaxSandboxes
	}
	if c.ReadyTimeout == 0 {
		c.ReadyTimeout = DefaultReadyTimeout
	}
	if c.StepTimeout <= 0 {
		c.StepTimeout = DefaultStepTimeout
	}
	if c.Retention == 0 {
		c.Retention = 7 * 24 * time.Hour
	}
	if c.MaxJobsPerSandbox == 0 {
		c.MaxJobsPerSandbox = DefaultMaxJobs
	}
	if c.JobRetention == 0 {
		c.JobRetention = c.Retention
	}
}

// ExecRequest runs a command in a sandbox.
type ExecRequest struct {
	Argv           []string
	Env            map[string]string
	Cwd            string
	Stdin          []byte
	Timeout        time.Duration // default guest.DefaultTimeout
	MaxOutputBytes int64         // default guest.DefaultMaxOutputBytes
	User           string
	// Changes and Checkpoint: the paths the command changed, a snapshot after it (the snapshots feature's Exec hook).
	Changes, Checkpoint bool
}

// Capacity is how much of the server's bounds is used.
type Capacity struct {
	MaxSandboxes   int     `json:"max_sandboxes"`
	Live           int     `json:"live"`
	Free           int     `json:"free"`
	CPUBudget      float64 `json:"cpu_budget"`
	CPUUsed        float64 `json:"cpu_used"`
	MemoryBudgetMB int64   `json:"memory_budget_mb"`
	MemoryUsedMB   int64   `json:"memory_used_mb"`
	DiskBudgetMB   int64   `json:"disk_budget_mb"`
	DiskUsedMB     int64   `json:"disk_used_mb"`
	// Sleeping is how many of Live sleep: they count against the live bound and the disk
	// budget, not the CPU and memory budgets.
	Sleeping int `json:"sleeping"`
	// Overcommit is how far the budgets let limits exceed the host (1: hard reservations).
	Overcommit float64 `json:"overcommit,omitempty"`
	// What the host really has free now, and what admission keeps for it.
	MemoryAvailableMB int64 `json:"host_memory_available_mb,omitempty"`
	MemoryReserveMB   int64 `json:"host_memory_reserve_mb,omitempty"`
	DiskFreeMB        int64 `json:"host_disk_free_mb,omitempty"`
	DiskReserveMB     int64 `json:"host_disk_reserve_mb,omitempty"`
	// Pools are the warm pools: target size, ready, hits and misses (pooled sandboxes count in
	// Live and the budgets like any other); MaxPooled bounds their sizes' sum.
	Pools     []PoolStatus `json:"pools,omitempty"`
	MaxPooled int          `json:"max_pooled,omitempty"`
}

// Service is the sandbox control plane. It is safe for concurrent use.
type Service struct {
	store Store
	local *host // this server's machine
	cfg   Config
	log   *slog.Logger
	now   func() time.Time
	// tracer makes the create trace's spans (trace.go).
	tracer trace.Tracer

	idMu sync.Mutex // serializes picking a free id range with recording it

	locksMu sync.Mutex
	locks   map[string]*idLock // per-sandbox lifecycle locks

	guestsMu sync.Mutex
	guests   map[string]*guest.Client

	bus     *bus // wakes event subscribers
	retries retries
	egress  egressProxy // the egress proxy, if configured, and who records what it did
	hooks   hookSet     // the features' hooks (hooks.go)
	// features holds the feature services that register hooks, one per kind (Core.Feature).
	featuresMu sync.Mutex
	features   map[any]any

	// unadopted holds the running sandboxes whose Adopt at start failed for a reason that may
	// pass; the control loop retries it (lifecycle.go adopt). A sandbox leaves it when it
	// leaves running.
	unadopted idSet
	// loopWatched holds the running sandboxes the control loop watches (Config.Shared: those
	// another replica created, whose exit that replica's own watch, if it died, cannot record).
	loopWatched idSet
	// steps are the control loop's steps in flight (lifecycle.go Converge): Run and Close wait
	// for them.
	steps inflight
	// loopSlots bounds the steps Run's passes keep running at once (convergeWorkers): a pass
	// that finds them all taken leaves the rest to a later tick.
	loopSlots chan struct{}

	// bg lives as long as the service: background work (exit watches) runs on it, and Close
	// cancels it and waits for wg.
	bg     context.Context
	stop   context.CancelFunc
	wg     sync.WaitGroup
	closed sync.Once
}

type idLock struct {
	mu   sync.Mutex
	refs int
}

// NewService returns a Service over store and the given runtimes (keyed by Name()).
func NewService(st Store, rts []runtime.Runtime, cfg Config, log *slog.Logger) (*Service, error) {
	cfg.setDefaults()
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	h := &host{name: cfg.Node, runtimes: map[string]runtime.Runtime{}, headroom: cfg.Headroom,
		admission:       Admission{MaxLive: cfg.MaxSandboxes, CPU: cfg.CPUBudget, MemoryMB: cfg.MemoryBudgetMB, DiskMB: cfg.DiskBudgetMB},
		memoryReserveMB: cfg.MemoryReserveMB, diskReserveMB: cfg.DiskReserveMB}
	for _, rt := range rts {
		h.runtimes[rt.Name()] = rt
	}
	if _, ok := h.runtimes[cfg.DefaultRuntime]; !ok {
		return nil, fmt.Errorf("default runtime %q is not configured", cfg.DefaultRuntime)
	}
	pool := IDPool{Base: cfg.IDPoolBase, Size: IDRangeSize, Ranges: cfg.IDPoolRanges, Reserved: cfg.ReservedIDs}
	var err error
	if h.idBases, err = pool.bases(); err != nil {
		return nil, err
	}
	s := &Service{store: st, local: h, cfg: cfg, log: log, now: cfg.Now, tracer: cfg.tracer(),
		locks: map[string]*idLock{}, guests: map[string]*guest.Client{}, bus: newBus(),
		retries: retries{m: map[string]retry{}}, loopSlots: make(chan struct{}, convergeWorkers)}
	s.bg, s.stop = context.WithCancel(context.Background())
	if cfg.Egress.NewProxy != nil {
		p, err := cfg.Egress.NewProxy(&s.egress)
		if err != nil {
			s.stop()
			return nil, fmt.Errorf("egress proxy: %w", err)
		}
		s.egress.proxy = p
	}
	return s, nil
}

// Config returns the effective configuration.
func (s *Service) Config() Config { return s.cfg }

// Runtimes returns the declared capabilities of every configured runtime, sorted by name.
func (s *Service) Runtimes() []runtime.Capabilities {
	out := make([]runtime.Capabilities, 0, len(s.local.runtimes))
	for _, rt := range s.local.runtimes {
		out = append(out, rt.Capabilities())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// tryLock takes id's lifecycle lock if no one holds it.
func (s *Service) tryLock(id string) (unlock func(), ok bool) {
	s.locksMu.Lock()
	defer s.locksMu.Unlock()
	if s.locks[id] != nil {
		return nil, false
	}
	l := &idLock{refs: 1}
	l.mu.Lock()
	s.locks[id] = l
	return func() { s.unlock(id, l) }, true
}

// unlock releases l, id's lock, and forgets it when no one else waits for it.
func (s *Service) unlock(id string, l *idLock) {
	l.mu.Unlock()
	s.locksMu.Lock()
	if l.refs--; l.refs == 0 {
		delete(s.locks, id)
	}
	s.locksMu.Unlock()
}

func (s *Service) lock(id string) func() {
	s.locksMu.Lock()
	l := s.locks[id]
	if l == nil {
		l = &idLock{}
		s.locks[id] = l
	}
	l.refs++
	s.locksMu.Unlock()
	l.mu.Lock()
	return func() { s.unlock(id, l) }
}

// transition moves sb to state `to`, recording an event; it returns the updated record.
func (s *Service) transition(ctx context.Context, sb Sandbox, to State, reason, errMsg string) (Sandbox, error) {
	if !CanTransition(sb.State, to) {
		return sb, errcode.New(errcode.Conflict, "sandbox %s cannot go from %s to %s", sb.ID, sb.State, to)
	}
	from := sb.State
	sb.State = to
	sb.UpdatedAt = s.now().UTC().Truncate(time.Millisecond)
	sb.Version++
	if errMsg != "" {
		sb.Error = errMsg
	}
	ev := Event{SandboxID: sb.ID, Type: "state", From: from, To: to, Reason: reason, At: sb.UpdatedAt}
	if err := s.store.UpdateSandbox(ctx, sb, ev); err != nil {
		return sb, fmt.Errorf("sandbox %s %s→%s: %w", sb.ID, from, to, err)
	}
	s.bus.publish()
	s.log.Info("sandbox state", "sandbox_id", sb.ID, "from", from, "to", to, "reason", reason)
	switch {
	case from == StateRunning && to == StateSleeping:
		s.unadopted.remove(sb.ID) // its jobs: jobsSlept (sleep.go)
	case from == StateRunning, from == StateSleeping && (to == StateStopping || to == StateLost):
		s.unadopted.remove(sb.ID)
		s.hooks.ending(ctx, sb, to, reason) // its jobs: canceled or unknown
	}
	return sb, nil
}

// Get returns one sandbox's record.
func (s *Service) Get(ctx context.Context, id string) (Sandbox, error) {
	if err := checkID(id); err != nil {
		return Sandbox{}, err
	}
	return s.store.GetSandbox(ctx, id)
}

// MaxList bounds one listing.
const MaxList = 1000

// List returns sandboxes matching filter, oldest first. With no states given it returns every
// sandbox that is not destroyed.
func (s *Service) List(ctx context.Context, f ListFilter) ([]Sandbox, error) {
	for _, st := range f.States {
		if !st.Valid() {
			return nil, errcode.New(errcode.InvalidArgument, "state %q is unknown; use creating, running, sleeping, stopping, destroyed, failed or lost", st)
		}
	}
	if f.Limit < 0 || f.Limit > MaxList {
		return nil, errcode.New(errcode.InvalidArgument, "limit must be between 1 and %d; got %d", MaxList, f.Limit)
	}
	if f.Limit == 0 {
		f.Limit = MaxList
	}
	if len(f.States) == 0 {
		f.States = []State{StateCreating, StateRunning, StateSleeping, StateStopping, StateFailed, StateLost}
	}
	f.NoPooled = f.Pool == "" // a pool's sandboxes are nobody's until claimed (internal/sandbox/pools)
	return s.store.ListSandboxes(ctx, f)
}

// Destroy stops and removes a sandbox and every host resource it held. Destroying a destroyed
// sandbox returns its record unchanged.
func (s *Service) Destroy(ctx context.Context, id string) (Sandbox, error) {
	return s.destroy(ctx, id, "destroy requested")
}

func (s *Service) destroy(ctx context.Context, id, reason string) (Sandbox, error) {
	if err := checkID(id); err != nil {
		return Sandbox{}, err
	}
	unlock := s.lock(id)
	defer unlock()
	sb, err := s.store.GetSandbox(ctx, id)
	if err != nil {
		return Sandbox{}, err
	}
	if sb.State == StateDestroyed {
		return sb, nil
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	out, err := s.stopAndDestroy(wctx, sb, reason)
	for attempt := 0; err != nil && errcode.Of(err) == errcode.Conflict && attempt < 3; attempt++ {
		// Another replica changed it meanwhile (its control loop reaping or finishing it, or a
		// destroy of its own): read it again and finish what is left.
		cur, gerr := s.store.GetSandbox(wctx, id)
		if gerr != nil {
			break
		}
		if cur.State == StateDestroyed {
			return cur, nil
		}
		out, err = s.stopAndDestroy(wctx, cur, reason)
	}
	if err != nil && out.State == StateStopping {
		// Intent is recorded; the control loop finishes the delete with backoff.
		s.retries.failed(id, s.now())
		return out, errcode.Wrap(errcode.RuntimeUnavailable, err, "sandbox %s is stopping, but deleting its host resources failed; the server retries until it is gone", id).With("state", string(out.State))
	}
	return out, err
}

func (s *Service) dropGuest(id string) {
	s.hooks.released(id)
	s.guestsMu.Lock()
	if gc := s.guests[id]; gc != nil {
		gc.Close()
		delete(s.guests, id)
	}
	s.guestsMu.Unlock()
}

// Extend pushes a sandbox's expiry ttlSeconds further, capped at the server's max TTL from now.
func (s *Service) Extend(ctx context.Context, id string, ttlSeconds int64) (Sandbox, error) {
	if err := checkID(id); err != nil {
		return Sandbox{}, err
	}
	if ttlSeconds <= 0 || ttlSeconds > int64(s.cfg.MaxTTL/time.Second) {
		return Sandbox{}, errcode.New(errcode.InvalidArgument, "ttl_seconds must be between 1 and %d; got %d", int64(s.cfg.MaxTTL/time.Second), ttlSeconds)
	}
	return s.moveExpiry(ctx, id, "extended", func(sb Sandbox, _ time.Time) time.Time {
		return sb.ExpiresAt.Add(time.Duration(ttlSeconds) * time.Second)
	})
}

// ExpireIn sets sandbox id's end to d from now, earlier or later than its current end (at most
// MaxTTL from now; d ≤ 0 ends it now): the control loop destroys it once that time has passed,
// within one tick of its loop (a second). The event recorded is an extend, with the new end.
func (s *Service) ExpireIn(ctx context.Context, id string, d time.Duration) (Sandbox, error) {
	if err := checkID(id); err != nil {
		return Sandbox{}, err
	}
	return s.moveExpiry(ctx, id, "set", func(_ Sandbox, now time.Time) time.Time { return now.Add(max(d, 0)) })
}

// moveExpiry sets the end of a running or sleeping sandbox to what end gives (capped at MaxTTL
// from now) and records it (how words the event: "ttl extended to …").
func (s *Service) moveExpiry(ctx context.Context, id, how string, end func(sb Sandbox, now time.Time) time.Time) (Sandbox, error) {
	unlock := s.lock(id)
	defer unlock()
	sb, err := s.store.GetSandbox(ctx, id)
	if err != nil {
		return Sandbox{}, err
	}
	if sb.State != StateRunning && sb.State != StateSleeping {
		return sb, errcode.New(errcode.SandboxNotRunning, "sandbox %s is %s; only a running or sleeping sandbox's TTL can change", id, sb.State)
	}
	now := s.now().UTC().Truncate(time.Millisecond)
	exp := end(sb, now).UTC().Truncate(time.Millisecond)
	if limit := now.Add(s.cfg.MaxTTL); exp.After(limit) {
		exp = limit
	}
	sb.ExpiresAt = exp
	sb.UpdatedAt = now
	sb.Version++
	ev := Event{SandboxID: id, Type: "extend", From: sb.State, To: sb.State, At: now,
		Reason: "ttl " + how + " to " + exp.Format(time.RFC3339)}
	if err := s.store.UpdateSandbox(ctx, sb, ev); err != nil {
		return sb, fmt.Errorf("ttl of %s: %w", id, err)
	}
	s.bus.publish()
	return sb, nil
}

// running returns the record and guest client of a running sandbox. A sleeping sandbox created
// with auto_wake is woken first; without, it is SANDBOX_NOT_RUNNING saying to wake it.
func (s *Service) running(ctx context.Context, id string) (Sandbox, *guest.Client, error) {
	return s.runningOr(ctx, id, true)
}

// runningOr is running; with wake false a sleeping sandbox is never woken (the server's own
// background work: job watches, network sessions).
func (s *Service) runningOr(ctx context.Context, id string, wake bool) (Sandbox, *guest.Client, error) {
	if err := checkID(id); err != nil {
		return Sandbox{}, nil, err
	}
	sb, err := s.store.GetSandbox(ctx, id)
	if err != nil {
		return sb, nil, err
	}
	if sb.State == StateSleeping {
		if !wake || !sb.AutoWake || !autoWakeAllowed(ctx) {
			return sb, nil, sleepingErr(id)
		}
		if sb, err = s.Wake(ctx, id); err != nil {
			return sb, nil, err
		}
	}
	if sb.State != StateRunning {
		msg := "create a new sandbox with sandbox_create"
		if sb.State == StateCreating {
			msg = "wait for it to be running and retry"
		}
		return sb, nil, errcode.New(errcode.SandboxNotRunning, "sandbox %s is %s; %s", id, sb.State, msg).With("state", string(sb.State))
	}
	s.guestsMu.Lock()
	gc := s.guests[id]
	s.guestsMu.Unlock()
	if gc != nil {
		return sb, gc, nil
	}
	rt, err := s.runtimeOf(sb)
	if err != nil {
		return sb, nil, err
	}
	dial, err := rt.Agent(ctx, id)
	if err != nil {
		return sb, nil, err
	}
	gc = guest.NewClient(guest.Dialer(dial))
	s.guestsMu.Lock()
	if cur := s.guests[id]; cur != nil {
		gc.Close()
		gc = cur
	} else {
		s.guests[id] = gc
	}
	s.guestsMu.Unlock()
	return sb, gc, nil
}

// guestFailed checks, after a failed call to a sandbox's agent, whether the sandbox is gone, and
// if so records it as lost and says so.
func (s *Service) guestFailed(ctx context.Context, sb Sandbox, err error) error {
	if errcode.Of(err) != errcode.SandboxNotRunning || ctx.Err() != nil {
		return err
	}
	// A destroy (or the TTL's) that cut the call may not have stopped the container yet when
	// the agent's stream breaks: the record says so first.
	if cur, gerr := s.store.GetSandbox(ctx, sb.ID); gerr == nil && (cur.State == StateStopping || cur.State == StateDestroyed) {
		return s.stoppedWhileCalled(cur)
	}
	rt, rerr := s.runtimeOf(sb)
	if rerr != nil {
		return err
	}
	st, serr := rt.State(ctx, sb.ID)
	if serr != nil || st == runtime.StatusRunning {
		return err
	}
	unlock := s.lock(sb.ID)
	defer unlock()
	cur, gerr := s.store.GetSandbox(ctx, sb.ID)
	if gerr == nil && (cur.State == StateSleeping || cur.State == StateCreating && cur.SleepSnapshot != "") {
		// It went to sleep while the call ran (and may have woken since): not lost.
		return errcode.New(errcode.SandboxNotRunning, "sandbox %s went to sleep while the call ran; wake it (%s) and retry", sb.ID, WakeHow(sb.ID)).With("state", string(StateSleeping))
	}
	if gerr == nil && cur.State == StateRunning {
		// Under the lock: a sandbox woken since the first look runs again.
		if st2, err2 := rt.State(ctx, sb.ID); err2 != nil || st2 == runtime.StatusRunning {
			return err
		}
	}
	if gerr == nil && (cur.State == StateStopping || cur.State == StateDestroyed) {
		return s.stoppedWhileCalled(cur)
	}
	if gerr == nil && cur.State == StateRunning {
		if _, terr := s.transition(ctx, cur, StateLost, "sandbox init exited ("+string(st)+")", "the sandbox stopped unexpectedly"); terr != nil {
			s.log.Warn("mark lost", "sandbox_id", sb.ID, "err", terr)
		}
	}
	s.dropGuest(sb.ID)
	return errcode.New(errcode.SandboxNotRunning, "sandbox %s stopped unexpectedly (its init exited); create a new sandbox", sb.ID)
}

// stoppedWhileCalled says why a call to sandbox cur's agent broke off when the server itself
// stopped it meanwhile (a destroy, or its TTL): not "unexpectedly".
func (s *Service) stoppedWhileCalled(cur Sandbox) error {
	why := "it was destroyed while the call ran; create a new sandbox"
	if !cur.ExpiresAt.After(s.now()) {
		why = fmt.Sprintf("its TTL ran out at %s; create a new sandbox with a longer ttl_seconds, or extend the TTL before it runs out", cur.ExpiresAt.UTC().Format(time.RFC3339))
	}
	return errcode.New(errcode.SandboxNotRunning, "sandbox %s is %s: %s", cur.ID, cur.State, why).With("state", string(cur.State))
}

// Exec runs a command in a running sandbox. A non-zero exit is a result, not an error. With
// onOutput non-nil, output is delivered while the command runs. Cancelling ctx kills the command.
func (s *Service) Exec(ctx context.Context, id string, req ExecRequest, onOutput OutputFunc) (_ ExecResult, err error) {
	var rtName string // known once the sandbox is found
	ctx, span := s.tracer.Start(ctx, SpanExec, trace.WithAttributes(attribute.String(AttrSandbox, id)))
	defer func() { endSpan(span, err) }()
	if o := s.cfg.Observer; o != nil {
		began := time.Now()
		defer func() { o.ObserveExec(rtName, outcome(err), time.Since(began)) }()
	}
	if err := checkExec(req); err != nil {
		return ExecResult{}, err
	}
	if req.Timeout == 0 {
		req.Timeout = guest.DefaultTimeout
	}
	sb, gc, err := s.running(ctx, id)
	rtName = sb.Runtime
	if err != nil {
		return ExecResult{}, err
	}
	// What a feature adds to the exec (the snapshots feature: changes, checkpoint).
	finish, served, err := s.hooks.exec(ctx, sb, req)
	if err != nil {
		return ExecResult{}, err
	}
	if (req.Changes || req.Checkpoint) && !served {
		return ExecResult{}, errcode.New(errcode.UnsupportedOp, "changes and checkpoint are not available on this server (it runs without the snapshots feature); exec without them")
	}
	// The agent enforces the timeout; this bound only catches an agent that stopped answering.
	cctx, cancel := context.WithTimeout(ctx, req.Timeout+30*time.Second)
	defer cancel()
	hostOOM := s.hostOOMKills(ctx, sb)
	gres, err := gc.Exec(cctx, guest.ExecRequest{Argv: req.Argv, Env: callEnv(sb, req.Env), Cwd: req.Cwd, Stdin: req.Stdin,
		TimeoutMs: req.Timeout.Milliseconds(), MaxOutputBytes: req.MaxOutputBytes, User: req.User}, guest.OutputFunc(onOutput))
	res := execResultFrom(gres)
	if err == nil && res.Signal == "SIGKILL" && !res.TimedOut && !res.OOMKilled && hostOOM != nil {
		res.OOMKilled = hostOOM()
	}
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			return res, errcode.New(errcode.CommandTimeout, "sandbox %s's agent did not answer within the command's timeout; the sandbox may be overloaded", id)
		}
		return res, s.guestFailed(ctx, sb, err)
	}
	for _, f := range finish {
		if err := f(ctx, &res); err != nil {
			return res, err
		}
	}
	return res, nil
}

// hostOOMKills, for a sandbox whose runtime counts its host OOM kills (runtime.OOMCounter),
// reads the count now and returns a func that says whether it has grown since; nil otherwise.
func (s *Service) hostOOMKills(ctx context.Context, sb Sandbox) func() bool {
	rt, err := s.runtimeOf(sb)
	if err != nil {
		return nil
	}
	oc, ok := rt.(runtime.OOMCounter)
	if !ok {
		return nil
	}
	before, ok := oc.OOMKills(ctx, sb.ID)
	if !ok {
		return nil
	}
	return func() bool {
		after, ok := oc.OOMKills(context.WithoutCancel(ctx), sb.ID)
		return ok && after > before
	}
}

// checkExec validates an exec request before it reaches a sandbox.
func checkExec(req ExecRequest) error {
	if len(req.Argv) == 0 || req.Argv[0] == "" {
		return errcode.New(errcode.InvalidArgument, "command must be a non-empty argv array, e.g. [\"ls\", \"-la\"]; it is never run through a shell (use [\"sh\", \"-c\", \"...\"] for shell syntax)")
	}
	for i, a := range req.Argv {
		if strings.ContainsRune(a, 0) {
			return errcode.New(errcode.InvalidArgument, "command[%d] contains a NUL byte", i)
		}
	}
	if err := ValidateEnv("env", req.Env); err != nil {
		return err
	}
	if strings.ContainsRune(req.Cwd, 0) {
		return errcode.New(errcode.InvalidArgument, "cwd contains a NUL byte")
	}
	if req.Timeout < 0 || req.Timeout > 24*time.Hour {
		return errcode.New(errcode.InvalidArgument, "timeout_seconds must be between 1 and 86400; got %d", int64(req.Timeout/time.Second))
	}
	if req.MaxOutputBytes < 0 {
		return errcode.New(errcode.InvalidArgument, "max_output_bytes must not be negative")
	}
	if req.MaxOutputBytes > guest.MaxMaxOutputBytes {
		return errcode.New(errcode.OutputLimitExceeded, "at most %d bytes of output are kept per stream; ask for less, or redirect output to a file and read it with offset and length", guest.MaxMaxOutputBytes)
	}
	if len(req.Stdin) > guest.MaxStdinBytes {
		return errcode.New(errcode.InvalidArgument, "stdin is %d bytes; at most %d are accepted (write large input to a file first)", len(req.Stdin), guest.MaxStdinBytes)
	}
	return nil
}

// Events returns recorded state transitions.
func (s *Service) Events(ctx context.Context, f EventFilter) ([]Event, error) {
	if f.SandboxID != "" {
		if err := checkID(f.SandboxID); err != nil {
			return nil, err
		}
	}
	if f.Limit < 0 || f.Limit > MaxList || f.AfterSeq < 0 {
		return nil, errcode.New(errcode.InvalidArgument, "limit must be between 1 and %d and after must not be negative", MaxList)
	}
	if f.Limit == 0 {
		f.Limit = MaxList
	}
	return s.store.ListEvents(ctx, f)
}

// Capacity reports the server's bounds, how much of them live sandboxes use, and what the
// host really has free.
func (s *Service) Capacity(ctx context.Context) (Capacity, error) {
	u, err := s.store.CountLive(ctx)
	if err != nil {
		return Capacity{}, err
	}
	c := Capacity{MaxSandboxes: s.cfg.MaxSandboxes, Live: u.Live, Free: max(0, s.cfg.MaxSandboxes-u.Live),
		CPUBudget: s.cfg.CPUBudget, CPUUsed: u.CPU, MemoryBudgetMB: s.cfg.MemoryBudgetMB, MemoryUsedMB: u.MemoryMB,
		DiskBudgetMB: s.cfg.DiskBudgetMB, DiskUsedMB: u.DiskMB, Sleeping: u.Sleeping, Overcommit: s.cfg.Overcommit,
		MemoryReserveMB: s.local.memoryReserveMB, DiskReserveMB: s.local.diskReserveMB}
	if s.local.headroom != nil {
		if hr, err := s.local.headroom(ctx); err == nil {
			c.MemoryAvailableMB, c.DiskFreeMB = hr.MemoryAvailableMB, hr.DiskFreeMB
		}
	}
	if err := s.hooks.capacity(ctx, &c); err != nil { // warm pools
		return Capacity{}, err
	}
	return c, nil
}

// Close stops the service's background work (exit watches, control-loop steps in flight) and
// waits for it, then releases the runtimes' host-wide resources (runtime.Closer, e.g. an empty
// cgroup parent). Sandboxes keep running: a restarted server adopts them.
func (s *Service) Close() error {
	var errs []error
	s.closed.Do(func() {
		s.stop()
		s.wg.Wait()
		s.steps.close()
		for _, rt := range s.local.runtimes {
			if c, ok := rt.(runtime.Closer); ok {
				errs = append(errs, c.Close(context.Background()))
			}
		}
	})
	return errors.Join(errs...)
}

func (s *Service) stamp() time.Time { return s.now().UTC().Truncate(time.Millisecond) }
