package oci

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/guest"
	"github.com/agentbox/agentbox/internal/runtime"
)

// A sandbox's init is the host process the OCI runtime writes to the bundle's init.pid: the
// container's init under runc and crun (the agent, PID 1 inside), runsc's sandbox process (the
// sentry) under gVisor. Its start time (field 22 of /proc/<pid>/stat, in clock ticks since
// boot) is recorded beside it, in init.start, when the sandbox is created, so a pid the kernel
// has since given to another process is never taken for the sandbox's init. The Handle is the
// pair, "<pid>:<start>".

const initStartFile = "init.start"

// initRef is a sandbox's init: its host pid and start time (0: unknown).
type initRef struct {
	pid   int
	start uint64
}

func (i initRef) handle() runtime.Handle {
	return runtime.Handle(strconv.Itoa(i.pid) + ":" + strconv.FormatUint(i.start, 10))
}

// parseHandle reads a Handle made by initRef.handle.
func parseHandle(h runtime.Handle) (initRef, error) {
	p, s, ok := strings.Cut(string(h), ":")
	pid, perr := strconv.Atoi(p)
	start, serr := strconv.ParseUint(s, 10, 64)
	if !ok || perr != nil || serr != nil || pid <= 0 {
		return initRef{}, fmt.Errorf("handle %q is not <pid>:<start time>", h)
	}
	return initRef{pid: pid, start: start}, nil
}

// procStart reads the state letter and start time of pid from /proc.
func procStart(pid int) (state byte, start uint64, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, false
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	// After the command: state (field 3), ppid (4), … starttime (22).
	if len(f) < 20 || len(f[0]) != 1 {
		return 0, 0, false
	}
	start, err = strconv.ParseUint(f[19], 10, 64)
	return f[0][0], start, err == nil
}

// recordInit writes the start time of the init a create left in init.pid and returns the
// sandbox's Handle. An init that is already gone gets start time 0 (its sandbox is stopped).
func (r *Runtime) recordInit(id string) (runtime.Handle, error) {
	dir := r.sandboxDir(id)
	pid := readPid(filepath.Join(dir, "init.pid"))
	if pid <= 0 {
		return "", errors.New("the OCI runtime wrote no init.pid")
	}
	ref := initRef{pid: pid}
	if state, start, ok := procStart(pid); ok && state != 'Z' && state != 'X' {
		ref.start = start
	}
	if err := os.WriteFile(filepath.Join(dir, initStartFile), []byte(strconv.FormatUint(ref.start, 10)), 0o600); err != nil {
		return "", err
	}
	return ref.handle(), nil
}

// initOf returns sandbox id's init as recorded in its bundle; ok is false without a bundle or
// an init.pid. A bundle from before init.start (start 0) is completed from /proc when the
// process with that pid is in the sandbox's cgroup, so it is still the sandbox's.
func (r *Runtime) initOf(id string) (ref initRef, ok bool) {
	dir := r.sandboxDir(id)
	ref.pid = readPid(filepath.Join(dir, "init.pid"))
	if ref.pid <= 0 {
		return initRef{}, false
	}
	if b, err := os.ReadFile(filepath.Join(dir, initStartFile)); err == nil {
		ref.start, _ = strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
		return ref, true
	}
	if _, start, ok := procStart(ref.pid); ok && r.inSandboxCgroup(ref.pid, id) {
		ref.start = start
		_ = os.WriteFile(filepath.Join(dir, initStartFile), []byte(strconv.FormatUint(start, 10)), 0o600)
	}
	return ref, true
}

// inSandboxCgroup reports whether pid is in sandbox id's cgroup in some hierarchy.
func (r *Runtime) inSandboxCgroup(pid int, id string) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	return err == nil && strings.Contains(string(b), "/"+cgroupPath(r.cgroupParent, id)+"\n")
}

// alive reports whether the process ref names is running: its pid exists, is not a zombie, and
// started when ref says (not a later process given the same pid).
func (ref initRef) alive() bool {
	state, start, ok := procStart(ref.pid)
	return ok && state != 'Z' && state != 'X' && ref.start != 0 && start == ref.start
}

// Adopt checks that sandbox id's init is the one h names (any, for h "") and still runs, and
// restores what the runtime does per sandbox outside its host state: gVisor's OOM guard.
func (r *Runtime) Adopt(ctx context.Context, id string, h runtime.Handle) error {
	if err := checkID(id); err != nil {
		return err
	}
	if err := r.checkAvailable(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if _, err := os.Stat(r.sandboxDir(id)); errors.Is(err, fs.ErrNotExist) {
		return errcode.New(errcode.SandboxNotFound, "sandbox %s does not exist in runtime %s", id, r.name)
	}
	ref, ok := r.initOf(id)
	if !ok {
		return errcode.New(errcode.SandboxNotRunning, "sandbox %s of runtime %s has no init process; destroy it", id, r.name)
	}
	if h != "" {
		want, err := parseHandle(h)
		if err != nil {
			return errcode.Wrap(errcode.InvalidArgument, err, "sandbox %s: the runtime handle on record is not one runtime %s made", id, r.name)
		}
		if want != ref {
			return errcode.New(errcode.SandboxNotRunning, "sandbox %s of runtime %s is not the sandbox on record (its init process differs: it was re-created); destroy it", id, r.name)
		}
	}
	if !ref.alive() {
		return errcode.New(errcode.SandboxNotRunning, "sandbox %s of runtime %s has stopped: its init process has exited; destroy it", id, r.name)
	}
	if err := r.resumeIfPaused(ctx, id); err != nil {
		return err
	}
	if err := r.relistenIfQuiesced(ctx, id); err != nil { // checkpoint_linux.go
		return err
	}
	r.guardMemory(id)
	return nil
}

// Wait blocks until sandbox id's init has exited or ctx ends. It waits on a pidfd parked in Go's
// netpoller, so a waiting sandbox costs no OS thread. It reaps nothing: the init, a child of this
// process when it is a subreaper, stays a zombie for Stop or Delete to reap (initGone), and a
// pidfd still reports the exit of a process reaped after it was opened. A pid that names another
// process by the time the pidfd is opened (the init was reaped and the pid reused) is detected by
// its start time and counts as exited.
func (r *Runtime) Wait(ctx context.Context, id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	ref, ok := r.initOf(id)
	if !ok || ref.start == 0 {
		return nil // absent, or never ran (or its init is unknown: nothing to wait for)
	}
	fd, err := unix.PidfdOpen(ref.pid, unix.PIDFD_NONBLOCK)
	if errors.Is(err, unix.ESRCH) {
		return nil // gone, and reaped
	}
	if err != nil {
		return errcode.Wrap(errcode.RuntimeUnavailable, err, "cannot wait for sandbox %s", id)
	}
	// Non-blocking, so os.NewFile registers it with the netpoller.
	f := os.NewFile(uintptr(fd), "pidfd")
	defer f.Close()
	// After the open: if the pid is still the init's, the pidfd is the init's.
	if !ref.alive() {
		return nil
	}
	return waitReadable(ctx, f)
}

// waitReadable waits until the pidfd f polls readable (its process has exited) or ctx ends.
func waitReadable(ctx context.Context, f *os.File) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, func() { _ = f.SetReadDeadline(time.Now()) })
	defer stop()
	var perr error
	err = rc.Read(func(fd uintptr) bool {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		for {
			n, err := unix.Poll(fds, 0)
			if err == unix.EINTR {
				continue
			}
			if err != nil {
				perr = err
				return true
			}
			return n > 0 // not yet: the netpoller waits for readability and calls again
		}
	})
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if err == nil {
		err = perr
	}
	return err
}

// Agent returns a dialer for the agent's socket in the sandbox's run/ directory. Every dial
// checks the process at the socket's other end (SO_PEERCRED: the pid of whoever called listen on
// it, in this process's pid namespace) and refuses any but the sandbox's own with an
// *runtime.AgentPeerError:
//
//   - runc and crun: the agent is the container's init (PID 1 inside), so the peer must be the
//     init's host pid (init.pid) exactly. A process of the sandbox that replaced the socket with
//     its own listener (root inside can: /.agentbox/run is its) is another pid and is refused.
//   - gVisor: no process of the sandbox is a host process. The host socket is bound and listened
//     on by the sandbox's gofer on the sentry's behalf (directfs off; the sentry itself with
//     directfs), so the peer must be this sandbox's gofer (gofer.pid) or sentry (init.pid). That
//     keeps out a socket held by any host process or another sandbox, but cannot tell the agent
//     from another listener inside the same sandbox: that is the sandbox's own kernel's business.
//
// A sandbox adopted after a restart gets its OOM guard here too, until the control plane calls
// Adopt (which does the same).
func (r *Runtime) Agent(ctx context.Context, id string) (runtime.Dialer, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if _, err := os.Stat(r.sandboxDir(id)); errors.Is(err, fs.ErrNotExist) {
		return nil, errcode.New(errcode.SandboxNotFound, "sandbox %s does not exist in runtime %s", id, r.name)
	}
	r.guardMemory(id)
	return r.dialer(id), nil
}

// dialer is Agent's dialer of sandbox id.
func (r *Runtime) dialer(id string) runtime.Dialer {
	sock, pidFile := r.SocketPath(id), filepath.Join(r.sandboxDir(id), "init.pid")
	return func(ctx context.Context) (net.Conn, error) {
		return guest.DialUnix(ctx, sock, func(c unix.Ucred) error {
			want := readPid(pidFile)
			if want > 0 && int(c.Pid) == want {
				return nil
			}
			if want > 0 && slices.Contains(r.helperPids(id), int(c.Pid)) {
				return nil // gVisor's gofer listens for the sentry
			}
			pe := &runtime.AgentPeerError{ID: id, PeerPID: c.Pid, WantPID: int32(want)}
			r.log.Warn("refused a connection to a sandbox's agent socket held by another process", "sandbox_id", id,
				"peer_pid", c.Pid, "peer_uid", c.Uid, "init_pid", want)
			return errcode.Wrap(errcode.SandboxNotRunning, pe,
				"sandbox %s: its agent socket is held by another process, not the sandbox's agent (something in the sandbox replaced it); destroy the sandbox", id)
		})
	}
}
