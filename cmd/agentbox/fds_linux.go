package main

import "golang.org/x/sys/unix"

// closeInheritedFDs marks every descriptor this process inherited beyond stdin, stdout and
// stderr close-on-exec, so none of them reaches a runtime or a sandbox's host processes
// (runc closes them in the container, runsc does not).
func closeInheritedFDs() {
	_ = unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC)
}
