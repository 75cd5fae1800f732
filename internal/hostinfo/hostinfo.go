// Package hostinfo reports facts about the host that decide what sandboxes can do here: the
// cgroup mode and hierarchies, hard resource limits, user namespaces, KVM, CPUs and memory.
// The OCI runtimes read it when they build a spec; `agentbox doctor` prints it.
package hostinfo

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// Cgroup modes, as CgroupMode reports them.
const (
	// CgroupV1: only v1 controller hierarchies.
	CgroupV1 = "v1"
	// CgroupHybrid: v1 controllers plus a cgroup2 hierarchy without controllers
	// (usually at /sys/fs/cgroup/unified).
	CgroupHybrid = "hybrid"
	// CgroupV2: the unified hierarchy at /sys/fs/cgroup.
	CgroupV2 = "v2"
)

// CgroupMount is one mounted cgroup hierarchy.
type CgroupMount struct {
	// Path is the mount point, e.g. /sys/fs/cgroup/memory.
	Path string `json:"path"`
	// Version is 1 or 2.
	Version int `json:"version"`
	// Options are the v1 super options naming the hierarchy ("memory", "cpu,cpuacct",
	// "name=systemd"); empty for v2.
	Options []string `json:"options,omitempty"`
}

// Rlimits holds hard resource limits.
type Rlimits struct {
	NOFILE uint64 `json:"nofile"`
	NPROC  uint64 `json:"nproc"`
	// FSIZE is the largest file size in bytes (RLIM_INFINITY, all ones, when unlimited).
	FSIZE uint64 `json:"fsize"`
}

// Info is every fact this package knows, for reports such as `agentbox doctor`.
type Info struct {
	CgroupMode     string        `json:"cgroup_mode"`
	CgroupMounts   []CgroupMount `json:"cgroup_mounts"`
	HardRlimits    Rlimits       `json:"hard_rlimits"`
	UserNamespaces bool          `json:"user_namespaces"`
	KVM            bool          `json:"kvm"`
	NumCPU         int           `json:"num_cpu"`
	MemTotalMiB    int64         `json:"mem_total_mib"`
	// Errors lists the facts that could not be read, and why.
	Errors []string `json:"errors,omitempty"`
}

// mountEntry is the part of a /proc/self/mountinfo line this package uses.
type mountEntry struct {
	mountPoint string
	fsType     string
	superOpts  []string
}

// cgroupMountsFrom picks the cgroup hierarchies out of a mount table.
func cgroupMountsFrom(entries []mountEntry) []CgroupMount {
	var out []CgroupMount
	for _, e := range entries {
		switch e.fsType {
		case "cgroup2":
			out = append(out, CgroupMount{Path: e.mountPoint, Version: 2})
		case "cgroup":
			var opts []string
			for _, o := range e.superOpts {
				switch o {
				case "rw", "ro", "clone_children", "noprefix", "xattr", "cpuset_v2_mode", "favordynmods":
					continue
				}
				if strings.HasPrefix(o, "release_agent=") {
					continue
				}
				opts = append(opts, o)
			}
			out = append(out, CgroupMount{Path: e.mountPoint, Version: 1, Options: opts})
		}
	}
	return out
}

// cgroupModeFrom classifies a set of cgroup mounts the way runc and containerd do.
func cgroupModeFrom(mounts []CgroupMount) string {
	var v1, v2 bool
	for _, m := range mounts {
		if m.Version == 2 && m.Path == "/sys/fs/cgroup" {
			return CgroupV2
		}
		if m.Version == 1 {
			v1 = true
		} else {
			v2 = true
		}
	}
	switch {
	case v1 && v2:
		return CgroupHybrid
	case v1:
		return CgroupV1
	case v2:
		return CgroupV2
	}
	return ""
}

// parseMemTotal reads MemTotal from the format of /proc/meminfo, in MiB.
func parseMemTotal(r io.Reader) (int64, error) { return parseMeminfo(r, "MemTotal") }

// parseMeminfo reads one field (in kB) from the format of /proc/meminfo, in MiB.
func parseMeminfo(r io.Reader, field string) (int64, error) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 2 && f[0] == field+":" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("parse %s %q: %w", field, f[1], err)
			}
			return kb / 1024, nil
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("no %s line in meminfo", field)
}
