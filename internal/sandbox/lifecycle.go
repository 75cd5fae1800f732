package sandbox

import (
	"context"
	"errors"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/runtime"
)

// Reconcile makes the store and the host agree. Run it at start, before serving, while holding
// the state-dir lock: running sandboxes whose container still runs are adopted; records whose
// container is gone become lost; half-made creates become failed; half-done destroys finish;
// host resources that no live record owns are deleted.
func (s *Service) Reconcile(ctx context.Context) error {
	owned := map[string]bool{}
	live, err := s.store.ListSandboxes(ctx, ListFilter{States: []State{StateCreating, StateRunning, StateStopping}, Limit: 100000})
	if err != nil {
		return err
	}
	for _, sb := range live {
		rt, ok := s.runtimes[sb.Runtime]
		if !ok {
			s.log.Warn("reconcile: runtime not configured; leaving sandbox as is", "sandbox_id", sb.ID, "runtime", sb.Runtime)
			owned[sb.ID] = true
			continue
		}
		switch sb.State {
		case StateRunning:
			st, err := rt.State(ctx, sb.ID)
			if err != nil {
				return err
			}
			if st == runtime.StatusRunning {
				owned[sb.ID] = true
				s.log.Info("reconcile: adopted", "sandbox_id", sb.ID)
				continue
			}
			if err := rt.Delete(ctx, sb.ID); err != nil {
				return err
			}
			if _, err := s.transition(ctx, sb, StateLost, "reconcile: container "+string(st), "the sandbox's container was gone when the server started"); err != nil {
				return err
			}
		case StateCreating:
			if err := rt.Delete(ctx, sb.ID); err != nil {
				return err
			}
			if _, err := s.transition(ctx, sb, StateFailed, "reconcile: server stopped during create", "the server stopped while this sandbox was being created"); err != nil {
				return err
			}
		case StateStopping:
			if err := rt.Delete(ctx, sb.ID); err != nil {
				return err
			}
			if _, err := s.transition(ctx, sb, StateDestroyed, "reconcile: finished destroy", ""); err != nil {
				return err
			}
		}
	}
	return s.sweep(ctx, func(id string) bool { return owned[id] })
}

// sweep deletes the host resources of every sandbox that owned does not claim, then frees the
// id ranges of sandboxes it does not claim (sweepIDRanges). It lists the host first and asks
// owned second, so a sandbox created in between (whose record is written before its container)
// is never mistaken for an orphan.
func (s *Service) sweep(ctx context.Context, owned func(id string) bool) error {
	type found struct {
		rt  runtime.Runtime
		ids []string
	}
	var all []found
	for _, rt := range s.runtimes {
		if !rt.Capabilities().Available {
			continue
		}
		ids, err := rt.List(ctx)
		if err != nil {
			return err
		}
		all = append(all, found{rt, ids})
	}
	for _, f := range all {
		for _, id := range f.ids {
			if owned(id) {
				continue
			}
			unlock := s.lock(id)
			s.log.Warn("sweeping orphaned sandbox resources", "sandbox_id", id, "runtime", f.rt.Name())
			err := f.rt.Delete(ctx, id)
			unlock()
			if err != nil {
				return err
			}
		}
	}
	return s.sweepIDRanges(ctx, owned)
}

// ownedByStore reports whether the store holds a live record for id.
func (s *Service) ownedByStore(ctx context.Context) func(id string) bool {
	return func(id string) bool {
		sb, err := s.store.GetSandbox(ctx, id)
		return err == nil && sb.State.Live() || err != nil && errcode.Of(err) != errcode.SandboxNotFound
	}
}

// ReapExpired destroys every running sandbox whose TTL has passed and returns how many.
func (s *Service) ReapExpired(ctx context.Context) (int, error) {
	live, err := s.store.ListSandboxes(ctx, ListFilter{States: []State{StateRunning, StateFailed, StateLost}, Limit: 100000})
	if err != nil {
		return 0, err
	}
	now := s.now()
	n := 0
	for _, sb := range live {
		if sb.ExpiresAt.After(now) {
			continue
		}
		if _, err := s.destroy(ctx, sb.ID, "ttl expired"); err != nil {
			s.log.Warn("reap expired sandbox", "sandbox_id", sb.ID, "err", err)
			continue
		}
		n++
	}
	return n, nil
}

// Run performs background duties until ctx ends: the TTL reaper (every second), the orphan
// sweep (every SweepInterval, a minute) and pruning of old finished records (every hour).
func (s *Service) Run(ctx context.Context) {
	tick := time.NewTicker(min(time.Second, s.cfg.SweepInterval))
	defer tick.Stop()
	lastSweep, lastPrune := s.now(), time.Time{}
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if _, err := s.ReapExpired(ctx); err != nil && ctx.Err() == nil {
			s.log.Warn("ttl reaper", "err", err)
		}
		if s.now().Sub(lastSweep) >= s.cfg.SweepInterval {
			lastSweep = s.now()
			if err := s.sweep(ctx, s.ownedByStore(ctx)); err != nil && ctx.Err() == nil {
				s.log.Warn("orphan sweep", "err", err)
			}
		}
		if p, ok := s.store.(Pruner); ok && s.now().Sub(lastPrune) >= time.Hour {
			lastPrune = s.now()
			if n, err := p.PruneSandboxes(ctx, s.now().Add(-s.cfg.Retention)); err != nil && ctx.Err() == nil {
				s.log.Warn("prune", "err", err)
			} else if n > 0 {
				s.log.Info("pruned finished sandbox records", "count", n)
			}
		}
	}
}

// Close releases the runtimes' host-wide resources (those that implement runtime.Closer, e.g.
// an empty cgroup parent). Sandboxes keep running: a restarted server adopts them.
func (s *Service) Close() error {
	var errs []error
	for _, rt := range s.runtimes {
		if c, ok := rt.(runtime.Closer); ok {
			errs = append(errs, c.Close(context.Background()))
		}
	}
	return errors.Join(errs...)
}
