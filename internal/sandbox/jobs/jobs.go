// Package jobs runs detached jobs in sandboxes (job_start, job_list, job_status, job_wait,
// job_cancel, job_logs and /v1/sandboxes/{id}/jobs): a feature over the sandbox lifecycle core,
// which it reaches through its sandbox.Core handle and whose hooks settle its records.
//
// The sandbox's agent owns a job (it runs on when callers, or this server, go); the control
// plane keeps a record of each in the store, written before it acts: "starting" before the
// agent is asked, then "running", or "failed" with the reason. While the sandbox runs the
// agent's status is the truth and the record follows it; a background watch per running job
// settles the record (state, exit, times, the last TailBytes of output) when the job ends, and
// the Adopted and Woken hooks re-arm the watches of adopted and woken sandboxes. When a sandbox
// ends its running jobs' records become canceled (destroy, TTL) or unknown (lost, or slept
// without memory), so job_list and job_status answer after the sandbox is gone, until the
// records are pruned.
package jobs

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/guest"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/sandboxid"
	"github.com/agentbox/agentbox/internal/text"
)

// Store is what jobs keep of durable state (sandbox.Store includes it).
type Store interface {
	sandbox.JobStore
	GetSandbox(ctx context.Context, id string) (sandbox.Sandbox, error)
	ListEvents(ctx context.Context, filter sandbox.EventFilter) ([]sandbox.Event, error)
}

// Service runs sandbox jobs. It is safe for concurrent use. Create exactly one per core: it
// registers the hooks that settle and watch the jobs.
type Service struct {
	core  *sandbox.Core
	store Store
	log   *slog.Logger

	mu      sync.Mutex
	watched map[string]bool // job ids that have a watch running, so that each has at most one
	// hostOOM holds, by job id, whether the host's OOM killer has acted in the job's sandbox
	// since the job started (sandbox.Core.HostOOMKills), for runtimes whose agent cannot see it:
	// a job they report killed by SIGKILL is then oom_killed, as an exec is. Kept in memory: a
	// job that outlives a server restart ends without this attribution.
	hostOOM map[string]func() bool
}

// New returns core's jobs feature (built, with its records in st, on the first call; the same
// one after) and so registers its hooks once:
// re-arm the watches of an adopted or woken sandbox, settle the jobs of a sandbox that ends or
// sleeps without memory, prune finished records past Config.JobRetention.
func New(core *sandbox.Core, st Store) *Service {
	return core.Feature(featureKey{}, func() any { return newService(core, st) }).(*Service)
}

// featureKey keeps the core's one jobs feature (sandbox.Core.Feature).
type featureKey struct{}

func newService(core *sandbox.Core, st Store) *Service {
	s := &Service{core: core, store: st, log: core.Log()}
	core.Register(sandbox.Hooks{Name: "jobs",
		Adopted: func(ctx context.Context, sb sandbox.Sandbox, _ runtime.Runtime) { s.reattach(ctx, sb.ID) },
		Woken:   func(ctx context.Context, sb sandbox.Sandbox) { s.reattach(ctx, sb.ID) },
		Ending:  s.ending,
		Slept:   s.slept,
		Prune:   s.prune,
	})
	return s
}

// prune deletes finished job records older than the retention.
func (s *Service) prune(ctx context.Context, now time.Time) {
	if n, err := s.store.PruneJobs(ctx, now.Add(-s.core.Config().JobRetention)); err != nil && ctx.Err() == nil {
		s.log.Warn("prune jobs", "err", err)
	} else if n > 0 {
		s.log.Info("pruned finished job records", "count", n)
	}
}

// slept settles sb's active jobs as it falls asleep: with memory saved their processes
// continue at wake, so their records stay running (their watches end while it sleeps and are
// re-armed at wake); without, they ended, and are settled unknown.
func (s *Service) slept(ctx context.Context, sb sandbox.Sandbox, memory bool) {
	if memory {
		return
	}
	jobs, _, err := s.store.ListJobs(ctx, sb.ID, []sandbox.JobState{sandbox.JobStarting, sandbox.JobRunning}, sandbox.MaxList)
	if err != nil {
		s.log.Warn("list a sleeping sandbox's jobs to settle them", "sandbox_id", sb.ID, "err", err)
		return
	}
	now := s.core.Now()
	for _, j := range jobs {
		j.FinishedAt = &now
		j.State = sandbox.JobUnknown
		j.Error = "the sandbox slept without memory (runtime " + sb.Runtime + " saves files only), so its processes ended; the job's exit was not recorded"
		if _, err := s.saveJob(ctx, j, endReason(j)); err != nil {
			s.log.Warn("settle job of a sleeping sandbox", "sandbox_id", sb.ID, "job_id", j.ID, "err", err)
		}
	}
}

// startOnAgent asks running sandbox id's agent to start a job; a dead agent is recorded lost.
func (s *Service) startOnAgent(ctx context.Context, id string, req guest.JobStartRequest) (guest.JobInfo, error) {
	sb, gc, err := s.core.Running(ctx, id, true)
	if err != nil {
		return guest.JobInfo{}, err
	}
	info, err := gc.StartJob(ctx, req)
	if err != nil {
		return info, s.core.GuestFailed(ctx, sb, err)
	}
	return info, nil
}

func (s *Service) maxJobs() int {
	if n := s.core.Config().MaxJobsPerSandbox; n > 0 {
		return n
	}
	return sandbox.DefaultMaxJobs
}

func checkJobID(id string) error {
	if !sandbox.ValidJobID(id) {
		return errcode.New(errcode.InvalidArgument, "job_id %q is malformed: job ids look like job-0123456789ab (from job_start or job_list)", text.Truncate(id, 64))
	}
	return nil
}

// validateCommand checks a command as Exec does.
func validateCommand(argv []string, env map[string]string, cwd, user string) error {
	if len(argv) == 0 || argv[0] == "" {
		return errcode.New(errcode.InvalidArgument, "command must be a non-empty argv array, e.g. [\"make\", \"build\"]; it is never run through a shell (use [\"sh\", \"-c\", \"...\"] for shell syntax)")
	}
	for i, a := range argv {
		if strings.ContainsRune(a, 0) {
			return errcode.New(errcode.InvalidArgument, "command[%d] contains a NUL byte", i)
		}
	}
	if len(env) > sandbox.MaxEnv {
		return errcode.New(errcode.InvalidArgument, "env has %d entries; at most %d are allowed", len(env), sandbox.MaxEnv)
	}
	if err := sandbox.ValidateEnv("env", env); err != nil {
		return err
	}
	if strings.ContainsRune(cwd, 0) || strings.ContainsRune(user, 0) {
		return errcode.New(errcode.InvalidArgument, "cwd and user must not contain a NUL byte")
	}
	return nil
}

// StartJob starts a detached job in a running sandbox and returns its record, state running.
// The record is written first (starting); a job the agent refuses is recorded failed.
func (s *Service) StartJob(ctx context.Context, sandboxID string, req sandbox.JobStartRequest) (sandbox.Job, error) {
	js := s.store
	if err := validateCommand(req.Argv, req.Env, req.Cwd, req.User); err != nil {
		return sandbox.Job{}, err
	}
	sb, _, err := s.core.Running(ctx, sandboxID, true)
	if err != nil {
		return sandbox.Job{}, err
	}
	now := s.core.Now()
	names := make([]string, 0, len(req.Env))
	for k := range req.Env {
		names = append(names, k)
	}
	slices.Sort(names)
	j := sandbox.Job{ID: sandbox.NewJobID(), SandboxID: sandboxID, Argv: req.Argv, EnvNames: names, Cwd: req.Cwd, User: req.User,
		State: sandbox.JobStarting, StartedAt: now, UpdatedAt: now, Version: 1}
	// From here on the caller may hang up: the record is driven to running or failed.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := js.CreateJob(wctx, j, s.maxJobs()); err != nil {
		if errcode.Is(err, errcode.JobLimitExceeded) {
			return sandbox.Job{}, errcode.New(errcode.JobLimitExceeded, "sandbox %s already runs %d jobs, the most it may; wait for one to end (job_wait) or cancel one (job_cancel)", sandboxID, s.maxJobs()).
				With("limit", s.maxJobs())
		}
		return sandbox.Job{}, fmt.Errorf("record job: %w", err)
	}
	if f := s.core.HostOOMKills(wctx, sb); f != nil {
		s.mu.Lock()
		if s.hostOOM == nil {
			s.hostOOM = map[string]func() bool{}
		}
		s.hostOOM[j.ID] = f
		s.mu.Unlock()
	}
	info, err := s.startOnAgent(wctx, sandboxID, guest.JobStartRequest{JobID: j.ID, Argv: req.Argv, Env: s.core.Env(sb, req.Env), Cwd: req.Cwd, User: req.User})
	if err != nil {
		s.forgetHostOOM(j.ID)
		j2 := j
		j2.State, j2.Error = sandbox.JobFailed, "start failed: "+errcode.Message(err)
		if _, uerr := s.saveJob(wctx, j2, "job "+j.ID+" failed to start"); uerr != nil {
			s.log.Warn("record failed job", "sandbox_id", sandboxID, "job_id", j.ID, "err", uerr)
		}
		return sandbox.Job{}, err
	}
	j.State = sandbox.JobRunning
	applyInfo(&j, info)
	out, err := s.saveJob(wctx, j, "job "+j.ID+" started")
	if err != nil {
		// The job runs; the watch settles the record.
		s.log.Warn("record running job", "sandbox_id", sandboxID, "job_id", j.ID, "err", err)
		out = j
	}
	s.watchJob(sandboxID, j.ID)
	return present(out), nil
}

// applyInfo copies what the agent reports of a job onto its record.
func applyInfo(j *sandbox.Job, info guest.JobInfo) {
	switch info.State {
	case "running":
		j.State = sandbox.JobRunning
	case "exited":
		j.State = sandbox.JobExited
	case "killed":
		j.State = sandbox.JobKilled
	case "canceled":
		j.State = sandbox.JobCanceled
	}
	if !info.StartedAt.IsZero() {
		j.StartedAt = info.StartedAt.UTC().Truncate(time.Millisecond)
	}
	j.ExitCode, j.Signal, j.OOMKilled = info.ExitCode, info.Signal, info.OOMKilled
	if info.CPUSeconds > j.CPUSeconds {
		j.CPUSeconds = info.CPUSeconds
	}
	if info.FinishedAt != nil {
		t := info.FinishedAt.UTC().Truncate(time.Millisecond)
		j.FinishedAt = &t
	}
	j.LogBytes, j.LogTruncated = info.LogBytes, info.LogTruncated
}

// saveJob writes j as the next version of its record, with a "job" event when reason is set.
// A concurrent update (CONFLICT) is retried on the fresh record unless that one has ended.
func (s *Service) saveJob(ctx context.Context, j sandbox.Job, reason string) (sandbox.Job, error) {
	js := s.store
	var err error
	for range 3 {
		j.Version++
		j.UpdatedAt = s.core.Now()
		var ev sandbox.Event
		if reason != "" {
			ev = sandbox.Event{SandboxID: j.SandboxID, Type: "job", Reason: text.Truncate(reason, 1024), At: j.UpdatedAt}
		}
		err = js.UpdateJob(ctx, j, ev)
		if err == nil {
			if reason != "" {
				s.core.Published()
			}
			return j, nil
		}
		if !errcode.Is(err, errcode.Conflict) {
			return j, err
		}
		cur, gerr := js.GetJob(ctx, j.SandboxID, j.ID)
		if gerr != nil {
			return j, gerr
		}
		if !cur.State.Active() {
			return cur, nil // someone settled it first: theirs stands
		}
		j.Version = cur.Version
	}
	return j, err
}

// forgetHostOOM returns, and forgets, job id's host OOM check (nil: none).
func (s *Service) forgetHostOOM(id string) func() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	f := s.hostOOM[id]
	delete(s.hostOOM, id)
	return f
}

// endReason is the event reason of a job that ended: "job-… exited 0" etc.
func endReason(j sandbox.Job) string {
	switch j.State {
	case sandbox.JobExited:
		code := -1
		if j.ExitCode != nil {
			code = *j.ExitCode
		}
		return fmt.Sprintf("job %s exited %d", j.ID, code)
	case sandbox.JobKilled:
		if j.OOMKilled {
			return fmt.Sprintf("job %s killed by %s (out of memory)", j.ID, j.Signal)
		}
		return fmt.Sprintf("job %s killed by %s", j.ID, j.Signal)
	}
	return fmt.Sprintf("job %s %s", j.ID, j.State)
}

// present fills the reply-only fields of a job.
func present(j sandbox.Job) sandbox.Job {
	j.Success = j.State == sandbox.JobExited && j.ExitCode != nil && *j.ExitCode == 0
	switch j.State {
	case sandbox.JobStarting:
		j.Message = "the job is being started"
	case sandbox.JobRunning:
		j.Message = "the job is running; job_wait waits for its end, job_logs reads its output"
	case sandbox.JobExited:
		if j.Success {
			j.Message = "the job exited with code 0"
		} else {
			j.Message = fmt.Sprintf("the job exited with code %d: it failed", *orZero(j.ExitCode))
		}
	case sandbox.JobKilled:
		j.Message = "the job was killed by " + j.Signal + ": it did not finish"
		if j.OOMKilled {
			j.Message = "the job was killed by " + j.Signal + " because the sandbox ran out of memory (memory_mb): it did not finish"
		}
	case sandbox.JobCanceled:
		j.Message = "the job was canceled before it finished"
		if j.Error != "" {
			j.Message = "the job was canceled before it finished: " + j.Error
		}
	case sandbox.JobFailed:
		j.Message = "the job never started: " + j.Error
	case sandbox.JobUnknown:
		j.Message = "the job's outcome is unknown (" + j.Error + "); do NOT treat it as a success: run it again to know"
	}
	if j.LogTruncated {
		j.Message += "; its log was truncated (the sandbox's disk filled), the job was not stopped by it"
	}
	return j
}

func orZero(p *int) *int {
	if p == nil {
		z := -1
		return &z
	}
	return p
}

// job returns a job's record after checking the ids.
func (s *Service) job(ctx context.Context, sandboxID, jobID string) (sandbox.Job, error) {
	if err := sandboxid.Check(sandboxID); err != nil {
		return sandbox.Job{}, err
	}
	if err := checkJobID(jobID); err != nil {
		return sandbox.Job{}, err
	}
	js := s.store
	return js.GetJob(ctx, sandboxID, jobID)
}

// ListJobs returns a sandbox's jobs, newest first: at most limit (1..1000, default 20), and how
// many older ones were omitted. It answers from the records, after the sandbox is gone too.
func (s *Service) ListJobs(ctx context.Context, sandboxID string, limit int) (sandbox.JobList, error) {
	if err := sandboxid.Check(sandboxID); err != nil {
		return sandbox.JobList{}, err
	}
	if limit < 0 || limit > sandbox.MaxList {
		return sandbox.JobList{}, errcode.New(errcode.InvalidArgument, "limit must be between 1 and %d; got %d", sandbox.MaxList, limit)
	}
	if limit == 0 {
		limit = sandbox.DefaultJobList
	}
	js := s.store
	if _, err := s.store.GetSandbox(ctx, sandboxID); err != nil {
		return sandbox.JobList{}, err
	}
	jobs, omitted, err := js.ListJobs(ctx, sandboxID, nil, limit)
	if err != nil {
		return sandbox.JobList{}, err
	}
	out := sandbox.JobList{Jobs: make([]sandbox.Job, 0, len(jobs)), Omitted: omitted}
	for _, j := range jobs {
		if j.State.Active() {
			if fresh, err := s.refreshJob(ctx, j); err == nil {
				j = fresh
			}
		}
		out.Jobs = append(out.Jobs, present(j))
	}
	return out, nil
}

// JobStatus returns a job's status: the agent's while the sandbox runs (the record follows it),
// the record's after.
func (s *Service) JobStatus(ctx context.Context, sandboxID, jobID string) (sandbox.Job, error) {
	j, err := s.job(ctx, sandboxID, jobID)
	if err != nil {
		return sandbox.Job{}, err
	}
	if j.State.Active() {
		if j, err = s.refreshJob(ctx, j); err != nil {
			return sandbox.Job{}, err
		}
	}
	return present(j), nil
}

// refreshJob asks the agent about an active job and brings its record up to date. A sandbox
// that is no longer running settles the record (canceled or unknown).
func (s *Service) refreshJob(ctx context.Context, j sandbox.Job) (sandbox.Job, error) {
	sb, gc, err := s.core.Running(ctx, j.SandboxID, true)
	if err != nil {
		if errcode.Is(err, errcode.SandboxNotRunning) {
			return s.settleGone(ctx, j, sb)
		}
		return j, err
	}
	info, err := gc.Job(ctx, j.ID)
	if errcode.Is(err, errcode.JobNotFound) {
		if j.State == sandbox.JobStarting && s.core.Now().Sub(j.UpdatedAt) < 30*time.Second {
			return j, nil // its start is still in flight
		}
		j.State, j.Error = sandbox.JobUnknown, "the sandbox's agent has no record of it (it was restarted, or the server stopped while starting the job)"
		now := s.core.Now()
		j.FinishedAt = &now
		return s.saveJob(ctx, j, endReason(j)+": no exit record")
	}
	if err != nil {
		return j, s.core.GuestFailed(ctx, sb, err)
	}
	return s.follow(ctx, gc, j, info)
}

// follow updates j's record from the agent's info: an ended job's record is settled with the
// last sandbox.TailBytes of its output; a job found running is marked running.
func (s *Service) follow(ctx context.Context, gc *guest.Client, j sandbox.Job, info guest.JobInfo) (sandbox.Job, error) {
	if info.State == "running" {
		if j.State == sandbox.JobRunning && j.LogBytes == info.LogBytes && j.LogTruncated == info.LogTruncated {
			// Only its CPU time moved: the reply has it, the record is not rewritten for it.
			j.CPUSeconds = max(j.CPUSeconds, info.CPUSeconds)
			return j, nil
		}
		was := j.State
		applyInfo(&j, info)
		reason := ""
		if was == sandbox.JobStarting {
			reason = "job " + j.ID + " started"
		}
		return s.saveJob(ctx, j, reason)
	}
	applyInfo(&j, info)
	if j.State.Active() { // a state this build does not know: keep it running, say so
		s.log.Warn("agent reported an unknown job state", "sandbox_id", j.SandboxID, "job_id", j.ID, "state", text.Truncate(info.State, 32))
		return j, nil
	}
	if hostOOM := s.forgetHostOOM(j.ID); hostOOM != nil && j.State == sandbox.JobKilled && j.Signal == "SIGKILL" && !j.OOMKilled {
		j.OOMKilled = hostOOM()
	}
	j.Tail = s.tailOf(ctx, gc, j)
	return s.saveJob(ctx, j, endReason(j))
}

// tailOf reads the last sandbox.TailBytes of a job's output from its agent (best effort).
func (s *Service) tailOf(ctx context.Context, gc *guest.Client, j sandbox.Job) []byte {
	if j.LogBytes <= 0 {
		return nil
	}
	tctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	off := max(0, j.LogBytes-sandbox.TailBytes)
	lg, err := gc.JobLogs(tctx, j.ID, guest.JobLogsRequest{Stream: "all", Offset: off, Max: sandbox.TailBytes})
	if err != nil {
		s.log.Warn("read the end of a job's output", "sandbox_id", j.SandboxID, "job_id", j.ID, "err", err)
		return nil
	}
	if len(lg.Data) > sandbox.TailBytes {
		return lg.Data[len(lg.Data)-sandbox.TailBytes:]
	}
	return lg.Data
}

// settleGone settles an active job whose sandbox is no longer running: canceled when the
// server stopped the sandbox (destroy, TTL), unknown when it was lost.
func (s *Service) settleGone(ctx context.Context, j sandbox.Job, sb sandbox.Sandbox) (sandbox.Job, error) {
	if sb.ID == "" {
		var err error
		if sb, err = s.store.GetSandbox(ctx, j.SandboxID); err != nil {
			return j, err
		}
	}
	now := s.core.Now()
	j.FinishedAt = &now
	switch sb.State {
	case sandbox.StateLost, sandbox.StateFailed:
		j.State, j.Error = sandbox.JobUnknown, "the sandbox was lost ("+sb.Error+"); its agent's exit record is gone with it"
	case sandbox.StateCreating, sandbox.StateRunning, sandbox.StateStopping, sandbox.StateSleeping:
		// Stopping: ending, called as the sandbox left running, settles it. Sleeping:
		// jobsSlept settled it unless memory was saved; then it continues at wake.
		return j, nil
	default:
		reason := "destroyed"
		if evs, err := s.store.ListEvents(ctx, sandbox.EventFilter{SandboxID: sb.ID, Limit: sandbox.MaxList}); err == nil {
			for i := len(evs) - 1; i >= 0; i-- {
				if evs[i].Type == "state" && evs[i].To == sandbox.StateStopping {
					reason = evs[i].Reason
					break
				}
			}
		}
		j.State, j.Error = sandbox.JobCanceled, "its sandbox was stopped: "+reason
	}
	return s.saveJob(ctx, j, endReason(j))
}

// ending settles the records of sb's active jobs when sb leaves running for state to:
// canceled when the server stops it (reason: destroy requested, ttl expired), unknown when it
// is lost. Before a stop it saves what the agent still has of each job's end.
func (s *Service) ending(ctx context.Context, sb sandbox.Sandbox, to sandbox.State, reason string) {
	js := s.store
	jobs, _, err := js.ListJobs(ctx, sb.ID, []sandbox.JobState{sandbox.JobStarting, sandbox.JobRunning}, sandbox.MaxList)
	if err != nil {
		s.log.Warn("list a sandbox's jobs to settle them", "sandbox_id", sb.ID, "err", err)
		return
	}
	if len(jobs) == 0 {
		return
	}
	var gc *guest.Client
	if to == sandbox.StateStopping {
		gc = s.core.Guest(sb.ID)
	}
	now := s.core.Now()
	// What the agent still has of the jobs' ends is read within one bound for them all.
	actx, acancel := context.WithTimeout(ctx, 5*time.Second)
	defer acancel()
	for _, j := range jobs {
		j.FinishedAt = &now
		if to == sandbox.StateLost {
			j.State, j.Error = sandbox.JobUnknown, "the sandbox was lost ("+reason+"); its agent's exit record is gone with it"
		} else {
			if gc != nil && actx.Err() == nil {
				if info, err := gc.Job(actx, j.ID); err == nil {
					if info.State != "running" {
						if _, err := s.follow(ctx, gc, j, info); err != nil {
							s.log.Warn("settle job", "job_id", j.ID, "err", err)
						}
						continue
					}
					j.LogBytes, j.LogTruncated = info.LogBytes, info.LogTruncated
					j.Tail = s.tailOf(actx, gc, j)
				}
			}
			j.State, j.Error = sandbox.JobCanceled, "its sandbox was stopped: "+reason
		}
		if _, err := s.saveJob(ctx, j, endReason(j)); err != nil {
			s.log.Warn("settle job of an ended sandbox", "sandbox_id", sb.ID, "job_id", j.ID, "err", err)
		}
	}
}

// activeJob returns a job and its sandbox's agent to ask about it or, when there is no one to
// ask (the job has ended, or its sandbox is gone and the record was settled), the job as it
// stands with done set.
func (s *Service) activeJob(ctx context.Context, sandboxID, jobID string) (j sandbox.Job, sb sandbox.Sandbox, gc *guest.Client, done bool, err error) {
	if j, err = s.job(ctx, sandboxID, jobID); err != nil {
		return sandbox.Job{}, sb, nil, true, err
	}
	if !j.State.Active() {
		return present(j), sb, nil, true, nil
	}
	if sb, gc, err = s.core.Running(ctx, sandboxID, true); err != nil {
		if errcode.Is(err, errcode.SandboxNotRunning) {
			j, err = s.settleGone(ctx, j, sb)
			return present(j), sb, nil, true, err
		}
		return sandbox.Job{}, sb, nil, true, err
	}
	return j, sb, gc, false, nil
}

// WaitJob waits up to timeout (0..1 h) for a job to end and returns its status; a wait that
// times out is not an error: it returns the job running.
func (s *Service) WaitJob(ctx context.Context, sandboxID, jobID string, timeout time.Duration) (sandbox.Job, error) {
	if timeout < 0 || timeout > sandbox.MaxJobWait {
		return sandbox.Job{}, errcode.New(errcode.InvalidArgument, "timeout_seconds must be between 0 and %d; got %g", int(sandbox.MaxJobWait/time.Second), timeout.Seconds())
	}
	j, sb, gc, done, err := s.activeJob(ctx, sandboxID, jobID)
	if done || err != nil {
		return j, err
	}
	wctx, cancel := context.WithTimeout(ctx, timeout+30*time.Second)
	defer cancel()
	info, err := gc.WaitJob(wctx, jobID, timeout)
	if err != nil {
		if errcode.Is(err, errcode.JobNotFound) {
			j, err = s.refreshJob(ctx, j)
			return present(j), err
		}
		if ctx.Err() != nil {
			return sandbox.Job{}, ctx.Err()
		}
		return sandbox.Job{}, s.core.GuestFailed(ctx, sb, err)
	}
	j, err = s.follow(ctx, gc, j, info)
	return present(j), err
}

// CancelJob stops a job: SIGTERM to its whole process tree, SIGKILL after grace (0..10 min,
// default 10 s), and returns it canceled. A job that already ended is returned as it ended.
func (s *Service) CancelJob(ctx context.Context, sandboxID, jobID string, grace *time.Duration) (sandbox.Job, error) {
	g := sandbox.DefaultCancelGrace
	if grace != nil {
		g = *grace
	}
	if g < 0 || g > sandbox.MaxCancelGrace {
		return sandbox.Job{}, errcode.New(errcode.InvalidArgument, "grace_seconds must be between 0 and %d; got %g", int(sandbox.MaxCancelGrace/time.Second), g.Seconds())
	}
	j, sb, gc, done, err := s.activeJob(ctx, sandboxID, jobID)
	if done || err != nil {
		return j, err
	}
	// The cancel finishes even if the caller goes.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), g+30*time.Second)
	defer cancel()
	info, err := gc.CancelJob(cctx, jobID, g)
	if err != nil {
		if errcode.Is(err, errcode.JobNotFound) {
			j, err = s.refreshJob(cctx, j)
			return present(j), err
		}
		return sandbox.Job{}, s.core.GuestFailed(cctx, sb, err)
	}
	j, err = s.follow(cctx, gc, j, info)
	return present(j), err
}

// sandbox.JobLogs returns a bounded slice of a job's output: the last sandbox.DefaultTailLines lines when
// neither Offset nor TailLines is given. From a running sandbox it reads the agent's log (the
// whole output); after the sandbox is gone, the last sandbox.TailBytes kept in the record.
func (s *Service) JobLogs(ctx context.Context, sandboxID, jobID string, req sandbox.JobLogsRequest) (sandbox.JobLogs, error) {
	switch req.Stream {
	case "":
		req.Stream = "all"
	case "all", "stdout", "stderr":
	default:
		return sandbox.JobLogs{}, errcode.New(errcode.InvalidArgument, "stream must be all, stdout or stderr; got %q", text.Truncate(req.Stream, 32))
	}
	if req.Offset != nil && *req.Offset < 0 {
		return sandbox.JobLogs{}, errcode.New(errcode.InvalidArgument, "offset_bytes must be at least 0; got %d", *req.Offset)
	}
	if req.MaxBytes != nil && (*req.MaxBytes < 1 || *req.MaxBytes > sandbox.MaxJobLogBytes) {
		return sandbox.JobLogs{}, errcode.New(errcode.InvalidArgument, "max_bytes must be between 1 and %d; got %d", sandbox.MaxJobLogBytes, *req.MaxBytes)
	}
	if req.TailLines != nil && (*req.TailLines < 1 || *req.TailLines > sandbox.MaxTailLines) {
		return sandbox.JobLogs{}, errcode.New(errcode.InvalidArgument, "tail_lines must be between 1 and %d; got %d", sandbox.MaxTailLines, *req.TailLines)
	}
	if req.TailLines != nil && (req.Offset != nil || req.MaxBytes != nil) {
		return sandbox.JobLogs{}, errcode.New(errcode.InvalidArgument, "give tail_lines, or offset_bytes and max_bytes, not both")
	}
	if req.Wait < 0 || req.Wait > sandbox.MaxJobLogWait || req.Wait%time.Millisecond != 0 {
		return sandbox.JobLogs{}, errcode.New(errcode.InvalidArgument, "a log read's wait must be whole milliseconds from 0 to %d; got %s", sandbox.MaxJobLogWait.Milliseconds(), req.Wait)
	}
	if req.Wait > 0 && req.Offset == nil {
		return sandbox.JobLogs{}, errcode.New(errcode.InvalidArgument, "a log read waits for output past an offset: give offset_bytes with the wait")
	}
	maxBytes, tail := int64(sandbox.DefaultJobLogBytes), 0
	if req.MaxBytes != nil {
		maxBytes = *req.MaxBytes
		if req.Offset == nil {
			zero := int64(0)
			req.Offset = &zero
		}
	}
	if req.TailLines != nil {
		tail = *req.TailLines
	} else if req.Offset == nil {
		tail = sandbox.DefaultTailLines
	}
	j, err := s.job(ctx, sandboxID, jobID)
	if err != nil {
		return sandbox.JobLogs{}, err
	}
	out := sandbox.JobLogs{JobID: j.ID, SandboxID: j.SandboxID, Stream: req.Stream, State: j.State}
	sb, gc, err := s.core.Running(ctx, sandboxID, true)
	if err == nil {
		greq := guest.JobLogsRequest{Stream: req.Stream, TailLines: tail}
		if req.Offset != nil {
			greq.Offset, greq.Max, greq.Wait = *req.Offset, maxBytes, req.Wait
		}
		lg, gerr := gc.JobLogs(ctx, jobID, greq)
		if gerr == nil {
			out.Data, out.Offset, out.NextOffset, out.TotalBytes, out.Truncated = lg.Data, lg.Offset, lg.NextOffset, lg.TotalBytes, lg.Truncated
			out.Source = "agent"
			if lg.State != "" && lg.State != guest.JobRunning && j.State.Active() {
				// The agent says the job ended (its log is complete) before the record
				// followed: settle the record now, so the reply does not say running.
				if rj, rerr := s.refreshJob(ctx, j); rerr == nil {
					out.State = rj.State
				}
			}
			return out, nil
		}
		if !errcode.Is(gerr, errcode.JobNotFound) {
			return sandbox.JobLogs{}, s.core.GuestFailed(ctx, sb, gerr)
		}
	} else if !errcode.Is(err, errcode.SandboxNotRunning) {
		return sandbox.JobLogs{}, err
	}
	// From the record: the last sandbox.TailBytes of the interleaved output.
	if req.Stream != "all" {
		return sandbox.JobLogs{}, errcode.New(errcode.SandboxNotRunning, "sandbox %s is not running: only the last %d bytes of the job's interleaved output (stream all) were kept", sandboxID, sandbox.TailBytes)
	}
	out.Source, out.TotalBytes, out.Truncated = "record", j.LogBytes, j.LogTruncated
	start := j.LogBytes - int64(len(j.Tail))
	data := j.Tail
	if req.Offset != nil {
		off := *req.Offset
		if off < start {
			out.Message = fmt.Sprintf("the sandbox is gone and only the last %d bytes were kept (from offset %d); bytes before it are lost", len(j.Tail), start)
			off = start
		}
		off = min(off, j.LogBytes)
		data = j.Tail[off-start:]
		if int64(len(data)) > maxBytes {
			data = data[:maxBytes]
		}
		out.Offset = off
	} else {
		data = lastLines(data, tail)
		out.Offset = j.LogBytes - int64(len(data))
		if out.Offset == start && start > 0 {
			out.Message = fmt.Sprintf("the sandbox is gone and only the last %d bytes were kept", len(j.Tail))
		}
	}
	out.Data = data
	out.NextOffset = out.Offset + int64(len(data))
	return out, nil
}

// lastLines returns the last n lines of b (a final line without a newline counts).
func lastLines(b []byte, n int) []byte {
	end := len(b)
	if end > 0 && b[end-1] == '\n' {
		end--
	}
	i := end
	for k := 0; k < n; k++ {
		p := bytes.LastIndexByte(b[:i], '\n')
		if p < 0 {
			return b
		}
		i = p
		if k == n-1 {
			return b[p+1:]
		}
	}
	return b[i:]
}

// sandbox.Job watches. A running job has one background watch that waits on the agent (long waits,
// re-armed) and settles its record when it ends. It stops when the job ends, the sandbox stops
// running (ending settles the record) or the service closes.

const jobWaitSlice = 10 * time.Minute

func (s *Service) watchJob(sandboxID, jobID string) {
	s.mu.Lock()
	if s.watched == nil {
		s.watched = map[string]bool{}
	}
	if s.watched[jobID] {
		s.mu.Unlock()
		return
	}
	s.watched[jobID] = true
	s.mu.Unlock()
	s.core.Go(func(bg context.Context) {
		defer func() {
			s.mu.Lock()
			delete(s.watched, jobID)
			s.mu.Unlock()
		}()
		backoff := time.Second
		for {
			if bg.Err() != nil {
				return
			}
			j, err := s.job(bg, sandboxID, jobID)
			if err != nil || !j.State.Active() {
				if err == nil || errcode.Is(err, errcode.JobNotFound) {
					s.forgetHostOOM(jobID) // ended (or gone) without follow
				}
				return
			}
			sb, gc, err := s.core.Running(bg, sandboxID, false) // a sleeping sandbox ends the watch
			if err != nil {
				if errcode.Is(err, errcode.SandboxNotRunning) {
					s.forgetHostOOM(jobID)
					if _, err := s.settleGone(bg, j, sb); err != nil {
						s.log.Warn("settle job", "job_id", jobID, "err", err)
					}
					return
				}
			} else {
				wctx, cancel := context.WithTimeout(bg, jobWaitSlice+time.Minute)
				info, err2 := gc.WaitJob(wctx, jobID, jobWaitSlice)
				cancel()
				switch {
				case err2 == nil:
					if _, ferr := s.follow(bg, gc, j, info); ferr != nil {
						s.log.Warn("record job", "job_id", jobID, "err", ferr)
					} else if info.State == "running" {
						backoff = time.Second
						continue
					} else {
						return
					}
				case errcode.Is(err2, errcode.JobNotFound):
					// refreshJob settles it (unknown), or leaves a start in flight for later.
					if _, ferr := s.refreshJob(bg, j); ferr != nil {
						s.log.Warn("record job", "job_id", jobID, "err", ferr)
					}
				case bg.Err() != nil:
					return
				default:
					err = s.core.GuestFailed(bg, sb, err2)
				}
			}
			if err != nil {
				s.log.Debug("job watch: retrying", "sandbox_id", sandboxID, "job_id", jobID, "err", err)
			}
			t := time.NewTimer(backoff)
			select {
			case <-bg.Done():
				t.Stop()
				return
			case <-t.C:
			}
			backoff = min(2*backoff, time.Minute)
		}
	})
}

// reattach re-arms the watches of an adopted sandbox's active jobs (Reconcile).
func (s *Service) reattach(ctx context.Context, sandboxID string) {
	js := s.store
	jobs, _, err := js.ListJobs(ctx, sandboxID, []sandbox.JobState{sandbox.JobStarting, sandbox.JobRunning}, sandbox.MaxList)
	if err != nil {
		s.log.Warn("reconcile: list jobs", "sandbox_id", sandboxID, "err", err)
		return
	}
	for _, j := range jobs {
		s.log.Info("reconcile: re-attached job", "sandbox_id", sandboxID, "job_id", j.ID)
		s.watchJob(sandboxID, j.ID)
	}
}

// JobsByState counts job records by state, for the server's metrics.
func (s *Service) JobsByState(ctx context.Context) (map[string]int, error) {
	js := s.store
	counts, err := js.CountJobs(ctx)
	if err != nil {
		return nil, err
	}
	out := make(map[string]int, len(counts))
	for st, n := range counts {
		out[string(st)] = n
	}
	return out, nil
}

// Sandboxes is the sandbox service with its jobs feature: one value for the consumers that take
// both (the MCP backend, the runs' workers). Create it with With.
type Sandboxes struct {
	*sandbox.Service
	*feature
}

// feature names the embedded jobs Service apart from the embedded sandbox.Service.
type feature = Service

// Jobs returns the jobs feature.
func (s Sandboxes) Jobs() *Service { return s.feature }

// With returns svc with its jobs feature, which it creates (New over svc's core and store):
// call it once per service, and pass its Jobs() where the feature alone is wanted.
func With(svc *sandbox.Service) Sandboxes {
	core := svc.Core()
	return Sandboxes{svc, New(core, core.Store())}
}
