package hostjobs

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/jobmodel"
	"github.com/agentbox/agentbox/internal/text"
)

// SupervisorCommand is the hidden agentbox subcommand that supervises one job
// (cmd/agentbox runs Supervise for it).
const SupervisorCommand = "hostjob-supervise"

// Files of a job's directory.
const (
	specFile   = "spec.json"  // the agent's: what runs (no env values), written before it starts
	pidFile    = "pid.json"   // the supervisor's: the job's and its own pid, once the job runs
	exitFile   = "exit.json"  // the supervisor's: how the job ended (atomic: temp, then rename)
	cancelFile = "cancel"     // the agent's: written before cancel signals the job
	logFile    = "output.log" // the job's stdout and stderr, interleaved as written
)

// Options configures a Manager.
type Options struct {
	// Dir holds one directory per job (created 0700).
	Dir string
	// Supervisor is the argv prefix that runs the supervisor; the job's directory is appended.
	// Default: this executable with SupervisorCommand.
	Supervisor []string
	// NoSystemdScope keeps jobs out of their own systemd scope even where systemd-run works
	// (Linux); by default each job's supervisor runs in a transient scope, so restarting the
	// agent's service does not kill it.
	NoSystemdScope bool
	Logger         *slog.Logger
	// Now is the clock (tests); default time.Now.
	Now func() time.Time
}

// Manager runs and reads the jobs of one state dir. Its state is the directory: a new Manager
// on the same Dir (after the agent restarted) sees every job the old one started.
type Manager struct {
	opts Options
	log  *slog.Logger
	mu   sync.Mutex // serializes starts, cancels' markers and pruning
}

// spec is specFile.
type spec struct {
	JobID     string    `json:"job_id"`
	Command   string    `json:"command"`
	Shell     string    `json:"shell"`
	Cwd       string    `json:"cwd,omitempty"`
	EnvNames  []string  `json:"env_names,omitempty"`
	GPUIndex  *int      `json:"gpu_index,omitempty"`
	StartedAt time.Time `json:"started_at"`
}

// pids is pidFile. Start ticks (Linux: /proc/<pid>/stat's starttime) tell a live process from a
// later one that reused its pid; 0 where the platform has none.
type pids struct {
	PID             int    `json:"pid"`
	PIDStart        uint64 `json:"pid_start,omitempty"`
	Supervisor      int    `json:"supervisor"`
	SupervisorStart uint64 `json:"supervisor_start,omitempty"`
}

// exitRecord is exitFile.
type exitRecord struct {
	ExitCode   int       `json:"exit_code"`
	Signal     string    `json:"signal,omitempty"`
	SignalNum  int       `json:"signal_num,omitempty"`
	Canceled   bool      `json:"canceled,omitempty"`
	FinishedAt time.Time `json:"finished_at"`
}

// supervisorInput is what the agent hands the supervisor on its stdin (env values never touch
// the disk).
type supervisorInput struct {
	Argv []string `json:"argv"`
	// CmdLine is the exact Windows command line (shell.Spec.CmdLine, cmd); "" elsewhere.
	CmdLine string   `json:"cmd_line,omitempty"`
	Env     []string `json:"env"`
	Cwd     string   `json:"cwd,omitempty"`
}

// supervisorReply is the supervisor's one line on its stdout once the job runs or failed to.
type supervisorReply struct {
	PID     int    `json:"pid,omitempty"`
	Code    string `json:"code,omitempty"`
	Message string `json:"message,omitempty"`
}

// NewManager returns a Manager of opts.Dir, creating it.
func NewManager(opts Options) (*Manager, error) {
	if opts.Dir == "" {
		return nil, errors.New("hostjobs: no directory")
	}
	if err := os.MkdirAll(opts.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("hostjobs: %w", err)
	}
	if len(opts.Supervisor) == 0 {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("hostjobs: cannot find this executable for the supervisor: %w", err)
		}
		opts.Supervisor = []string{exe, SupervisorCommand}
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Manager{opts: opts, log: opts.Logger}, nil
}

func (m *Manager) jobDir(id string) string { return filepath.Join(m.opts.Dir, id) }

// validate checks a start request; every refusal says what to change.
func validate(req StartRequest) error {
	bad := func(f string, a ...any) error { return errcode.New(errcode.InvalidArgument, f, a...) }
	switch {
	case !ValidID(req.JobID):
		return bad("job_id must be rjob- and 16 lowercase hex digits, not %q", req.JobID)
	case strings.TrimSpace(req.Command) == "":
		return bad("command is required")
	case len(req.Command) > MaxCommandBytes:
		return bad("command is %d bytes; at most %d", len(req.Command), MaxCommandBytes)
	case strings.ContainsRune(req.Command, 0):
		return bad("command contains a NUL byte")
	case len(req.Cwd) > MaxCwdBytes || strings.ContainsRune(req.Cwd, 0):
		return bad("cwd is too long or contains a NUL byte")
	case req.Cwd != "" && !filepath.IsAbs(req.Cwd):
		return bad("cwd must be an absolute path, not %q", req.Cwd)
	case req.GPUIndex != nil && (*req.GPUIndex < 0 || *req.GPUIndex > MaxGPUIndex):
		return bad("gpu_index must be 0–%d, not %d", MaxGPUIndex, *req.GPUIndex)
	case len(req.Env) > MaxEnv:
		return bad("env has %d entries; at most %d", len(req.Env), MaxEnv)
	}
	size := 0
	for k, v := range req.Env {
		if !validEnvName(k) {
			return bad("env name %q is not a valid variable name (letters, digits, _; not starting with a digit)", k)
		}
		if k == "CUDA_VISIBLE_DEVICES" && req.GPUIndex != nil {
			return bad("env CUDA_VISIBLE_DEVICES and gpu_index together: gpu_index sets it")
		}
		if strings.ContainsRune(v, 0) {
			return bad("env %s contains a NUL byte", k)
		}
		size += len(k) + len(v) + 2
	}
	if size > MaxEnvBytes {
		return bad("env is %d bytes; at most %d", size, MaxEnvBytes)
	}
	return nil
}

func validEnvName(k string) bool {
	if k == "" || len(k) > 256 || (k[0] >= '0' && k[0] <= '9') {
		return false
	}
	for _, c := range k {
		if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// Start starts a job and returns it, running. A job id that exists returns that job as it is.
func (m *Manager) Start(ctx context.Context, req StartRequest) (Job, error) {
	if err := validate(req); err != nil {
		return Job{}, err
	}
	shell, sh, err := shellSpec(req.Shell, req.Command)
	if err != nil {
		return Job{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	dir := m.jobDir(req.JobID)
	if _, err := os.Stat(filepath.Join(dir, specFile)); err == nil {
		return m.Status(ctx, req.JobID)
	}
	if err := m.admit(ctx); err != nil {
		return Job{}, err
	}
	names := make([]string, 0, len(req.Env))
	env := os.Environ()
	for k, v := range req.Env {
		names = append(names, k)
		env = append(env, k+"="+v)
	}
	slices.Sort(names)
	if req.GPUIndex != nil {
		env = append(env, "CUDA_VISIBLE_DEVICES="+strconv.Itoa(*req.GPUIndex))
	}
	sp := spec{JobID: req.JobID, Command: req.Command, Shell: shell, Cwd: req.Cwd, EnvNames: names,
		GPUIndex: req.GPUIndex, StartedAt: m.opts.Now().UTC()}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return Job{}, errcode.Wrap(errcode.Internal, err, "cannot create the job's directory: %v", err)
	}
	if err := writeJSONAtomic(filepath.Join(dir, specFile), sp); err != nil {
		os.RemoveAll(dir)
		return Job{}, errcode.Wrap(errcode.Internal, err, "cannot write the job's spec: %v", err)
	}
	in := supervisorInput{Argv: sh.Args, CmdLine: sh.CmdLine, Env: env, Cwd: req.Cwd}
	reply, err := m.runSupervisor(ctx, dir, in)
	if err == nil && reply.PID <= 0 {
		code := errcode.Code(reply.Code)
		if !slices.Contains(errcode.Codes, code) {
			code = errcode.Internal
		}
		err = errcode.New(code, "the job did not start: %s", text.Truncate(reply.Message, 1024))
	}
	if err != nil {
		os.RemoveAll(dir)
		return Job{}, err
	}
	m.log.Info("remote job started", "job_id", req.JobID, "pid", reply.PID, "shell", shell)
	return m.Status(ctx, req.JobID)
}

// admit refuses a start beyond MaxRunning and prunes the oldest ended jobs beyond MaxKept.
func (m *Manager) admit(ctx context.Context) error {
	ids, err := m.ids()
	if err != nil {
		return err
	}
	var ended []Job
	running := 0
	for _, id := range ids {
		j, err := m.Status(ctx, id)
		if err != nil {
			continue
		}
		if j.Ended() {
			ended = append(ended, j)
		} else {
			running++
		}
	}
	if running >= MaxRunning {
		return errcode.New(errcode.JobLimitExceeded, "this machine already runs %d jobs, the most it may: wait for one to end or cancel one", running)
	}
	if over := len(ids) + 1 - MaxKept; over > 0 {
		slices.SortFunc(ended, func(a, b Job) int { return a.StartedAt.Compare(b.StartedAt) })
		for _, j := range ended[:min(over, len(ended))] {
			os.RemoveAll(m.jobDir(j.JobID))
		}
	}
	return nil
}

// runSupervisor starts the supervisor detached and waits for its reply line (30 s at most).
func (m *Manager) runSupervisor(ctx context.Context, dir string, in supervisorInput) (supervisorReply, error) {
	argv := append(slices.Clone(m.opts.Supervisor), dir)
	scoped := false
	if !m.opts.NoSystemdScope {
		if pre := systemdScope(filepath.Base(dir)); pre != nil {
			argv, scoped = append(pre, argv...), true
		}
	}
	reply, err := m.spawn(ctx, argv, in)
	if err != nil && scoped {
		// systemd-run refused (no bus, no permission): the job still runs, in its own session.
		m.log.Warn("remote job: systemd-run failed; starting it in its own session only", "err", err)
		reply, err = m.spawn(ctx, argv[len(argv)-len(m.opts.Supervisor)-1:], in)
	}
	return reply, err
}

func (m *Manager) spawn(ctx context.Context, argv []string, in supervisorInput) (supervisorReply, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.SysProcAttr = detachedAttr()
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return supervisorReply{}, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return supervisorReply{}, err
	}
	if err := cmd.Start(); err != nil {
		return supervisorReply{}, errcode.Wrap(errcode.Internal, err, "cannot start the job's supervisor: %v", err)
	}
	go func() {
		json.NewEncoder(stdin).Encode(in)
		stdin.Close()
	}()
	line := make(chan []byte, 1)
	read := make(chan struct{})
	go func() {
		defer close(read)
		b, _ := bufio.NewReaderSize(io.LimitReader(stdout, 8<<10), 8<<10).ReadBytes('\n')
		line <- b
	}()
	// The agent reaps its supervisors while it lives; after it is gone, init (or a subreaper)
	// does. Wait closes the stdout pipe, so it waits for the reply line to be read first: a
	// supervisor whose job ends at once may exit before the line is read.
	waited := make(chan error, 1)
	go func() {
		<-read
		waited <- cmd.Wait()
	}()
	timer := time.NewTimer(30 * time.Second)
	defer timer.Stop()
	select {
	case b := <-line:
		var r supervisorReply
		if err := json.Unmarshal(b, &r); err != nil {
			err := <-waited
			return supervisorReply{}, errcode.New(errcode.Internal, "the job's supervisor failed before starting it (%v)", err)
		}
		return r, nil
	case <-timer.C:
	case <-ctx.Done():
	}
	cmd.Process.Kill()
	return supervisorReply{}, errcode.New(errcode.Internal, "the job's supervisor did not report within 30 s; nothing was started")
}

// ids lists the job directories.
func (m *Manager) ids() ([]string, error) {
	ents, err := os.ReadDir(m.opts.Dir)
	if err != nil {
		return nil, errcode.Wrap(errcode.Internal, err, "cannot read the jobs directory: %v", err)
	}
	var ids []string
	for _, e := range ents {
		if e.IsDir() && ValidID(e.Name()) {
			ids = append(ids, e.Name())
		}
	}
	return ids, nil
}

func notFound(id string) error {
	return errcode.New(errcode.JobNotFound, "this machine has no job %s (ids come from remote_job_start; remote_job_list lists them)", id).With("job_id", id)
}

// Status reads a job's state from its files.
func (m *Manager) Status(_ context.Context, id string) (Job, error) {
	if !ValidID(id) {
		return Job{}, notFound(id)
	}
	dir := m.jobDir(id)
	var sp spec
	if err := readJSON(filepath.Join(dir, specFile), &sp); err != nil {
		return Job{}, notFound(id)
	}
	j := Job{JobID: id, Command: sp.Command, Shell: sp.Shell, Cwd: sp.Cwd, EnvNames: sp.EnvNames,
		GPUIndex: sp.GPUIndex, StartedAt: sp.StartedAt}
	if fi, err := os.Stat(filepath.Join(dir, logFile)); err == nil {
		j.LogBytes = fi.Size()
	}
	var p pids
	havePids := readJSON(filepath.Join(dir, pidFile), &p) == nil
	j.PID = p.PID
	var ex exitRecord
	if readJSON(filepath.Join(dir, exitFile), &ex) == nil {
		return ended(j, ex), nil
	}
	if havePids && (alive(p.Supervisor, p.SupervisorStart) || alive(p.PID, p.PIDStart)) {
		j.State, j.Message = StateRunning, "the job is running"
		return j, nil
	}
	// The exit record may have landed between the two reads.
	if readJSON(filepath.Join(dir, exitFile), &ex) == nil {
		return ended(j, ex), nil
	}
	j.State = StateUnknown
	j.Message = "no exit record: the job and its supervisor are gone without one (killed with SIGKILL, the OOM killer, or the machine restarted); its outcome is unknown — do not treat it as a success"
	if !havePids {
		j.Message = "the job never confirmed its start (the agent stopped while starting it); its outcome is unknown — do not treat it as a success"
	}
	return j, nil
}

// ended builds an ended job from its exit record.
func ended(j Job, ex exitRecord) Job {
	t := ex.FinishedAt
	j.FinishedAt, j.Signal = &t, ex.Signal
	switch {
	case ex.Canceled:
		j.State, j.Message = StateCanceled, "the job was canceled (remote_job_cancel)"
	case ex.Signal == "SIGKILL":
		// SIGKILL from outside is what the OOM killer and kill -9 send: nothing says the job
		// finished its work, so it is no exit code at all.
		j.State = StateUnknown
		j.Message = "the job was killed by SIGKILL (kill -9 or the OOM killer), not by remote_job_cancel; its outcome is unknown — do not treat it as a success"
	case ex.Signal != "":
		code := ex.ExitCode
		j.State, j.ExitCode = StateExited, &code
		j.Message = fmt.Sprintf("the job was killed by %s (exit code %d)", ex.Signal, code)
	default:
		code := ex.ExitCode
		j.State, j.ExitCode, j.Success = StateExited, &code, code == 0
		j.Message = fmt.Sprintf("the job exited with code %d", code)
	}
	return j
}

// List returns the newest limit jobs and how many older ones were left out.
func (m *Manager) List(ctx context.Context, limit int) (List, error) {
	if limit < 1 || limit > MaxListLimit {
		return List{}, errcode.New(errcode.InvalidArgument, "limit must be 1–%d, not %d", MaxListLimit, limit)
	}
	ids, err := m.ids()
	if err != nil {
		return List{}, err
	}
	jobs := make([]Job, 0, len(ids))
	for _, id := range ids {
		if j, err := m.Status(ctx, id); err == nil {
			jobs = append(jobs, j)
		}
	}
	slices.SortFunc(jobs, func(a, b Job) int {
		if c := b.StartedAt.Compare(a.StartedAt); c != 0 {
			return c
		}
		return strings.Compare(b.JobID, a.JobID)
	})
	out := List{Jobs: jobs[:min(limit, len(jobs))], Omitted: max(len(jobs)-limit, 0)}
	return out, nil
}

// Logs reads a slice of a job's output.
func (m *Manager) Logs(ctx context.Context, id string, req LogsRequest) (Logs, error) {
	if err := req.Check(); err != nil {
		return Logs{}, err
	}
	j, err := m.Status(ctx, id) // state first: an ended job's slice is of its whole log
	if err != nil {
		return Logs{}, err
	}
	out := Logs{JobID: id, State: j.State, Data: []byte{}}
	f, err := os.Open(filepath.Join(m.jobDir(id), logFile))
	if errors.Is(err, os.ErrNotExist) {
		return out, nil
	}
	if err != nil {
		return Logs{}, errcode.Wrap(errcode.Internal, err, "cannot open the job's log: %v", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return Logs{}, errcode.Wrap(errcode.Internal, err, "cannot stat the job's log: %v", err)
	}
	total, limit := fi.Size(), int64(req.MaxBytes)
	var start int64
	if req.Offset != nil {
		start = min(*req.Offset, total)
	} else {
		start = max(total-limit, 0)
	}
	data := make([]byte, min(limit, total-start))
	n, err := f.ReadAt(data, start)
	if err != nil && !errors.Is(err, io.EOF) {
		return Logs{}, errcode.Wrap(errcode.Internal, err, "cannot read the job's log: %v", err)
	}
	data = data[:n]
	if req.Offset == nil {
		data, start = lastLines(data, start, req.TailLines)
	}
	out.Data, out.Offset, out.NextOffset, out.TotalBytes = data, start, start+int64(len(data)), total
	return out, nil
}

// lastLines keeps the last n lines of data (a final newline ends the last line).
func lastLines(data []byte, start int64, n int) ([]byte, int64) {
	end := len(data)
	if end > 0 && data[end-1] == '\n' {
		end--
	}
	for i, seen := end-1, 0; i >= 0; i-- {
		if data[i] == '\n' {
			if seen++; seen == n {
				return data[i+1:], start + int64(i+1)
			}
		}
	}
	return data, start
}

// Cancel ends a running job's whole process tree: SIGTERM, then SIGKILL after grace. It
// returns the job once it ended (canceled, or how it ended first).
func (m *Manager) Cancel(ctx context.Context, id string, grace time.Duration) (Job, error) {
	if err := jobmodel.CheckGrace(grace); err != nil {
		return Job{}, err
	}
	j, err := m.Status(ctx, id)
	if err != nil || j.Ended() {
		return j, err
	}
	dir := m.jobDir(id)
	var p pids
	if err := readJSON(filepath.Join(dir, pidFile), &p); err != nil {
		return j, nil
	}
	m.mu.Lock()
	err = os.WriteFile(filepath.Join(dir, cancelFile), nil, 0o600)
	m.mu.Unlock()
	if err != nil {
		return Job{}, errcode.Wrap(errcode.Internal, err, "cannot mark the job canceled: %v", err)
	}
	// The tree is gone when the job has ended and nothing is left below its supervisor (on
	// Linux, orphans of the tree are reparented to the supervisor, which stays to reap them).
	gone := func() bool {
		j, err := m.Status(ctx, id)
		return err != nil || (j.Ended() && len(treeOf(p)) == 0)
	}
	waitGone := func(d time.Duration) bool {
		for deadline := time.Now().Add(d); ; time.Sleep(20 * time.Millisecond) {
			if gone() {
				return true
			}
			if time.Now().After(deadline) || ctx.Err() != nil {
				return false
			}
		}
	}
	if grace > 0 {
		killTree(p, false)
		waitGone(grace)
	}
	if !gone() {
		killTree(p, true)
		waitGone(10 * time.Second)
	}
	j, err = m.Status(ctx, id)
	if err == nil && !j.Ended() {
		return j, errcode.New(errcode.Internal, "the job's processes did not die within 10 s of SIGKILL")
	}
	return j, err
}

// writeJSONAtomic writes v to path through a synced temp file and a rename.
func writeJSONAtomic(path string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// readJSON reads a small JSON file (at most 64 KiB).
func readJSON(path string, v any) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, 64<<10))
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

// Validate checks a start request as the machine will (the server checks before it records
// anything).
func Validate(req StartRequest) error { return validate(req) }
