package guest

import (
	"path/filepath"

	"golang.org/x/sys/unix"
)

// onTmpfs reports whether path (or, when it does not exist, its nearest existing parent) is
// on a tmpfs.
func onTmpfs(path string) bool {
	var st unix.Statfs_t
	for dir := path; ; dir = filepath.Dir(dir) {
		if unix.Statfs(dir, &st) == nil || dir == "/" || dir == "." {
			break
		}
	}
	return st.Type == unix.TMPFS_MAGIC
}
