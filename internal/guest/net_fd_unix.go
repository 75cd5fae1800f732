//go:build linux

package guest

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"

	"golang.org/x/sys/unix"
)

// readFirstWithRights reads p (the frame's first byte) from uc with room for one descriptor's
// ancillary data (a second in the same message fits the padding and is returned too, so the
// caller refuses and closes both; any beyond are discarded by the kernel, MSG_CTRUNC). It
// returns every descriptor received, which the caller owns, even with an error.
func readFirstWithRights(uc *net.UnixConn, p []byte) ([]int, error) {
	oob := make([]byte, unix.CmsgSpace(4))
	n, oobn, flags, _, err := uc.ReadMsgUnix(p, oob)
	var fds []int
	if oobn > 0 {
		msgs, perr := unix.ParseSocketControlMessage(oob[:oobn])
		for _, m := range msgs {
			if got, err := unix.ParseUnixRights(&m); err == nil {
				fds = append(fds, got...)
			}
		}
		if perr != nil && err == nil {
			err = perr
		}
	}
	if n == 0 && err == nil {
		err = errNoFrame
	}
	if err != nil {
		if n == 0 && len(fds) == 0 {
			return nil, errNoFrame
		}
		return fds, err
	}
	if flags&unix.MSG_CTRUNC != 0 {
		return fds, errors.New("more descriptors than one came with the header")
	}
	return fds, nil
}

// takeSocket checks that fd, handed over by the (untrusted) agent for header h, is a
// connected TCP socket (IPv4 or IPv6) and, for a transparent stream, that its local address is
// h.Dst; it returns it as a *net.TCPConn and closes fd either way.
func takeSocket(fd int, h NetStreamHeader) (*net.TCPConn, error) {
	f := os.NewFile(uintptr(fd), "agent-socket")
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("fstat a handed-over descriptor: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return nil, fmt.Errorf("a handed-over descriptor is not a socket (mode %#o)", st.Mode&unix.S_IFMT)
	}
	for _, c := range []struct {
		opt  int
		name string
		ok   func(int) bool
	}{
		{unix.SO_TYPE, "SO_TYPE", func(v int) bool { return v == unix.SOCK_STREAM }},
		{unix.SO_DOMAIN, "SO_DOMAIN", func(v int) bool { return v == unix.AF_INET || v == unix.AF_INET6 }},
		{unix.SO_PROTOCOL, "SO_PROTOCOL", func(v int) bool { return v == unix.IPPROTO_TCP }},
		{unix.SO_ACCEPTCONN, "SO_ACCEPTCONN", func(v int) bool { return v == 0 }},
	} {
		v, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, c.opt)
		if err != nil {
			return nil, fmt.Errorf("getsockopt %s of a handed-over socket: %w", c.name, err)
		}
		if !c.ok(v) {
			return nil, fmt.Errorf("a handed-over socket is not a connected TCP socket (%s %d)", c.name, v)
		}
	}
	if h.Kind == "transparent" {
		sa, err := unix.Getsockname(fd)
		if err != nil {
			return nil, fmt.Errorf("getsockname of a handed-over socket: %w", err)
		}
		local := sockaddrPort(sa)
		want, _ := netip.ParseAddrPort(h.Dst)
		if !local.IsValid() || local.Addr().Unmap() != want.Addr().Unmap() || local.Port() != want.Port() {
			return nil, fmt.Errorf("a transparent stream's dst %s is not its socket's local address %s", want, local)
		}
	}
	c, err := net.FileConn(f)
	if err != nil {
		return nil, fmt.Errorf("a handed-over socket: %w", err)
	}
	tc, ok := c.(*net.TCPConn)
	if !ok {
		_ = c.Close()
		return nil, fmt.Errorf("a handed-over socket is a %T, not TCP", c)
	}
	return tc, nil
}

// takeListenerFD checks that fd, handed over by the (untrusted) agent for a listener header
// h, is a listening TCP socket (IPv4 or IPv6; Go listens with MPTCP where the kernel has it,
// which accepts plain TCP clients as TCP) bound at h.Dst; it returns it as a *net.TCPListener
// and closes fd either way. Whether h.Dst is one of the session's is the caller's check.
func takeListenerFD(fd int, h NetStreamHeader) (*net.TCPListener, error) {
	f := os.NewFile(uintptr(fd), "agent-listener")
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("fstat a handed-over descriptor: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return nil, fmt.Errorf("a handed-over descriptor is not a socket (mode %#o)", st.Mode&unix.S_IFMT)
	}
	for _, c := range []struct {
		opt  int
		name string
		ok   func(int) bool
	}{
		{unix.SO_TYPE, "SO_TYPE", func(v int) bool { return v == unix.SOCK_STREAM }},
		{unix.SO_DOMAIN, "SO_DOMAIN", func(v int) bool { return v == unix.AF_INET || v == unix.AF_INET6 }},
		{unix.SO_PROTOCOL, "SO_PROTOCOL", func(v int) bool { return v == unix.IPPROTO_TCP || v == unix.IPPROTO_MPTCP }},
		{unix.SO_ACCEPTCONN, "SO_ACCEPTCONN", func(v int) bool { return v == 1 }},
	} {
		v, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, c.opt)
		if err != nil {
			return nil, fmt.Errorf("getsockopt %s of a handed-over listener: %w", c.name, err)
		}
		if !c.ok(v) {
			return nil, fmt.Errorf("a handed-over listener is not a listening TCP socket (%s %d)", c.name, v)
		}
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return nil, fmt.Errorf("getsockname of a handed-over listener: %w", err)
	}
	local := sockaddrPort(sa)
	want, _ := netip.ParseAddrPort(h.Dst)
	if !local.IsValid() || local.Addr().Unmap() != want.Addr().Unmap() || local.Port() != want.Port() {
		return nil, fmt.Errorf("a listener's dst %s is not its socket's address %s", want, local)
	}
	l, err := net.FileListener(f)
	if err != nil {
		return nil, fmt.Errorf("a handed-over listener: %w", err)
	}
	tl, ok := l.(*net.TCPListener)
	if !ok {
		_ = l.Close()
		return nil, fmt.Errorf("a handed-over listener is a %T, not TCP", l)
	}
	return tl, nil
}

func sockaddrPort(sa unix.Sockaddr) netip.AddrPort {
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(a.Addr), uint16(a.Port))
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(a.Addr), uint16(a.Port))
	}
	return netip.AddrPort{}
}

func closeFD(fd int) { _ = unix.Close(fd) }

// isPlainTCP reports whether fd is a TCP socket (SO_PROTOCOL IPPROTO_TCP), what the host
// takes; an MPTCP connection (a client that asked for it) is relayed instead.
func isPlainTCP(fd int) bool {
	v, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_PROTOCOL)
	return err == nil && v == unix.IPPROTO_TCP
}

// dupCloexec duplicates fd, close-on-exec (a listener's, for the session's reply).
func dupCloexec(fd int) (int, error) { return unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0) }

// maxReplyFDs is the most descriptors a session's reply carries: its TCP listeners (the proxy,
// the resolver's TCP side and the transparent ports).
const maxReplyFDs = MaxTransparentPorts + 2

// readReplyWithRights reads a session's reply line (at most max bytes, newline excluded) from
// uc, with room for maxReplyFDs descriptors' ancillary data (more: an error; the kernel drops
// those past the room). It returns the line, what came after it, and every descriptor
// received, which the caller owns, even with an error.
func readReplyWithRights(uc *net.UnixConn, max int) (line, rest []byte, fds []int, err error) {
	buf := make([]byte, max+2)
	oob := make([]byte, unix.CmsgSpace(4*maxReplyFDs))
	n := 0
	for {
		m, oobn, flags, _, rerr := uc.ReadMsgUnix(buf[n:], oob)
		if oobn > 0 {
			msgs, perr := unix.ParseSocketControlMessage(oob[:oobn])
			for _, msg := range msgs {
				if got, err := unix.ParseUnixRights(&msg); err == nil {
					fds = append(fds, got...)
				}
			}
			if perr != nil && rerr == nil {
				rerr = perr
			}
		}
		if flags&unix.MSG_CTRUNC != 0 && rerr == nil {
			rerr = fmt.Errorf("more than %d descriptors came with the reply", maxReplyFDs)
		}
		n += m
		if i := bytes.IndexByte(buf[:n], '\n'); i >= 0 && rerr == nil {
			if i > max {
				return nil, nil, fds, errLineTooLong
			}
			return buf[:i], buf[i+1 : n], fds, nil
		}
		switch {
		case rerr != nil:
			return nil, nil, fds, rerr
		case m == 0:
			return nil, nil, fds, io.ErrUnexpectedEOF
		case n >= len(buf):
			return nil, nil, fds, errLineTooLong
		}
	}
}
