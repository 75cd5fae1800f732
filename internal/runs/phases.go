package runs

import (
	"context"
	"errors"
	"fmt"
	"path"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/faultpoint"
	"github.com/agentbox/agentbox/internal/gate"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// One run's execution: its record is written before each act, so a restarted server continues
// from it (a phase's job is waited for again; a phase cut before its job id was recorded is
// interrupted, never re-run).

const (
	// ttlSlack is added to the run's timeout for its sandbox's TTL.
	ttlSlack = 10 * time.Minute
	// waitSlice is how long one WaitJob call waits before the worker looks at its deadlines.
	waitSlice = 5 * time.Second
	// cancelGrace is how long a canceled or timed-out phase's job has before SIGKILL.
	cancelGrace = 2 * time.Second
	// stdinFile holds a command's stdin inside the sandbox (+ the run id).
	stdinFile = "/tmp/.agentbox-stdin-"
	// stdinScript feeds the file named by $0 to the command "$@" (user input only as arguments).
	stdinScript = `exec "$@" < "$0"`
	// opTimeout bounds one control-plane call the worker makes (a write, a mkdir).
	opTimeout = 2 * time.Minute
)

var errShutdown = errors.New("server stopping")

// exe is one run being executed.
type exe struct {
	s   *Service
	r   Run
	ctx context.Context // the service's: ends at shutdown
	// cctx ends on shutdown or when the run's cancel is requested.
	cctx     context.Context
	deadline time.Time
	narrowed bool // the network is back on the run's own policy
}

func (s *Service) execute(ctx, cctx context.Context, r Run) {
	x := &exe{s: s, r: r, ctx: ctx, cctx: cctx}
	start := r.CreatedAt
	if r.StartedAt != nil {
		start = *r.StartedAt
	}
	x.deadline = start.Add(time.Duration(r.Spec.TimeoutSeconds) * time.Second)
	if r.CancelRequested {
		s.signalCancel(r.ID)
	}
	err := x.run()
	if err != nil {
		if ctx.Err() != nil {
			s.log.Info("run left for the next start", "run_id", r.ID, "state", x.r.State)
			return
		}
		s.log.Error("run: record failed", "run_id", r.ID, "err", err)
	}
}

func (x *exe) canceled() bool { return x.cctx.Err() != nil && x.ctx.Err() == nil }

// save writes the record (version bump) with evs; a concurrent cancel request is merged in.
func (x *exe) save(evs ...Event) error {
	for attempt := 0; ; attempt++ {
		wctx, cancel := context.WithTimeout(context.WithoutCancel(x.ctx), 30*time.Second)
		err := x.write(wctx, evs)
		if err == nil {
			cancel()
			x.s.notify()
			return nil
		}
		if !errcode.Is(err, errcode.Conflict) || attempt > 10 {
			cancel()
			return err
		}
		cur, gerr := x.s.store.GetRun(wctx, x.r.ID)
		cancel()
		if gerr != nil {
			return gerr
		}
		if cur.State.Settled() {
			return fmt.Errorf("run %s settled elsewhere (%s)", x.r.ID, cur.State)
		}
		x.r.Version = cur.Version
		if cur.CancelRequested && !x.r.CancelRequested {
			x.r.CancelRequested = true
			x.s.signalCancel(x.r.ID)
		}
	}
}

// write stamps the record and evs and writes them; a settle is stamped and written under
// stampMu (see Service.stampMu).
func (x *exe) write(ctx context.Context, evs []Event) error {
	if x.r.State.Settled() {
		x.s.stampMu.Lock()
		defer x.s.stampMu.Unlock()
	}
	now := x.s.stamp()
	x.r.UpdatedAt = now
	x.r.Version++
	for i := range evs {
		evs[i].RunID, evs[i].Time = x.r.ID, now
	}
	err := x.s.store.UpdateRun(ctx, x.r, evs...)
	if err != nil {
		x.r.Version--
	}
	return err
}

// setState moves the run to st (an event) if it is not there yet.
func (x *exe) setState(st State, reason string) error {
	if x.r.State == st {
		return nil
	}
	from := x.r.State
	x.r.State, x.r.Reason = st, reason
	return x.save(Event{From: from, To: st, Reason: reason})
}

func (x *exe) phase(name string) *Phase {
	for i := range x.r.Phases {
		if x.r.Phases[i].Name == name {
			return &x.r.Phases[i]
		}
	}
	x.r.Phases = append(x.r.Phases, Phase{Name: name, State: PhasePending})
	return &x.r.Phases[len(x.r.Phases)-1]
}

func phaseDone(p PhaseState) bool { return p != PhasePending && p != PhaseRunning }

// stateOf is the run state a phase belongs to.
func stateOf(name string) State {
	switch {
	case name == PhaseCommand:
		return Running
	case strings.HasPrefix(name, PhaseValidation):
		return Validating
	case name == PhaseCollect:
		return Collecting
	case name == PhaseCleanup:
		return Cleaning
	}
	return Preparing
}

// blocking reports whether a phase's failure skips the phases after it (the command's and
// the validations' do not: validations are diagnostics of the command's work).
func blocking(p Phase) bool {
	if p.State == PhaseSucceeded || p.State == PhaseSkipped || p.State == PhasePending || p.State == PhaseRunning {
		return false
	}
	if p.State == PhaseFailed && (p.Name == PhaseCommand || strings.HasPrefix(p.Name, PhaseValidation)) {
		return false
	}
	return true
}

// run drives the run from wherever its record is to settled.
func (x *exe) run() error {
	if !x.r.State.Settled() && x.r.State != Collecting && x.r.State != Cleaning {
		if err := x.runPhases(); err != nil {
			return err
		}
	}
	if x.r.State == Queued { // requeued for capacity
		return nil
	}
	if x.r.State != Cleaning {
		if err := x.collect(); err != nil {
			return err
		}
	}
	if err := x.cleanup(); err != nil {
		return err
	}
	return x.settle()
}

func (x *exe) runPhases() error {
	stop := ""
	for i := 0; i < len(x.r.Phases); i++ {
		p := x.r.Phases[i]
		if p.Name == PhaseCollect || p.Name == PhaseCleanup {
			break
		}
		if stop != "" {
			if p.State == PhasePending {
				x.r.Phases[i].State, x.r.Phases[i].Error = PhaseSkipped, stop
			}
			continue
		}
		if !phaseDone(p.State) {
			if p.Name != PhaseSandbox && p.Name != PhaseCheckout && p.Name != PhaseAgentCheckout && p.Name != PhaseFiles {
				if err := x.narrowNetwork(); err != nil {
					if x.ctx.Err() != nil {
						return errShutdown
					}
					if err := x.failPhase(i, err.Error()); err != nil {
						return err
					}
					stop = "skipped: the network could not be restored"
					continue
				}
			}
			if err := x.runPhase(i); err != nil {
				return err
			}
			if x.r.State == Queued {
				return nil
			}
			faultpoint.Hit(faultpoint.RunStep) // the phase is recorded; the next has not started
		}
		p = x.r.Phases[i]
		if p.State == PhaseSucceeded && (p.Name == PhaseCheckout && x.r.Commit == "" || p.Name == PhaseAgentCheckout && x.r.AgentCommit == "") {
			c := commitOf(p)
			if c == "" {
				x.r.Phases[i].State, x.r.Phases[i].Error = PhaseFailed, "the checkout printed no commit"
			} else if p.Name == PhaseCheckout {
				x.r.Commit = c
			} else {
				x.r.AgentCommit = c
			}
			if err := x.save(Event{From: x.r.State, To: x.r.State, Phase: p.Name, Reason: "checked out " + c}); err != nil {
				return err
			}
			p = x.r.Phases[i]
		}
		if blocking(p) {
			stop = fmt.Sprintf("skipped: phase %s %s", p.Name, p.State)
		}
	}
	return nil
}

// outcome derives the run's settled state and reason from its phases.
func (x *exe) outcome() (State, string) {
	var failed []string
	for _, p := range x.r.Phases {
		switch p.State {
		case PhaseInterrupted:
			return Errored, fmt.Sprintf("phase %s was interrupted: %s", p.Name, p.Error)
		case PhaseTimedOut:
			return TimedOut, fmt.Sprintf("phase %s timed out: %s", p.Name, p.Error)
		case PhaseCanceled:
			return Canceled, "canceled during phase " + p.Name
		case PhaseFailed:
			if p.Name == PhaseSandbox {
				return Errored, "the sandbox could not be created: " + p.Error
			}
			if p.Name == PhaseCollect || p.Name == PhaseCleanup {
				continue
			}
			// A phase whose command never started (no job) failed on agentbox's side.
			if p.ExitCode == nil && p.JobID == "" && p.Signal == "" && p.Name != PhaseCheckout && p.Name != PhaseAgentCheckout {
				return Errored, fmt.Sprintf("phase %s could not be run: %s", p.Name, p.Error)
			}
			failed = append(failed, p.Name+describeExit(p))
		}
	}
	if x.r.CancelRequested {
		return Canceled, "canceled"
	}
	if len(failed) > 0 {
		return Failed, "failed: " + strings.Join(failed, ", ")
	}
	return Succeeded, "every phase succeeded"
}

func describeExit(p Phase) string {
	switch {
	case p.ExitCode != nil:
		return fmt.Sprintf(" exited %d", *p.ExitCode)
	case p.Signal != "":
		return " killed by " + p.Signal
	case p.Error != "":
		return ": " + trunc(p.Error, 200)
	}
	return ""
}

func (x *exe) runPhase(i int) error {
	name := x.r.Phases[i].Name
	if err := x.setState(stateOf(name), "phase "+name); err != nil {
		return err
	}
	if x.r.Phases[i].State == PhaseRunning {
		return x.resumePhase(i)
	}
	if x.canceled() {
		x.endPhase(i, PhaseCanceled, nil, "the run was canceled")
		return x.save(Event{From: x.r.State, To: x.r.State, Phase: name, Reason: "phase " + name + " canceled"})
	}
	if x.s.now().After(x.deadline) {
		x.endPhase(i, PhaseTimedOut, nil, fmt.Sprintf("the run's timeout (%ds) passed", x.r.Spec.TimeoutSeconds))
		return x.save(Event{From: x.r.State, To: x.r.State, Phase: name, Reason: "phase " + name + " timed out"})
	}
	switch {
	case name == PhaseSandbox:
		return x.sandboxPhase(i)
	case name == PhaseFiles:
		return x.filesPhase(i)
	case name == PhaseCheckout:
		return x.checkoutPhase(i, x.r.Spec.RepoURL, x.r.Spec.Ref, x.r.Spec.RepoSecret, x.r.Spec.Dir)
	case name == PhaseAgentCheckout:
		a := x.r.Spec.Agent
		return x.checkoutPhase(i, a.RepoURL, a.Ref, a.RepoSecret, a.Dir)
	case name == PhaseAgentBuild:
		return x.jobPhase(i, x.r.Spec.Agent.BuildCommand, x.r.Spec.Agent.Dir, nil, PhaseAgentBuild)
	case name == PhaseSetup:
		return x.jobPhase(i, x.r.Spec.Setup, x.r.Spec.Dir, nil, PhaseSetup)
	case name == PhaseCommand:
		argv := x.r.Spec.Command
		if x.r.Spec.Stdin != "" {
			wctx, cancel := context.WithTimeout(x.ctx, opTimeout)
			_, err := x.s.sb.WriteFile(wctx, x.r.SandboxID, stdinFile+x.r.ID, 0o600, strings.NewReader(x.r.Spec.Stdin))
			cancel()
			if err != nil {
				return x.failPhase(i, "writing the command's stdin: "+err.Error())
			}
			argv = append([]string{"sh", "-c", stdinScript, stdinFile + x.r.ID}, argv...)
		}
		return x.jobPhase(i, argv, x.r.Spec.Dir, nil, PhaseCommand)
	case strings.HasPrefix(name, PhaseValidation):
		var n int
		fmt.Sscanf(name, PhaseValidation+"[%d]", &n)
		if n < 0 || n >= len(x.r.Spec.ValidationCommands) {
			return x.failPhase(i, "no such validation command")
		}
		return x.jobPhase(i, x.r.Spec.ValidationCommands[n], x.r.Spec.Dir, nil, PhaseValidation)
	}
	return x.failPhase(i, "unknown phase")
}

// startPhase records phase i running (argv shown) before it acts.
func (x *exe) startPhase(i int, argv []string) error {
	now := x.s.stamp()
	p := &x.r.Phases[i]
	p.State, p.Argv, p.StartedAt, p.Error = PhaseRunning, argv, &now, ""
	return x.save(Event{From: x.r.State, To: x.r.State, Phase: p.Name, Reason: "phase " + p.Name + " started"})
}

func (x *exe) endPhase(i int, st PhaseState, exit *int, msg string) {
	now := x.s.stamp()
	p := &x.r.Phases[i]
	p.State, p.ExitCode, p.FinishedAt = st, exit, &now
	if msg != "" {
		p.Error = trunc(msg, 2048)
	}
	if p.StartedAt == nil {
		p.StartedAt = &now
	}
	d := now.Sub(*p.StartedAt).Milliseconds()
	p.DurationMs = &d
}

// failPhase ends phase i failed with why (no exit code) and records it.
func (x *exe) failPhase(i int, why string) error {
	if x.ctx.Err() != nil {
		return errShutdown
	}
	x.endPhase(i, PhaseFailed, nil, why)
	p := x.r.Phases[i]
	return x.save(Event{From: x.r.State, To: x.r.State, Phase: p.Name, Reason: trunc("phase "+p.Name+" failed: "+why, 1024)})
}

func (x *exe) donePhase(i int) error {
	p := x.r.Phases[i]
	reason := fmt.Sprintf("phase %s %s", p.Name, p.State)
	if d := describeExit(p); d != "" && p.State != PhaseSucceeded {
		reason += ":" + d
	}
	return x.save(Event{From: x.r.State, To: x.r.State, Phase: p.Name, Reason: trunc(reason, 1024)})
}

// owned is ctx as the run's sandbox is made under: owned by the run, and the principal of
// whoever started it.
func (x *exe) owned(ctx context.Context) context.Context {
	return sandbox.WithPrincipal(sandbox.WithOwner(ctx, "run:"+x.r.ID), gate.PrincipalOf(x.r.Owner))
}

// sandboxPhase creates (or, after a restart, finds again by idempotency key) the sandbox.
func (x *exe) sandboxPhase(i int) error {
	if err := x.startPhase(i, nil); err != nil {
		return err
	}
	return x.createSandbox(i)
}

func (x *exe) createSandbox(i int) error {
	sp := x.r.Spec
	labels := map[string]string{"agentbox.run": x.r.ID}
	if x.r.BatchID != "" {
		labels["agentbox.batch"] = x.r.BatchID
	}
	remaining := time.Until(x.deadline)
	if remaining < time.Minute {
		remaining = time.Minute
	}
	ttl := min(remaining+ttlSlack, sandbox.DefaultMaxTTL) // the server's default bound of a TTL
	req := sandbox.CreateRequest{Image: sp.Image, Runtime: sp.Runtime, CPU: sp.CPU, MemoryMB: sp.MemoryMB,
		DiskMB: sp.DiskMB, TTLSeconds: int64(ttl / time.Second), Env: sp.Env, Labels: labels,
		Requirements: sp.Requirements, IdempotencyKey: x.r.ID, Secrets: x.createSecrets(), Network: x.createNetwork()}
	sb, err := x.create(req)
	if err != nil {
		if x.ctx.Err() != nil {
			return errShutdown
		}
		if errcode.Is(err, errcode.CapacityUnavailable) {
			return x.noCapacity(i, err)
		}
		return x.failPhase(i, err.Error())
	}
	x.s.forgetRetry(x.r.ID)
	x.r.SandboxID = sb.ID
	if err := x.save(Event{From: x.r.State, To: x.r.State, Phase: PhaseSandbox, Reason: "sandbox " + sb.ID + " created"}); err != nil {
		return err
	}
	// Dir exists before any phase runs in it.
	ectx, cancel := context.WithTimeout(x.ctx, opTimeout)
	mk := []string{"mkdir", "-p", "--", sp.Dir}
	if sp.Agent != nil {
		mk = append(mk, sp.Agent.Dir)
	}
	res, err := x.s.sb.Exec(ectx, sb.ID, sandbox.ExecRequest{Argv: mk, Timeout: time.Minute, MaxOutputBytes: 4096}, nil)
	cancel()
	if err != nil {
		return x.failPhase(i, "making dir: "+err.Error())
	}
	if res.ExitCode != 0 {
		return x.failPhase(i, fmt.Sprintf("making dir %s: mkdir exited %d: %s", sp.Dir, res.ExitCode, trunc(res.Stderr, 512)))
	}
	x.endPhase(i, PhaseSucceeded, nil, "")
	return x.donePhase(i)
}

// create makes the run's sandbox under the idempotency key of the run, so a create retried
// after a crash returns the same sandbox. A sandbox that key made and that failed (a server
// killed during its create) is destroyed and the create made again under a key naming it,
// which a later retry finds the same way.
func (x *exe) create(req sandbox.CreateRequest) (sandbox.Sandbox, error) {
	for attempt := 0; ; attempt++ {
		cctx, cancel := context.WithTimeout(x.owned(x.ctx), 10*time.Minute)
		sb, err := x.s.sb.Create(cctx, req)
		cancel()
		e, ok := errcode.As(err)
		if !ok || e.Details["reason"] != "key_used_by_failed_create" || attempt >= 3 {
			return sb, err
		}
		failed, _ := e.Details["sandbox_id"].(string)
		dctx, cancel := context.WithTimeout(x.owned(context.WithoutCancel(x.ctx)), opTimeout)
		if _, derr := x.s.sb.Destroy(dctx, failed); derr != nil && !errcode.Is(derr, errcode.SandboxNotFound) {
			x.s.log.Warn("runs: destroying a failed sandbox of the run", "run_id", x.r.ID, "sandbox_id", failed, "err", derr)
		}
		cancel()
		x.s.log.Info("runs: the run's sandbox create had failed; creating it again", "run_id", x.r.ID, "failed_sandbox_id", failed)
		req.IdempotencyKey = x.r.ID + "/" + failed
	}
}

// noCapacity puts the run back in the queue (backoff) until its timeout.
func (x *exe) noCapacity(i int, cause error) error {
	if x.s.now().After(x.r.CreatedAt.Add(time.Duration(x.r.Spec.TimeoutSeconds) * time.Second)) {
		x.endPhase(i, PhaseTimedOut, nil, "no capacity for a sandbox before the run's timeout: "+cause.Error())
		return x.donePhase(i)
	}
	delay := x.s.requeue(x.r.ID)
	x.r.Phases[i] = Phase{Name: PhaseSandbox, State: PhasePending}
	from := x.r.State
	x.r.State, x.r.StartedAt = Queued, nil
	x.r.Reason = fmt.Sprintf("no capacity for a sandbox; retrying in %s", delay)
	return x.save(Event{From: from, To: Queued, Phase: PhaseSandbox, Reason: trunc(x.r.Reason+": "+cause.Error(), 1024)})
}

// filesPhase writes Spec.Files into Dir (idempotent: redone after a restart).
func (x *exe) filesPhase(i int) error {
	if err := x.startPhase(i, nil); err != nil {
		return err
	}
	dirs := map[string]bool{}
	for p := range x.r.Spec.Files {
		if d := path.Dir(p); d != "." {
			dirs[x.r.Spec.Dir+"/"+d] = true
		}
	}
	if len(dirs) > 0 {
		ectx, cancel := context.WithTimeout(x.cctx, opTimeout)
		res, err := x.s.sb.Exec(ectx, x.r.SandboxID, sandbox.ExecRequest{Argv: append([]string{"mkdir", "-p", "--"}, sortedKeys(dirs)...), Timeout: time.Minute, MaxOutputBytes: 4096}, nil)
		cancel()
		if err == nil && res.ExitCode != 0 {
			err = fmt.Errorf("mkdir exited %d: %s", res.ExitCode, trunc(res.Stderr, 512))
		}
		if err != nil {
			if x.canceled() {
				x.endPhase(i, PhaseCanceled, nil, "the run was canceled")
				return x.donePhase(i)
			}
			return x.failPhase(i, "making the files' directories: "+err.Error())
		}
	}
	for _, p := range sortedKeys(x.r.Spec.Files) {
		wctx, cancel := context.WithTimeout(x.cctx, opTimeout)
		_, err := x.s.sb.WriteFile(wctx, x.r.SandboxID, x.r.Spec.Dir+"/"+p, 0o644, strings.NewReader(x.r.Spec.Files[p]))
		cancel()
		if err != nil {
			if x.canceled() {
				x.endPhase(i, PhaseCanceled, nil, "the run was canceled")
				return x.donePhase(i)
			}
			return x.failPhase(i, fmt.Sprintf("writing %s: %v", p, err))
		}
	}
	x.endPhase(i, PhaseSucceeded, nil, "")
	return x.donePhase(i)
}

// phaseTimeout is the deadline of a phase of kind (its PhaseTimeouts entry, or the run's).
func (x *exe) phaseDeadline(kind string) time.Time {
	d := x.deadline
	if t, ok := x.r.Spec.PhaseTimeouts[kind]; ok {
		if p := x.s.now().Add(time.Duration(t) * time.Second); p.Before(d) {
			d = p
		}
	}
	return d
}

// jobPhase runs argv as a sandbox job in dir: record running → StartJob → record the job id →
// wait → copy its output → record the end.
func (x *exe) jobPhase(i int, argv []string, dir string, env map[string]string, kind string) error {
	return x.jobPhaseShown(i, argv, argv, dir, env, kind)
}

func (x *exe) jobPhaseShown(i int, argv, shown []string, dir string, env map[string]string, kind string) error {
	if err := x.startPhase(i, shown); err != nil {
		return err
	}
	return x.jobPhaseStarted(i, argv, shown, dir, env, kind)
}

// jobPhaseStarted starts the job of a phase already recorded running.
func (x *exe) jobPhaseStarted(i int, argv, shown []string, dir string, env map[string]string, kind string) error {
	x.r.Phases[i].Argv = shown
	deadline := x.phaseDeadline(kind)
	sctx, cancel := context.WithTimeout(x.ctx, opTimeout)
	j, err := x.s.sb.StartJob(sctx, x.r.SandboxID, sandbox.JobStartRequest{Argv: argv, Env: env, Cwd: dir})
	cancel()
	if err != nil {
		if x.ctx.Err() != nil {
			return errShutdown
		}
		if errcode.Is(err, errcode.SandboxNotRunning) || errcode.Is(err, errcode.SandboxNotFound) {
			x.endPhase(i, PhaseInterrupted, nil, "sandbox "+x.r.SandboxID+" was lost: "+err.Error())
			return x.donePhase(i)
		}
		return x.failPhase(i, "starting its job: "+err.Error())
	}
	x.r.Phases[i].JobID = j.ID
	if err := x.save(Event{From: x.r.State, To: x.r.State, Phase: x.r.Phases[i].Name, Reason: "phase " + x.r.Phases[i].Name + " runs as job " + j.ID}); err != nil {
		return err
	}
	return x.waitPhase(i, j.ID, deadline)
}

// resumePhase continues a phase that was running when the server stopped.
func (x *exe) resumePhase(i int) error {
	p := x.r.Phases[i]
	switch {
	case p.Name == PhaseSandbox:
		return x.createSandbox(i) // idempotent by the run's id
	case p.Name == PhaseFiles:
		return x.filesPhase(i)
	case p.JobID == "":
		x.endPhase(i, PhaseInterrupted, nil, "the server stopped after the phase started and before its job was recorded; it is not re-run (it may have run)")
		return x.donePhase(i)
	}
	kind := p.Name
	if strings.HasPrefix(kind, PhaseValidation) {
		kind = PhaseValidation
	}
	if kind == PhaseAgentCheckout {
		kind = PhaseCheckout
	}
	deadline := x.deadline
	if t, ok := x.r.Spec.PhaseTimeouts[kind]; ok && p.StartedAt != nil {
		if d := p.StartedAt.Add(time.Duration(t) * time.Second); d.Before(deadline) {
			deadline = d
		}
	}
	x.s.log.Info("run: waiting again for a phase's job", "run_id", x.r.ID, "phase", p.Name, "job_id", p.JobID)
	return x.waitPhase(i, p.JobID, deadline)
}

// waitPhase waits for phase i's job in slices, cancels it on a cancel request or its
// deadline, then copies its output and records its end.
func (x *exe) waitPhase(i int, jobID string, deadline time.Time) error {
	sbID := x.r.SandboxID
	var j sandbox.Job
	endAs := PhaseState("")
	endMsg := ""
	for {
		left := time.Until(deadline)
		if left <= 0 {
			endAs, endMsg = PhaseTimedOut, "its timeout passed"
			break
		}
		wctx, cancel := context.WithCancel(x.cctx)
		var err error
		j, err = x.s.sb.WaitJob(wctx, sbID, jobID, min(left, waitSlice))
		cancel()
		if x.ctx.Err() != nil {
			return errShutdown
		}
		if x.canceled() {
			endAs, endMsg = PhaseCanceled, "the run was canceled"
			break
		}
		if err != nil {
			if errcode.Is(err, errcode.SandboxNotFound) || errcode.Is(err, errcode.JobNotFound) {
				x.endPhase(i, PhaseInterrupted, nil, "sandbox "+sbID+" was lost: "+err.Error())
				return x.donePhase(i)
			}
			x.s.log.Warn("run: waiting for a job", "run_id", x.r.ID, "job_id", jobID, "err", err)
			select {
			case <-time.After(time.Second):
			case <-x.cctx.Done():
			}
			continue
		}
		if !j.State.Active() {
			break
		}
	}
	if endAs != "" {
		grace := cancelGrace
		cctx, cancel := context.WithTimeout(x.ctx, time.Minute)
		cj, err := x.s.sb.CancelJob(cctx, sbID, jobID, &grace)
		if err == nil && !cj.State.Active() {
			j = cj
		} else if wj, werr := x.s.sb.WaitJob(cctx, sbID, jobID, grace+5*time.Second); werr == nil {
			j = wj
		}
		cancel()
		if x.ctx.Err() != nil {
			return errShutdown
		}
	}
	x.copyLogs(i, sbID, jobID)
	p := &x.r.Phases[i]
	p.Signal = j.Signal
	switch {
	case endAs != "":
		x.endPhase(i, endAs, nil, endMsg)
	case j.State == sandbox.JobExited && j.ExitCode != nil:
		st := PhaseSucceeded
		if *j.ExitCode != 0 {
			st = PhaseFailed
		}
		code := *j.ExitCode
		x.endPhase(i, st, &code, "")
	case j.State == sandbox.JobKilled:
		msg := "killed by " + j.Signal
		if j.OOMKilled {
			msg += " (out of memory)"
		}
		x.endPhase(i, PhaseFailed, nil, msg)
	case j.State == sandbox.JobUnknown:
		x.endPhase(i, PhaseInterrupted, nil, "the job's outcome is unknown (sandbox "+sbID+" was lost or restarted): "+j.Error)
	case j.State == sandbox.JobCanceled:
		x.endPhase(i, PhaseInterrupted, nil, "the job was canceled by the sandbox's end: "+j.Error)
	default:
		x.endPhase(i, PhaseFailed, nil, fmt.Sprintf("job %s: %s", j.State, j.Error))
	}
	return x.donePhase(i)
}

// copyLogs copies a job's stdout and stderr into the blob store (up to MaxLogBytes each) and
// keeps the last PhaseOutputBytes of each in the record.
func (x *exe) copyLogs(i int, sbID, jobID string) {
	p := &x.r.Phases[i]
	for _, stream := range []string{"stdout", "stderr"} {
		total, tail, truncated, err := x.copyStream(p.Name, stream, sbID, jobID)
		if err != nil {
			x.s.log.Warn("run: copying a phase's output", "run_id", x.r.ID, "phase", p.Name, "stream", stream, "err", err)
			p.Error = trunc(strings.TrimSpace(p.Error+"; output not kept: "+err.Error()), 2048)
		}
		text := strings.ToValidUTF8(string(tail), "\uFFFD")
		if stream == "stdout" {
			p.Stdout, p.StdoutBytes = text, total
		} else {
			p.Stderr, p.StderrBytes = text, total
		}
		p.Truncated = p.Truncated || truncated
	}
}

func (x *exe) copyStream(phase, stream, sbID, jobID string) (total int64, tail []byte, truncated bool, err error) {
	w, err := x.s.blobs.create(x.s.blobs.logPath(x.r.ID, phase, stream))
	if err != nil {
		return 0, nil, false, err
	}
	var off int64
	for off < MaxLogBytes {
		max := min(int64(sandbox.MaxJobLogBytes), MaxLogBytes-off)
		o := off
		ctx, cancel := context.WithTimeout(x.ctx, time.Minute)
		lg, lerr := x.s.sb.JobLogs(ctx, sbID, jobID, sandbox.JobLogsRequest{Stream: stream, Offset: &o, MaxBytes: &max})
		cancel()
		if lerr != nil {
			w.abort()
			return total, tail, truncated, lerr
		}
		total = lg.TotalBytes
		w.Write(lg.Data)
		tail = append(tail, lg.Data...)
		if len(tail) > PhaseOutputBytes {
			tail = tail[len(tail)-PhaseOutputBytes:]
		}
		off = lg.NextOffset
		if len(lg.Data) == 0 || off >= lg.TotalBytes {
			break
		}
	}
	truncated = total > MaxLogBytes
	// Keep the tail on a rune boundary.
	for len(tail) > 0 && !utf8.RuneStart(tail[0]) && len(tail) == PhaseOutputBytes {
		tail = tail[1:]
	}
	return total, tail, truncated, w.commit()
}

// settle writes the run's final state.
func (x *exe) settle() error {
	st, reason := x.outcome()
	now := x.s.stamp()
	from := x.r.State
	x.r.State, x.r.Reason, x.r.FinishedAt = st, reason, &now
	x.r.Success = st == Succeeded
	if x.r.StartedAt != nil {
		d := now.Sub(*x.r.StartedAt).Milliseconds()
		x.r.DurationMs = &d
	}
	if err := x.save(Event{From: from, To: st, Reason: trunc(reason, 1024)}); err != nil {
		return err
	}
	x.s.log.Info("run settled", "run_id", x.r.ID, "state", st, "reason", reason)
	x.s.runSettled(context.WithoutCancel(x.ctx), x.r)
	return nil
}
