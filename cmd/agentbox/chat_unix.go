//go:build unix

package main

import (
	"os/exec"
	"syscall"
)

// ownProcessGroup puts cmd in a process group of its own, so that the terminal's Ctrl-C
// (sent to the foreground group) reaches the chat alone, which cancels the call in progress.
func ownProcessGroup(cmd *exec.Cmd) { cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} }
