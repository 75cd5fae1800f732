//go:build windows

package remoteexec

import (
	"context"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"unsafe"

	"golang.org/x/sys/windows"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/shell"
)

// setProcAttr hands cmd.exe its command line verbatim (shell.Spec.CmdLine) and starts the
// command suspended in a new process group, so afterStart can put it in a job object before
// it runs a single instruction.
func setProcAttr(cmd *exec.Cmd, spec shell.Spec) {
	cmd.SysProcAttr = &syscall.SysProcAttr{
		CmdLine:       spec.CmdLine,
		CreationFlags: windows.CREATE_NEW_PROCESS_GROUP | windows.CREATE_SUSPENDED,
	}
}

// procTree is the command's job object (closing it kills every process in it); when no job
// object could be made, taskkill /T kills the tree instead.
type procTree struct {
	pid int
	job windows.Handle
}

func afterStart(cmd *exec.Cmd) *procTree {
	t := &procTree{pid: cmd.Process.Pid}
	job, err := windows.CreateJobObject(nil, nil)
	if err == nil {
		info := windows.JOBOBJECT_EXTENDED_LIMIT_INFORMATION{}
		info.BasicLimitInformation.LimitFlags = windows.JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE
		if _, err = windows.SetInformationJobObject(job, windows.JobObjectExtendedLimitInformation,
			uintptr(unsafe.Pointer(&info)), uint32(unsafe.Sizeof(info))); err == nil {
			if h, err2 := windows.OpenProcess(windows.PROCESS_SET_QUOTA|windows.PROCESS_TERMINATE, false, uint32(t.pid)); err2 == nil {
				if windows.AssignProcessToJobObject(job, h) == nil {
					t.job = job
				}
				windows.CloseHandle(h)
			}
		}
		if t.job == 0 {
			windows.CloseHandle(job)
		}
	}
	resumeThreads(uint32(t.pid))
	return t
}

// resumeThreads resumes the threads of a process started with CREATE_SUSPENDED.
func resumeThreads(pid uint32) {
	snap, err := windows.CreateToolhelp32Snapshot(windows.TH32CS_SNAPTHREAD, 0)
	if err != nil {
		return
	}
	defer windows.CloseHandle(snap)
	var te windows.ThreadEntry32
	te.Size = uint32(unsafe.Sizeof(te))
	for err = windows.Thread32First(snap, &te); err == nil; err = windows.Thread32Next(snap, &te) {
		if te.OwnerProcessID != pid {
			continue
		}
		if th, err := windows.OpenThread(windows.THREAD_SUSPEND_RESUME, false, te.ThreadID); err == nil {
			_, _ = windows.ResumeThread(th)
			windows.CloseHandle(th)
		}
	}
}

func (t *procTree) kill() {
	if t.job != 0 {
		_ = windows.TerminateJobObject(t.job, 1)
		return
	}
	_ = exec.Command("taskkill", "/T", "/F", "/PID", strconv.Itoa(t.pid)).Run()
}

func (t *procTree) close() {
	if t.job != 0 {
		windows.CloseHandle(t.job) // KILL_ON_JOB_CLOSE: leftovers of the tree go with it
		t.job = 0
	}
}

func signalOf(*os.ProcessState) (int, bool) { return 0, false }

// elevate: Windows cannot raise a process non-interactively (UAC asks a person), so elevated
// runs only when the agent itself runs elevated.
func elevate(_ context.Context, spec shell.Spec) (shell.Spec, error) {
	if windows.GetCurrentProcessToken().IsElevated() {
		return spec, nil
	}
	return spec, errcode.New(errcode.UnsupportedOp, "elevated needs the machine's agent to run elevated (as Administrator or a service as LocalSystem); Windows cannot elevate a command without a person at UAC. Restart the agent elevated or drop elevated").
		With("reason", "agent_not_elevated")
}
