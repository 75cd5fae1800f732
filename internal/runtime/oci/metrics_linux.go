package oci

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/hostinfo"
	"github.com/agentbox/agentbox/internal/runtime"
)

var _ runtime.MetricsReader = (*Runtime)(nil)

// cgroupHierarchies is where each controller's hierarchy is mounted: on cgroup v2 every
// controller is the unified hierarchy; on v1 and hybrid hosts each v1 controller has its own
// (or a shared one such as cpu,cpuacct). A sandbox's cgroup is <hierarchy>/<CgroupParent>/<id>;
// runsc puts gVisor's sentry, gofer and their threads in that same cgroup.
type cgroupHierarchies struct {
	v2                         bool
	cpu, cpuacct, memory, pids string
}

// hierarchies finds the controllers' mounts once.
func (r *Runtime) hierarchies() (cgroupHierarchies, error) {
	r.hierOnce.Do(func() {
		mounts, err := hostinfo.CgroupMounts()
		if err != nil {
			r.hierErr = err
			return
		}
		r.hier = hierarchiesFrom(r.caps.CgroupMode, mounts)
	})
	return r.hier, r.hierErr
}

func hierarchiesFrom(mode string, mounts []hostinfo.CgroupMount) cgroupHierarchies {
	var h cgroupHierarchies
	if mode == hostinfo.CgroupV2 {
		for _, m := range mounts {
			if m.Version == 2 && (m.Path == "/sys/fs/cgroup" || h.cpu == "") {
				h = cgroupHierarchies{v2: true, cpu: m.Path, cpuacct: m.Path, memory: m.Path, pids: m.Path}
			}
		}
		return h
	}
	for _, m := range mounts {
		if m.Version != 1 {
			continue
		}
		for _, o := range m.Options {
			switch o {
			case "cpu":
				h.cpu = m.Path
			case "cpuacct":
				h.cpuacct = m.Path
			case "memory":
				h.memory = m.Path
			case "pids":
				h.pids = m.Path
			}
		}
	}
	return h
}

// Metrics samples a sandbox's cgroups (CPU, memory, pids) and its disk.
func (r *Runtime) Metrics(ctx context.Context, id string) (runtime.Metrics, error) {
	if err := checkID(id); err != nil {
		return runtime.Metrics{}, err
	}
	if err := r.checkAvailable(); err != nil {
		return runtime.Metrics{}, err
	}
	if err := ctx.Err(); err != nil {
		return runtime.Metrics{}, err
	}
	if _, err := os.Stat(r.sandboxDir(id)); err != nil {
		return runtime.Metrics{}, errcode.New(errcode.SandboxNotFound, "sandbox %s has no host resources on runtime %s", id, r.name)
	}
	h, err := r.hierarchies()
	if err != nil {
		return runtime.Metrics{}, errcode.Wrap(errcode.RuntimeUnavailable, err, "cannot find the cgroup hierarchies of this host")
	}
	rel := cgroupPath(r.cgroupParent, id)
	m := runtime.Metrics{SampledAt: time.Now().UTC()}
	var errs []error
	note := func(group string, err error) {
		if errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
		m.Unsupported = append(m.Unsupported, group)
	}
	if cpu, err := readCPU(h, rel); err == nil {
		m.CPU = &cpu
	} else {
		note("cpu", err)
	}
	if mem, err := readMemory(h, rel); err == nil {
		if r.flavor == FlavorGVisor && mem.LimitBytes > 0 {
			// The cgroup's limit is memory_mb plus the OOM guard's slack; the sandbox's limit,
			// what its kernel shows and the guard enforces, is the threshold.
			if t, err := readInt64(filepath.Join(r.sandboxDir(id), oomThresholdFile)); err == nil && t > 0 {
				mem.LimitBytes = t
			}
		}
		m.Memory = &mem
	} else {
		note("memory", err)
	}
	if p, err := readPids(h, rel); err == nil {
		m.Pids = &p
	} else {
		note("pids", err)
	}
	if d, err := diskUsage(filepath.Join(r.sandboxDir(id), diskMountName)); err == nil {
		m.Disk = &d
	} else {
		note("disk", err)
	}
	if m.CPU == nil && m.Memory == nil && m.Pids == nil {
		if len(errs) > 0 {
			// The cgroups are gone: the sandbox is not running.
			return runtime.Metrics{}, errcode.New(errcode.SandboxNotRunning, "sandbox %s is not running (it has no cgroups)", id)
		}
		return runtime.Metrics{}, errcode.New(errcode.UnsupportedOp, "runtime %s cannot read the cgroups of sandbox %s on this host", r.name, id)
	}
	return m, nil
}

func readCPU(h cgroupHierarchies, rel string) (runtime.CPUMetrics, error) {
	var c runtime.CPUMetrics
	if h.v2 {
		dir := filepath.Join(h.cpu, rel)
		stat, err := readKeyed(filepath.Join(dir, "cpu.stat"))
		if err != nil {
			return c, err
		}
		usec, ok := stat["usage_usec"]
		if !ok {
			return c, errors.New("cpu.stat has no usage_usec")
		}
		c.UsageSeconds = float64(usec) / 1e6
		b, err := os.ReadFile(filepath.Join(dir, "cpu.max"))
		if err == nil {
			c.LimitCores = parseCPUMax(string(b))
		}
		return c, nil
	}
	if h.cpuacct == "" {
		return c, errors.New("no cpuacct hierarchy")
	}
	ns, err := readInt64(filepath.Join(h.cpuacct, rel, "cpuacct.usage"))
	if err != nil {
		return c, err
	}
	c.UsageSeconds = float64(ns) / 1e9
	if h.cpu != "" {
		quota, qerr := readInt64(filepath.Join(h.cpu, rel, "cpu.cfs_quota_us"))
		period, perr := readInt64(filepath.Join(h.cpu, rel, "cpu.cfs_period_us"))
		if qerr == nil && perr == nil && quota > 0 && period > 0 {
			c.LimitCores = float64(quota) / float64(period)
		}
	}
	return c, nil
}

// parseCPUMax reads cgroup v2's cpu.max ("max 100000" or "150000 100000") as cores; 0 is
// unlimited.
func parseCPUMax(s string) float64 {
	f := strings.Fields(s)
	if len(f) != 2 || f[0] == "max" {
		return 0
	}
	q, err1 := strconv.ParseFloat(f[0], 64)
	p, err2 := strconv.ParseFloat(f[1], 64)
	if err1 != nil || err2 != nil || p <= 0 {
		return 0
	}
	return q / p
}

// unlimitedBytes: v1 reports "no limit" as the largest page-aligned int64.
const unlimitedBytes = 1 << 62

func readMemory(h cgroupHierarchies, rel string) (runtime.MemoryMetrics, error) {
	var m runtime.MemoryMetrics
	if h.memory == "" {
		return m, errors.New("no memory hierarchy")
	}
	dir := filepath.Join(h.memory, rel)
	usageFile, limitFile, inactive, cache := "memory.usage_in_bytes", "memory.limit_in_bytes", "total_inactive_file", "total_cache"
	if h.v2 {
		usageFile, limitFile, inactive, cache = "memory.current", "memory.max", "inactive_file", "file"
	}
	usage, err := readInt64(filepath.Join(dir, usageFile))
	if err != nil {
		return m, err
	}
	stat, err := readKeyed(filepath.Join(dir, "memory.stat"))
	if err != nil {
		return m, err
	}
	// As docker stats: the working set leaves out page cache the kernel can drop at once.
	m.UsedBytes = max(0, usage-stat[inactive])
	m.CacheBytes = stat[cache]
	if b, err := os.ReadFile(filepath.Join(dir, limitFile)); err == nil {
		if s := strings.TrimSpace(string(b)); s != "max" {
			if n, err := strconv.ParseInt(s, 10, 64); err == nil && n < unlimitedBytes {
				m.LimitBytes = n
			}
		}
	}
	events := "memory.oom_control" // v1: "oom_kill N" since Linux 4.13
	if h.v2 {
		events = "memory.events"
	}
	if ev, err := readKeyed(filepath.Join(dir, events)); err == nil {
		m.OOMEvents = ev["oom_kill"]
	}
	return m, nil
}

func readPids(h cgroupHierarchies, rel string) (runtime.PidsMetrics, error) {
	var p runtime.PidsMetrics
	if h.pids == "" {
		return p, errors.New("no pids hierarchy")
	}
	dir := filepath.Join(h.pids, rel)
	cur, err := readInt64(filepath.Join(dir, "pids.current"))
	if err != nil {
		return p, err
	}
	p.Current = cur
	if b, err := os.ReadFile(filepath.Join(dir, "pids.max")); err == nil {
		if s := strings.TrimSpace(string(b)); s != "max" {
			p.Limit, _ = strconv.ParseInt(s, 10, 64)
		}
	}
	return p, nil
}

// readKeyed reads a cgroup flat-keyed file ("key value" per line); values that are not
// integers are left out.
func readKeyed(path string) (map[string]int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return parseKeyed(b), nil
}

func parseKeyed(b []byte) map[string]int64 {
	out := map[string]int64{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		if n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil {
			out[k] = n
		}
	}
	return out
}

// diskUsage is statfs of the sandbox's mounted disk. A directory that is not a mount point
// (the disk is not mounted) is an error: statfs would describe the host's file system.
func diskUsage(mnt string) (runtime.DiskMetrics, error) {
	var st, parent unix.Stat_t
	if err := unix.Stat(mnt, &st); err != nil {
		return runtime.DiskMetrics{}, err
	}
	if err := unix.Stat(filepath.Dir(mnt), &parent); err != nil {
		return runtime.DiskMetrics{}, err
	}
	if st.Dev == parent.Dev {
		return runtime.DiskMetrics{}, fmt.Errorf("%s is not mounted", mnt)
	}
	var sf unix.Statfs_t
	if err := unix.Statfs(mnt, &sf); err != nil {
		return runtime.DiskMetrics{}, err
	}
	bs := int64(sf.Bsize)
	return runtime.DiskMetrics{UsedBytes: int64(sf.Blocks-sf.Bfree) * bs, TotalBytes: int64(sf.Blocks) * bs}, nil
}

// hierarchy state lives on Runtime (runtime_linux.go holds the struct); kept here.
type hierState struct {
	hierOnce sync.Once
	hier     cgroupHierarchies
	hierErr  error
}
