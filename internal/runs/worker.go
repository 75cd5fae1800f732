package runs

import (
	"context"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
)

// Capacity retry backoff of a queued run whose sandbox create was refused for capacity.
const (
	firstRetry = time.Second
	maxRetry   = 30 * time.Second
	// pruneEvery is how often settled runs past Retention (and blobs over the budget) go.
	pruneEvery = time.Hour
	// gcEvery is how often the blob store is trimmed to its budget.
	gcEvery = time.Minute
)

// dispatch is the dispatcher: it resumes unsettled runs, then claims queued runs oldest first
// while fewer than Config.Workers execute, woken by wake, by runs settling and every second.
func (s *Service) dispatch(ctx context.Context) {
	slots := make(chan struct{}, s.cfg.Workers)
	s.resume(ctx, slots)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var lastPrune, lastGC time.Time
	for {
		if ctx.Err() != nil {
			return
		}
		s.claimQueued(ctx, slots)
		if s.cfg.Shared {
			s.checkCancels(ctx)
		}
		if time.Since(lastPrune) > pruneEvery {
			lastPrune, lastGC = time.Now(), time.Now()
			s.prune(ctx)
		} else if time.Since(lastGC) > gcEvery {
			lastGC = time.Now()
			s.gc(ctx)
		}
		select {
		case <-ctx.Done():
			return
		case <-s.wakeCh:
		case <-tick.C:
		}
	}
}

// resume picks up every run this server left unsettled: queued ones wait for the dispatcher,
// the others continue where their record says (phases.go).
func (s *Service) resume(ctx context.Context, slots chan struct{}) {
	runs, err := s.store.UnsettledRuns(ctx)
	if err != nil {
		s.log.Error("runs: resume: listing unsettled runs", "err", err)
		return
	}
	for _, r := range runs {
		if r.State == Queued {
			continue
		}
		s.log.Info("run resumed", "run_id", r.ID, "state", r.State)
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return
		}
		s.launch(ctx, r, slots)
	}
}

// claimBatch bounds how many queued runs one dispatcher pass looks at: the oldest first, ids
// only. Runs past it wait for a later pass (every second, or sooner when a run settles).
const claimBatch = 256

func (s *Service) claimQueued(ctx context.Context, slots chan struct{}) {
	if len(slots) == cap(slots) {
		return // every worker is busy: nothing to read
	}
	queued, err := s.store.QueuedRuns(ctx, claimBatch)
	if err != nil {
		if ctx.Err() == nil {
			s.log.Error("runs: listing queued runs", "err", err)
		}
		return
	}
	now := s.now()
	for _, r := range queued {
		if s.isActive(r.ID) {
			continue
		}
		s.mu.Lock()
		rt, waiting := s.retryAt[r.ID]
		s.mu.Unlock()
		if waiting && now.Before(rt.at) {
			continue
		}
		select {
		case slots <- struct{}{}:
		default:
			return // every worker is busy
		}
		maxParallel := 0
		if r.BatchID != "" {
			b, err := s.store.GetBatch(ctx, r.BatchID)
			if err != nil {
				<-slots
				s.log.Error("runs: reading a run's batch", "run_id", r.ID, "batch_id", r.BatchID, "err", err)
				continue
			}
			maxParallel = b.MaxParallel
		}
		reason := "claimed by a worker"
		if waiting {
			reason = "claimed by a worker (retrying the sandbox create)"
		}
		s.stampMu.Lock()
		at := s.stamp()
		c, claimed, err := s.store.ClaimRun(ctx, r.ID, maxParallel, at, Event{RunID: r.ID, Time: at, From: Queued, To: Preparing, Reason: reason})
		s.stampMu.Unlock()
		if err != nil || !claimed {
			<-slots
			if err != nil && ctx.Err() == nil {
				s.log.Error("runs: claim", "run_id", r.ID, "err", err)
			}
			continue
		}
		s.notify()
		// A run canceled while queued is settled by run_cancel itself; one canceled between
		// the list and the claim is the worker's to settle (execute signals its cancel).
		s.launch(ctx, c, slots)
	}
}

func (s *Service) isActive(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.active[id]
	return ok
}

// launch executes r in its own goroutine, holding one slot.
func (s *Service) launch(ctx context.Context, r Run, slots chan struct{}) {
	cctx, cancel := context.WithCancel(ctx)
	s.mu.Lock()
	s.active[r.ID] = cancel
	s.mu.Unlock()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer func() { <-slots }()
		defer func() {
			s.mu.Lock()
			delete(s.active, r.ID)
			s.mu.Unlock()
			cancel()
			s.wake()
		}()
		s.execute(ctx, cctx, r)
		if ctx.Err() == nil {
			s.gc(ctx) // the run's blobs may have passed the budget
		}
	}()
}

func (s *Service) forgetRetry(id string) {
	s.mu.Lock()
	delete(s.retryAt, id)
	s.mu.Unlock()
}

// requeue puts a run refused for capacity back in the queue with backoff.
func (s *Service) requeue(id string) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	rt := s.retryAt[id]
	if rt.delay == 0 {
		rt.delay = firstRetry
	} else {
		rt.delay = min(rt.delay*2, maxRetry)
	}
	rt.at = s.now().Add(rt.delay)
	s.retryAt[id] = rt
	return rt.delay
}

// prune deletes runs settled longer than Retention with their blobs, then trims the blob
// store to its budget (oldest settled runs first).
func (s *Service) prune(ctx context.Context) {
	ids, err := s.store.PruneRuns(ctx, s.now().Add(-s.cfg.Retention))
	if err != nil {
		if ctx.Err() == nil {
			s.log.Error("runs: prune", "err", err)
		}
		return
	}
	for _, id := range ids {
		s.blobs.remove(id)
	}
	if len(ids) > 0 {
		s.log.Info("runs pruned", "runs", len(ids))
	}
	s.gc(ctx)
}

// gc trims the blob store to ArtifactBudgetBytes, the oldest settled runs' blobs first.
func (s *Service) gc(ctx context.Context) {
	gone := s.blobs.gcOverBudget(s.cfg.ArtifactBudgetBytes, func(id string) bool {
		r, err := s.store.GetRun(ctx, id)
		return errcode.Is(err, errcode.RunNotFound) || (err == nil && r.State.Settled())
	})
	if len(gone) > 0 {
		s.log.Info("run blobs removed over the budget", "runs", len(gone), "budget_bytes", s.cfg.ArtifactBudgetBytes)
	}
}
