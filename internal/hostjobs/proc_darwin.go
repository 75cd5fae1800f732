package hostjobs

import (
	"os/exec"
	"syscall"

	"golang.org/x/sys/unix"
)

// procStart reports whether pid is a live process; macOS gives no start ticks here, so a reused
// pid is not told apart.
func procStart(pid int) (uint64, bool) {
	err := unix.Kill(pid, 0)
	return 0, err == nil || err == unix.EPERM
}

// descendants is empty on macOS: cancel signals the job's process group only.
func descendants(int) []int { return nil }

func becomeSubreaper() {}

func waitJob(cmd *exec.Cmd) (int, string) {
	err := cmd.Wait()
	if cmd.ProcessState == nil {
		_ = err
		return -1, ""
	}
	return waitStatus(cmd.ProcessState.Sys().(syscall.WaitStatus))
}

// systemdScope: macOS has no systemd; launchd does not kill a session the agent left.
func systemdScope(string) []string { return nil }

// reapRest has no orphans to reap on macOS (they go to launchd).
func reapRest() {}
