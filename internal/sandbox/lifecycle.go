package sandbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/faultpoint"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/text"
)

// The control loop is level-triggered, as Kubernetes controllers are: step looks at one
// sandbox's record and drives whatever is unfinished toward its goal —
//
//	stopping                       → host resources deleted, id range freed → destroyed
//	creating, no create in flight  → host resources deleted → failed
//	running/failed/lost, expired   → stopping → … → destroyed
//	running, expired, on_expiry sleep → sleeping (sleep.go), woken with its TTL again
//	running, Adopt failed at start → adopted, or lost if Adopt refuses it (reconcile's adopt)
//	running, SleepSnapshot set     → an unfinished sleep or wake settled (sleep.go's rules)
//	creating, SleepSnapshot set    → a wake's leftovers deleted → sleeping
//	sleeping, ttl_while_sleeping and expired → stopping → … → destroyed
//
// Reconcile runs it over every unsettled sandbox at start and Converge on every tick. A failure
// is kept per sandbox (logged, recorded as an "error" event, retried with backoff) and never
// stops the other sandboxes or the server's start.

// Backoff of a sandbox whose step failed: 1 s, doubling, at most 5 minutes.
const (
	retryMin = time.Second
	retryMax = 5 * time.Minute
)

// retries remembers, per sandbox, when a failed step may be tried again.
type retries struct {
	mu sync.Mutex
	m  map[string]retry
}

type retry struct {
	next     time.Time
	attempts int
}

func (r *retries) due(id string, now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return !now.Before(r.m[id].next)
}

// failed records a failure and returns how many in a row there have been.
func (r *retries) failed(id string, now time.Time) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	rt := r.m[id]
	rt.attempts++
	d := retryMin << min(rt.attempts-1, 16)
	rt.next = now.Add(min(d, retryMax))
	r.m[id] = rt
	return rt.attempts
}

// known reports whether a step or destroy of id failed in this process and awaits a retry.
func (r *retries) known(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.m[id]
	return ok
}

func (r *retries) clear(id string) {
	r.mu.Lock()
	delete(r.m, id)
	r.mu.Unlock()
}

// createDeadline is how long after its record was written a create may still be making its
// sandbox: the bring-up bound (ReadyTimeout + 30 s) and a margin.
func (s *Service) createDeadline() time.Duration { return s.cfg.ReadyTimeout + time.Minute }

// destroyGrace is how long a stopping record another replica may still be finishing (a destroy
// bounds its delete to a minute) is left to it before the control loop finishes it.
const destroyGrace = 2 * time.Minute

// DefaultStepTimeout is Config.StepTimeout's default: longer than a runtime's own bound on a
// delete (Kubernetes waits up to a minute for a pod to go) and the store writes around it, so a
// slow but working step is not cut short.
const DefaultStepTimeout = 90 * time.Second

// convergeWorkers bounds how many sandboxes one pass of the control loop works on at once: a
// step waiting on a slow runtime delays no other sandbox, and a pass over many expiries does not
// flood the runtime or the store.
const convergeWorkers = 4

// Converge runs one pass of the control loop over every unsettled sandbox (creating, stopping,
// and expired ones) whose backoff allows, and returns what failed, joined. It works on up to
// convergeWorkers sandboxes at once, each step under its own deadline (Config.StepTimeout; a
// sleep, or a sleep's settling, gets at least sleepTimeout), and returns when every step it
// started has finished or passed its deadline. A step past its deadline is recorded as a failure (event,
// backoff), as any other; if the runtime ignores the deadline the step runs on in the background,
// holding its sandbox's lock, and is waited for by Run and Close. A sandbox another call or a
// step of an earlier pass is working on (its lock is held) is left to it.
func (s *Service) Converge(ctx context.Context) error { return s.convergePass(ctx, true) }

// convergePass is Converge, waiting for the steps it starts or not. Run's passes do not: a step
// that takes long (a destroy on a loaded host, a sleep at expiry saving memory, a runtime that
// hangs until the step's deadline) then holds one of the loopSlots and its sandbox's lock, while
// the next tick's pass starts the steps of other sandboxes (an expiry is acted on within a tick
// of it, not after the slowest step of the pass before).
func (s *Service) convergePass(ctx context.Context, wait bool) error {
	list, err := s.store.ListSandboxes(ctx, ListFilter{States: []State{StateCreating, StateRunning, StateSleeping, StateStopping, StateFailed, StateLost}, Limit: 100000})
	if err != nil {
		return fmt.Errorf("list sandboxes: %w", err)
	}
	now := s.now()
	var (
		mu   sync.Mutex
		errs []error
		g    errgroup.Group
	)
	g.SetLimit(convergeWorkers)
	for _, sb := range list {
		if s.cfg.Shared && sb.State == StateRunning && !s.loopWatched.has(sb.ID) {
			s.watchFromLoop(sb)
		}
		if !s.unsettled(sb, now, false) || !s.retries.due(sb.ID, now) {
			continue
		}
		if ctx.Err() != nil {
			break
		}
		if !wait {
			// Every slot taken: a later tick starts it (the loop goes on for the watches above).
			s.startStep(ctx, sb)
			continue
		}
		g.Go(func() error {
			unlock, ok := s.tryLock(sb.ID)
			if !ok {
				return nil
			}
			if err := s.boundedStep(ctx, sb, unlock); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
			return nil
		})
	}
	_ = g.Wait()                                         // the steps' errors are collected in errs
	if err := s.hooks.converge(ctx, false); err != nil { // the features' parts (snapshots)
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// startStep starts boundedStep on sb in the background if a loop slot is free and sb is not
// locked by another call or step; the step holds the slot until it returns.
func (s *Service) startStep(ctx context.Context, sb Sandbox) {
	select {
	case s.loopSlots <- struct{}{}:
	default:
		return
	}
	unlock, ok := s.tryLock(sb.ID)
	if !ok {
		<-s.loopSlots
		return
	}
	// Counted here, before the goroutine starts, so that Run's and Close's wait cannot miss it.
	if !s.steps.add() {
		unlock()
		<-s.loopSlots
		return // the service is closing
	}
	go func() {
		defer func() { <-s.loopSlots }()
		_ = s.boundedStepCounted(ctx, sb, unlock) // its failure is recorded against the sandbox
	}()
}

// boundedStep runs step on sb, whose lock the caller took (unlock releases it), under the step's
// deadline, and returns when the step has returned or its deadline has passed. In the second
// case the step is recorded as failed at once and left to finish in the background: it keeps
// the lock until it does, so no later pass starts a second step on the sandbox meanwhile.
func (s *Service) boundedStep(ctx context.Context, sb Sandbox, unlock func()) error {
	if !s.steps.add() {
		unlock()
		return nil // the service is closing
	}
	return s.boundedStepCounted(ctx, sb, unlock)
}

// boundedStepCounted is boundedStep once the step is counted in s.steps.
func (s *Service) boundedStepCounted(ctx context.Context, sb Sandbox, unlock func()) error {
	d := s.cfg.StepTimeout
	if sb.SleepSnapshot != "" || sb.State == StateRunning && sb.OnExpiry == OnExpirySleep {
		d = max(d, sleepTimeout) // settling a sleep may finish its snapshot; an expiry's sleep takes one
	}
	sctx, cancel := context.WithTimeout(ctx, d)
	stopOnClose := context.AfterFunc(s.bg, cancel)
	res := make(chan error, 1)
	// Who settles the step: the step itself when it returns in time (stepReturned), recording
	// its failure while it still holds the lock, else the loop when its deadline passes
	// (stepAbandoned), whichever comes first.
	const (
		stepRunning int32 = iota
		stepReturned
		stepAbandoned
	)
	var state atomic.Int32
	go func() {
		record, err := s.stepOnce(sctx, sb.ID, false)
		if err != nil && errors.Is(sctx.Err(), context.DeadlineExceeded) {
			err = stepTimedOut(d, err)
		}
		returned := state.CompareAndSwap(stepRunning, stepReturned)
		if returned {
			err = s.stepDone(ctx, sb.ID, err, record)
		} else {
			// The loop has recorded its timeout already (or the service is stopping).
			if err == nil {
				s.retries.clear(sb.ID)
			}
			if ctx.Err() == nil && s.bg.Err() == nil {
				s.log.Info("control loop step returned after its deadline", "sandbox_id", sb.ID, "err", err)
			}
		}
		cancel()
		stopOnClose()
		// The lock is released before the pass learns the result: a pass that has returned
		// must not leave its sandbox locked, or the next pass would skip it as busy.
		unlock()
		s.steps.done()
		if returned {
			res <- err
		}
	}()
	select {
	case err := <-res:
		return err
	case <-sctx.Done():
	}
	if !state.CompareAndSwap(stepRunning, stepAbandoned) {
		return <-res
	}
	if ctx.Err() != nil || s.bg.Err() != nil {
		// Shutting down: the step was stopped, not the sandbox at fault. Run and Close wait
		// for it; a later term retries.
		return fmt.Errorf("sandbox %s: %w", sb.ID, context.Cause(sctx))
	}
	return s.stepFailed(ctx, sb.ID, stepTimedOut(d, context.Cause(sctx)))
}

// stepTimedOut is the failure of a step that passed its deadline d, as its event tells it.
func stepTimedOut(d time.Duration, cause error) error {
	return errcode.Wrap(errcode.Internal, cause, "step did not finish within %v", d)
}

// inflight counts the control loop's steps running in the background. Once closed it starts
// no more, so Close's wait cannot miss one.
type inflight struct {
	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup
}

// add counts a step about to start; false once closed.
func (f *inflight) add() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false
	}
	f.wg.Add(1)
	return true
}

func (f *inflight) done() { f.wg.Done() }

// wait waits for the steps in flight.
func (f *inflight) wait() { f.wg.Wait() }

// close refuses further steps and waits for those in flight.
func (f *inflight) close() {
	f.mu.Lock()
	f.closed = true
	f.mu.Unlock()
	f.wg.Wait()
}

// unsettled reports whether sb has work step would do. At start (orphaned true) no create of
// this server is in flight, so every creating record is orphaned.
func (s *Service) unsettled(sb Sandbox, now time.Time, orphaned bool) bool {
	switch sb.State {
	case StateStopping:
		// Alone on the store, a destroy in flight holds the sandbox's lock, which the loop
		// respects. Shared, another replica may be finishing it: the loop waits out
		// destroyGrace, unless the destroy failed here (its retry is this process's).
		return !s.cfg.Shared || orphaned || s.retries.known(sb.ID) || now.Sub(sb.UpdatedAt) > destroyGrace
	case StateCreating:
		if sb.SleepSnapshot != "" { // a wake
			return orphaned || now.Sub(sb.UpdatedAt) > s.createDeadline()+sleepTimeout
		}
		return orphaned || now.Sub(sb.CreatedAt) > s.createDeadline()
	case StateRunning:
		return !sb.ExpiresAt.After(now) || s.unadopted.has(sb.ID) || sb.SleepSnapshot != ""
	case StateSleeping:
		// By default a sleeping sandbox's TTL is paused (it moves on at wake).
		return sb.TTLWhileSleeping && !sb.ExpiresAt.After(now)
	case StateFailed, StateLost:
		return !sb.ExpiresAt.After(now)
	}
	return false
}

// step drives sandbox id one move toward its goal; the caller holds its lock. Errors are
// recorded against the sandbox (log, event, backoff) and returned.
func (s *Service) step(ctx context.Context, id string, orphaned bool) error {
	record, err := s.stepOnce(ctx, id, orphaned)
	return s.stepDone(ctx, id, err, record)
}

// stepDone settles a step of id that returned err: nil clears its backoff; an error is recorded
// against the sandbox (stepFailed) if record says it is the sandbox's, and returned.
func (s *Service) stepDone(ctx context.Context, id string, err error, record bool) error {
	switch {
	case err == nil:
		s.retries.clear(id)
		return nil
	case record:
		return s.stepFailed(ctx, id, err)
	default:
		return fmt.Errorf("sandbox %s: %w", id, err)
	}
}

// stepOnce is step without the recording: it returns what failed, and whether that is a
// failure of the sandbox's step (record) rather than of reading its record.
func (s *Service) stepOnce(ctx context.Context, id string, orphaned bool) (record bool, err error) {
	sb, err := s.store.GetSandbox(ctx, id)
	if err != nil {
		return false, err
	}
	now := s.now()
	if !s.unsettled(sb, now, orphaned) {
		return false, nil
	}
	switch {
	case sb.State == StateCreating && sb.SleepSnapshot != "":
		var rt runtime.Runtime
		if rt, err = s.runtimeOf(sb); err == nil {
			_, err = s.backToSleep(ctx, sb, rt, "wake abandoned: the server stopped during it, or it passed its deadline")
		}
	case sb.State == StateRunning && sb.SleepSnapshot != "":
		_, err = s.settleSleep(ctx, sb)
	case sb.State == StateCreating:
		err = s.abandonCreate(ctx, sb, orphaned)
	case sb.State == StateStopping:
		// The stop's own reason is on its stopping event; the loop only finishes it.
		_, err = s.finishDestroy(ctx, sb, "destroy finished by the control loop")
	case sb.ExpiresAt.After(now): // running, its Adopt at start failed: try it again
		var rt runtime.Runtime
		if rt, err = s.runtimeOf(sb); err == nil {
			_, err = s.adopt(ctx, rt, sb)
		}
	case sb.State == StateRunning && sb.OnExpiry == OnExpirySleep: // expired: it sleeps
		_, err = s.sleep(ctx, sb, "ttl expired (on_expiry sleep)")
	default: // expired
		_, err = s.stopAndDestroy(ctx, sb, "ttl expired")
	}
	return err != nil, err
}

// stepFailed logs err, records it as an event of the sandbox and schedules a retry.
func (s *Service) stepFailed(ctx context.Context, id string, err error) error {
	n := s.retries.failed(id, s.now())
	s.log.Warn("sandbox did not converge; will retry", "sandbox_id", id, "attempt", n, "err", err)
	if sb, gerr := s.store.GetSandbox(ctx, id); gerr == nil {
		sb.Version++
		sb.UpdatedAt = s.now().UTC().Truncate(time.Millisecond)
		ev := Event{SandboxID: id, Type: "error", From: sb.State, To: sb.State, At: sb.UpdatedAt,
			Reason: text.Truncate(fmt.Sprintf("attempt %d: %s", n, errcode.Message(err)), 1024)}
		if aerr := s.store.UpdateSandbox(ctx, sb, ev); aerr == nil {
			s.bus.publish()
		}
	}
	return fmt.Errorf("sandbox %s: %w", id, err)
}

// abandonCreate deletes what a create that is no longer running left, and records it failed.
func (s *Service) abandonCreate(ctx context.Context, sb Sandbox, atStart bool) error {
	rt, err := s.runtimeOf(sb)
	if err != nil {
		return err
	}
	if err := rt.Delete(ctx, sb.ID); err != nil {
		return fmt.Errorf("delete half-made sandbox: %w", err)
	}
	s.releaseIDRange(ctx, sb.ID)
	reason, msg := "create abandoned: past its deadline", "the create did not finish in time"
	if atStart {
		reason, msg = "reconcile: server stopped during create", "the server stopped while this sandbox was being created"
	}
	_, err = s.transition(ctx, sb, StateFailed, reason, msg)
	return err
}

// stopAndDestroy records the intent to stop sb and then finishes it.
func (s *Service) stopAndDestroy(ctx context.Context, sb Sandbox, reason string) (Sandbox, error) {
	if sb.State != StateStopping {
		var err error
		if sb, err = s.transition(ctx, sb, StateStopping, reason, ""); err != nil {
			return sb, err
		}
	}
	faultpoint.Hit(faultpoint.DestroyStopping) // recorded stopping; the runtime still holds it
	return s.finishDestroy(ctx, sb, reason)
}

// finishDestroy deletes a stopping sandbox's host resources, frees its id range and records it
// destroyed with reason. On failure the record stays stopping, which the control loop retries.
func (s *Service) finishDestroy(ctx context.Context, sb Sandbox, reason string) (Sandbox, error) {
	s.dropGuest(sb.ID)
	rt, err := s.runtimeOf(sb)
	if err != nil {
		return sb, err
	}
	if err := rt.Delete(ctx, sb.ID); err != nil {
		return sb, fmt.Errorf("delete host resources: %w", err)
	}
	if err := s.deleteSleepSnapshot(ctx, sb.SleepSnapshot); err != nil {
		return sb, err
	}
	sb.SleepSnapshot = ""
	s.releaseIDRange(ctx, sb.ID)
	if err := s.store.DeleteExposures(ctx, sb.ID); err != nil {
		return sb, fmt.Errorf("delete preview URLs: %w", err)
	}
	return s.transition(ctx, sb, StateDestroyed, reason, "")
}

// Reconcile makes the store and the host agree. Run it at start, before serving, while holding
// the state-dir lock: running sandboxes whose container still runs are adopted (runtime.Adopter)
// and watched; records whose container is gone, or whose Adopt refuses them, become lost; half-made creates become failed;
// half-done destroys finish; host resources that no live record owns are deleted. A sandbox it
// cannot settle (its state unreadable, a delete failing) is logged, recorded and left to the
// control loop: it never stops the server from starting. Only a store it cannot read is an error.
//
// With several replicas on one store (Config.Shared) it runs wherever the node's lifecycle
// lease is taken (lease.go), while other replicas serve: a creating record is then failed only
// past its deadline, an unfinished snapshot only by the control loop's rules, and the sweep
// spares whatever has a live record when it looks, not only what was live when it began.
func (s *Service) Reconcile(ctx context.Context) error {
	live, err := s.store.ListSandboxes(ctx, ListFilter{States: []State{StateCreating, StateRunning, StateSleeping, StateStopping, StateFailed, StateLost}, Limit: 100000})
	if err != nil {
		return fmt.Errorf("list sandboxes: %w", err)
	}
	owned := map[string]bool{}
	now := s.now()
	for _, listed := range live {
		unlock := s.lock(listed.ID)
		// Read again under the lock: a watch (or another replica) may have settled it since the
		// list, and acting on the listed copy would fail on its version and keep what is gone.
		sb, err := s.store.GetSandbox(ctx, listed.ID)
		keep := false
		switch {
		case errcode.Of(err) == errcode.SandboxNotFound:
			err = nil
		case err != nil:
			keep = true // unreadable: keep what it holds and let the control loop settle it
		default:
			keep, err = s.reconcileOne(ctx, sb, now)
		}
		unlock()
		if keep {
			owned[listed.ID] = true
		}
		if err != nil {
			s.log.Warn("reconcile: sandbox left to the control loop", "sandbox_id", listed.ID, "err", err)
		}
	}
	isOwned := func(id string) bool { return owned[id] }
	if s.cfg.Shared {
		// Other replicas create while this one reconciles: a sandbox whose record was written
		// after the list above is theirs, not an orphan (the sweep lists the runtime first).
		byStore := s.ownedByStore(ctx)
		isOwned = func(id string) bool { return owned[id] || byStore(id) }
	}
	if err := s.sweep(ctx, isOwned); err != nil {
		s.log.Warn("reconcile: sweep incomplete; the periodic sweep retries", "err", err)
	}
	// The features' parts (snapshots: half-taken ones failed, half-deleted ones deleted,
	// directories no record owns removed, ready ones whose files are gone failed).
	if err := s.hooks.converge(ctx, !s.cfg.Shared); err != nil {
		s.log.Warn("reconcile: features' records left to the control loop", "err", err)
	}
	if err := s.hooks.sweep(ctx, true); err != nil {
		s.log.Warn("reconcile: features' sweep incomplete; the periodic sweep retries", "err", err)
	}
	return nil
}

// reconcileOne settles one sandbox at start and says whether its host resources must be kept.
func (s *Service) reconcileOne(ctx context.Context, sb Sandbox, now time.Time) (keep bool, err error) {
	rt, rerr := s.runtimeOf(sb)
	if rerr != nil {
		return sb.State.Live(), rerr // not ours to judge: leave it as it is
	}
	if sb.State == StateRunning && sb.SleepSnapshot != "" {
		// A sleep (or a wake's last step) the server did not finish.
		if sb, err = s.settleSleep(ctx, sb); err != nil {
			return true, s.stepFailed(ctx, sb.ID, err)
		}
	}
	switch sb.State {
	case StateSleeping:
		if sb, err = s.checkSleeping(ctx, sb); err != nil {
			return true, s.stepFailed(ctx, sb.ID, err)
		}
		if sb.State != StateSleeping {
			return false, nil
		}
		if s.unsettled(sb, now, false) {
			return false, s.step(ctx, sb.ID, false)
		}
		return true, nil // its id range stays held
	case StateCreating:
		if sb.SleepSnapshot == "" {
			break
		}
		if err := s.step(ctx, sb.ID, !s.cfg.Shared); err != nil {
			return true, err
		}
		return true, nil // a wake, back to sleeping: its id range stays held
	}
	switch sb.State {
	case StateRunning:
		st, err := rt.State(ctx, sb.ID)
		if err != nil {
			return true, s.stepFailed(ctx, sb.ID, fmt.Errorf("read state: %w", err))
		}
		if st != runtime.StatusRunning {
			if _, err := s.transition(ctx, sb, StateLost, "reconcile: container "+string(st), "the sandbox's container was gone when the server started"); err != nil {
				return true, err
			}
			return false, nil // the sweep deletes what is left
		}
		lost, aerr := s.adopt(ctx, rt, sb)
		if lost {
			return false, nil // the sweep deletes what is left
		}
		if aerr != nil {
			// It may pass: the sandbox is served and watched, and the control loop retries.
			aerr = s.stepFailed(ctx, sb.ID, aerr)
		} else {
			s.log.Info("reconcile: adopted", "sandbox_id", sb.ID)
		}
		s.watch(rt, sb.ID)
		s.hooks.adopted(ctx, sb, rt) // its jobs' watches re-armed, its network session reopened
		if aerr == nil && s.unsettled(sb, now, false) {
			return true, s.step(ctx, sb.ID, false)
		}
		return true, aerr
	case StateCreating, StateStopping:
		// Alone on its store, no create of this server is in flight at start: a creating
		// record is orphaned. Shared, another replica may be making it: it is abandoned only
		// past its deadline (the control loop's rule), and kept until then.
		if err := s.step(ctx, sb.ID, !s.cfg.Shared); err != nil {
			return true, err
		}
		return sb.State == StateCreating && s.cfg.Shared && !s.unsettled(sb, now, false), nil
	default: // failed, lost: not live; the sweep deletes what they left
		if s.unsettled(sb, now, false) {
			return false, s.step(ctx, sb.ID, false)
		}
		return false, nil
	}
}

// adopt calls the runtime's Adopt (runtime.Adopter) for sb, found running at start. A refusal
// that says the host's sandbox is gone, has stopped or is not the one on record
// (SANDBOX_NOT_FOUND, SANDBOX_NOT_RUNNING, or INVALID_ARGUMENT: a handle on record the runtime
// did not make) records sb lost, as a container found gone at start is, with the refusal as the
// event's reason, and returns lost true: its host resources are no record's, so the sweep
// deletes them. Any other failure may pass: sb stays running and is marked unadopted, and the
// control loop (step) retries Adopt with backoff until it succeeds or is refused.
func (s *Service) adopt(ctx context.Context, rt runtime.Runtime, sb Sandbox) (lost bool, err error) {
	a, ok := rt.(runtime.Adopter)
	if !ok {
		s.unadopted.remove(sb.ID)
		return false, nil
	}
	err = a.Adopt(ctx, sb.ID, runtime.Handle(sb.Handle))
	if err == nil {
		s.unadopted.remove(sb.ID)
		return false, nil
	}
	switch errcode.Of(err) {
	case errcode.SandboxNotFound, errcode.SandboxNotRunning, errcode.InvalidArgument:
		s.log.Warn("reconcile: adopt refused; sandbox lost", "sandbox_id", sb.ID, "err", err)
		if _, terr := s.transition(ctx, sb, StateLost, text.Truncate("reconcile: adopt refused: "+errcode.Message(err), 1024),
			"the sandbox on the host had stopped or was not this sandbox when the server started"); terr != nil {
			s.unadopted.add(sb.ID)
			return false, terr
		}
		s.dropGuest(sb.ID)
		return true, nil
	}
	s.unadopted.add(sb.ID)
	return false, fmt.Errorf("adopt: %w", err)
}

// idSet is a set of sandbox ids, safe for concurrent use.
type idSet struct {
	mu sync.Mutex
	m  map[string]bool
}

func (s *idSet) add(id string) {
	s.mu.Lock()
	if s.m == nil {
		s.m = map[string]bool{}
	}
	s.m[id] = true
	s.mu.Unlock()
}

func (s *idSet) remove(id string) {
	s.mu.Lock()
	delete(s.m, id)
	s.mu.Unlock()
}

func (s *idSet) has(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m[id]
}

// watchFromLoop watches running sb (watch) once for the control loop: with other replicas a
// sandbox may have been made by one that died since, and its exit must still be recorded at
// once. A second watch of a sandbox its own replica watches too is harmless: the first to record
// it lost wins, the other finds it no longer running.
func (s *Service) watchFromLoop(sb Sandbox) {
	rt, err := s.runtimeOf(sb)
	if err != nil {
		return
	}
	if _, ok := rt.(runtime.Waiter); !ok {
		return
	}
	s.loopWatched.add(sb.ID)
	s.watchThen(rt, sb.ID, func() { s.loopWatched.remove(sb.ID) })
}

// watch waits, in the background, for the sandbox's init to exit (runtime.Waiter), and then
// records a sandbox that was running as lost at once, not at the next call to it.
func (s *Service) watch(rt runtime.Runtime, id string) { s.watchThen(rt, id, nil) }

// watchThen is watch, calling done (if set) when the watch ends.
func (s *Service) watchThen(rt runtime.Runtime, id string, done func()) {
	w, ok := rt.(runtime.Waiter)
	if !ok {
		return
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if done != nil {
			defer done()
		}
		if err := w.Wait(s.bg, id); err != nil {
			return // the service is closing
		}
		// A store that cannot take the write now (a full disk) gets it later: the record must
		// not stay running for a sandbox that is gone.
		for delay := 100 * time.Millisecond; !s.recordExited(rt, id); delay = min(2*delay, 5*time.Second) {
			select {
			case <-s.bg.Done():
				return
			case <-time.After(delay):
			}
		}
	}()
}

// recordExited records sandbox id, whose init has exited, lost, and says whether it is settled
// (recorded, or nothing left to record); false means the store could not be read or written.
func (s *Service) recordExited(rt runtime.Runtime, id string) bool {
	unlock := s.lock(id)
	defer unlock()
	sb, err := s.store.GetSandbox(s.bg, id)
	if err != nil {
		return errcode.Of(err) == errcode.SandboxNotFound
	}
	if sb.State != StateRunning {
		return true // destroyed, asleep or already settled
	}
	if st, err := rt.State(s.bg, id); err == nil && st == runtime.StatusRunning {
		return true // it slept and woke again since: the wake watches the new one
	}
	reason := "sandbox init exited"
	if er, ok := rt.(runtime.ExitReporter); ok {
		if why := text.Clean(er.ExitReason(s.bg, id), 1024); why != "" {
			reason += ": " + why
		}
	}
	if _, err := s.transition(s.bg, sb, StateLost, reason, "the sandbox stopped unexpectedly"); err != nil {
		s.log.Warn("record lost sandbox; will retry", "sandbox_id", id, "err", err)
		return false
	}
	s.dropGuest(id)
	return true
}

// sweep deletes the host resources of every sandbox that owned does not claim, then frees the
// id ranges of sandboxes it does not claim (sweepIDRanges). It lists the host first and asks
// owned second, so a sandbox created in between (whose record is written before its container)
// is never mistaken for an orphan. A failing runtime or delete does not stop the rest; the
// ranges of sandboxes whose delete failed stay held.
func (s *Service) sweep(ctx context.Context, owned func(id string) bool) error {
	type found struct {
		rt  runtime.Runtime
		ids []string
	}
	var all []found
	var errs []error
	for _, rt := range s.local.runtimes {
		if !rt.Capabilities().Available {
			continue
		}
		ids, err := rt.List(ctx)
		if err != nil {
			errs = append(errs, fmt.Errorf("list %s sandboxes: %w", rt.Name(), err))
			continue
		}
		all = append(all, found{rt, ids})
	}
	undeleted := map[string]bool{}
	for _, f := range all {
		for _, id := range f.ids {
			if owned(id) {
				continue
			}
			unlock, ok := s.tryLock(id)
			if !ok {
				continue // a lifecycle call holds it: not an orphan now
			}
			s.log.Warn("sweeping orphaned sandbox resources", "sandbox_id", id, "runtime", f.rt.Name())
			err := f.rt.Delete(ctx, id)
			unlock()
			if err != nil {
				undeleted[id] = true
				errs = append(errs, fmt.Errorf("delete orphan %s: %w", id, err))
			}
		}
	}
	if len(errs) > 0 && len(all) < len(s.local.runtimes) {
		// A runtime could not list: its sandboxes' ranges must not be freed blindly.
		return errors.Join(errs...)
	}
	if err := s.sweepIDRanges(ctx, func(id string) bool { return undeleted[id] || owned(id) }); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// ownedByStore reports whether the store holds a live record for id (or cannot say).
func (s *Service) ownedByStore(ctx context.Context) func(id string) bool {
	return func(id string) bool {
		sb, err := s.store.GetSandbox(ctx, id)
		return err == nil && sb.State.Live() || err != nil && errcode.Of(err) != errcode.SandboxNotFound
	}
}

// Run performs background duties until ctx ends: the control loop (every second), the orphan
// sweep (every SweepInterval, a minute) and pruning of old finished records (every hour).
//
// With several replicas it runs only on the holder of the node's lifecycle lease, for as long
// as it holds it (lease.go): when ctx ends Run returns once the pools' refill loop and the
// control loop's steps in flight have too, so a later term starts afresh.
func (s *Service) Run(ctx context.Context) {
	defer s.hooks.start(ctx)() // the features' loops (warm pools' refill)
	defer s.steps.wait()       // control-loop steps still running past their deadline
	tick := time.NewTicker(min(time.Second, s.cfg.SweepInterval))
	defer tick.Stop()
	lastSweep, lastPrune := s.now(), time.Time{}
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if err := s.convergePass(ctx, false); err != nil && ctx.Err() == nil {
			s.log.Debug("control loop pass incomplete", "err", err)
		}
		if s.now().Sub(lastSweep) >= s.cfg.SweepInterval {
			lastSweep = s.now()
			if err := s.sweep(ctx, s.ownedByStore(ctx)); err != nil && ctx.Err() == nil {
				s.log.Warn("orphan sweep incomplete", "err", err)
			}
			if err := s.hooks.sweep(ctx, false); err != nil && ctx.Err() == nil {
				s.log.Warn("features' sweep incomplete", "err", err)
			}
		}
		if s.now().Sub(lastPrune) >= time.Hour {
			lastPrune = s.now()
			if n, err := s.store.PruneSandboxes(ctx, s.now().Add(-s.cfg.Retention)); err != nil && ctx.Err() == nil {
				s.log.Warn("prune", "err", err)
			} else if n > 0 {
				s.log.Info("pruned finished sandbox records", "count", n)
			}
			s.hooks.prune(ctx, s.now())
		}
	}
}
