//go:build unix

package hostlock

import (
	"os"

	"golang.org/x/sys/unix"
)

var errWouldBlock = unix.EWOULDBLOCK

// tryLock takes f's exclusive flock without waiting (errWouldBlock when another holds it).
func tryLock(f *os.File) error { return unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) }
