//go:build unix

package sandbox

import "golang.org/x/sys/unix"

// freeBytes is the space free to unprivileged users on the file system that holds path.
func freeBytes(path string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return 0, err
	}
	return int64(st.Bavail) * int64(st.Bsize), nil //nolint:unconvert // field types differ by platform
}
