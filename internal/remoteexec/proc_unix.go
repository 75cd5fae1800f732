//go:build !windows

package remoteexec

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"syscall"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/shell"
)

// setProcAttr starts the command in a session of its own, so the whole tree can be killed.
func setProcAttr(cmd *exec.Cmd, _ shell.Spec) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
}

// procTree is a started command's process tree: its session.
type procTree struct{ sid int }

func afterStart(cmd *exec.Cmd) *procTree { return &procTree{sid: cmd.Process.Pid} }

// kill SIGKILLs the command's process group and (where the platform lists them) every process
// still in its session, whichever group it moved to.
func (t *procTree) kill() {
	_ = syscall.Kill(-t.sid, syscall.SIGKILL)
	killSession(t.sid)
}

func (t *procTree) close() {}

func signalOf(ps *os.ProcessState) (int, bool) {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return int(ws.Signal()), true
	}
	return 0, false
}

// elevate makes spec run as root: unchanged when the agent is root, through `sudo -n` when
// passwordless sudo works, refused (saying why) otherwise.
func elevate(ctx context.Context, spec shell.Spec) (shell.Spec, error) {
	return elevateAs(ctx, spec, os.Geteuid())
}

// elevateAs is elevate for an agent running as euid.
func elevateAs(ctx context.Context, spec shell.Spec, euid int) (shell.Spec, error) {
	if euid == 0 {
		return spec, nil
	}
	sudo, err := exec.LookPath("sudo")
	if err != nil {
		return spec, errcode.New(errcode.UnsupportedOp, "elevated needs root: the machine's agent runs as uid %d and this machine has no sudo; run the agent as root or drop elevated", euid).
			With("reason", "no_sudo")
	}
	out, err := exec.CommandContext(ctx, sudo, "-n", "true").CombinedOutput()
	if err != nil {
		return spec, errcode.New(errcode.UnsupportedOp, "elevated needs passwordless sudo for the agent's user (uid %d), and `sudo -n true` failed: %s; allow it in sudoers (NOPASSWD) or drop elevated",
			euid, clip(strings.TrimSpace(string(out)))).With("reason", "sudo_needs_password")
	}
	return shell.Spec{Path: sudo, Args: append([]string{sudo, "-n", "--"}, spec.Args...)}, nil
}
