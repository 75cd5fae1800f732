//go:build unix

package guest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errcode"
)

const (
	// MaxTimeout caps timeout_ms.
	maxTimeout = 24 * time.Hour
	// chunkSize is the largest piece of output read (and streamed) at once.
	chunkSize = 32 << 10
	// drainGrace is how long output is still waited for, once the command's main process has
	// exited, after the last read that found some (background children may hold the pipes open
	// indefinitely); drainMax bounds the whole drain, for a child that keeps writing.
	drainGrace = 100 * time.Millisecond
	drainMax   = 5 * time.Second
	// killWait bounds the wait for a SIGKILLed process to be reaped (a process stuck in
	// uninterruptible sleep cannot die until the kernel lets it).
	killWait = 10 * time.Second
	// frameWriteTimeout bounds the write of one streamed frame: a client that stops reading
	// must not stall the command forever.
	frameWriteTimeout = 60 * time.Second
	// maxExecBody bounds an exec request: stdin (base64 in JSON) plus room for argv and env.
	maxExecBody = MaxStdinBytes/3*4 + 4 + 4<<20
	// defaultPath is the search path when the environment has no PATH (as a shell would).
	defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	ndjson      = "application/x-ndjson"
)

// execSpec is a validated exec request.
type execSpec struct {
	argv  []string
	path  string // the program to execute
	env   []string
	dir   string
	stdin []byte
	// stdinFile, when set, is the read end of a pipe the caller feeds (stdin.go): the command's
	// stdin instead of stdin.
	stdinFile *os.File
	timeout   time.Duration
	maxOut    int64
	// user is who runs the command; nil runs it as the agent itself.
	user *User
	// failCode, when non-zero, is the exit status of a command that cannot be started (127 not
	// found, 126 not executable); failMsg is its stderr. Like a shell, this is a result.
	failCode int
	failMsg  string
}

func (s *server) handleExec(w http.ResponseWriter, r *http.Request) {
	var req ExecRequest
	if err := decodeJSON(w, r, maxExecBody, &req); err != nil {
		s.writeError(w, err)
		return
	}
	sp, err := s.prepareExec(&req)
	if err != nil {
		s.writeError(w, err)
		return
	}
	if !req.Stream {
		res, err := s.runExec(r.Context(), sp, nil)
		if err != nil {
			s.writeError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, res)
		return
	}
	s.streamExec(w, r, sp)
}

// streamExec runs the command and writes NDJSON frames: output chunks as they are read, then
// exactly one Result or Error frame.
func (s *server) streamExec(w http.ResponseWriter, r *http.Request, sp *execSpec) {
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	h := w.Header()
	h.Set("Content-Type", ndjson)
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	// The connection may be reused by a later request: leave no deadline behind.
	defer func() { _ = rc.SetWriteDeadline(time.Time{}) }()
	enc := json.NewEncoder(w)
	alive := rc.Flush() == nil
	// send writes a frame, and flushes unless more are already waiting (they follow at once).
	send := func(f Frame, more bool) {
		if !alive {
			return
		}
		_ = rc.SetWriteDeadline(time.Now().Add(frameWriteTimeout))
		if err := enc.Encode(f); err != nil {
			alive = false
		} else if !more {
			alive = rc.Flush() == nil
		}
		if !alive {
			cancel() // nobody is listening: kill the command
		}
	}

	frames, done := s.startExec(ctx, sp)
	// Always drain frames until runExec is done, so the output readers never block for good.
	for f := range frames {
		send(f, len(frames) > 0)
	}
	o := <-done
	if o.err != nil {
		eb := errorBody(o.err)
		send(Frame{Error: &eb}, false)
		return
	}
	send(Frame{Result: &o.res}, false)
}

// execOutcome is how a command run by startExec ended.
type execOutcome struct {
	res ExecResult
	err error
}

// startExec runs sp in the background: its output comes as frames (closed when it ends), then
// its outcome; a panic in the run is its outcome's error, not the agent's end.
func (s *server) startExec(ctx context.Context, sp *execSpec) (<-chan Frame, <-chan execOutcome) {
	frames := make(chan Frame, 16)
	done := make(chan execOutcome, 1)
	go func() {
		var o execOutcome
		defer func() {
			if v := recover(); v != nil {
				s.log.Error("guest: exec panic", "panic", v)
				o = execOutcome{err: errcode.New(errcode.Internal, "the agent hit an internal error (%v); see its log", v)}
			}
			close(frames)
			done <- o
		}()
		o.res, o.err = s.runExec(ctx, sp, frames)
	}()
	return frames, done
}

// prepareExec validates req and resolves the program, cwd and environment.
func (s *server) prepareExec(req *ExecRequest) (*execSpec, error) {
	inv := func(format string, args ...any) error { return errcode.New(errcode.InvalidArgument, format, args...) }
	if len(req.Argv) == 0 {
		return nil, inv(`argv is empty: pass the command and its arguments, e.g. ["ls", "-l"] (no shell is involved; use ["sh", "-c", "..."] for shell syntax)`)
	}
	if req.Argv[0] == "" {
		return nil, inv("argv[0] is empty: it must name the command to run")
	}
	for i, a := range req.Argv {
		if strings.IndexByte(a, 0) >= 0 {
			return nil, inv("argv[%d] contains a NUL byte", i)
		}
	}
	for k, v := range req.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return nil, inv("env key %q is invalid: it must be non-empty and contain no '=' or NUL", k)
		}
		if strings.IndexByte(v, 0) >= 0 {
			return nil, inv("env value of %s contains a NUL byte", k)
		}
	}
	if len(req.Stdin) > MaxStdinBytes {
		return nil, inv("stdin is %d bytes; at most %d are accepted (write a file and redirect it instead)", len(req.Stdin), MaxStdinBytes)
	}
	timeout := DefaultTimeout
	switch {
	case req.TimeoutMs < 0:
		return nil, inv("timeout_ms must not be negative (0 means the default of %d)", DefaultTimeout.Milliseconds())
	case req.TimeoutMs > 0:
		timeout = min(time.Duration(min(req.TimeoutMs, maxTimeout.Milliseconds()))*time.Millisecond, maxTimeout)
	}
	maxOut := int64(DefaultMaxOutputBytes)
	switch {
	case req.MaxOutputBytes < 0 || req.MaxOutputBytes > MaxMaxOutputBytes:
		return nil, inv("max_output_bytes must be between 0 (default %d) and %d, got %d", DefaultMaxOutputBytes, MaxMaxOutputBytes, req.MaxOutputBytes)
	case req.MaxOutputBytes > 0:
		maxOut = req.MaxOutputBytes
	}
	var user *User
	switch req.User {
	case "":
		user = s.user
	case "root":
		if !s.root {
			return nil, inv(`user "root" is not available: the agent does not run as root in this sandbox; omit user`)
		}
		u := rootUser()
		user = &u
	default:
		return nil, inv(`user %q is not supported: use "" (the sandbox's default user) or "root"`, req.User)
	}
	dir := s.workdir
	if req.Cwd != "" {
		p, err := s.resolve(req.Cwd, "cwd")
		if err != nil {
			return nil, err
		}
		dir = p
	}
	if fi, err := os.Stat(dir); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, inv("working directory %s does not exist; create it first or pass another cwd", dir)
		}
		return nil, errcode.Wrap(errcode.InvalidArgument, err, "working directory %s is not usable: %v", dir, unwrapPathErr(err))
	} else if !fi.IsDir() {
		return nil, inv("working directory %s is not a directory", dir)
	}

	env := os.Environ()
	if len(s.env) > 0 {
		env = mergeEnv(env, s.env)
	}
	if user != nil {
		// Who the command runs as; the request's env may still override it.
		env = mergeEnv(env, map[string]string{"HOME": user.Home, "USER": user.Name, "LOGNAME": user.Name})
	}
	env = mergeEnv(env, req.Env)
	sp := &execSpec{argv: req.Argv, env: env, dir: dir, stdin: req.Stdin, timeout: timeout, maxOut: maxOut, user: user}
	pathEnv, ok := req.Env["PATH"]
	if !ok {
		pathEnv, ok = s.env["PATH"]
	}
	if !ok {
		pathEnv, ok = os.LookupEnv("PATH")
	}
	if !ok {
		pathEnv = defaultPath
	}
	sp.path, sp.failCode, sp.failMsg = lookPath(req.Argv[0], pathEnv, dir)
	return sp, nil
}

// mergeEnv returns base with over applied (over's keys replace base's), over's keys sorted.
func mergeEnv(base []string, over map[string]string) []string {
	env := make([]string, 0, len(base)+len(over))
	for _, kv := range base {
		k, _, _ := strings.Cut(kv, "=")
		if _, ok := over[k]; !ok {
			env = append(env, kv)
		}
	}
	keys := make([]string, 0, len(over))
	for k := range over {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		env = append(env, k+"="+over[k])
	}
	return env
}

// lookPath finds the program for argv0 like a shell would: a name with a slash is used as is
// (relative to dir), any other is searched in pathEnv. It returns the path, or an exit code of
// 127 (not found) or 126 (not executable) and a shell-like message.
func lookPath(argv0, pathEnv, dir string) (string, int, string) {
	fail := func(code int, why string) (string, int, string) {
		return "", code, fmt.Sprintf("agentbox: %s: %s\n", argv0, why)
	}
	if strings.Contains(argv0, "/") {
		p := argv0
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
		fi, err := os.Stat(p)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return fail(127, "No such file or directory")
		case err == nil && fi.IsDir():
			return fail(126, "Is a directory")
		}
		return p, 0, "" // other failures are reported by execve
	}
	denied := false
	for _, d := range filepath.SplitList(pathEnv) {
		if d == "" {
			d = "."
		}
		if !filepath.IsAbs(d) {
			d = filepath.Join(dir, d)
		}
		p := filepath.Join(d, argv0)
		fi, err := os.Stat(p)
		if err != nil || fi.IsDir() {
			continue
		}
		if unix.Access(p, unix.X_OK) == nil {
			return p, 0, ""
		}
		denied = true
	}
	if denied {
		return fail(126, "Permission denied")
	}
	return fail(127, "command not found")
}

// capture keeps the first max bytes of a stream and counts all of them.
type capture struct {
	kept  []byte
	max   int64
	total int64
}

func (c *capture) add(p []byte) {
	c.total += int64(len(p))
	room := c.max - int64(len(c.kept))
	if room <= 0 {
		return
	}
	if int64(len(p)) > room {
		p = p[:room]
	}
	if need := len(c.kept) + len(p); need > cap(c.kept) {
		// Grow by doubling, never past max, so memory stays within the bound.
		grown := make([]byte, len(c.kept), int(min(max(int64(2*cap(c.kept)), int64(need), 64<<10), c.max)))
		copy(grown, c.kept)
		c.kept = grown
	}
	c.kept = append(c.kept, p...)
}

// drain is when the pumps stop once the main process has exited: after drainGrace without
// output, or at drainMax. Until start is called they read without a deadline.
type drain struct {
	on  atomic.Bool
	end time.Time // drainMax after start; read only once on is set
}

func (d *drain) start(files ...*os.File) {
	d.end = time.Now().Add(drainMax)
	d.on.Store(true)
	for _, f := range files {
		d.extend(f)
	}
}

// extend pushes f's read deadline drainGrace ahead (never past the end) while draining: a
// pump that was busy (e.g. blocked sending to a slow client) still reads what the pipe holds.
func (d *drain) extend(f *os.File) {
	if d.on.Load() {
		t := time.Now().Add(drainGrace)
		if t.After(d.end) {
			t = d.end
		}
		_ = f.SetReadDeadline(t)
	}
}

// pump reads f until EOF, error or the drain's deadline, keeping what c allows and forwarding
// every chunk to sink (when streaming).
func pump(f *os.File, stream string, c *capture, sink chan<- Frame, d *drain) {
	buf := make([]byte, chunkSize)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			c.add(buf[:n])
			if sink != nil {
				sink <- Frame{Stream: stream, Data: bytes.Clone(buf[:n])}
			}
			d.extend(f)
		}
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				// The drain's deadline passed: what the command wrote before it ended may still
				// sit in the pipe (a pump scheduled late on a loaded machine). Take it, without
				// waiting for more.
				readReady(f, buf, func(b []byte) {
					c.add(b)
					if sink != nil {
						sink <- Frame{Stream: stream, Data: bytes.Clone(b)}
					}
				})
			}
			return
		}
	}
}

// readReady reads what f (a pipe) holds now, without waiting: at most maxReadyChunks reads,
// each handed to got; it stops at the first read that finds nothing.
func readReady(f *os.File, buf []byte, got func([]byte)) {
	if f.SetReadDeadline(time.Time{}) != nil {
		return
	}
	rc, err := f.SyscallConn()
	if err != nil {
		return
	}
	for range maxReadyChunks {
		var n int
		var rerr error
		if err := rc.Read(func(fd uintptr) bool {
			n, rerr = unix.Read(int(fd), buf)
			return true // one attempt: never wait for the writer
		}); err != nil || rerr != nil || n <= 0 {
			return
		}
		got(buf[:n])
	}
}

// maxReadyChunks bounds readReady: a pipe holds 64 KiB by default (16 chunks of 4 KiB at
// least), so this takes everything a pipe can hold.
const maxReadyChunks = 64

// runExec runs a prepared command to completion (or timeout, or ctx cancellation, both of which
// SIGKILL its whole process tree: see killTree) and returns its result. With sink non-nil, output chunks are sent
// to it as they are read; runExec never closes sink.
func (s *server) runExec(ctx context.Context, sp *execSpec, sink chan<- Frame) (ExecResult, error) {
	start := time.Now()
	if sp.failCode != 0 {
		return failResult(sp, sp.failCode, sp.failMsg, start, sink), nil
	}
	var files []*os.File // every descriptor still to close on an early return
	closeAll := func() {
		for _, f := range files {
			_ = f.Close()
		}
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		return ExecResult{}, errcode.Wrap(errcode.Internal, err, "cannot create the stdout pipe: %v", err)
	}
	files = append(files, outR, outW)
	errR, errW, err := os.Pipe()
	if err != nil {
		closeAll()
		return ExecResult{}, errcode.Wrap(errcode.Internal, err, "cannot create the stderr pipe: %v", err)
	}
	files = append(files, errR, errW)
	var inR, inW *os.File
	switch {
	case sp.stdinFile != nil:
		inR = sp.stdinFile
	case len(sp.stdin) > 0:
		inR, inW, err = os.Pipe()
	default:
		inR, err = os.Open(os.DevNull)
	}
	if err != nil {
		closeAll()
		return ExecResult{}, errcode.Wrap(errcode.Internal, err, "cannot create the stdin pipe: %v", err)
	}

	attr := &os.ProcAttr{
		Dir:   sp.dir,
		Env:   sp.env,
		Files: []*os.File{inR, outW, errW},
		Sys:   s.procAttr(&syscall.SysProcAttr{Setpgid: true}),
	}
	tree := processTree{since: bootTicks()}
	if s.root {
		// As root the agent sets the command's credentials, and tags the command with a
		// supplementary group of its own (see execTags).
		tree.tag = s.reaper.tags.acquire()
		defer s.reaper.tags.release(tree.tag)
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
	pid, waitCh, err := s.reaper.start(sp.path, sp.argv, attr)
	// The child has its copies; the parent keeps only its own ends.
	_ = inR.Close()
	_ = outW.Close()
	_ = errW.Close()
	if err != nil {
		_ = outR.Close()
		_ = errR.Close()
		if inW != nil {
			_ = inW.Close()
		}
		if errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.ENOMEM) {
			return ExecResult{}, errcode.Wrap(errcode.CapacityUnavailable, err, "cannot start the command: the sandbox is out of processes or memory (%v)", unwrapPathErr(err))
		}
		code, why := startFailure(err)
		return failResult(sp, code, fmt.Sprintf("agentbox: %s: %s\n", sp.argv[0], why), start, sink), nil
	}

	var writerDone chan struct{}
	if inW != nil {
		writerDone = make(chan struct{})
		go func() {
			defer close(writerDone)
			_, _ = inW.Write(sp.stdin) // fails with EPIPE if the command does not read it all
			_ = inW.Close()
		}()
	}
	stdout := &capture{max: sp.maxOut}
	stderr := &capture{max: sp.maxOut}
	var wg sync.WaitGroup
	var dr drain
	wg.Go(func() { pump(outR, "stdout", stdout, sink, &dr) })
	wg.Go(func() { pump(errR, "stderr", stderr, sink, &dr) })

	timer := time.NewTimer(sp.timeout)
	defer timer.Stop()
	var ws unix.WaitStatus
	timedOut := false
	select {
	case ws = <-waitCh:
	case <-timer.C:
		timedOut = true
		ws = s.killTree(pid, tree, waitCh)
	case <-ctx.Done():
		ws = s.killTree(pid, tree, waitCh)
	}
	end := time.Now()
	oomKilled := s.endedForMemory(pid, tree, ws, timedOut, oomBefore)

	// The main process is gone; background children may still hold the pipes. Read what is
	// there until it stops coming for a short grace period, then stop.
	dr.start(outR, errR)
	if inW != nil {
		_ = inW.Close() // unblocks a writer the command never read from
		<-writerDone
	}
	wg.Wait()
	_ = outR.Close()
	_ = errR.Close()

	res := ExecResult{
		Stdout:      stdout.kept,
		Stderr:      stderr.kept,
		StdoutBytes: stdout.total,
		StderrBytes: stderr.total,
		Truncated:   stdout.total > int64(len(stdout.kept)) || stderr.total > int64(len(stderr.kept)),
		DurationMs:  end.Sub(start).Milliseconds(),
		TimedOut:    timedOut,
	}
	switch {
	case ws.Exited():
		res.ExitCode = ws.ExitStatus()
	case ws.Signaled():
		sig := ws.Signal()
		res.ExitCode = 128 + int(sig)
		res.Signal = unix.SignalName(sig)
		if res.Signal == "" {
			res.Signal = fmt.Sprintf("SIG%d", int(sig))
		}
		res.OOMKilled = oomKilled
	default:
		res.ExitCode = -1
	}
	return res, nil
}

// endedForMemory reports whether the command pid leads, ended with status ws, was killed for
// memory: by SIGKILL, not by the agent itself (byAgent: its timeout, a cancel, a shutdown), and
// marked by the OOM guard or counted by the memory cgroup since oomBefore (-1: no count). If so
// it ends what is left of the command, as a timeout ends it: the kernel's OOM killer takes one
// process (the largest; a fork bomb's leader, say), and the rest would run on without it.
func (s *server) endedForMemory(pid int, tree processTree, ws unix.WaitStatus, byAgent bool, oomBefore int64) bool {
	guarded := s.takeOOMMark(tree.tag, pid) // always: a mark must not outlive its command
	if !ws.Signaled() || ws.Signal() != unix.SIGKILL || byAgent || !(guarded || oomBefore >= 0 && s.oomKills() > oomBefore) {
		return false
	}
	if !newCmdTree(pid, tree).end(time.Now().Add(killWait)) {
		s.log.Warn("guest: processes of a command killed for memory still alive after repeated kills", "pgid", pid, "tag", tree.tag)
	}
	return true
}

// processTree identifies the processes of one command beyond its process group: those that
// carry its exec tag (0: none) and started at or after since (boot time in clock ticks).
type processTree struct {
	tag   uint32
	since uint64
}

// killTree ends the command pid leads and everything it started (see cmdTree: its process
// group, the processes that carry its exec tag, their descendants), frozen first and then
// killed, until nothing of it is left, so a fork bomb racing the kill cannot outlive it. It
// returns the main process's status.
func (s *server) killTree(pid int, tree processTree, waitCh <-chan unix.WaitStatus) unix.WaitStatus {
	return s.endTree(newCmdTree(pid, tree), waitCh)
}

// endTree ends ct (see killTree) and returns its main process's status.
func (s *server) endTree(ct *cmdTree, waitCh <-chan unix.WaitStatus) unix.WaitStatus {
	if !ct.end(time.Now().Add(killWait)) {
		s.log.Warn("guest: processes of a killed command still alive after repeated kills", "pgid", ct.pid, "tag", ct.tree.tag)
	}
	t := time.NewTimer(killWait)
	defer t.Stop()
	var ws unix.WaitStatus
	select {
	case ws = <-waitCh:
	case <-t.C:
		// The reaper will still collect it; report the kill that was sent.
		s.log.Warn("guest: killed command did not exit in time", "pid", ct.pid)
		ws = unix.WaitStatus(unix.SIGKILL)
	}
	// Its status is in: once more, for anything that a process stuck in the kernel started
	// while the first pass ran.
	if !ct.end(time.Now().Add(killWait)) {
		s.log.Warn("guest: processes of a killed command still alive after repeated kills", "pgid", ct.pid, "tag", ct.tree.tag)
	}
	return ws
}

// startFailure maps an execve failure to a shell's exit status and reason.
func startFailure(err error) (int, string) {
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return 126, err.Error()
	}
	switch errno {
	case syscall.ENOENT:
		return 127, "No such file or directory"
	case syscall.EACCES, syscall.EPERM:
		return 126, "Permission denied"
	case syscall.ENOEXEC:
		return 126, "Exec format error"
	}
	return 126, errno.Error()
}

// failResult is the result of a command that could not be started: its reason is its stderr.
func failResult(sp *execSpec, code int, msg string, start time.Time, sink chan<- Frame) ExecResult {
	if sink != nil {
		sink <- Frame{Stream: "stderr", Data: []byte(msg)}
	}
	c := &capture{max: sp.maxOut}
	c.add([]byte(msg))
	return ExecResult{
		ExitCode:    code,
		Stderr:      c.kept,
		StderrBytes: c.total,
		Truncated:   c.total > int64(len(c.kept)),
		DurationMs:  time.Since(start).Milliseconds(),
	}
}

func unwrapPathErr(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// takeOOMMark reports, and forgets, whether the OOM guard killed the command with exec tag tag
// (0: none) led by pid. A command that died of SIGKILL was also killed for want of memory if the
// kernel's count of OOM kills in the sandbox's memory cgroup grew while it ran (with commands
// side by side, the kernel's victim may have been another's process: the flag then errs towards
// saying so).
func (s *server) takeOOMMark(tag uint32, pid int) bool {
	_, byTag := s.oomKilled.LoadAndDelete(tag)
	_, byPid := s.oomKilled.LoadAndDelete(pid)
	return (tag != 0 && byTag) || byPid
}
