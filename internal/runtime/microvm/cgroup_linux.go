package microvm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

const cgroupRoot = "/sys/fs/cgroup"

// cgroups is where the VMs' cgroups live: the unified hierarchy (v2), or on a v1 or hybrid host
// the cpu, memory and pids hierarchies.
type cgroups struct {
	v2 bool
	// roots are the hierarchies' mount points: one for v2, cpu/memory/pids for v1.
	roots []string
}

func detectCgroups() (cgroups, error) {
	var st unix.Statfs_t
	if unix.Statfs(cgroupRoot, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
		return cgroups{v2: true, roots: []string{cgroupRoot}}, nil
	}
	var c cgroups
	for _, ctl := range []string{"cpu", "memory", "pids"} {
		d := filepath.Join(cgroupRoot, ctl)
		if unix.Statfs(d, &st) != nil || st.Type != unix.CGROUP_SUPER_MAGIC {
			return c, fmt.Errorf("the host has neither a cgroup v2 hierarchy at %s nor a v1 %s hierarchy at %s", cgroupRoot, ctl, d)
		}
		c.roots = append(c.roots, d)
	}
	return c, nil
}

// cgroupParent makes the runtime's parent cgroup (with the cpu, memory and pids controllers
// delegated to its children on v2).
func (r *Runtime) cgroupParent() error {
	for _, root := range r.cg.roots {
		parent := filepath.Join(root, r.cfg.CgroupParent)
		if err := os.MkdirAll(parent, 0o755); err != nil {
			return fmt.Errorf("cgroup %s: %w", parent, err)
		}
		if !r.cg.v2 {
			continue
		}
		for _, c := range []string{"cpu", "memory", "pids"} {
			for _, d := range []string{root, parent} {
				ctl := filepath.Join(d, "cgroup.subtree_control")
				if b, _ := os.ReadFile(ctl); strings.Contains(" "+strings.TrimSpace(string(b))+" ", " "+c+" ") {
					continue
				}
				if err := os.WriteFile(ctl, []byte("+"+c), 0); err != nil {
					return fmt.Errorf("enable the %s controller in %s: %w", c, d, err)
				}
			}
		}
	}
	return nil
}

// makeCgroup makes <parent>/<id> in each hierarchy with the VM's limits: memory = guest RAM +
// QEMU's overhead, cpu = the spec's cores, a bound on QEMU's threads. It returns the
// directories.
func (r *Runtime) makeCgroup(id string, rec record) ([]string, error) {
	mem := strconv.FormatInt((rec.MemoryMB+qemuOverheadMB)<<20, 10)
	// In order: v1 takes memsw only at or above the memory limit.
	type limit struct{ file, value string }
	var limits []limit
	if r.cg.v2 {
		limits = []limit{{"memory.max", mem}, {"memory.swap.max", "0"}, {"pids.max", "256"}}
		if rec.CPU > 0 {
			limits = append(limits, limit{"cpu.max", fmt.Sprintf("%d 100000", int64(rec.CPU*100000))})
		}
	} else {
		limits = []limit{{"memory/memory.limit_in_bytes", mem}, {"memory/memory.memsw.limit_in_bytes", mem}, {"pids/pids.max", "256"}}
		if rec.CPU > 0 {
			limits = append(limits, limit{"cpu/cpu.cfs_period_us", "100000"},
				limit{"cpu/cpu.cfs_quota_us", strconv.FormatInt(int64(rec.CPU*100000), 10)})
		}
	}
	var dirs []string
	for _, root := range r.cg.roots {
		dir := filepath.Join(root, r.cfg.CgroupParent, id)
		if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("vm runtime: cgroup: %w", err)
		}
		dirs = append(dirs, dir)
	}
	for _, l := range limits {
		f, v := l.file, l.value
		path := filepath.Join(r.cg.roots[0], r.cfg.CgroupParent, id, f)
		if !r.cg.v2 {
			ctl, file, _ := strings.Cut(f, "/")
			path = filepath.Join(cgroupRoot, ctl, r.cfg.CgroupParent, id, file)
		}
		if err := os.WriteFile(path, []byte(v), 0); err != nil {
			if (strings.Contains(f, "swap") || strings.Contains(f, "memsw")) && errors.Is(err, os.ErrNotExist) {
				continue // no swap accounting on this host
			}
			return nil, fmt.Errorf("vm runtime: cgroup %s: %w", f, err)
		}
	}
	return dirs, nil
}

// joinCgroup moves pid into the v1 hierarchies' cgroups (v2 starts QEMU in its cgroup).
func (r *Runtime) joinCgroup(pid int, dirs []string) error {
	for _, d := range dirs {
		if err := os.WriteFile(filepath.Join(d, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
			return fmt.Errorf("vm runtime: join cgroup %s: %w", d, err)
		}
	}
	return nil
}

// cgroupIDs lists the sandbox-shaped cgroups under the parent.
func (r *Runtime) cgroupIDs() []string {
	var ids []string
	for _, root := range r.cg.roots {
		ents, _ := os.ReadDir(filepath.Join(root, r.cfg.CgroupParent))
		for _, e := range ents {
			if e.IsDir() {
				ids = append(ids, e.Name())
			}
		}
	}
	return ids
}

// removeCgroup removes <parent>/<id> from every hierarchy, killing what is left in it first.
func (r *Runtime) removeCgroup(ctx context.Context, id string) error {
	for _, root := range r.cg.roots {
		dir := filepath.Join(root, r.cfg.CgroupParent, id)
		if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
			continue
		}
		if r.cg.v2 {
			_ = os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0)
		} else if b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs")); err == nil {
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil {
					_ = unix.Kill(pid, unix.SIGKILL)
				}
			}
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			err := unix.Rmdir(dir)
			if err == nil || err == unix.ENOENT {
				break
			}
			if err != unix.EBUSY || time.Now().After(deadline) || ctx.Err() != nil {
				return fmt.Errorf("vm runtime: remove cgroup %s: %w", dir, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return nil
}

// removeParent removes the runtime's parent cgroups when they are empty (tests; a server keeps
// them).
func (r *Runtime) removeParent() {
	for _, root := range r.cg.roots {
		_ = unix.Rmdir(filepath.Join(root, r.cfg.CgroupParent))
	}
}
