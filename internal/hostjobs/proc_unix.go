//go:build !windows

package hostjobs

import (
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/sys/unix"
)

// detachedAttr puts the supervisor in its own session: no terminal, no process group of the
// agent's, so nothing sent to the agent's group reaches it.
func detachedAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setsid: true} }

// jobAttr puts the job in its own process group (its pgid is its pid), which cancel signals.
// cmdLine is Windows-only (always "" here).
func jobAttr(string) *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }

// ignoreSignals makes the supervisor deaf to the signals a terminal, a session's end or a
// service stop send. They are caught and dropped, not ignored: an ignored disposition would pass
// to the job through exec, and the job must still die of cancel's SIGTERM.
func ignoreSignals() {
	ch := make(chan os.Signal, 8)
	signal.Notify(ch, unix.SIGHUP, unix.SIGINT, unix.SIGTERM, unix.SIGPIPE)
	go func() {
		for range ch {
		}
	}()
}

// alive reports whether pid runs and (where start ticks exist) is the process that was recorded.
func alive(pid int, start uint64) bool {
	if pid <= 0 {
		return false
	}
	s, ok := procStart(pid)
	return ok && (start == 0 || s == 0 || s == start)
}

// treeOf returns the live processes of a job's tree: its process group's leader and every
// process below its supervisor (Linux: orphans of the tree are reparented to it) or below the
// job.
func treeOf(p pids) []int {
	var out []int
	if alive(p.PID, p.PIDStart) {
		out = append(out, p.PID)
	}
	root := p.PID
	if alive(p.Supervisor, p.SupervisorStart) {
		root = p.Supervisor
	}
	for _, pid := range descendants(root) {
		if pid != p.Supervisor && pid != p.PID {
			if _, ok := procStart(pid); ok {
				out = append(out, pid)
			}
		}
	}
	return out
}

// killTree sends SIGTERM (SIGKILL when hard) to the job's process group and its whole tree.
func killTree(p pids, hard bool) {
	sig := unix.SIGTERM
	if hard {
		sig = unix.SIGKILL
	}
	if alive(p.PID, p.PIDStart) {
		unix.Kill(-p.PID, sig)
	}
	for _, pid := range treeOf(p) {
		unix.Kill(pid, sig)
	}
}

// waitStatus turns a wait status into an exit code and a signal name ("" when it exited).
func waitStatus(ws syscall.WaitStatus) (int, string) {
	if ws.Signaled() {
		return 128 + int(ws.Signal()), unix.SignalName(ws.Signal())
	}
	return ws.ExitStatus(), ""
}
