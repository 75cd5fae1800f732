package hostjobs

import (
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"

	"golang.org/x/sys/windows"
)

// detachedAttr starts the supervisor detached from the agent's console, in its own process group.
func detachedAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{CreationFlags: windows.CREATE_NEW_PROCESS_GROUP | windows.DETACHED_PROCESS, HideWindow: true}
}

// jobAttr starts the job in its own process group, with cmdLine (cmd's verbatim command line,
// shell.Spec.CmdLine) as its command line when set.
func jobAttr(cmdLine string) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{CmdLine: cmdLine, CreationFlags: windows.CREATE_NEW_PROCESS_GROUP, HideWindow: true}
}

// ignoreSignals catches (and drops) Ctrl+C and Ctrl+Break sent to the supervisor.
func ignoreSignals() {
	ch := make(chan os.Signal, 8)
	signal.Notify(ch, os.Interrupt)
	go func() {
		for range ch {
		}
	}()
}

func becomeSubreaper() {}

// procStart reports whether pid is a live process (no start ticks: a reused pid is not told apart).
func procStart(pid int) (uint64, bool) {
	h, err := windows.OpenProcess(windows.PROCESS_QUERY_LIMITED_INFORMATION, false, uint32(pid))
	if err != nil {
		return 0, false
	}
	defer windows.CloseHandle(h)
	var code uint32
	if err := windows.GetExitCodeProcess(h, &code); err != nil {
		return 0, false
	}
	return 0, code == 259 // STILL_ACTIVE
}

func alive(pid int, _ uint64) bool {
	if pid <= 0 {
		return false
	}
	_, ok := procStart(pid)
	return ok
}

// treeOf is the job itself while it lives (taskkill /T finds its descendants).
func treeOf(p pids) []int {
	if alive(p.PID, 0) {
		return []int{p.PID}
	}
	return nil
}

// reapRest has nothing to reap on Windows.
func reapRest() {}

// killTree ends the job's tree with taskkill /T (forcefully when hard; without /F it asks the
// windows to close, which console programs ignore).
func killTree(p pids, hard bool) {
	args := []string{"/T", "/PID", strconv.Itoa(p.PID)}
	if hard {
		args = append([]string{"/F"}, args...)
	}
	exec.Command("taskkill", args...).Run()
}

func waitJob(cmd *exec.Cmd) (int, string) {
	cmd.Wait()
	if cmd.ProcessState == nil {
		return -1, ""
	}
	return cmd.ProcessState.ExitCode(), ""
}

func systemdScope(string) []string { return nil }
