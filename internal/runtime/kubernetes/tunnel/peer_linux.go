package tunnel

import (
	"net"

	"golang.org/x/sys/unix"
)

// peerPID is the pid (in this process's pid namespace) of the process at c's other end.
func peerPID(c *net.UnixConn) (int32, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *unix.Ucred
	var serr error
	if err := raw.Control(func(fd uintptr) { cred, serr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil {
		return 0, err
	}
	if serr != nil {
		return 0, serr
	}
	return cred.Pid, nil
}
