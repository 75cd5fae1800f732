package runs

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/agentbox/agentbox/internal/egress"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/linksign"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/sandbox/jobs"
	"github.com/agentbox/agentbox/internal/sandbox/netsession"
)

// Backend is what runs need of the sandbox control plane; *sandbox.Service satisfies it.
type Backend interface {
	Create(ctx context.Context, req sandbox.CreateRequest) (sandbox.Sandbox, error)
	Get(ctx context.Context, id string) (sandbox.Sandbox, error)
	Destroy(ctx context.Context, id string) (sandbox.Sandbox, error)
	Extend(ctx context.Context, id string, ttlSeconds int64) (sandbox.Sandbox, error)
	Exec(ctx context.Context, id string, req sandbox.ExecRequest, onOutput sandbox.OutputFunc) (sandbox.ExecResult, error)
	StartJob(ctx context.Context, sandboxID string, req sandbox.JobStartRequest) (sandbox.Job, error)
	JobStatus(ctx context.Context, sandboxID, jobID string) (sandbox.Job, error)
	WaitJob(ctx context.Context, sandboxID, jobID string, timeout time.Duration) (sandbox.Job, error)
	CancelJob(ctx context.Context, sandboxID, jobID string, grace *time.Duration) (sandbox.Job, error)
	JobLogs(ctx context.Context, sandboxID, jobID string, req sandbox.JobLogsRequest) (sandbox.JobLogs, error)
	WriteFile(ctx context.Context, id, path string, mode uint32, r io.Reader) (sandbox.FileInfo, error)
	ReadFile(ctx context.Context, id, path string, offset, length, limit int64) (io.ReadCloser, int64, error)
	Stat(ctx context.Context, id, path string) (sandbox.FileInfo, error)
	ListDir(ctx context.Context, id, path string) (sandbox.DirList, error)
}

// NetworkUpdater changes a sandbox's egress policy (the network feature, *netsession.Service):
// a checkout lets the sandbox reach the repository's host, then restores the run's own policy.
type NetworkUpdater interface {
	UpdateNetwork(ctx context.Context, id string, p egress.Policy) (sandbox.Sandbox, error)
}

// Config configures the run service.
type Config struct {
	Sandboxes Backend
	// Network changes sandboxes' egress policies; nil: the network feature of Sandboxes' core
	// (an in-process backend), else none (a checkout that needs it fails).
	Network NetworkUpdater
	Store   Store
	// Dir is the service's own directory (<state>/runs): the blob store of logs and artifacts
	// and the key that signs artifact URLs.
	Dir string
	// BaseURL returns the server's address as clients reach it ("http://127.0.0.1:8080"), for
	// artifact URLs.
	BaseURL func() string
	// Workers bounds the runs this server executes at once (default DefaultWorkers).
	Workers int
	// CheckoutDirs are the host directories a file:// repo_url may name (operator's flag
	// --checkout-dir); none: file:// is refused.
	CheckoutDirs []string
	// ArtifactBudgetBytes bounds the blob store (logs and artifacts; oldest runs' blobs go
	// first); Retention is how long settled runs, their logs and artifacts are kept.
	ArtifactBudgetBytes int64
	Retention           time.Duration
	// ArtifactURLTTL is how long a signed artifact URL is valid (default DefaultArtifactURLTTL).
	ArtifactURLTTL time.Duration
	Log            *slog.Logger
	Now            func() time.Time
	// Shared says other replicas share the store (Postgres): a cancel requested through
	// another replica is only in the store, so the dispatcher rereads its executing runs'
	// records every pass (at most Workers reads a second) and signals their cancels.
	Shared bool
}

// Defaults.
const (
	DefaultWorkers             = 16
	DefaultArtifactBudgetBytes = 2 << 30
	DefaultRetention           = 7 * 24 * time.Hour
)

// Service runs runs. It is safe for concurrent use.
type Service struct {
	cfg    Config
	log    *slog.Logger
	now    func() time.Time
	store  Store
	sb     Backend
	blobs  *blobStore
	signer *linksign.Signer // artifact URLs (sign.go)
	// onSettled is called when a run settles (the batch service's hook: hooks.go).
	onSettled func(context.Context, Run)

	wakeCh chan struct{}
	// stampMu orders claims and settles: each is stamped and written under it, so the events'
	// times agree with the order the store saw them in (a batch's runs never seem to overlap
	// more than max_parallel when read from the events).
	stampMu sync.Mutex
	mu      sync.Mutex
	// changed is closed and replaced whenever a run's record changes here (Wait's signal).
	changed chan struct{}
	// active are the runs executing in this server: cancel asks one to stop now.
	active map[string]context.CancelFunc
	// retryAt holds queued runs back after a capacity refusal (backoff).
	retryAt map[string]retry
	wg      sync.WaitGroup
	// runDone is closed when the current (or last) Run has returned; nil before the first.
	runDone chan struct{}
}

type retry struct {
	at    time.Time
	delay time.Duration
}

// New returns the service; Run starts its workers.
func New(cfg Config) (*Service, error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Workers <= 0 {
		cfg.Workers = DefaultWorkers
	}
	if cfg.ArtifactBudgetBytes <= 0 {
		cfg.ArtifactBudgetBytes = DefaultArtifactBudgetBytes
	}
	if cfg.Retention <= 0 {
		cfg.Retention = DefaultRetention
	}
	if cfg.ArtifactURLTTL <= 0 {
		cfg.ArtifactURLTTL = DefaultArtifactURLTTL
	}
	if cfg.BaseURL == nil {
		cfg.BaseURL = func() string { return "" }
	}
	if cfg.Store == nil || cfg.Sandboxes == nil || cfg.Dir == "" {
		return nil, fmt.Errorf("runs: Store, Sandboxes and Dir are required")
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("runs: %w", err)
	}
	signer, err := linksign.Load(filepath.Join(cfg.Dir, "url-key"), cfg.Now)
	if err != nil {
		return nil, err
	}
	blobs, err := newBlobStore(filepath.Join(cfg.Dir, "blobs"))
	if err != nil {
		return nil, err
	}
	if cfg.Network == nil {
		if c, ok := cfg.Sandboxes.(interface{ Core() *sandbox.Core }); ok {
			core := c.Core()
			cfg.Network = netsession.New(core, core.Store())
		}
	}
	s := &Service{cfg: cfg, log: cfg.Log, now: cfg.Now, store: cfg.Store, sb: cfg.Sandboxes,
		blobs: blobs, signer: signer, wakeCh: make(chan struct{}, 1), changed: make(chan struct{}),
		active: map[string]context.CancelFunc{}, retryAt: map[string]retry{}}
	s.onSettled = s.batchRunSettled // batch.go: a batch's counts and settled state
	return s, nil
}

// Run resumes every unsettled run and executes queued ones until ctx ends; Close waits for it.
// It may be called again after it returned: with several replicas the workers run only on the
// holder of the node's lifecycle lease, one term at a time (lease.Owner), and a later term
// resumes what an earlier one (or another replica) left.
func (s *Service) Run(ctx context.Context) {
	done := make(chan struct{})
	s.mu.Lock()
	s.runDone = done
	s.mu.Unlock()
	defer close(done)
	s.dispatch(ctx)
	s.wg.Wait()
}

// Close waits for the workers to stop (after Run's ctx ended).
func (s *Service) Close() error {
	s.mu.Lock()
	done := s.runDone
	s.mu.Unlock()
	if done != nil {
		<-done
	}
	return nil
}

// StoreChanged tells the service another replica changed runs in the shared store: waits
// reread their run now, and the dispatcher looks for queued runs (sandbox.FollowChanges).
func (s *Service) StoreChanged() {
	s.notify()
	s.wake()
}

// wake tells the dispatcher to look for queued runs now.
func (s *Service) wake() {
	select {
	case s.wakeCh <- struct{}{}:
	default:
	}
}

// notify wakes every Wait.
func (s *Service) notify() {
	s.mu.Lock()
	close(s.changed)
	s.changed = make(chan struct{})
	s.mu.Unlock()
}

func (s *Service) changedCh() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.changed
}

func checkRunID(id string) error {
	if !runIDPattern.MatchString(id) {
		return errcode.New(errcode.InvalidArgument, "run_id must look like run-0123456789ab; got %q", trunc(id, 64)).With("field", "run_id")
	}
	return nil
}

// Start records a run (queued) and returns it at once; the caller's owner is
// sandbox.OwnerFrom(ctx). Bad input is INVALID_ARGUMENT naming the field, and nothing is
// recorded.
func (s *Service) Start(ctx context.Context, spec Spec) (Run, error) {
	v, err := s.validate(spec)
	if err != nil {
		return Run{}, err
	}
	r := s.newRun(ctx, v, "")
	got, created, err := s.store.CreateRun(ctx, r, s.firstEvent(r))
	if err != nil {
		return Run{}, err
	}
	if !created {
		if !sameSpec(got.Spec, v) {
			return Run{}, errcode.New(errcode.Conflict, "idempotency_key %q already names run %s with a different spec", trunc(v.IdempotencyKey, 64), got.ID).With("run_id", got.ID)
		}
		return s.present(got), nil
	}
	s.log.Info("run recorded", "run_id", r.ID, "owner", r.Owner)
	s.notify()
	s.wake()
	return s.present(r), nil
}

func sameSpec(a, b Spec) bool {
	ja, err1 := json.Marshal(a)
	jb, err2 := json.Marshal(b)
	return err1 == nil && err2 == nil && bytes.Equal(ja, jb)
}

// present fills a run's reply-only fields: fresh artifact URLs, non-nil lists.
func (s *Service) present(r Run) Run {
	if r.Phases == nil {
		r.Phases = []Phase{}
	}
	if r.ChangedFiles == nil {
		r.ChangedFiles = []ChangedFile{}
	}
	arts := make([]Artifact, len(r.Artifacts))
	exp := s.now().Add(s.cfg.ArtifactURLTTL).UTC().Truncate(time.Second)
	for i, a := range r.Artifacts {
		a.ExpiresAt = exp
		a.URL = s.ArtifactURL(r.ID, a.Path, exp)
		arts[i] = a
	}
	r.Artifacts = arts
	return r
}

// Wait returns the run once it settled, or as it is when timeout (at most MaxWait) passes or
// ctx ends (a caller that hangs up loses nothing: the run goes on).
func (s *Service) Wait(ctx context.Context, id string, timeout time.Duration) (Run, error) {
	if err := checkRunID(id); err != nil {
		return Run{}, err
	}
	if timeout < 0 || timeout > MaxWait {
		return Run{}, errcode.New(errcode.InvalidArgument, "wait must be between 0 and %s; got %s", MaxWait, timeout).With("field", "wait_seconds")
	}
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		ch := s.changedCh()
		r, err := s.store.GetRun(ctx, id)
		if err != nil {
			if ctx.Err() != nil {
				return Run{}, err
			}
			return Run{}, err
		}
		if r.State.Settled() || timeout == 0 {
			return s.present(r), nil
		}
		select {
		case <-ch:
		case <-tick.C:
		case <-deadline.C:
			return s.present(r), nil
		case <-ctx.Done():
			return s.present(r), nil
		}
	}
}

// Get returns a run (artifact URLs freshly signed).
func (s *Service) Get(ctx context.Context, id string) (Run, error) {
	if err := checkRunID(id); err != nil {
		return Run{}, err
	}
	r, err := s.store.GetRun(ctx, id)
	if err != nil {
		return Run{}, err
	}
	return s.present(r), nil
}

// List pages runs, newest first.
func (s *Service) List(ctx context.Context, f Filter) (RunList, error) {
	if f.Limit < 0 || f.Limit > MaxList {
		return RunList{}, errcode.New(errcode.InvalidArgument, "limit must be between 1 and %d; got %d", MaxList, f.Limit).With("field", "limit")
	}
	if f.Limit == 0 {
		f.Limit = DefaultList
	}
	for _, st := range f.States {
		if !st.Valid() {
			return RunList{}, errcode.New(errcode.InvalidArgument, "state %q is not a run state", trunc(string(st), 32)).With("field", "state")
		}
	}
	if f.Before != "" {
		if err := checkRunID(f.Before); err != nil {
			return RunList{}, errcode.New(errcode.InvalidArgument, "before must be a run id (a previous page's next); got %q", trunc(f.Before, 64)).With("field", "before")
		}
	}
	if len(f.Labels) > maxLabels {
		return RunList{}, errcode.New(errcode.InvalidArgument, "at most %d labels", maxLabels).With("field", "label")
	}
	l, err := s.store.ListRuns(ctx, f)
	if err != nil {
		return RunList{}, err
	}
	for i := range l.Runs {
		l.Runs[i] = s.present(l.Runs[i])
	}
	if l.Runs == nil {
		l.Runs = []Run{}
	}
	return l, nil
}

// Cancel asks for a run's end: a queued run is canceled at once; a running phase's job is
// canceled and the run cleans up and settles canceled. Canceling a settled run returns it.
func (s *Service) Cancel(ctx context.Context, id string) (Run, error) {
	if err := checkRunID(id); err != nil {
		return Run{}, err
	}
	for attempt := 0; attempt < 20; attempt++ {
		r, err := s.store.GetRun(ctx, id)
		if err != nil {
			return Run{}, err
		}
		if r.State.Settled() || r.CancelRequested {
			s.signalCancel(id)
			return s.present(r), nil
		}
		now := s.stamp()
		prev := r.State
		r.CancelRequested = true
		r.Version++
		r.UpdatedAt = now
		ev := Event{RunID: id, Time: now, From: prev, To: prev, Reason: "cancel requested"}
		var evs []Event
		if prev == Queued {
			r.State, r.Reason = Canceled, "canceled before it started"
			r.FinishedAt = &now
			for i := range r.Phases {
				if r.Phases[i].State == PhasePending {
					r.Phases[i].State, r.Phases[i].Error = PhaseSkipped, "the run was canceled"
				}
			}
			evs = append(evs, ev, Event{RunID: id, Time: now, From: Queued, To: Canceled, Reason: r.Reason})
		} else {
			evs = append(evs, ev)
		}
		if err := s.store.UpdateRun(ctx, r, evs...); err != nil {
			if errcode.Is(err, errcode.Conflict) {
				continue
			}
			return Run{}, err
		}
		s.notify()
		if r.State.Settled() {
			s.forgetRetry(id)
			s.runSettled(context.WithoutCancel(ctx), r)
			s.wake()
		} else {
			s.signalCancel(id)
		}
		s.log.Info("run cancel requested", "run_id", id, "state", prev)
		return s.present(r), nil
	}
	return Run{}, errcode.New(errcode.Conflict, "run %s kept changing; try again", id)
}

// checkCancels signals the cancel of each executing run whose record asks for it (a cancel
// requested through another replica).
func (s *Service) checkCancels(ctx context.Context) {
	s.mu.Lock()
	ids := make([]string, 0, len(s.active))
	for id := range s.active {
		ids = append(ids, id)
	}
	s.mu.Unlock()
	for _, id := range ids {
		if r, err := s.store.GetRun(ctx, id); err == nil && r.CancelRequested {
			s.signalCancel(id)
		}
	}
}

func (s *Service) signalCancel(id string) {
	s.mu.Lock()
	c := s.active[id]
	s.mu.Unlock()
	if c != nil {
		c()
	}
}

// Events pages a run's events.
func (s *Service) Events(ctx context.Context, id string, after int64, limit int) (EventList, error) {
	if err := checkRunID(id); err != nil {
		return EventList{}, err
	}
	if after < 0 {
		return EventList{}, errcode.New(errcode.InvalidArgument, "after must be a cursor (a seq, ≥ 0); got %d", after).With("field", "after")
	}
	if limit < 0 || limit > MaxEventsPage {
		return EventList{}, errcode.New(errcode.InvalidArgument, "limit must be between 1 and %d; got %d", MaxEventsPage, limit).With("field", "limit")
	}
	if limit == 0 {
		limit = MaxEventsPage
	}
	if _, err := s.store.GetRun(ctx, id); err != nil {
		return EventList{}, err
	}
	evs, err := s.store.RunEvents(ctx, id, after, limit)
	if err != nil {
		return EventList{}, err
	}
	if evs == nil {
		evs = []Event{}
	}
	next := after
	if len(evs) > 0 {
		next = evs[len(evs)-1].Seq
	}
	return EventList{RunID: id, Events: evs, Next: next}, nil
}

// Logs returns a slice of one phase's output (live while it runs, from the blob store after).
func (s *Service) Logs(ctx context.Context, id string, req LogsRequest) (Logs, error) {
	if err := checkRunID(id); err != nil {
		return Logs{}, err
	}
	if req.Phase == "" {
		req.Phase = PhaseCommand
	}
	switch req.Stream {
	case "":
		req.Stream = "stdout"
	case "stdout", "stderr":
	default:
		return Logs{}, errcode.New(errcode.InvalidArgument, "stream must be stdout or stderr; got %q", trunc(req.Stream, 32)).With("field", "stream")
	}
	if req.Offset < 0 {
		return Logs{}, errcode.New(errcode.InvalidArgument, "offset must be at least 0; got %d", req.Offset).With("field", "offset")
	}
	if req.MaxBytes == 0 {
		req.MaxBytes = DefaultLogPage
	}
	if req.MaxBytes < 1 || req.MaxBytes > MaxLogPage {
		return Logs{}, errcode.New(errcode.InvalidArgument, "max_bytes must be between 1 and %d; got %d", MaxLogPage, req.MaxBytes).With("field", "max_bytes")
	}
	r, err := s.store.GetRun(ctx, id)
	if err != nil {
		return Logs{}, err
	}
	var ph *Phase
	for i := range r.Phases {
		if r.Phases[i].Name == req.Phase {
			ph = &r.Phases[i]
		}
	}
	if ph == nil {
		names := make([]string, len(r.Phases))
		for i, p := range r.Phases {
			names[i] = p.Name
		}
		return Logs{}, errcode.New(errcode.InvalidArgument, "run %s has no phase %q (its phases: %s)", id, trunc(req.Phase, 32), strings.Join(names, ", ")).With("field", "phase")
	}
	out := Logs{RunID: id, Phase: ph.Name, Stream: req.Stream, Offset: req.Offset, Data: []byte{}}
	switch {
	case ph.State == PhasePending:
		out.NextOffset = req.Offset
		return out, nil
	case ph.State == PhaseRunning && ph.JobID != "" && r.SandboxID != "":
		max := min(req.MaxBytes, int64(sandbox.MaxJobLogBytes))
		off := req.Offset
		lg, err := s.sb.JobLogs(ctx, r.SandboxID, ph.JobID, sandbox.JobLogsRequest{Stream: req.Stream, Offset: &off, MaxBytes: &max})
		if err == nil {
			out.Data, out.Offset, out.NextOffset, out.TotalBytes, out.Truncated = lg.Data, lg.Offset, lg.NextOffset, lg.TotalBytes, lg.Truncated
			return out, nil
		}
		// The job may have just ended: the blob store may have it now.
		if r, err = s.store.GetRun(ctx, id); err != nil {
			return Logs{}, err
		}
		for i := range r.Phases {
			if r.Phases[i].Name == req.Phase {
				ph = &r.Phases[i]
			}
		}
		if ph.State == PhaseRunning {
			out.NextOffset = req.Offset
			return out, nil
		}
	}
	data, total, err := s.blobs.readLog(r.ID, ph.Name, req.Stream, req.Offset, req.MaxBytes)
	switch {
	case errors.Is(err, fs.ErrNotExist) && ph.JobID == "":
		data, total = []byte{}, 0 // the phase ran no command (sandbox, files, collect, cleanup)
	case errors.Is(err, fs.ErrNotExist):
		return Logs{}, errcode.New(errcode.LinkExpired, "the %s of phase %s of run %s are not kept (retention or the artifact budget removed them, or they could not be copied)", req.Stream, ph.Name, id)
	case err != nil:
		return Logs{}, err
	}
	out.Data, out.TotalBytes = data, total
	out.NextOffset = min(req.Offset, total) + int64(len(data))
	out.Offset = min(req.Offset, total)
	out.Truncated = ph.Truncated
	out.Complete = true
	return out, nil
}

// OpenArtifact opens a collected artifact (LINK_EXPIRED when it is no longer kept).
func (s *Service) OpenArtifact(ctx context.Context, runID, path string) (io.ReadCloser, Artifact, error) {
	if err := checkRunID(runID); err != nil {
		return nil, Artifact{}, err
	}
	r, err := s.store.GetRun(ctx, runID)
	if err != nil {
		return nil, Artifact{}, err
	}
	for i, a := range r.Artifacts {
		if a.Path == path {
			f, err := s.blobs.openArtifact(runID, i)
			if err != nil {
				return nil, Artifact{}, errcode.New(errcode.LinkExpired, "artifact %q of run %s is no longer kept (retention or the artifact budget removed it)", trunc(path, 128), runID)
			}
			return f, s.present(Run{ID: runID, Artifacts: []Artifact{a}}).Artifacts[0], nil
		}
	}
	return nil, Artifact{}, errcode.New(errcode.FileNotFound, "run %s has no artifact %q", runID, trunc(path, 128)).With("field", "path")
}

var _ Backend = jobs.Sandboxes{}
