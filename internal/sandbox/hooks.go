package sandbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agentbox/agentbox/internal/guest"
	"github.com/agentbox/agentbox/internal/runtime"
)

// Hooks are where the lifecycle core calls a feature (jobs, network sessions, snapshots, warm
// pools, metrics): a feature registers the ones it needs at wiring time (Core.Register), and the
// core calls every registered hook at that point of a sandbox's life, in registration order.
// A nil field is a hook the feature does not need. Hooks run with the sandbox's lifecycle lock
// held where the point they mark does (Ending, Slept); they must not call back into the
// lifecycle of the same sandbox.
type Hooks struct {
	// Name names the feature in the errors of its Converge, Sweep and Capacity.
	Name string
	// Adopted: running sandbox sb, made by an earlier process (or another replica), is this
	// process's now (Reconcile's adopt): re-arm what watched it.
	Adopted func(ctx context.Context, sb Sandbox, rt runtime.Runtime)
	// Woken: sleeping sandbox sb runs again (Wake), its agent answering: re-arm what watched
	// it. (Adopted is not called at wake.)
	Woken func(ctx context.Context, sb Sandbox)
	// Ending: sandbox sb leaves running (or sleeping) for to (stopping, lost), for reason.
	Ending func(ctx context.Context, sb Sandbox, to State, reason string)
	// Slept: running sandbox sb sleeps now; memory says its processes were saved with it.
	Slept func(ctx context.Context, sb Sandbox, memory bool)
	// Released: this process lets go of sandbox id's agent connection (it stopped, sleeps or
	// is gone): drop what was kept per connection.
	Released func(id string)
	// Converge is the feature's part of a control-loop pass (atStart: Reconcile at start,
	// alone on the store).
	Converge func(ctx context.Context, atStart bool) error
	// Sweep is the feature's part of the periodic orphan sweep (atStart: Reconcile's).
	Sweep func(ctx context.Context, atStart bool) error
	// Prune deletes the feature's finished records older than its retention (hourly).
	Prune func(ctx context.Context, now time.Time)
	// Exec: an exec of running sandbox sb (req) is about to run its command. A feature that adds
	// to what the exec returns (changes, checkpoint) does its part before the command here and
	// returns finish (nil: nothing to add), which the core calls after the command has run,
	// whatever its exit, to fill res. An error from either fails the exec.
	Exec func(ctx context.Context, sb Sandbox, req ExecRequest) (finish func(ctx context.Context, res *ExecResult) error, err error)
	// Capacity adds the feature's part to a capacity reply.
	Capacity func(ctx context.Context, c *Capacity) error
	// Start starts the feature's background loop for as long as ctx (the control loop's term)
	// lasts; wait returns once it ended.
	Start func(ctx context.Context) (wait func())

	// The create hooks, in the order a create (create.go) calls them. Each stage calls every
	// feature's hook, in registration order, before the next stage begins; an error or an
	// answer (Creation.Answer) ends the create there.

	// Request: a create's request, not yet validated (c.Runtime and c.Sandbox are nil): a
	// feature may fill or narrow c.Req. A create from a snapshot takes the snapshot's shape,
	// network and secrets here, before the core validates them, and sets c.FromSnapshot,
	// c.Source and c.ImageDigest.
	Request func(ctx context.Context, c *Creation) error
	// Prepare: the request is valid (defaults filled, the runtime picked: c.Runtime) and the
	// record drafted (c.Sandbox, not yet recorded): a feature checks its part against the
	// runtime and sets it on the draft (egress validates the network and secrets and sets the
	// record's), or answers the create itself (a warm pool's claim). Registration order is
	// the order of these hooks: a feature that reads what another prepared (the pools read
	// the network) registers after it.
	Prepare func(ctx context.Context, c *Creation) error
	// Spec: sandbox sb is about to be started (created, or woken) with spec: a feature adds
	// its part (egress: the network mode, the CA bundle and the proxy's environment).
	Spec func(sb Sandbox, spec *runtime.Spec)
	// Up: the created sandbox's agent answers (gc), its record still creating: a feature
	// readies its part before the create reports the sandbox running (egress opens its
	// network session; a pool's refill primes its member). An error fails the create. What is
	// to run once the record says running goes to c.OnStarted.
	Up func(ctx context.Context, c *Creation, gc *guest.Client) error
	// Claimed: running sandbox sb, started for a warm pool, was claimed by a create and its
	// record took the claimant's network and secrets: apply them before the create returns.
	Claimed func(ctx context.Context, sb Sandbox)
	// Resumed: running sandbox sb, whose agent connection this process let go of for a sleep
	// that failed, runs on (with rt): reopen what Released dropped.
	Resumed func(ctx context.Context, sb Sandbox, rt runtime.Runtime)
}

// Creation is one create as it passes the create hooks (Hooks.Request, Prepare, Up): the
// request, then the runtime and the draft record, and what the features add to them.
type Creation struct {
	// Req is the request. Request hooks may change it; from Prepare on it is validated, its
	// defaults filled, and read only.
	Req *CreateRequest
	// Pool names the warm pool this create fills (Core.CreatePooled); "" for a caller's
	// create.
	Pool string
	// Check says the create is only checked (Core.CheckCreate, a warm pool's shape): Prepare
	// hooks check their part and change nothing (claim nothing); nothing is started.
	Check bool
	// Runtime runs the sandbox (from Prepare on).
	Runtime runtime.Runtime
	// Sandbox is the draft record (from Prepare on; at Up, as recorded): Prepare hooks set
	// their fields on it.
	Sandbox *Sandbox
	// For a create from a snapshot (a Request hook sets them): the snapshot's id (the record's
	// FromSnapshot), what the runtime starts the sandbox from, and the digest its image is
	// pinned to (the snapshot's image, wherever its tag moved since).
	FromSnapshot string
	Source       *runtime.SnapshotSource
	ImageDigest  string

	answered  bool
	answer    Sandbox
	answerErr error
	deferred  []func()
	onStarted []func(sb Sandbox, ok bool)
}

// Answer ends the create with sb and err, from a Request or Prepare hook (a warm pool's claim
// answers it with the claimed sandbox): nothing is created, the later hooks are not called.
func (c *Creation) Answer(sb Sandbox, err error) {
	c.answered, c.answer, c.answerErr = true, sb, err
}

// Defer adds f to what runs when the create ends, whatever its outcome (last added, first
// run): a pin to release, a count to drop.
func (c *Creation) Defer(f func()) { c.deferred = append(c.deferred, f) }

// OnStarted adds f, from an Up hook, to what runs once the create is over: with the running
// record and ok true, or ok false when recording it running failed.
func (c *Creation) OnStarted(f func(sb Sandbox, ok bool)) { c.onStarted = append(c.onStarted, f) }

// result is what an ended create returns: its answer, or err.
func (c *Creation) result(err error) (Sandbox, error) {
	if err != nil {
		return Sandbox{}, err
	}
	return c.answer, c.answerErr
}

func (c *Creation) started(sb Sandbox, ok bool) {
	for _, f := range c.onStarted {
		f(sb, ok)
	}
}

func (c *Creation) end() {
	for i := len(c.deferred) - 1; i >= 0; i-- {
		c.deferred[i]()
	}
}

// hookSet is the hooks registered with a service, in order. Registering copies the list, so
// the core reads it without a lock while a late feature registers.
type hookSet struct {
	mu  sync.Mutex
	cur atomic.Pointer[[]Hooks]
	// runs are the control loop's terms running now (start): a feature registered during one
	// has its Start hook started in it too.
	runs map[*hookRun]bool
}

// hookRun is one term's Start hooks: its context and what to wait for when it ends.
type hookRun struct {
	ctx   context.Context
	waits []func()
}

func (hs *hookSet) register(h Hooks) {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	all := append(slices.Clone(hs.list()), h)
	hs.cur.Store(&all)
	if h.Start != nil {
		for r := range hs.runs {
			if r.ctx.Err() == nil {
				r.waits = append(r.waits, h.Start(r.ctx))
			}
		}
	}
}

// list returns the hooks registered so far.
func (hs *hookSet) list() []Hooks {
	if p := hs.cur.Load(); p != nil {
		return *p
	}
	return nil
}

func (hs *hookSet) adopted(ctx context.Context, sb Sandbox, rt runtime.Runtime) {
	for _, h := range hs.list() {
		if h.Adopted != nil {
			h.Adopted(ctx, sb, rt)
		}
	}
}

func (hs *hookSet) woken(ctx context.Context, sb Sandbox) {
	for _, h := range hs.list() {
		if h.Woken != nil {
			h.Woken(ctx, sb)
		}
	}
}

func (hs *hookSet) ending(ctx context.Context, sb Sandbox, to State, reason string) {
	for _, h := range hs.list() {
		if h.Ending != nil {
			h.Ending(ctx, sb, to, reason)
		}
	}
}

func (hs *hookSet) slept(ctx context.Context, sb Sandbox, memory bool) {
	for _, h := range hs.list() {
		if h.Slept != nil {
			h.Slept(ctx, sb, memory)
		}
	}
}

func (hs *hookSet) released(id string) {
	for _, h := range hs.list() {
		if h.Released != nil {
			h.Released(id)
		}
	}
}

// request runs the Request hooks until one fails or answers.
func (hs *hookSet) request(ctx context.Context, c *Creation) error {
	for _, h := range hs.list() {
		if h.Request != nil {
			if err := h.Request(ctx, c); err != nil || c.answered {
				return err
			}
		}
	}
	return nil
}

// prepare runs the Prepare hooks until one fails or answers.
func (hs *hookSet) prepare(ctx context.Context, c *Creation) error {
	for _, h := range hs.list() {
		if h.Prepare != nil {
			if err := h.Prepare(ctx, c); err != nil || c.answered {
				return err
			}
		}
	}
	return nil
}

func (hs *hookSet) spec(sb Sandbox, spec *runtime.Spec) {
	for _, h := range hs.list() {
		if h.Spec != nil {
			h.Spec(sb, spec)
		}
	}
}

// up runs the Up hooks until one fails.
func (hs *hookSet) up(ctx context.Context, c *Creation, gc *guest.Client) error {
	for _, h := range hs.list() {
		if h.Up != nil {
			if err := h.Up(ctx, c, gc); err != nil {
				return err
			}
		}
	}
	return nil
}

func (hs *hookSet) claimed(ctx context.Context, sb Sandbox) {
	for _, h := range hs.list() {
		if h.Claimed != nil {
			h.Claimed(ctx, sb)
		}
	}
}

func (hs *hookSet) resumed(ctx context.Context, sb Sandbox, rt runtime.Runtime) {
	for _, h := range hs.list() {
		if h.Resumed != nil {
			h.Resumed(ctx, sb, rt)
		}
	}
}

// converge runs every Converge hook (all of them, whatever one returns) and joins their errors.
func (hs *hookSet) converge(ctx context.Context, atStart bool) error {
	var errs []error
	for _, h := range hs.list() {
		if h.Converge != nil {
			if err := h.Converge(ctx, atStart); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", h.Name, err))
			}
		}
	}
	return errors.Join(errs...)
}

func (hs *hookSet) sweep(ctx context.Context, atStart bool) error {
	var errs []error
	for _, h := range hs.list() {
		if h.Sweep != nil {
			if err := h.Sweep(ctx, atStart); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", h.Name, err))
			}
		}
	}
	return errors.Join(errs...)
}

func (hs *hookSet) prune(ctx context.Context, now time.Time) {
	for _, h := range hs.list() {
		if h.Prune != nil {
			h.Prune(ctx, now)
		}
	}
}

// exec runs every Exec hook before an exec's command and returns what to run after it; served
// reports whether a feature serves the exec's extras at all.
func (hs *hookSet) exec(ctx context.Context, sb Sandbox, req ExecRequest) (finish []func(context.Context, *ExecResult) error, served bool, err error) {
	for _, h := range hs.list() {
		if h.Exec == nil {
			continue
		}
		served = true
		f, err := h.Exec(ctx, sb, req)
		if err != nil {
			return nil, served, err
		}
		if f != nil {
			finish = append(finish, f)
		}
	}
	return finish, served, nil
}

func (hs *hookSet) capacity(ctx context.Context, c *Capacity) error {
	for _, h := range hs.list() {
		if h.Capacity != nil {
			if err := h.Capacity(ctx, c); err != nil {
				return fmt.Errorf("%s: %w", h.Name, err)
			}
		}
	}
	return nil
}

// start starts every Start hook's loop for the term ctx, and those of features registered
// while it lasts; wait waits for them all.
func (hs *hookSet) start(ctx context.Context) (wait func()) {
	hs.mu.Lock()
	r := &hookRun{ctx: ctx}
	for _, h := range hs.list() {
		if h.Start != nil {
			r.waits = append(r.waits, h.Start(ctx))
		}
	}
	if hs.runs == nil {
		hs.runs = map[*hookRun]bool{}
	}
	hs.runs[r] = true
	hs.mu.Unlock()
	return func() {
		hs.mu.Lock()
		delete(hs.runs, r)
		waits := r.waits
		hs.mu.Unlock()
		for _, w := range waits {
			w()
		}
	}
}
