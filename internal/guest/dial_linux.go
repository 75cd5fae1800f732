package guest

import (
	"context"
	"fmt"
	"net"
	"strconv"

	"golang.org/x/sys/unix"
)

// dialSocket connects to the agent's socket without following a symlink in its last
// component. The socket's directory is writable from inside the sandbox, so root inside could
// replace the socket by a symlink to any host socket (another sandbox's agent, a host daemon);
// the host resolves that path as root. It opens the path with O_PATH|O_NOFOLLOW, checks that
// it is a socket, and connects through /proc/self/fd, which names exactly that inode.
func dialSocket(ctx context.Context, d *net.Dialer, path string) (net.Conn, error) {
	fd, err := unix.Open(path, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &net.OpError{Op: "dial", Net: "unix", Err: fmt.Errorf("open %s: %w", path, err)}
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, &net.OpError{Op: "dial", Net: "unix", Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return nil, &net.OpError{Op: "dial", Net: "unix", Err: fmt.Errorf("%s is not a socket (mode %o): refusing to follow it", path, st.Mode)}
	}
	return d.DialContext(ctx, "unix", "/proc/self/fd/"+strconv.Itoa(fd))
}

// DialUnix connects to an agent's unix socket at path as NewUnixClient does (never following
// a symlink in its last component) and, when verify is not nil, hands it the credentials of
// the process at the other end (SO_PEERCRED: whoever called listen on the socket, its pid in
// this process's pid namespace). A non-nil error from verify closes the connection before a
// byte is written or read and is returned as is, so the caller never talks to an impostor.
func DialUnix(ctx context.Context, path string, verify func(unix.Ucred) error) (net.Conn, error) {
	var d net.Dialer
	conn, err := dialSocket(ctx, &d, path)
	if err != nil || verify == nil {
		return conn, err
	}
	cred, err := peerCred(conn)
	if err == nil {
		err = verify(cred)
	}
	if err != nil {
		conn.Close()
		return nil, err
	}
	return conn, nil
}

// peerCred returns SO_PEERCRED of a unix connection.
func peerCred(conn net.Conn) (unix.Ucred, error) {
	uc, ok := conn.(*net.UnixConn)
	if !ok {
		return unix.Ucred{}, fmt.Errorf("peer credentials: %T is not a unix connection", conn)
	}
	rc, err := uc.SyscallConn()
	if err != nil {
		return unix.Ucred{}, fmt.Errorf("peer credentials: %w", err)
	}
	var cred *unix.Ucred
	var serr error
	if err := rc.Control(func(fd uintptr) {
		cred, serr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return unix.Ucred{}, fmt.Errorf("peer credentials: %w", err)
	}
	if serr != nil {
		return unix.Ucred{}, fmt.Errorf("peer credentials: %w", serr)
	}
	return *cred, nil
}
