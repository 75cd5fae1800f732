package sandbox

import (
	"context"
	"log/slog"
	"time"

	"github.com/agentbox/agentbox/internal/egress"
	"github.com/agentbox/agentbox/internal/guest"
	"github.com/agentbox/agentbox/internal/runtime"
)

// Core is the handle a feature package (metrics, and the features to follow it out of this
// package) gets on the lifecycle core at wiring time: what a feature may reach of the core's
// internals, and nothing of the other features. A feature calls the core through it; the core
// calls the feature only through the Hooks the feature registers. It is what containerd's
// plugin InitContext or a Nomad driver's host is to a plugin.
type Core struct{ s *Service }

// Core returns the service's handle for features.
func (s *Service) Core() *Core { return &Core{s} }

// Register adds a feature's hooks (hooks.go). Call it while wiring, in the order the create
// hooks need: the network feature before the warm pools, whose claim reads the network it
// prepared. A feature registered while the control loop runs has its Start hook started in
// the running term.
func (c *Core) Register(h Hooks) { c.s.hooks.register(h) }

// Feature returns the feature service kept under key, building it with build (which may
// Register hooks) the first time: a feature that hooks into the core exists once per core,
// however many surfaces (the REST API, the MCP server, the run workers) ask for it, so its
// hooks never run twice for one event. key is a value of a type of the feature's own.
func (c *Core) Feature(key any, build func() any) any {
	c.s.featuresMu.Lock()
	defer c.s.featuresMu.Unlock()
	if f, ok := c.s.features[key]; ok {
		return f
	}
	if c.s.features == nil {
		c.s.features = map[any]any{}
	}
	f := build()
	c.s.features[key] = f
	return f
}

// Config is the service's effective configuration.
func (c *Core) Config() Config { return c.s.cfg }

// Store is the service's store; a feature takes the part it needs (its own Store interface,
// which sandbox.Store includes) as a constructor argument.
func (c *Core) Store() Store { return c.s.store }

// Log is the service's logger.
func (c *Core) Log() *slog.Logger { return c.s.log }

// Now is the service's clock, in milliseconds (what the store keeps), UTC.
func (c *Core) Now() time.Time { return c.s.stamp() }

// Node is the name of the node this server manages (what a record's Node says of it).
func (c *Core) Node() string { return c.s.local.name }

// SnapshotDir is the directory of snapshot id under Config.SnapshotDir (a sleep snapshot's
// too): the runtime fills it, and the snapshot's files are there while its record lives.
func (c *Core) SnapshotDir(id string) string { return c.s.snapshotDir(id) }

// Admit refuses, before anything is made, n sandboxes of shape (CPU, MemoryMB, DiskMB) that
// the host's headroom or the admission bounds would not take all of (CAPACITY_UNAVAILABLE,
// prefixed with what, e.g. "a fork of 3 does not fit (none was made): "). Each create admits
// itself again; this is the all-or-nothing check of a batch.
func (c *Core) Admit(ctx context.Context, shape Sandbox, n int, what string) error {
	return c.s.roomFor(ctx, shape, n, what)
}

// Create is Service.Create, for a feature that makes sandboxes (a fork).
func (c *Core) Create(ctx context.Context, req CreateRequest) (Sandbox, error) {
	return c.s.Create(ctx, req)
}

// Event appends an event of typ (from and to the sandbox's current state) to sandbox id's
// record and wakes the subscribers; the caller holds id's lock. A failure is logged, not
// returned: the event tells of an operation that has already happened.
func (c *Core) Event(ctx context.Context, id, typ, reason string) {
	c.s.sandboxEvent(ctx, id, typ, reason)
}

// Lock takes sandbox id's lifecycle lock: while it is held no create, destroy, sleep, wake or
// control-loop step changes the sandbox.
func (c *Core) Lock(id string) (unlock func()) { return c.s.lock(id) }

// RuntimeOf returns the runtime that runs sb (RUNTIME_UNAVAILABLE when this server does not
// manage its node or runtime).
func (c *Core) RuntimeOf(sb Sandbox) (runtime.Runtime, error) { return c.s.runtimeOf(sb) }

// HostOOMKills, for a sandbox whose runtime counts its host OOM kills (runtime.OOMCounter: gVisor,
// whose agent cannot see them), reads the count now and returns a func that says whether it has
// grown since; nil otherwise.
func (c *Core) HostOOMKills(ctx context.Context, sb Sandbox) func() bool {
	return c.s.hostOOMKills(ctx, sb)
}

// Running returns the record and agent client of running sandbox id (a sleeping one with
// auto_wake is woken first; wake false never wakes it).
func (c *Core) Running(ctx context.Context, id string, wake bool) (Sandbox, *guest.Client, error) {
	return c.s.runningOr(ctx, id, wake)
}

// GuestFailed judges a failed call to sb's agent: when the sandbox is gone it is recorded lost
// and the returned error says so; else err is returned.
func (c *Core) GuestFailed(ctx context.Context, sb Sandbox, err error) error {
	return c.s.guestFailed(ctx, sb, err)
}

// Transition moves sb to state to with an event (reason; errMsg sets its Error), under the
// caller's lock of it, and returns the updated record.
func (c *Core) Transition(ctx context.Context, sb Sandbox, to State, reason, errMsg string) (Sandbox, error) {
	return c.s.transition(ctx, sb, to, reason, errMsg)
}

// Published wakes the event subscribers: call it after writing an event to the store.
func (c *Core) Published() { c.s.bus.publish() }

// Go runs f on the service's background context, which Close cancels before it waits for f.
func (c *Core) Go(f func(ctx context.Context)) {
	c.s.wg.Go(func() { f(c.s.bg) })
}

// WakeForCall wakes sandbox id when it sleeps with auto_wake, for a call that needs it
// running (a sleeping one without auto_wake is SANDBOX_SLEEPING); any other state is nil, for
// the caller to judge under its lock.
func (c *Core) WakeForCall(ctx context.Context, id string) error { return c.s.wakeForCall(ctx, id) }

// Release lets go of sandbox id's agent connection (and runs the Released hooks): for a feature
// that has just marked the sandbox failed under its lock (a commit whose resume failed).
func (c *Core) Release(id string) { c.s.dropGuest(id) }

// Guest returns the agent connection this process keeps for sandbox id, or nil when it keeps
// none (a feature settling a sandbox that is ending reads what the agent still has, without
// dialling it).
func (c *Core) Guest(id string) *guest.Client {
	c.s.guestsMu.Lock()
	defer c.s.guestsMu.Unlock()
	return c.s.guests[id]
}

// Env is the env a command run in sb gets (a sandbox claimed from a warm pool has its
// claimant's env and secret placeholders laid under env).
func (c *Core) Env(sb Sandbox, env map[string]string) map[string]string { return callEnv(sb, env) }

// TryLock takes sandbox id's lifecycle lock if no one holds it (ok false: someone does): a
// control-loop step skips what an operation holds. Snapshot ids share the lock space.
func (c *Core) TryLock(id string) (unlock func(), ok bool) { return c.s.tryLock(id) }

// StopAndDestroy stops sb and removes what it held, recording reason, under the caller's lock
// of it (a warm pool retiring its member).
func (c *Core) StopAndDestroy(ctx context.Context, sb Sandbox, reason string) (Sandbox, error) {
	return c.s.stopAndDestroy(ctx, sb, reason)
}

// Destroy is Service.Destroy.
func (c *Core) Destroy(ctx context.Context, id string) (Sandbox, error) { return c.s.Destroy(ctx, id) }

// CheckCreate checks req as a create would up to its Prepare stage (defaults filled, the
// runtime picked, the features' Prepare hooks run with Creation.Check set), creating nothing:
// a warm pool's shape.
func (c *Core) CheckCreate(ctx context.Context, req *CreateRequest) error {
	cr := &Creation{Req: req, Check: true}
	defer cr.end()
	_, err := c.s.checkCreate(ctx, cr)
	return err
}

// SameCreate answers a create (req; asked, its record as drafted) whose idempotency key its
// owner already used for prior: prior once its create is over, if the request is the same,
// else CONFLICT.
func (c *Core) SameCreate(ctx context.Context, prior, asked Sandbox, req CreateRequest) (Sandbox, error) {
	return c.s.sameCreate(ctx, prior, asked, req)
}

// Claimed runs the Claimed hooks for sb, just claimed from a warm pool (its record has the
// claimant's network and secrets), and wakes the event subscribers.
func (c *Core) Claimed(ctx context.Context, sb Sandbox) {
	c.s.hooks.claimed(ctx, sb)
	c.s.bus.publish()
}

// Context is the service's background context: Close cancels it (then waits for what Go
// started).
func (c *Core) Context() context.Context { return c.s.bg }

// Hold counts work in flight that Close waits for, until done is called: for work that runs in
// a goroutine not started by Go. Call it only while work Close already waits for runs (so that
// Close cannot have finished waiting).
func (c *Core) Hold() (done func()) {
	c.s.wg.Add(1)
	return c.s.wg.Done
}

// EgressProxy is the egress proxy (Config.Egress.NewProxy built it), or nil when the server
// has none: the network feature hands it the egress sandboxes' streams.
func (c *Core) EgressProxy() EgressProxy { return c.s.egress.proxy }

// SetEgressRecorder makes r the recorder of what the egress proxy does (its connections and
// secret swaps): the network feature, which the proxy, built with the service, could not name.
func (c *Core) SetEgressRecorder(r egress.Recorder) { c.s.egress.rec.Store(&r) }
