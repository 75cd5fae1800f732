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
