package sandbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

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
	// Capacity adds the feature's part to a capacity reply.
	Capacity func(ctx context.Context, c *Capacity) error
	// Start starts the feature's background loop for as long as ctx (the control loop's term)
	// lasts; wait returns once it ended.
	Start func(ctx context.Context) (wait func())
}

// hookSet is the hooks registered with a service, in order. Registering copies the list, so
// the core reads it without a lock while a late feature registers.
type hookSet struct {
	mu  sync.Mutex
	cur atomic.Pointer[[]Hooks]
}

func (hs *hookSet) register(h Hooks) {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	all := append(slices.Clone(hs.list()), h)
	hs.cur.Store(&all)
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

// start starts every Start hook's loop; wait waits for them all.
func (hs *hookSet) start(ctx context.Context) (wait func()) {
	var waits []func()
	for _, h := range hs.list() {
		if h.Start != nil {
			waits = append(waits, h.Start(ctx))
		}
	}
	return func() {
		for _, w := range waits {
			w()
		}
	}
}

// registerFeatures registers the hooks of the features that still live in this package.
func (s *Service) registerFeatures() {
	s.hooks.register(Hooks{Name: "network",
		Adopted:  func(_ context.Context, sb Sandbox, rt runtime.Runtime) { s.startNet(sb, rt, nil) },
		Released: s.stopNet})
	s.hooks.register(Hooks{Name: "snapshots", Converge: s.convergeSnapshots, Sweep: s.sweepSnapshots})
	s.hooks.register(Hooks{Name: "pools", Capacity: func(ctx context.Context, c *Capacity) error {
		var err error
		if c.Pools, err = s.ListPools(ctx); err != nil {
			return err
		}
		c.MaxPooled = s.maxPooled()
		return nil
	}, Start: s.startPools})
}
