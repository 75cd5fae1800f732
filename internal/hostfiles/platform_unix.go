//go:build unix

package hostfiles

import (
	"fmt"
	"io/fs"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// owner is a replaced file's uid and gid (ok false: none to keep).
type owner struct {
	uid, gid int
	ok       bool
}

func ownerOf(fi fs.FileInfo) owner {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return owner{}
	}
	return owner{uid: int(st.Uid), gid: int(st.Gid), ok: true}
}

// setOwner gives f the owner o, where the agent may (root, or its own uid with one of its
// groups); it returns "uid:gid" when set, "" otherwise.
func setOwner(f *os.File, o owner) string {
	if !o.ok {
		return ""
	}
	if err := f.Chown(o.uid, o.gid); err != nil {
		return ""
	}
	return fmt.Sprintf("%d:%d", o.uid, o.gid)
}

// openRead opens p without blocking on a FIFO swapped in after the caller's stat.
func openRead(p string) (*os.File, error) {
	return os.OpenFile(p, os.O_RDONLY|syscall.O_NONBLOCK, 0)
}

// freeBytes is the space on dir's filesystem available to an unprivileged writer.
func freeBytes(dir string) (uint64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, err
	}
	return uint64(st.Bavail) * uint64(st.Bsize), nil //nolint:unconvert // Bsize's type differs by platform
}

// syncDir makes a rename in dir durable (best effort).
func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		_ = d.Close()
	}
}
