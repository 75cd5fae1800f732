package testenv

import (
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// releaseMounts detaches every mount under dir and every loop device whose backing file is
// under dir, so that removing a failed test's temp dir never deletes through a sandbox's
// mounted disk nor leaves its loop device attached.
func releaseMounts(dir string) {
	dirs := []string{dir}
	if real, err := filepath.EvalSymlinks(dir); err == nil && real != dir {
		dirs = append(dirs, real)
	}
	under := func(p string) bool {
		for _, d := range dirs {
			if p == d || strings.HasPrefix(p, d+"/") {
				return true
			}
		}
		return false
	}
	var mine []string
	mounts, _ := mountinfo.GetMounts(func(m *mountinfo.Info) (skip, stop bool) { return !under(m.Mountpoint), false })
	for _, m := range mounts {
		mine = append(mine, m.Mountpoint)
	}
	sort.Slice(mine, func(i, j int) bool { return len(mine[i]) > len(mine[j]) })
	for _, mp := range mine {
		_ = unix.Unmount(mp, unix.MNT_DETACH)
	}
	backing, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, p := range backing {
		b, err := os.ReadFile(p)
		if err != nil || !under(strings.TrimSuffix(strings.TrimSpace(string(b)), " (deleted)")) {
			continue
		}
		if f, err := os.OpenFile("/dev/"+filepath.Base(filepath.Dir(filepath.Dir(p))), os.O_RDWR, 0); err == nil {
			_ = unix.IoctlSetInt(int(f.Fd()), unix.LOOP_CLR_FD, 0)
			f.Close()
		}
	}
}
