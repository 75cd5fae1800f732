package oci

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
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
	// The limits are set at create and never change: read once per sandbox.
	var lim sandboxLimits
	v, cached := r.limits.Load(id)
	if cached {
		lim = v.(sandboxLimits)
	}
	fr := new(fileReader)
	if cpu, err := readCPU(fr, h, rel, !cached); err == nil {
		if cached {
			cpu.LimitCores = lim.cpuCores
		}
		m.CPU = &cpu
	} else {
		note("cpu", err)
	}
	if mem, err := readMemory(fr, h, rel, !cached); err == nil {
		if cached {
			mem.LimitBytes = lim.memoryBytes
		} else if r.flavor == FlavorGVisor && mem.LimitBytes > 0 {
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
	if p, err := readPids(fr, h, rel, !cached); err == nil {
		if cached {
			p.Limit = lim.pids
		}
		m.Pids = &p
	} else {
		note("pids", err)
	}
	if d, err := r.diskUsage(id); err == nil {
		m.Disk = &d
	} else {
		note("disk", err)
	}
	if m.CPU == nil && m.Memory == nil && m.Pids == nil {
		r.limits.Delete(id)
		if _, err := os.Stat(r.sandboxDir(id)); err != nil {
			return runtime.Metrics{}, errcode.New(errcode.SandboxNotFound, "sandbox %s has no host resources on runtime %s", id, r.name)
		}
		if len(errs) > 0 {
			// The cgroups are gone: the sandbox is not running.
			return runtime.Metrics{}, errcode.New(errcode.SandboxNotRunning, "sandbox %s is not running (it has no cgroups)", id)
		}
		return runtime.Metrics{}, errcode.New(errcode.UnsupportedOp, "runtime %s cannot read the cgroups of sandbox %s on this host", r.name, id)
	}
	if !cached && m.CPU != nil && m.Memory != nil && m.Pids != nil {
		r.limits.Store(id, sandboxLimits{cpuCores: m.CPU.LimitCores, memoryBytes: m.Memory.LimitBytes, pids: m.Pids.Limit})
	}
	return m, nil
}

// fileReader reads small cgroup files with open, read and close alone (os.ReadFile adds a
// stat, the poller's registration and an allocation per file: a scrape reads a dozen files per
// sandbox). Its buffer holds the largest file read, memory.stat.
type fileReader struct{ buf [16 << 10]byte }

func (fr *fileReader) read(path string) ([]byte, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	n := 0
	for n < len(fr.buf) {
		m, err := unix.Read(fd, fr.buf[n:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, &fs.PathError{Op: "read", Path: path, Err: err}
		}
		if m == 0 {
			break
		}
		n += m
	}
	return fr.buf[:n], nil
}

func (fr *fileReader) int64(path string) (int64, error) {
	b, err := fr.read(path)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(string(bytes.TrimSpace(b)), 10, 64)
}

// keyed reads a cgroup flat-keyed file and returns the values of keys (missing: absent).
func (fr *fileReader) keyed(path string, keys ...string) (map[string]int64, error) {
	b, err := fr.read(path)
	if err != nil {
		return nil, err
	}
	return parseKeyed(b, keys...), nil
}

// sandboxLimits are a sandbox's limits as Metrics reports them, cached per sandbox.
type sandboxLimits struct {
	cpuCores    float64
	memoryBytes int64
	pids        int64
}

// The read* functions read a group's usage, and its limit with withLimit.
func readCPU(fr *fileReader, h cgroupHierarchies, rel string, withLimit bool) (runtime.CPUMetrics, error) {
	var c runtime.CPUMetrics
	if h.v2 {
		dir := filepath.Join(h.cpu, rel)
		stat, err := fr.keyed(filepath.Join(dir, "cpu.stat"), "usage_usec")
		if err != nil {
			return c, err
		}
		usec, ok := stat["usage_usec"]
		if !ok {
			return c, errors.New("cpu.stat has no usage_usec")
		}
		c.UsageSeconds = float64(usec) / 1e6
		if !withLimit {
			return c, nil
		}
		b, err := fr.read(filepath.Join(dir, "cpu.max"))
		if err == nil {
			c.LimitCores = parseCPUMax(string(b))
		}
		return c, nil
	}
	if h.cpuacct == "" {
		return c, errors.New("no cpuacct hierarchy")
	}
	ns, err := fr.int64(filepath.Join(h.cpuacct, rel, "cpuacct.usage"))
	if err != nil {
		return c, err
	}
	c.UsageSeconds = float64(ns) / 1e9
	if withLimit && h.cpu != "" {
		quota, qerr := fr.int64(filepath.Join(h.cpu, rel, "cpu.cfs_quota_us"))
		period, perr := fr.int64(filepath.Join(h.cpu, rel, "cpu.cfs_period_us"))
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

func readMemory(fr *fileReader, h cgroupHierarchies, rel string, withLimit bool) (runtime.MemoryMetrics, error) {
	var m runtime.MemoryMetrics
	if h.memory == "" {
		return m, errors.New("no memory hierarchy")
	}
	dir := filepath.Join(h.memory, rel)
	usageFile, limitFile, inactive, cache := "memory.usage_in_bytes", "memory.limit_in_bytes", "total_inactive_file", "total_cache"
	if h.v2 {
		usageFile, limitFile, inactive, cache = "memory.current", "memory.max", "inactive_file", "file"
	}
	usage, err := fr.int64(filepath.Join(dir, usageFile))
	if err != nil {
		return m, err
	}
	stat, err := fr.keyed(filepath.Join(dir, "memory.stat"), inactive, cache)
	if err != nil {
		return m, err
	}
	// As docker stats: the working set leaves out page cache the kernel can drop at once.
	m.UsedBytes = max(0, usage-stat[inactive])
	m.CacheBytes = stat[cache]
	if !withLimit {
	} else if b, err := fr.read(filepath.Join(dir, limitFile)); err == nil {
		if s := string(bytes.TrimSpace(b)); s != "max" {
			if n, err := strconv.ParseInt(s, 10, 64); err == nil && n < unlimitedBytes {
				m.LimitBytes = n
			}
		}
	}
	events := "memory.oom_control" // v1: "oom_kill N" since Linux 4.13
	if h.v2 {
		events = "memory.events"
	}
	if ev, err := fr.keyed(filepath.Join(dir, events), "oom_kill"); err == nil {
		m.OOMEvents = ev["oom_kill"]
	}
	return m, nil
}

func readPids(fr *fileReader, h cgroupHierarchies, rel string, withLimit bool) (runtime.PidsMetrics, error) {
	var p runtime.PidsMetrics
	if h.pids == "" {
		return p, errors.New("no pids hierarchy")
	}
	dir := filepath.Join(h.pids, rel)
	cur, err := fr.int64(filepath.Join(dir, "pids.current"))
	if err != nil {
		return p, err
	}
	p.Current = cur
	if !withLimit {
	} else if b, err := fr.read(filepath.Join(dir, "pids.max")); err == nil {
		if s := string(bytes.TrimSpace(b)); s != "max" {
			p.Limit, _ = strconv.ParseInt(s, 10, 64)
		}
	}
	return p, nil
}

// parseKeyed parses a cgroup flat-keyed file ("key value" per line), keeping keys (all when
// none are given); values that are not integers are left out.
func parseKeyed(b []byte, keys ...string) map[string]int64 {
	out := make(map[string]int64, len(keys))
	for len(b) > 0 {
		line := b
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			line, b = b[:i], b[i+1:]
		} else {
			b = nil
		}
		k, v, ok := bytes.Cut(line, []byte{' '})
		if !ok {
			continue
		}
		if len(keys) > 0 && !slices.Contains(keys, string(k)) {
			continue
		}
		if n, err := strconv.ParseInt(string(bytes.TrimSpace(v)), 10, 64); err == nil {
			out[string(k)] = n
		}
	}
	return out
}

// diskUsage is statfs of the sandbox's mounted disk. A directory that is not a mount point
// (the disk is not mounted) is an error: statfs would describe the host's file system. Every
// sandbox's directory is on the file system of Root's sandboxes/, whose device is read once.
func (r *Runtime) diskUsage(id string) (runtime.DiskMetrics, error) {
	mnt := filepath.Join(r.sandboxDir(id), diskMountName)
	r.rootDevOnce.Do(func() {
		var st unix.Stat_t
		if r.rootDevErr = unix.Stat(filepath.Join(r.root, "sandboxes"), &st); r.rootDevErr == nil {
			r.rootDev = st.Dev
		}
	})
	if r.rootDevErr != nil {
		return runtime.DiskMetrics{}, r.rootDevErr
	}
	var st unix.Stat_t
	if err := unix.Stat(mnt, &st); err != nil {
		return runtime.DiskMetrics{}, err
	}
	if st.Dev == r.rootDev {
		return runtime.DiskMetrics{}, fmt.Errorf("%s is not mounted", mnt)
	}
	var sf unix.Statfs_t
	if err := unix.Statfs(mnt, &sf); err != nil {
		return runtime.DiskMetrics{}, err
	}
	bs := int64(sf.Bsize)
	return runtime.DiskMetrics{UsedBytes: int64(sf.Blocks-sf.Bfree) * bs, TotalBytes: int64(sf.Blocks) * bs}, nil
}

// hierState is Metrics' state on Runtime: the hierarchies, the sandboxes' cached limits
// (dropped by Delete) and the device of Root's sandboxes/.
type hierState struct {
	hierOnce    sync.Once
	hier        cgroupHierarchies
	hierErr     error
	limits      sync.Map // sandbox id → sandboxLimits
	rootDevOnce sync.Once
	rootDev     uint64
	rootDevErr  error
}
