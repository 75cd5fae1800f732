package main

import "golang.org/x/sys/unix"

// closeInheritedFDs marks every descriptor the agent inherited beyond stdin, stdout and stderr
// close-on-exec, so that none reaches a command it runs (runc closes them in the container,
// runsc does not).
func closeInheritedFDs() {
	_ = unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC)
}
