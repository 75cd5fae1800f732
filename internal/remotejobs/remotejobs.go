// Package remotejobs is the server side of remote jobs: it records each job on a
// joined machine before asking the machine to start it, reserves the GPU a job asks for
// exclusively (GPU_BUSY for a second job wanting it; an index the machine never reported is
// refused before anything is written), and converges those records with what the machines say:
// on every status, list and cancel call and in a background check, so a reservation is released
// when its job ends or is canceled and a server that crashed between recording a job and
// starting it settles the record once the machine answers.
package remotejobs

import (
	"context"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/gpu"
	"github.com/agentbox/agentbox/internal/hostjobs"
	"github.com/agentbox/agentbox/internal/jobmodel"
	"github.com/agentbox/agentbox/internal/store"
)

// Machines reaches joined machines (machine.Registry; an httptest server in tests).
type Machines interface {
	Client(ctx context.Context, ref string) (*http.Client, store.Machine, error)
}

// startGrace is how long a record may stay `starting` before a machine that does not know the
// job means it never started (a start call's own bound is 30 s on the machine).
const startGrace = 2 * time.Minute

// Options configures a Service.
type Options struct {
	// Owner names the caller of ctx (the API key's owner), recorded with each job it starts.
	Owner  func(ctx context.Context) string
	Logger *slog.Logger
	Now    func() time.Time
}

// Service runs remote jobs.
type Service struct {
	machines Machines
	store    store.RemoteJobStore
	log      *slog.Logger
	now      func() time.Time
	owner    func(context.Context) string
}

// New returns a Service.
func New(m Machines, st store.RemoteJobStore, opts Options) *Service {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Owner == nil {
		opts.Owner = func(context.Context) string { return "" }
	}
	return &Service{machines: m, store: st, log: opts.Logger, now: opts.Now, owner: opts.Owner}
}

// StartRequest is a job to start on a machine.
type StartRequest struct {
	Command  string            `json:"command"`
	Shell    string            `json:"shell,omitempty"`
	Env      map[string]string `json:"env,omitempty"`
	Cwd      string            `json:"cwd,omitempty"`
	GPUIndex *int              `json:"gpu_index,omitempty"`
}

// Job is a remote job as the surfaces show it: the machine's view when it answered, the
// record's otherwise.
type Job struct {
	JobID      string     `json:"job_id"`
	MachineID  string     `json:"machine_id"`
	State      string     `json:"state"`
	Success    bool       `json:"success"`
	Message    string     `json:"message"`
	Command    string     `json:"command"`
	Shell      string     `json:"shell"`
	Cwd        string     `json:"cwd,omitempty"`
	EnvNames   []string   `json:"env_names,omitempty"`
	GPUIndex   *int       `json:"gpu_index,omitempty"`
	ExitCode   *int       `json:"exit_code,omitempty"`
	Signal     string     `json:"signal,omitempty"`
	PID        int        `json:"pid,omitempty"`
	StartedAt  time.Time  `json:"started_at"`
	FinishedAt *time.Time `json:"finished_at,omitempty"`
	LogBytes   int64      `json:"log_bytes"`
	Owner      string     `json:"owner,omitempty"`
}

// List is a page of a machine's jobs, newest first.
type List struct {
	Jobs    []Job `json:"jobs"`
	Omitted int   `json:"omitted"`
}

// Logs is a slice of a job's output.
type Logs = hostjobs.Logs

// LogsRequest selects it.
type LogsRequest = hostjobs.LogsRequest

func newID() string { return jobmodel.MachineJobID.New() }

func (s *Service) client(ctx context.Context, ref string) (*hostjobs.Client, store.Machine, error) {
	hc, m, err := s.machines.Client(ctx, ref)
	if err != nil {
		return nil, m, err
	}
	return hostjobs.NewClient(hc, "http://machine"), m, nil
}

// Start records a job (and its GPU reservation), then asks the machine to start it.
func (s *Service) Start(ctx context.Context, machineRef string, req StartRequest) (Job, error) {
	mc, m, err := s.client(ctx, machineRef)
	if err != nil {
		return Job{}, err
	}
	shell, err := hostjobs.CheckShell(m.Platform, req.Shell)
	if err != nil {
		return Job{}, err
	}
	if req.GPUIndex != nil && !slices.ContainsFunc(m.GPUs, func(g gpu.GPU) bool { return g.Index == *req.GPUIndex }) {
		known := make([]string, 0, len(m.GPUs))
		for _, g := range m.GPUs {
			known = append(known, strconv.Itoa(g.Index))
		}
		list := "none"
		if len(known) > 0 {
			list = strings.Join(known, ", ")
		}
		return Job{}, errcode.New(errcode.InvalidArgument, "machine %s has no GPU %d (its GPUs, from its last heartbeat: %s; machine_status lists them)",
			m.Name, *req.GPUIndex, list).With("gpu_index", *req.GPUIndex)
	}
	hreq := hostjobs.StartRequest{JobID: newID(), Command: req.Command, Shell: shell, Env: req.Env, Cwd: req.Cwd, GPUIndex: req.GPUIndex}
	if err := hostjobs.Validate(hreq); err != nil {
		return Job{}, err
	}
	now := s.now().UTC()
	rec := store.RemoteJob{ID: hreq.JobID, MachineID: m.ID, Owner: s.owner(ctx), Command: req.Command, Shell: shell,
		GPUIndex: req.GPUIndex, State: store.RemoteJobStarting, CreatedAt: now, UpdatedAt: now}
	if err := s.store.CreateRemoteJob(ctx, rec); err != nil {
		return Job{}, err
	}
	mj, err := mc.Start(ctx, hreq)
	if err != nil {
		if e, ok := errcode.As(err); ok && e.Code != errcode.Internal {
			// The machine refused it: nothing runs; the reservation goes with the record's end.
			s.end(context.WithoutCancel(ctx), rec, store.RemoteJobFailed, nil, "the machine refused it: "+e.Message)
			return Job{}, err
		}
		// The outcome is unknown (the connection broke, the reply was bad): the record stays
		// `starting` and converges when the machine answers again.
		s.log.Warn("remote job start: outcome unknown", "job_id", rec.ID, "machine", m.ID, "err", err)
		return Job{}, errcode.Wrap(errcode.Internal, err, "the machine did not confirm job %s; it may or may not run: remote_job_status tells once the machine answers", rec.ID).
			With("job_id", rec.ID)
	}
	rec = s.sync(ctx, rec, mj)
	return view(rec, &mj), nil
}

// record returns the record of id on machine m (JOB_NOT_FOUND when it is another machine's).
func (s *Service) record(ctx context.Context, m store.Machine, id string) (store.RemoteJob, error) {
	rec, err := s.store.GetRemoteJob(ctx, id)
	if err != nil {
		return rec, err
	}
	if rec.MachineID != m.ID {
		return rec, errcode.New(errcode.JobNotFound, "machine %s has no job %s (remote_job_list lists its jobs)", m.Name, id).With("job_id", id)
	}
	return rec, nil
}

// Status asks the machine how the job is and records what it says.
func (s *Service) Status(ctx context.Context, machineRef, id string) (Job, error) {
	mc, m, err := s.client(ctx, machineRef)
	if err != nil {
		return Job{}, err
	}
	rec, err := s.record(ctx, m, id)
	if err != nil {
		return Job{}, err
	}
	return s.refresh(ctx, mc, rec)
}

// refresh asks the machine about rec and converges the record.
func (s *Service) refresh(ctx context.Context, mc *hostjobs.Client, rec store.RemoteJob) (Job, error) {
	mj, err := mc.Status(ctx, rec.ID)
	if errcode.Is(err, errcode.JobNotFound) {
		switch {
		case rec.State == store.RemoteJobStarting && s.now().Sub(rec.CreatedAt) < startGrace:
			return view(rec, nil), nil // its start may still be on the way
		case rec.State == store.RemoteJobStarting:
			rec = s.end(ctx, rec, store.RemoteJobFailed, nil, "the machine never started it (the server stopped while starting it)")
		case !store.RemoteJobEnded(rec.State):
			rec = s.end(ctx, rec, store.RemoteJobUnknown, nil, "the machine has no record of it any more (its state was lost); its outcome is unknown — do not treat it as a success")
		}
		return view(rec, nil), nil
	}
	if err != nil {
		return Job{}, err
	}
	rec = s.sync(ctx, rec, mj)
	return view(rec, &mj), nil
}

// List returns the machine's newest limit jobs.
func (s *Service) List(ctx context.Context, machineRef string, limit int) (List, error) {
	if limit == 0 {
		limit = hostjobs.DefaultListLimit
	}
	if limit < 1 || limit > hostjobs.MaxListLimit {
		return List{}, errcode.New(errcode.InvalidArgument, "limit must be 1–%d, not %d", hostjobs.MaxListLimit, limit)
	}
	mc, m, err := s.client(ctx, machineRef)
	if err != nil {
		return List{}, err
	}
	ml, err := mc.List(ctx, limit)
	if err != nil {
		return List{}, err
	}
	out := List{Jobs: make([]Job, 0, len(ml.Jobs)), Omitted: ml.Omitted}
	for _, mj := range ml.Jobs {
		rec, err := s.record(ctx, m, mj.JobID)
		if err != nil { // a job this server did not start (another server's, or a record pruned)
			out.Jobs = append(out.Jobs, view(store.RemoteJob{ID: mj.JobID, MachineID: m.ID}, &mj))
			continue
		}
		rec = s.sync(ctx, rec, mj)
		out.Jobs = append(out.Jobs, view(rec, &mj))
	}
	return out, nil
}

// Logs reads part of a job's output from the machine.
func (s *Service) Logs(ctx context.Context, machineRef, id string, req LogsRequest) (Logs, error) {
	mc, m, err := s.client(ctx, machineRef)
	if err != nil {
		return Logs{}, err
	}
	if _, err := s.record(ctx, m, id); err != nil {
		return Logs{}, err
	}
	return mc.Logs(ctx, id, req)
}

// Cancel ends the job's whole tree on the machine (SIGTERM, SIGKILL after grace) and releases
// its GPU.
func (s *Service) Cancel(ctx context.Context, machineRef, id string, grace time.Duration) (Job, error) {
	if err := jobmodel.CheckGrace(grace); err != nil {
		return Job{}, err
	}
	mc, m, err := s.client(ctx, machineRef)
	if err != nil {
		return Job{}, err
	}
	rec, err := s.record(ctx, m, id)
	if err != nil {
		return Job{}, err
	}
	if store.RemoteJobEnded(rec.State) {
		return s.refresh(ctx, mc, rec)
	}
	mj, err := mc.Cancel(ctx, id, grace)
	if errcode.Is(err, errcode.JobNotFound) {
		return s.refresh(ctx, mc, rec)
	}
	if err != nil {
		return Job{}, err
	}
	rec = s.sync(ctx, rec, mj)
	return view(rec, &mj), nil
}

// Reconcile asks each reachable machine about the jobs recorded as not ended, so reservations
// of jobs that ended while nobody asked are released, and records a crash left `starting`
// settle. Offline machines are skipped (their jobs may still run).
func (s *Service) Reconcile(ctx context.Context) {
	recs, err := s.store.ActiveRemoteJobs(ctx, 1000)
	if err != nil {
		s.log.Warn("remote jobs: reconcile", "err", err)
		return
	}
	clients := map[string]*hostjobs.Client{}
	for _, rec := range recs {
		mc, ok := clients[rec.MachineID]
		if !ok {
			mc, _, err = s.client(ctx, rec.MachineID)
			if err != nil {
				mc = nil
			}
			clients[rec.MachineID] = mc
		}
		if mc == nil {
			continue
		}
		if _, err := s.refresh(ctx, mc, rec); err != nil {
			s.log.Debug("remote jobs: reconcile", "job_id", rec.ID, "err", err)
		}
	}
}

// Run reconciles every interval until ctx ends, and returns then. With several replicas on one
// store only one should run it: serve runs it as lifecycle work, on the holder of the node's
// lifecycle lease (lease.Owner), and waits for it at shutdown.
func (s *Service) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		s.Reconcile(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// sync records what the machine says of rec's job, when it moved on.
func (s *Service) sync(ctx context.Context, rec store.RemoteJob, mj hostjobs.Job) store.RemoteJob {
	state := mj.State // the machine's states are the record's
	if state == rec.State {
		return rec
	}
	if state == hostjobs.StateRunning {
		next := rec
		next.State, next.UpdatedAt, next.Message = store.RemoteJobRunning, s.now().UTC(), mj.Message
		return s.update(ctx, rec, next)
	}
	return s.end(ctx, rec, state, mj.ExitCode, mj.Message)
}

// end records rec's end (releasing its GPU).
func (s *Service) end(ctx context.Context, rec store.RemoteJob, state string, code *int, msg string) store.RemoteJob {
	now := s.now().UTC()
	next := rec
	next.State, next.ExitCode, next.Message, next.UpdatedAt, next.EndedAt = state, code, msg, now, &now
	return s.update(ctx, rec, next)
}

func (s *Service) update(ctx context.Context, rec, next store.RemoteJob) store.RemoteJob {
	got, err := s.store.UpdateRemoteJob(ctx, next)
	if err != nil {
		s.log.Warn("remote jobs: cannot record a job's state", "job_id", rec.ID, "state", next.State, "err", err)
		return rec
	}
	return got
}

// view is what the surfaces show: the machine's job when it answered, the record otherwise.
func view(rec store.RemoteJob, mj *hostjobs.Job) Job {
	j := Job{JobID: rec.ID, MachineID: rec.MachineID, State: rec.State, Message: rec.Message, Command: rec.Command,
		Shell: rec.Shell, GPUIndex: rec.GPUIndex, ExitCode: rec.ExitCode, StartedAt: rec.CreatedAt, FinishedAt: rec.EndedAt, Owner: rec.Owner}
	if mj != nil {
		j.State, j.Success, j.Message, j.Command, j.Shell, j.Cwd = mj.State, mj.Success, mj.Message, mj.Command, mj.Shell, mj.Cwd
		j.EnvNames, j.GPUIndex, j.ExitCode, j.Signal, j.PID = mj.EnvNames, mj.GPUIndex, mj.ExitCode, mj.Signal, mj.PID
		j.StartedAt, j.FinishedAt, j.LogBytes = mj.StartedAt, mj.FinishedAt, mj.LogBytes
	}
	if j.State == store.RemoteJobUnknown && !strings.Contains(j.Message, "success") {
		j.Message += " — its outcome is unknown: do not treat it as a success"
	}
	j.Success = j.Success && j.State == store.RemoteJobExited && j.ExitCode != nil && *j.ExitCode == 0
	return j
}
