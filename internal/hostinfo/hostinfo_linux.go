package hostinfo

import (
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// CgroupMounts lists the cgroup hierarchies mounted in this process's mount namespace.
func CgroupMounts() ([]CgroupMount, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("cgroup mounts: %w", err)
	}
	defer f.Close()
	entries, err := parseMountinfo(f)
	if err != nil {
		return nil, fmt.Errorf("cgroup mounts: %w", err)
	}
	return cgroupMountsFrom(entries), nil
}

// parseMountinfo reads the format of proc(5) /proc/[pid]/mountinfo (github.com/moby/sys/mountinfo
// parses it and undoes its octal escapes).
func parseMountinfo(r io.Reader) ([]mountEntry, error) {
	infos, err := mountinfo.GetMountsFromReader(r, nil)
	if err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	out := make([]mountEntry, 0, len(infos))
	for _, m := range infos {
		e := mountEntry{mountPoint: m.Mountpoint, fsType: m.FSType}
		if m.VFSOptions != "" {
			e.superOpts = strings.Split(m.VFSOptions, ",")
		}
		out = append(out, e)
	}
	return out, nil
}

// CgroupMode reports "v1", "hybrid" or "v2". It trusts the file system type of
// /sys/fs/cgroup (as runc does) and falls back to the mount table elsewhere.
func CgroupMode() (string, error) {
	var st unix.Statfs_t
	if err := unix.Statfs("/sys/fs/cgroup", &st); err == nil {
		switch st.Type {
		case unix.CGROUP2_SUPER_MAGIC:
			return CgroupV2, nil
		case unix.TMPFS_MAGIC:
			var u unix.Statfs_t
			if err := unix.Statfs("/sys/fs/cgroup/unified", &u); err == nil && u.Type == unix.CGROUP2_SUPER_MAGIC {
				return CgroupHybrid, nil
			}
			return CgroupV1, nil
		}
	}
	mounts, err := CgroupMounts()
	if err != nil {
		return "", err
	}
	if mode := cgroupModeFrom(mounts); mode != "" {
		return mode, nil
	}
	return "", errors.New("cgroup mode: no cgroup hierarchy is mounted")
}

// HardRlimits returns the hard limits of RLIMIT_NOFILE, RLIMIT_NPROC and RLIMIT_FSIZE of this
// process; a container may not ask for more (the runtime fails at start with "operation not
// permitted").
func HardRlimits() (Rlimits, error) {
	var nofile, nproc, fsize unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &nofile); err != nil {
		return Rlimits{}, fmt.Errorf("getrlimit NOFILE: %w", err)
	}
	if err := unix.Getrlimit(unix.RLIMIT_NPROC, &nproc); err != nil {
		return Rlimits{}, fmt.Errorf("getrlimit NPROC: %w", err)
	}
	if err := unix.Getrlimit(unix.RLIMIT_FSIZE, &fsize); err != nil {
		return Rlimits{}, fmt.Errorf("getrlimit FSIZE: %w", err)
	}
	return Rlimits{NOFILE: nofile.Max, NPROC: nproc.Max, FSIZE: fsize.Max}, nil
}

// UserNamespaces reports whether unprivileged-to-root user namespaces may be created:
// /proc/sys/user/max_user_namespaces is above zero.
func UserNamespaces() bool {
	return userNamespacesAt("/proc/sys/user/max_user_namespaces")
}

func userNamespacesAt(path string) bool {
	b, err := os.ReadFile(path)
	if err != nil {
		return false
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return err == nil && n > 0
}

// KVM reports whether /dev/kvm exists as a character device. It does not prove that KVM
// works (nested KVM may hang); a microVM runtime probes that itself.
func KVM() bool {
	fi, err := os.Stat("/dev/kvm")
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// NumCPU is the number of CPUs this process may use.
func NumCPU() int { return runtime.NumCPU() }

// MemTotalMiB is the host's total memory in MiB (MemTotal of /proc/meminfo).
func MemTotalMiB() (int64, error) { return meminfo("MemTotal") }

// MemAvailableMiB is the memory the host can give new work without swapping, in MiB
// (MemAvailable of /proc/meminfo).
func MemAvailableMiB() (int64, error) { return meminfo("MemAvailable") }

func meminfo(field string) (int64, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, fmt.Errorf("meminfo: %w", err)
	}
	defer f.Close()
	mib, err := parseMeminfo(f, field)
	if err != nil {
		return 0, fmt.Errorf("meminfo: %w", err)
	}
	return mib, nil
}

// DiskSpaceMiB is the space free to unprivileged users and the size of the file system that
// holds path, in MiB.
func DiskSpaceMiB(path string) (free, total int64, err error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return 0, 0, fmt.Errorf("statfs %s: %w", path, err)
	}
	return int64(st.Bavail) * int64(st.Bsize) >> 20, int64(st.Blocks) * int64(st.Bsize) >> 20, nil
}

// Probe gathers every fact; facts that cannot be read are zero and named in Errors.
func Probe() Info {
	var info Info
	fail := func(err error) { info.Errors = append(info.Errors, err.Error()) }
	var err error
	if info.CgroupMode, err = CgroupMode(); err != nil {
		fail(err)
	}
	if info.CgroupMounts, err = CgroupMounts(); err != nil {
		fail(err)
	}
	if info.HardRlimits, err = HardRlimits(); err != nil {
		fail(err)
	}
	info.UserNamespaces = UserNamespaces()
	info.KVM = KVM()
	info.NumCPU = NumCPU()
	if info.MemTotalMiB, err = MemTotalMiB(); err != nil {
		fail(err)
	}
	return info
}
