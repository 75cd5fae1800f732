//go:build unix

package guest

import (
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// reaper is the process's single waiter for children. The agent is PID 1 in the sandbox, so
// every orphan is reparented to it and must be reaped; it therefore collects every exit with
// wait4(-1) and hands each status to whoever registered for that pid. Nothing else may wait for
// a child (exec.Cmd.Wait / os.Process.Wait would race it).
type reaper struct {
	log *slog.Logger
	// mu is held while a child is started and registered, and while a status is collected and
	// delivered, so a child that exits at once cannot be reaped before its waiter exists, and a
	// reused pid cannot receive a stale status.
	mu      sync.Mutex
	waiters map[int]waiter
	// tags are the exec tags of the commands in flight: process-wide like the reaper, since
	// every agent in a process (tests run several) sees the same processes.
	tags execTags
	// own: this reaper waits for the children it starts only, one wait4(pid) each, and never
	// for other children of the process (ServerConfig.Embedded). It has no loop.
	own bool
}

// waiter is who registered for a child's exit: its status goes on ch, and its rusage (its own
// and that of the descendants it waited for) into *ru first when ru is not nil.
type waiter struct {
	ch chan unix.WaitStatus
	ru *unix.Rusage
}

// ownChildrenReaper returns a reaper for an embedded agent: it collects the exit status of
// each child it starts, and nothing else.
func ownChildrenReaper(log *slog.Logger) *reaper {
	return &reaper{log: log, waiters: map[int]waiter{}, own: true}
}

var (
	theReaper     *reaper
	theReaperOnce sync.Once
)

// reapSafetyInterval re-runs the reaper even without SIGCHLD, as a cheap guard against a lost
// signal.
const reapSafetyInterval = 2 * time.Second

// startReaper starts the process-wide reaper once and returns it.
func startReaper(log *slog.Logger) *reaper {
	theReaperOnce.Do(func() {
		if os.Getpid() != 1 {
			// Not PID 1 (tests, or an agent run by hand): become the reaper of our orphans
			// anyway so the behaviour is the same.
			if err := setSubreaper(); err != nil {
				log.Warn("guest: cannot become a child subreaper; orphans will not be reaped here", "err", err)
			}
		}
		r := &reaper{log: log, waiters: map[int]waiter{}}
		sigs := make(chan os.Signal, 1)
		signal.Notify(sigs, unix.SIGCHLD)
		go r.loop(sigs)
		theReaper = r
	})
	return theReaper
}

func (r *reaper) loop(sigs <-chan os.Signal) {
	t := time.NewTicker(reapSafetyInterval)
	defer t.Stop()
	for {
		select {
		case <-sigs:
		case <-t.C:
		}
		r.reapAll()
	}
}

// reapAll collects every exited child. Statuses of unregistered pids (orphans) are discarded.
func (r *reaper) reapAll() {
	for {
		r.mu.Lock()
		var ws unix.WaitStatus
		var ru unix.Rusage
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG|waitAllFlag, &ru)
		if err == unix.EINTR {
			r.mu.Unlock()
			continue
		}
		if err != nil || pid <= 0 {
			r.mu.Unlock()
			return
		}
		if w, ok := r.waiters[pid]; ok {
			delete(r.waiters, pid)
			if w.ru != nil {
				*w.ru = ru
			}
			w.ch <- ws // buffered: never blocks
		}
		r.mu.Unlock()
	}
}

// start starts a child and registers for its exit status, which the returned channel delivers
// exactly once. The *os.Process is released at once: the pid is all the caller uses.
func (r *reaper) start(name string, argv []string, attr *os.ProcAttr) (int, <-chan unix.WaitStatus, error) {
	return r.startRusage(name, argv, attr, nil)
}

// startRusage is start that also writes the child's rusage into *ru (when not nil), under
// r.mu, before its status is delivered: once the status is received, r.rusage(ru) has the CPU
// time of the child and of the descendants it waited for (zero if it was not collected yet).
func (r *reaper) startRusage(name string, argv []string, attr *os.ProcAttr, ru *unix.Rusage) (int, <-chan unix.WaitStatus, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var p *os.Process
	var err error
	start := func() { p, err = os.StartProcess(name, argv, attr) }
	if r.own {
		start() // a host process's agent (Embedded) leaves the process's OOM standing alone
	} else {
		withCommandOOMScoreAdj(start)
	}
	if err != nil {
		return 0, nil, err
	}
	ch := make(chan unix.WaitStatus, 1)
	pid := p.Pid
	_ = p.Release()
	if r.own {
		go func() {
			var ws unix.WaitStatus
			var got unix.Rusage
			for {
				_, err := unix.Wait4(pid, &ws, 0, &got)
				if err != unix.EINTR {
					break
				}
			}
			if ru != nil {
				r.mu.Lock()
				*ru = got
				r.mu.Unlock()
			}
			ch <- ws
		}()
		return pid, ch, nil
	}
	r.waiters[pid] = waiter{ch: ch, ru: ru}
	return pid, ch, nil
}

// rusage reads *ru, which the reaper may be writing, under r.mu.
func (r *reaper) rusage(ru *unix.Rusage) unix.Rusage {
	r.mu.Lock()
	defer r.mu.Unlock()
	return *ru
}
