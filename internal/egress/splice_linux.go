package egress

import (
	"io"
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// spliceChunk is the most one splice(2) moves, and the pipe's size.
const spliceChunk = 1 << 20

// spliceN moves exactly n bytes from src to dst with splice(2) through a pipe, never through
// user space: the body of a forwarded response, whose length is known, when both ends are
// sockets (the sandbox's unix connection, the upstream's TCP one). Go's own splice (io.Copy to
// or from a TCPConn) has no limit in this direction, and bytes past the body must not reach the
// sandbox. ok is false when it cannot be done that way (nothing was moved then).
func spliceN(dst net.Conn, src net.Conn, n int64) (written int64, ok bool, err error) {
	ds, dok := dst.(syscall.Conn)
	ss, sok := src.(syscall.Conn)
	if !dok || !sok {
		return 0, false, nil
	}
	wc, err1 := ds.SyscallConn()
	rc, err2 := ss.SyscallConn()
	if err1 != nil || err2 != nil {
		return 0, false, nil
	}
	var p [2]int
	if unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK) != nil {
		return 0, false, nil
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	// A pipe holds 64 KiB by default, so each splice in moves at most that and each wait for
	// the upstream moves 64 KiB: at 1 MiB (what Go's own splice sets, and pipe-max-size's
	// default) a wake-up moves what the socket holds. Unchanged where the kernel refuses.
	unix.FcntlInt(uintptr(p[0]), unix.F_SETPIPE_SZ, spliceChunk)
	const flags = unix.SPLICE_F_MOVE | unix.SPLICE_F_NONBLOCK
	for written < n {
		var in int
		var serr error
		if err := rc.Read(func(fd uintptr) bool {
			m, e := unix.Splice(int(fd), nil, p[1], nil, int(min(n-written, spliceChunk)), flags)
			if e == unix.EAGAIN {
				return false
			}
			in, serr = int(m), e
			return true
		}); err != nil {
			return written, true, err
		}
		if serr != nil {
			return written, true, serr
		}
		if in == 0 {
			return written, true, io.ErrUnexpectedEOF
		}
		for in > 0 {
			var out int
			if err := wc.Write(func(fd uintptr) bool {
				m, e := unix.Splice(p[0], nil, int(fd), nil, in, flags)
				if e == unix.EAGAIN {
					return false
				}
				out, serr = int(m), e
				return true
			}); err != nil {
				return written, true, err
			}
			if serr != nil {
				return written, true, serr
			}
			in -= out
			written += int64(out)
		}
	}
	return written, true, nil
}
