//go:build unix

package guest

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/text"
)

const (
	// maxJobStartBody bounds a job start request: argv (MaxJobArgvBytes) and env.
	maxJobStartBody = 1 << 20
	// maxRetainedJobs bounds the finished jobs the agent remembers; past it the oldest finished
	// one is forgotten (its files stay on the disk).
	maxRetainedJobs = 4096
	// jobDrainGrace is how long a job's output is still read after its main process exited:
	// background children may hold the pipes open indefinitely.
	jobDrainGrace = 500 * time.Millisecond
	// jobPoll is how often a cancel checks whether the job's tree is gone within its grace.
	jobPoll = 10 * time.Millisecond
)

// jobManager holds the agent's jobs.
type jobManager struct {
	dir string
	// temp: dir is the embedded agent's own, removed when Run returns.
	temp bool
	// kill is closed when the agent shuts down: every running job is killed.
	kill chan struct{}
	// draining is closed when the agent starts to shut down: log reads waiting for output
	// (wait_ms) answer with what they have, so they never hold the shutdown.
	draining  chan struct{}
	drainOnce sync.Once
	wg        sync.WaitGroup

	mu       sync.Mutex
	byID     map[string]*job
	order    []*job // oldest first
	pending  map[string]bool
	running  int
	stopping bool
}

// job is one detached command.
type job struct {
	id      string
	argv    []string
	started time.Time
	dir     string // its files; "" when none could be created (the disk was full)
	// cancel carries the grace of the first cancel to the job's goroutine.
	cancel chan time.Duration
	done   chan struct{}

	logMu    sync.Mutex
	out      *os.File
	streams  map[string]*os.File
	logBytes atomic.Int64
	trunc    atomic.Bool

	// grown is closed, and cleared, after each write to the logs: a log read that long-polls
	// (wait_ms) takes it before reading and waits on it (logGrown).
	growMu sync.Mutex
	grown  chan struct{}

	mu    sync.Mutex
	final *JobInfo // set once, before done is closed

	// pid and tree find the job's processes for CPU samples (pid 0: none, it never started);
	// set before the job is added, never changed. cpuNanos is the largest sample so far.
	pid      int
	tree     processTree
	cpuNanos atomic.Int64
}

// sampleCPU samples the CPU time of the job's live processes and returns the largest sample
// so far (a process that ended without being waited for takes its time with it; the job's
// time never goes down).
func (j *job) sampleCPU() time.Duration {
	if j.pid > 0 {
		if n, ok := jobCPU(j.pid, j.tree.tag, j.tree.since); ok {
			j.sampled(n)
		}
	}
	return time.Duration(j.cpuNanos.Load())
}

// sampled records a CPU sample n of the job, kept if it is the largest so far.
func (j *job) sampled(n time.Duration) {
	for {
		old := j.cpuNanos.Load()
		if int64(n) <= old || j.cpuNanos.CompareAndSwap(old, int64(n)) {
			return
		}
	}
}

// sampleJobsCPU samples the CPU time of every running job of jobs in one pass over /proc.
func sampleJobsCPU(jobs []*job) {
	var trees []cpuTree
	var running []*job
	for _, j := range jobs {
		j.mu.Lock()
		fin := j.final != nil
		j.mu.Unlock()
		if !fin && j.pid > 0 {
			trees = append(trees, cpuTree{pid: j.pid, tree: j.tree})
			running = append(running, j)
		}
	}
	if len(trees) == 0 {
		return
	}
	if d, ok := jobsCPU(trees); ok {
		for i, j := range running {
			j.sampled(d[i])
		}
	}
}

// cpuSeconds is d in seconds, to the millisecond.
func cpuSeconds(d time.Duration) float64 { return math.Round(d.Seconds()*1000) / 1000 }

// initJobs sets up the jobs of a Run and loads the finished jobs a previous agent recorded.
func (s *server) initJobs(cfg ServerConfig) error {
	m := &jobManager{dir: cfg.JobsDir, kill: make(chan struct{}), draining: make(chan struct{}), byID: map[string]*job{}, pending: map[string]bool{}}
	if m.dir == "" && cfg.Embedded {
		d, err := os.MkdirTemp("", "agentbox-jobs-")
		if err != nil {
			return fmt.Errorf("guest: jobs dir: %w", err)
		}
		m.dir, m.temp = d, true
	} else if m.dir == "" {
		m.dir = DefaultJobsDir
	}
	if err := os.MkdirAll(m.dir, 0o700); err != nil {
		s.log.Warn("guest: cannot create the jobs directory; jobs will be refused", "dir", m.dir, "err", err)
	}
	s.jobs = m
	m.load(s)
	return nil
}

// load reads the exit records of the jobs in the jobs dir (a restarted agent's sandbox).
// A job without one was still running when its agent ended: it is not known here.
func (m *jobManager) load(s *server) {
	ents, err := os.ReadDir(m.dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		if !e.IsDir() || ValidJobID(e.Name()) != nil {
			continue
		}
		b, err := readSmall(filepath.Join(m.dir, e.Name(), "exit.json"), maxJobInfoReply)
		if err != nil {
			continue
		}
		var ji JobInfo
		if json.Unmarshal(b, &ji) != nil || validJobInfo(&ji) != nil || ji.JobID != e.Name() || ji.State == JobRunning {
			s.log.Warn("guest: ignoring a job's unreadable exit record", "job_id", e.Name())
			continue
		}
		j := &job{id: ji.JobID, argv: ji.Argv, started: ji.StartedAt, dir: filepath.Join(m.dir, ji.JobID), final: &ji, done: make(chan struct{})}
		close(j.done)
		m.byID[j.id] = j
		m.order = append(m.order, j)
	}
	slices.SortStableFunc(m.order, func(a, b *job) int { return a.started.Compare(b.started) })
	for len(m.order) > maxRetainedJobs {
		delete(m.byID, m.order[0].id)
		m.order = m.order[1:]
	}
}

func readSmall(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err == nil && int64(len(b)) > limit {
		err = errors.New("too large")
	}
	return b, err
}

// drain releases the log reads waiting for output (the agent is shutting down).
func (m *jobManager) drain() { m.drainOnce.Do(func() { close(m.draining) }) }

// stopJobs kills the jobs still running (the sandbox is ending) and waits for their records.
func (s *server) stopJobs() {
	m := s.jobs
	m.mu.Lock()
	m.stopping = true
	m.mu.Unlock()
	close(m.kill)
	done := make(chan struct{})
	go func() { m.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(2*killWait + jobDrainGrace):
		s.log.Warn("guest: jobs still ending at shutdown")
	}
	if m.temp {
		_ = os.RemoveAll(m.dir)
	}
}

func (s *server) jobRoutes(mux *http.ServeMux, p string) {
	mux.HandleFunc("POST "+p+"/jobs", s.handleJobStart)
	mux.HandleFunc("GET "+p+"/jobs", s.handleJobList)
	mux.HandleFunc("GET "+p+"/jobs/{id}", s.handleJobGet)
	mux.HandleFunc("GET "+p+"/jobs/{id}/logs", s.handleJobLogs)
	mux.HandleFunc("GET "+p+"/jobs/{id}/wait", s.handleJobWait)
	mux.HandleFunc("POST "+p+"/jobs/{id}/cancel", s.handleJobCancel)
}

func (m *jobManager) get(id string) (*job, error) {
	if err := ValidJobID(id); err != nil {
		return nil, errcode.New(errcode.InvalidArgument, "%v", err)
	}
	m.mu.Lock()
	j := m.byID[id]
	m.mu.Unlock()
	if j == nil {
		return nil, errcode.New(errcode.JobNotFound, "job %s does not exist in this sandbox", id).With("job_id", id)
	}
	return j, nil
}

// info is the job's status now.
func (j *job) info() JobInfo { return j.status(true) }

// status is the job's status now; sample reads its CPU time from /proc first, else it reports
// the last sample (a list samples every job in one pass: sampleJobsCPU).
func (j *job) status(sample bool) JobInfo {
	j.mu.Lock()
	fin := j.final
	j.mu.Unlock()
	if fin != nil {
		return *fin
	}
	cpu := time.Duration(j.cpuNanos.Load())
	if sample {
		cpu = j.sampleCPU() // outside the lock: it reads /proc
	}
	return JobInfo{JobID: j.id, Argv: j.argv, State: JobRunning, StartedAt: j.started, LogBytes: j.logBytes.Load(), LogTruncated: j.trunc.Load(),
		CPUSeconds: cpuSeconds(cpu)}
}

func (s *server) handleJobStart(w http.ResponseWriter, r *http.Request) {
	var req JobStartRequest
	if err := decodeJSON(w, r, maxJobStartBody, &req); err != nil {
		s.writeError(w, err)
		return
	}
	if err := ValidJobID(req.JobID); err != nil {
		s.writeError(w, errcode.New(errcode.InvalidArgument, "%v", err))
		return
	}
	if n := argvBytes(req.Argv); len(req.Argv) > MaxJobArgs || n > MaxJobArgvBytes {
		s.writeError(w, errcode.New(errcode.InvalidArgument, "argv has %d arguments of %d bytes; a job's argv may have 1 to %d arguments of at most %d bytes in all (write a script to a file and run it)",
			len(req.Argv), n, MaxJobArgs, MaxJobArgvBytes))
		return
	}
	sp, err := s.prepareExec(&ExecRequest{Argv: req.Argv, Env: req.Env, Cwd: req.Cwd, User: req.User})
	if err != nil {
		s.writeError(w, err)
		return
	}
	j, err := s.startJob(req.JobID, sp)
	if err != nil {
		s.writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, j.info())
}

// startJob starts sp as job id, detached from the request.
func (s *server) startJob(id string, sp *execSpec) (*job, error) {
	m := s.jobs
	m.mu.Lock()
	switch {
	case m.stopping:
		m.mu.Unlock()
		return nil, errcode.New(errcode.CapacityUnavailable, "the sandbox's agent is shutting down; no job can start")
	case m.byID[id] != nil || m.pending[id]:
		m.mu.Unlock()
		return nil, errcode.New(errcode.Conflict, "job %s already exists in this sandbox", id).With("job_id", id)
	case m.running >= MaxRunningJobs:
		m.mu.Unlock()
		return nil, errcode.New(errcode.JobLimitExceeded, "%d jobs are already running in this sandbox, the most it runs at once; wait for one to end or cancel one", m.running).
			With("limit", MaxRunningJobs)
	}
	m.running++
	m.pending[id] = true
	m.mu.Unlock()
	started := false
	defer func() {
		m.mu.Lock()
		delete(m.pending, id)
		if !started {
			m.running--
		}
		m.mu.Unlock()
	}()

	j := &job{id: id, argv: slices.Clone(sp.argv), started: time.Now().UTC(), cancel: make(chan time.Duration, 1), done: make(chan struct{})}
	if err := j.openLogs(s, filepath.Join(m.dir, id)); err != nil {
		return nil, err
	}
	if sp.failCode != 0 {
		j.record("stderr", []byte(sp.failMsg))
		code := sp.failCode
		started = true
		s.addJob(j)
		m.wg.Add(1)
		go func() { defer m.wg.Done(); s.finishJob(j, JobInfo{State: JobExited, ExitCode: &code}) }()
		return j, nil
	}

	outR, outW, err := os.Pipe()
	if err != nil {
		j.closeLogs(true)
		return nil, errcode.Wrap(errcode.Internal, err, "cannot create the stdout pipe: %v", err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		_, _ = outR.Close(), outW.Close()
		j.closeLogs(true)
		return nil, errcode.Wrap(errcode.Internal, err, "cannot create the stderr pipe: %v", err)
	}
	null, err := os.Open(os.DevNull)
	if err != nil {
		_, _, _, _ = outR.Close(), outW.Close(), errR.Close(), errW.Close()
		j.closeLogs(true)
		return nil, errcode.Wrap(errcode.Internal, err, "cannot open %s: %v", os.DevNull, err)
	}
	attr := &os.ProcAttr{Dir: sp.dir, Env: sp.env, Files: []*os.File{null, outW, errW}, Sys: s.procAttr(&syscall.SysProcAttr{Setpgid: true})}
	tree := processTree{since: bootTicks()}
	if s.root {
		// As exec: the job's credentials, and an exec tag its whole tree carries.
		tree.tag = s.reaper.tags.acquire()
		cred := &syscall.Credential{Uid: uint32(os.Geteuid()), Gid: uint32(os.Getegid()), Groups: []uint32{}}
		if sp.user != nil {
			cred.Uid, cred.Gid = sp.user.UID, sp.user.GID
		}
		if tree.tag != 0 {
			cred.Groups = []uint32{tree.tag}
		}
		attr.Sys.Credential = cred
	}
	oomBefore := s.oomKills()
	ru := new(unix.Rusage)
	pid, waitCh, err := s.reaper.startRusage(sp.path, sp.argv, attr, ru)
	_, _, _ = null.Close(), outW.Close(), errW.Close()
	if err != nil {
		_, _ = outR.Close(), errR.Close()
		s.reaper.tags.release(tree.tag)
		if errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.ENOMEM) {
			j.closeLogs(true)
			return nil, errcode.Wrap(errcode.CapacityUnavailable, err, "cannot start the job: the sandbox is out of processes or memory (%v)", unwrapPathErr(err))
		}
		code, why := startFailure(err)
		j.record("stderr", fmt.Appendf(nil, "agentbox: %s: %s\n", sp.argv[0], why))
		started = true
		s.addJob(j)
		m.wg.Add(1)
		go func() { defer m.wg.Done(); s.finishJob(j, JobInfo{State: JobExited, ExitCode: &code}) }()
		return j, nil
	}
	started = true
	j.pid, j.tree = pid, tree
	s.addJob(j)
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		s.runJob(j, pid, tree, waitCh, ru, outR, errR, oomBefore)
	}()
	return j, nil
}

// addJob records a started job, forgetting the oldest finished one past maxRetainedJobs.
func (s *server) addJob(j *job) {
	m := s.jobs
	m.mu.Lock()
	defer m.mu.Unlock()
	m.byID[j.id] = j
	m.order = append(m.order, j)
	if len(m.order) <= maxRetainedJobs {
		return
	}
	for i, old := range m.order {
		select {
		case <-old.done:
			delete(m.byID, old.id)
			m.order = slices.Delete(m.order, i, i+1)
			return
		default:
		}
	}
}

// openLogs creates the job's directory and its three log files. A full disk leaves the job
// without logs (log_truncated); any other failure refuses it.
func (j *job) openLogs(s *server, dir string) error {
	full := func(err error) bool { return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) }
	if err := os.Mkdir(dir, 0o700); err != nil {
		switch {
		case errors.Is(err, os.ErrExist):
			return errcode.New(errcode.Conflict, "job %s already exists in this sandbox (its files are in place)", j.id).With("job_id", j.id)
		case full(err):
			s.log.Warn("guest: the disk is full; the job runs without logs", "job_id", j.id)
			j.trunc.Store(true)
			return nil
		}
		return errcode.Wrap(errcode.Internal, err, "cannot create the job's directory: %v", unwrapPathErr(err))
	}
	j.dir = dir
	j.streams = map[string]*os.File{}
	for _, name := range []string{"output", "stdout", "stderr"} {
		f, err := os.OpenFile(filepath.Join(dir, name), os.O_WRONLY|os.O_CREATE|os.O_EXCL|os.O_APPEND, 0o600)
		if err != nil {
			if full(err) {
				s.log.Warn("guest: the disk is full; the job runs without logs", "job_id", j.id)
				j.trunc.Store(true)
				return nil
			}
			j.closeLogs(true)
			return errcode.Wrap(errcode.Internal, err, "cannot create the job's log: %v", unwrapPathErr(err))
		}
		if name == "output" {
			j.out = f
		} else {
			j.streams[name] = f
		}
	}
	return nil
}

// closeLogs closes the log files, and with remove deletes the job's directory (a job that
// never started).
func (j *job) closeLogs(remove bool) {
	j.logMu.Lock()
	defer j.logMu.Unlock()
	if j.out != nil {
		_ = j.out.Close()
		j.out = nil
	}
	for k, f := range j.streams {
		_ = f.Close()
		delete(j.streams, k)
	}
	if remove && j.dir != "" {
		_ = os.RemoveAll(j.dir)
	}
}

// record appends output of stream to the interleaved log and the stream's own, then wakes the
// log reads waiting for output. The first write error (a full disk) stops the logging for good;
// the job runs on.
func (j *job) record(stream string, p []byte) {
	j.logMu.Lock()
	if j.trunc.Load() || j.out == nil {
		j.logMu.Unlock()
		return
	}
	n, err := j.out.Write(p)
	j.logBytes.Add(int64(n))
	if err == nil {
		_, err = j.streams[stream].Write(p)
	}
	if err != nil {
		j.trunc.Store(true)
	}
	j.logMu.Unlock()
	j.growMu.Lock()
	if j.grown != nil {
		close(j.grown)
		j.grown = nil
	}
	j.growMu.Unlock()
}

// logGrown returns a channel closed at the next write to the job's logs. Taken before a read of
// the log, it misses no write the read did not see.
func (j *job) logGrown() <-chan struct{} {
	j.growMu.Lock()
	defer j.growMu.Unlock()
	if j.grown == nil {
		j.grown = make(chan struct{})
	}
	return j.grown
}

// logState returns the job's state and whether its logging stopped, without sampling its CPU.
func (j *job) logState() (state string, trunc bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.final != nil {
		return j.final.State, j.final.LogTruncated
	}
	return JobRunning, j.trunc.Load()
}

// pumpJob reads f until EOF, error or deadline, logging every chunk.
func (j *job) pump(f *os.File, stream string) {
	buf := make([]byte, chunkSize)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			j.record(stream, buf[:n])
		}
		if err != nil {
			return
		}
	}
}

// runJob logs the job's output until it ends, by itself, by a cancel or by the agent's end,
// then records how it ended.
func (s *server) runJob(j *job, pid int, tree processTree, waitCh <-chan unix.WaitStatus, ru *unix.Rusage, outR, errR *os.File, oomBefore int64) {
	defer s.reaper.tags.release(tree.tag)
	var wg sync.WaitGroup
	wg.Go(func() { j.pump(outR, "stdout") })
	wg.Go(func() { j.pump(errR, "stderr") })
	var ws unix.WaitStatus
	canceled, shutdown := false, false
	select {
	case ws = <-waitCh:
	case grace := <-j.cancel:
		canceled = true
		ws = s.cancelTree(pid, tree, waitCh, grace)
	case <-s.jobs.kill:
		shutdown = true
		ws = s.killTree(pid, tree, waitCh)
	}
	oomKilled := s.endedForMemory(pid, tree, ws, canceled || shutdown, oomBefore)
	// The reaper wrote *ru before it delivered the status (zero only when a kill gave up
	// waiting for it): the job's CPU time is that or the last sample, whichever is more.
	got := s.reaper.rusage(ru)
	cpu := max(time.Duration(got.Utime.Nano()+got.Stime.Nano()), time.Duration(j.cpuNanos.Load()))
	deadline := time.Now().Add(jobDrainGrace)
	_ = outR.SetReadDeadline(deadline)
	_ = errR.SetReadDeadline(deadline)
	wg.Wait()
	_, _ = outR.Close(), errR.Close()

	fin := JobInfo{CPUSeconds: cpuSeconds(cpu)}
	switch {
	case ws.Exited():
		code := ws.ExitStatus()
		fin.State, fin.ExitCode = JobExited, &code
	case ws.Signaled():
		sig := ws.Signal()
		fin.State, fin.Signal = JobKilled, unix.SignalName(sig)
		if fin.Signal == "" {
			fin.Signal = fmt.Sprintf("SIG%d", int(sig))
		}
		fin.OOMKilled = oomKilled
	default:
		fin.State, fin.Signal = JobKilled, "SIGKILL"
	}
	if canceled {
		fin.State, fin.OOMKilled = JobCanceled, false
	}
	s.finishJob(j, fin)
}

// finishJob records the job's end: fin's state, exit code and signal.
func (s *server) finishJob(j *job, fin JobInfo) {
	j.closeLogs(false)
	now := time.Now().UTC()
	fin.JobID, fin.Argv, fin.StartedAt, fin.FinishedAt = j.id, j.argv, j.started, &now
	fin.LogBytes, fin.LogTruncated = j.logBytes.Load(), j.trunc.Load()
	if j.dir != "" {
		if err := writeExitRecord(j.dir, fin); err != nil {
			s.log.Warn("guest: cannot write a job's exit record", "job_id", j.id, "err", err)
		}
	}
	j.mu.Lock()
	j.final = &fin
	j.mu.Unlock()
	m := s.jobs
	m.mu.Lock()
	m.running--
	m.mu.Unlock()
	close(j.done)
}

// writeExitRecord writes exit.json atomically: a temp file, then a rename.
func writeExitRecord(dir string, fin JobInfo) error {
	b, err := json.Marshal(fin)
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, ".exit.json.tmp")
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, "exit.json"))
	}
	if err != nil {
		_ = os.Remove(tmp)
	}
	return err
}

// cancelTree sends SIGTERM to the job's tree (see cmdTree), waits up to grace for all of it to
// be gone, then freezes and kills what is left (see killTree). It returns the main process's
// status once nothing of the tree runs.
func (s *server) cancelTree(pid int, tree processTree, waitCh <-chan unix.WaitStatus, grace time.Duration) unix.WaitStatus {
	ct := newCmdTree(pid, tree)
	ct.signal(unix.SIGTERM)
	deadline := time.Now().Add(grace)
	var ws unix.WaitStatus
	exited := false
	t := time.NewTicker(jobPoll)
	defer t.Stop()
	for time.Now().Before(deadline) {
		if !exited {
			select {
			case ws = <-waitCh:
				exited = true
			case <-t.C:
			}
		} else {
			<-t.C
		}
		// Each scan remembers the tree's members, so one that its parent's exit hands to PID 1
		// during the grace is still found by the kill.
		if alive := ct.alive(); exited && !alive {
			return ws
		}
	}
	if exited {
		// The main process is gone; endTree still has its status to hand back.
		ch := make(chan unix.WaitStatus, 1)
		ch <- ws
		waitCh = ch
	}
	return s.endTree(ct, waitCh)
}

func (s *server) handleJobList(w http.ResponseWriter, _ *http.Request) {
	m := s.jobs
	m.mu.Lock()
	jobs := make([]*job, 0, min(len(m.order), MaxJobList))
	for i := len(m.order) - 1; i >= 0 && len(jobs) < MaxJobList; i-- {
		jobs = append(jobs, m.order[i])
	}
	m.mu.Unlock()
	sampleJobsCPU(jobs) // one pass over /proc for them all, not one per job
	list := JobList{Jobs: make([]JobInfo, len(jobs))}
	for i, j := range jobs {
		list.Jobs[i] = j.status(false)
	}
	writeJSON(w, http.StatusOK, list)
}

func (s *server) handleJobGet(w http.ResponseWriter, r *http.Request) {
	j, err := s.jobs.get(r.PathValue("id"))
	if err != nil {
		s.writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, j.info())
}

// intArg parses the query argument name as an integer in [lo, hi]; absent, it is def.
func intArg(r *http.Request, name string, lo, hi, def int64) (int64, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < lo || n > hi {
		return 0, errcode.New(errcode.InvalidArgument, "%s must be an integer from %d to %d, got %q", name, lo, hi, text.Cut(v, 32)).With("argument", name)
	}
	return n, nil
}

func (s *server) handleJobWait(w http.ResponseWriter, r *http.Request) {
	timeout, err := intArg(r, "timeout_ms", 0, MaxJobWait.Milliseconds(), 0)
	if err != nil {
		s.writeError(w, err)
		return
	}
	j, err := s.jobs.get(r.PathValue("id"))
	if err != nil {
		s.writeError(w, err)
		return
	}
	t := time.NewTimer(time.Duration(timeout) * time.Millisecond)
	defer t.Stop()
	select {
	case <-j.done:
	case <-t.C:
	case <-r.Context().Done():
		return
	}
	writeJSON(w, http.StatusOK, j.info())
}

func (s *server) handleJobCancel(w http.ResponseWriter, r *http.Request) {
	var req JobCancelRequest
	if r.ContentLength != 0 {
		if err := decodeJSON(w, r, 4<<10, &req); err != nil {
			s.writeError(w, err)
			return
		}
	}
	grace := DefaultJobCancelGrace
	if req.GraceMs != nil {
		if *req.GraceMs < 0 || *req.GraceMs > MaxJobCancelGrace.Milliseconds() {
			s.writeError(w, errcode.New(errcode.InvalidArgument, "grace_ms must be from 0 to %d, got %d", MaxJobCancelGrace.Milliseconds(), *req.GraceMs).With("argument", "grace_ms"))
			return
		}
		grace = time.Duration(*req.GraceMs) * time.Millisecond
	}
	j, err := s.jobs.get(r.PathValue("id"))
	if err != nil {
		s.writeError(w, err)
		return
	}
	select {
	case <-j.done: // finished: its status as it is
	default:
		select {
		case j.cancel <- grace:
		default: // a cancel is already under way: wait for it
		}
		select {
		case <-j.done:
		case <-r.Context().Done():
			return
		}
	}
	writeJSON(w, http.StatusOK, j.info())
}

func (s *server) handleJobLogs(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	stream := q.Get("stream")
	file := map[string]string{"": "output", JobStreamAll: "output", JobStreamStdout: "stdout", JobStreamStderr: "stderr"}[stream]
	if file == "" {
		s.writeError(w, errcode.New(errcode.InvalidArgument, `stream must be "all", "stdout" or "stderr", got %q`, text.Cut(stream, 32)).With("argument", "stream"))
		return
	}
	offset, err := intArg(r, "offset", 0, 1<<62, 0)
	if err != nil {
		s.writeError(w, err)
		return
	}
	maxBytes, err := intArg(r, "max", 1, MaxJobLogBytes, MaxJobLogBytes)
	if err != nil {
		s.writeError(w, err)
		return
	}
	tail, err := intArg(r, "tail_lines", 1, MaxJobTailLines, 0)
	if err != nil {
		s.writeError(w, err)
		return
	}
	if tail > 0 && q.Get("offset") != "" {
		s.writeError(w, errcode.New(errcode.InvalidArgument, "tail_lines and offset exclude each other: pass one").With("argument", "offset"))
		return
	}
	waitMs, err := intArg(r, "wait_ms", 0, MaxJobLogWait.Milliseconds(), 0)
	if err != nil {
		s.writeError(w, err)
		return
	}
	if waitMs > 0 && tail > 0 {
		s.writeError(w, errcode.New(errcode.InvalidArgument, "wait_ms waits for output past offset: it and tail_lines exclude each other").With("argument", "wait_ms"))
		return
	}
	j, err := s.jobs.get(r.PathValue("id"))
	if err != nil {
		s.writeError(w, err)
		return
	}
	var timeout <-chan time.Time
	if waitMs > 0 {
		t := time.NewTimer(time.Duration(waitMs) * time.Millisecond)
		defer t.Stop()
		timeout = t.C
	}
	for {
		var grown <-chan struct{}
		if timeout != nil {
			grown = j.logGrown() // before the read: a write after it wakes this request
		}
		logs, err := j.readLog(file, offset, maxBytes, int(tail))
		if err != nil {
			s.writeError(w, err)
			return
		}
		if timeout == nil || len(logs.Data) > 0 || logs.State != JobRunning {
			writeJSON(w, http.StatusOK, logs)
			return
		}
		// Nothing past offset and the job runs: wait for a write, its end, the bound, or the
		// agent's shutdown.
		select {
		case <-grown:
		case <-j.done:
		case <-timeout:
			timeout = nil // one more read, then the (empty) reply
		case <-s.jobs.draining:
			timeout = nil
		case <-r.Context().Done():
			return
		}
	}
}

// readLog reads a slice of one of the job's logs: from offset, at most limit bytes; or, with
// tail > 0, the last tail lines (at most limit bytes of them, the end kept).
//
// Its State is read before the data: an ended job's slice is of its whole log.
func (j *job) readLog(name string, offset, limit int64, tail int) (JobLogs, error) {
	state, trunc := j.logState()
	if j.dir == "" {
		return JobLogs{Data: []byte{}, Truncated: trunc, State: state}, nil
	}
	f, err := os.Open(filepath.Join(j.dir, name))
	if errors.Is(err, os.ErrNotExist) {
		return JobLogs{Data: []byte{}, Truncated: trunc, State: state}, nil
	}
	if err != nil {
		return JobLogs{}, errcode.Wrap(errcode.Internal, err, "cannot open the job's log: %v", unwrapPathErr(err))
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return JobLogs{}, errcode.Wrap(errcode.Internal, err, "cannot stat the job's log: %v", err)
	}
	total := fi.Size()
	start := min(offset, total)
	if tail > 0 {
		start = max(total-limit, 0)
	}
	data := make([]byte, min(limit, total-start))
	n, err := f.ReadAt(data, start)
	if err != nil && !errors.Is(err, io.EOF) {
		return JobLogs{}, errcode.Wrap(errcode.Internal, err, "cannot read the job's log: %v", err)
	}
	data = data[:n]
	if tail > 0 {
		// The last tail lines of the window: a final newline ends the last line.
		end := len(data)
		if end > 0 && data[end-1] == '\n' {
			end--
		}
		cut := 0
		for i, seen := end-1, 0; i >= 0; i-- {
			if data[i] == '\n' {
				if seen++; seen == tail {
					cut = i + 1
					break
				}
			}
		}
		data, start = data[cut:], start+int64(cut)
	}
	return JobLogs{Data: data, Offset: start, NextOffset: start + int64(len(data)), TotalBytes: total, Truncated: trunc, State: state}, nil
}
