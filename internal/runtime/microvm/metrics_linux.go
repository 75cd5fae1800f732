package microvm

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/runtime"
)

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's CPU times (100 on Linux's ABI).
const clockTicks = 100

// Metrics samples a VM as the host sees it: its QEMU's CPU time and resident memory (what the
// VM costs the host, guest RAM included), the cgroup's OOM kills, and the host space its disk
// takes. Tasks inside the guest are not visible from the host: pids is unsupported.
func (r *Runtime) Metrics(ctx context.Context, id string) (runtime.Metrics, error) {
	rec, err := r.readRecord(id)
	if err != nil {
		return runtime.Metrics{}, err
	}
	p, ok := r.readProc(id)
	if !ok || !p.alive() {
		return runtime.Metrics{}, errcode.New(errcode.SandboxNotRunning, "sandbox %s's VM is not running", id)
	}
	m := runtime.Metrics{SampledAt: time.Now().UTC(), Unsupported: []string{"pids"}}
	if stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.PID)); err == nil {
		s := string(stat)
		if i := strings.LastIndexByte(s, ')'); i >= 0 {
			if f := strings.Fields(s[i+1:]); len(f) > 12 {
				ut, _ := strconv.ParseFloat(f[11], 64)
				st, _ := strconv.ParseFloat(f[12], 64)
				m.CPU = &runtime.CPUMetrics{UsageSeconds: (ut + st) / clockTicks, LimitCores: rec.CPU}
			}
		}
	}
	if status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.PID)); err == nil {
		for _, line := range strings.Split(string(status), "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
				kb, _ := strconv.ParseInt(f[1], 10, 64)
				m.Memory = &runtime.MemoryMetrics{UsedBytes: kb << 10, LimitBytes: (rec.MemoryMB + qemuOverheadMB) << 20, OOMEvents: r.oomKills(id)}
			}
		}
	}
	var st unix.Stat_t
	if unix.Stat(filepath.Join(r.dir(id), "data.ext4"), &st) == nil {
		m.Disk = &runtime.DiskMetrics{UsedBytes: st.Blocks * 512, TotalBytes: rec.DiskMB << 20}
	}
	if m.CPU == nil {
		m.Unsupported = append(m.Unsupported, "cpu")
	}
	if m.Memory == nil {
		m.Unsupported = append(m.Unsupported, "memory")
	}
	return m, nil
}

// oomKills is the OOM kills the VM's memory cgroup counted (QEMU killed at its limit).
func (r *Runtime) oomKills(id string) int64 {
	file := filepath.Join(cgroupRoot, r.cfg.CgroupParent, id, "memory.events")
	if !r.cg.v2 {
		file = filepath.Join(cgroupRoot, "memory", r.cfg.CgroupParent, id, "memory.oom_control")
	}
	b, _ := os.ReadFile(file)
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "oom_kill" {
			n, _ := strconv.ParseInt(f[1], 10, 64)
			return n
		}
	}
	return 0
}

var _ runtime.MetricsReader = (*Runtime)(nil)
