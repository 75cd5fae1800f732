package oci

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/guest"
	"github.com/agentbox/agentbox/internal/hostinfo"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/runtimetest"
)

func TestParseCgroupFiles(t *testing.T) {
	for in, want := range map[string]float64{"max 100000\n": 0, "150000 100000\n": 1.5, "50000 100000": 0.5, "": 0, "x y": 0} {
		if got := parseCPUMax(in); got != want {
			t.Errorf("parseCPUMax(%q) = %g, want %g", in, got, want)
		}
	}
	kv := parseKeyed([]byte("oom_kill_disable 0\nunder_oom 0\noom_kill 3\nbad x\n"))
	if kv["oom_kill"] != 3 || len(kv) != 3 {
		t.Errorf("parseKeyed: %v", kv)
	}
	hybrid := hierarchiesFrom(hostinfo.CgroupHybrid, []hostinfo.CgroupMount{
		{Path: "/sys/fs/cgroup/cpu,cpuacct", Version: 1, Options: []string{"cpu", "cpuacct"}},
		{Path: "/sys/fs/cgroup/memory", Version: 1, Options: []string{"memory"}},
		{Path: "/sys/fs/cgroup/pids", Version: 1, Options: []string{"pids"}},
		{Path: "/sys/fs/cgroup/unified", Version: 2},
	})
	if hybrid != (cgroupHierarchies{cpu: "/sys/fs/cgroup/cpu,cpuacct", cpuacct: "/sys/fs/cgroup/cpu,cpuacct", memory: "/sys/fs/cgroup/memory", pids: "/sys/fs/cgroup/pids"}) {
		t.Errorf("hybrid: %+v", hybrid)
	}
	v2 := hierarchiesFrom(hostinfo.CgroupV2, []hostinfo.CgroupMount{{Path: "/sys/fs/cgroup", Version: 2}})
	if !v2.v2 || v2.memory != "/sys/fs/cgroup" || v2.cpu != "/sys/fs/cgroup" || v2.pids != "/sys/fs/cgroup" {
		t.Errorf("v2: %+v", v2)
	}
}

func TestRuncMetrics(t *testing.T) {
	t.Parallel()
	testMetrics(t, newRunc(t))
}

func TestCrunMetrics(t *testing.T) {
	t.Parallel()
	testMetrics(t, newFlavor(t, FlavorCrun))
}

func TestGVisorMetrics(t *testing.T) {
	t.Parallel()
	testMetrics(t, newFlavor(t, FlavorGVisor))
}

func sampleMetrics(t *testing.T, rt *Runtime, id string) runtime.Metrics {
	t.Helper()
	m, err := rt.Metrics(context.Background(), id)
	if err != nil {
		t.Fatalf("metrics: %v", err)
	}
	if m.CPU == nil || m.Memory == nil || m.Pids == nil || m.Disk == nil || len(m.Unsupported) != 0 {
		t.Fatalf("metrics with a group missing: %+v", m)
	}
	return m
}

// pollMetrics samples until ok holds or 20 s pass, and returns the last sample.
func pollMetrics(t *testing.T, rt *Runtime, id string, what string, ok func(runtime.Metrics) bool) runtime.Metrics {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		m := sampleMetrics(t, rt, id)
		if ok(m) {
			return m
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: never seen; last sample cpu %+v memory %+v pids %+v disk %+v", what, *m.CPU, *m.Memory, *m.Pids, *m.Disk)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// testMetrics checks every number against what the test makes the sandbox do: CPU burnt, memory
// allocated, processes started and a file written each show up, and the limits are the spec's.
func testMetrics(t *testing.T, rt *Runtime) {
	id := runtimetest.NewID()
	spec := runtimetest.DefaultSpec(id)
	spec.CPU, spec.MemoryMB, spec.DiskMB, spec.PidsLimit = 0.5, 256, 256, 64
	c := runtimetest.Start(t, rt, spec)
	ctx := context.Background()

	m0 := sampleMetrics(t, rt, id)
	if m0.CPU.LimitCores != 0.5 {
		t.Errorf("cpu limit %g cores, want 0.5", m0.CPU.LimitCores)
	}
	if m0.Memory.LimitBytes != 256<<20 {
		t.Errorf("memory limit %d, want %d", m0.Memory.LimitBytes, 256<<20)
	}
	if rt.flavor == FlavorGVisor {
		if m0.Pids.Limit <= 64 { // the host's backstop, well above the workload's bound
			t.Errorf("gVisor host pids limit %d", m0.Pids.Limit)
		}
	} else if m0.Pids.Limit != 64 {
		t.Errorf("pids limit %d, want 64", m0.Pids.Limit)
	}
	if m0.Pids.Current < 1 || m0.Memory.UsedBytes <= 0 || m0.Disk.UsedBytes <= 0 {
		t.Errorf("an idle sandbox's use: %+v %+v %+v", *m0.Pids, *m0.Memory, *m0.Disk)
	}
	if tot := m0.Disk.TotalBytes; tot < 200<<20 || tot > 256<<20 {
		t.Errorf("disk total %d, want about 256 MiB", tot)
	}
	if time.Since(m0.SampledAt) > 10*time.Second || m0.SampledAt.After(time.Now()) {
		t.Errorf("sampled_at %v", m0.SampledAt)
	}

	// CPU: a fixed amount of work (not a time: on a busy host a sandbox gets less than its
	// limit) adds about the CPU time the same work takes the host's own python, which the
	// sandbox of image host runs too.
	const work = "x = 0\nfor i in range(6000000): x += i\nimport time\nprint(time.process_time())"
	out, err := exec.Command("/usr/bin/python3", "-c", work).Output()
	if err != nil {
		t.Fatalf("the work on the host: %v", err)
	}
	host, err := strconv.ParseFloat(strings.TrimSpace(string(out)), 64)
	if err != nil {
		t.Fatalf("the work on the host printed %q", out)
	}
	runtimetest.Exec(t, c, "/usr/bin/python3", "-c", work)
	m1 := sampleMetrics(t, rt, id)
	t.Logf("cpu seconds rose by %.3f for work that took the host %.3f s", m1.CPU.UsageSeconds-m0.CPU.UsageSeconds, host)
	if d := m1.CPU.UsageSeconds - m0.CPU.UsageSeconds; d < 0.6*host || d > 2*host+0.3 {
		t.Errorf("cpu seconds rose by %.3f for work that took the host %.3f s of CPU", d, host)
	}

	// Disk: 64 MiB written and synced.
	runtimetest.Exec(t, c, "sh", "-c", "head -c 67108864 /dev/zero > /workspace/blob && sync")
	m2 := sampleMetrics(t, rt, id)
	if d := m2.Disk.UsedBytes - m1.Disk.UsedBytes; d < 60<<20 || d > 80<<20 {
		t.Errorf("disk used rose by %d bytes after writing 64 MiB", d)
	}

	// Memory and pids, while a command holds 128 MiB and 6 sleeping children.
	done := make(chan runtimetest.Result, 1)
	go func() {
		done <- runtimetest.ExecRequest(t, c, guest.ExecRequest{Argv: []string{"python3", "-c",
			"import subprocess, time\nps = [subprocess.Popen(['sleep', '30']) for _ in range(6)]\nb = bytearray(128 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\nprint('ready', flush=True)\ntime.sleep(30)"},
			TimeoutMs: 4000})
	}()
	pollMetrics(t, rt, id, "memory used up by 100 MiB and 6 more tasks", func(m runtime.Metrics) bool {
		return m.Memory.UsedBytes-m2.Memory.UsedBytes >= 100<<20 && m.Pids.Current-m2.Pids.Current >= 6
	})
	if res := <-done; !res.TimedOut {
		t.Errorf("the holder: %+v", res)
	}
	// gVisor's platform keeps its host stub tasks as a pool: only runc's task count falls.
	pollMetrics(t, rt, id, "memory and tasks freed", func(m runtime.Metrics) bool {
		return m.Memory.UsedBytes-m2.Memory.UsedBytes < 64<<20 && (rt.flavor == FlavorGVisor || m.Pids.Current < m2.Pids.Current+6)
	})

	// OOM: an allocation past the limit. gVisor's OOM guard kills inside the sandbox before the
	// host cgroup's OOM killer acts, so only runc's count must rise.
	res := runtimetest.ExecRequest(t, c, guest.ExecRequest{Argv: []string{"python3", "-c", "b = bytearray(512 << 20)"}, TimeoutMs: 60000})
	if res.ExitCode == 0 {
		t.Fatalf("512 MiB under a 256 MiB limit: %+v", res)
	}
	if rt.flavor != FlavorGVisor {
		m3 := sampleMetrics(t, rt, id)
		if m3.Memory.OOMEvents <= m0.Memory.OOMEvents {
			t.Errorf("oom events %d after an OOM kill (before: %d)", m3.Memory.OOMEvents, m0.Memory.OOMEvents)
		}
	}

	if err := rt.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, err := rt.Metrics(ctx, id); !errcode.Is(err, errcode.SandboxNotFound) {
		t.Errorf("metrics of a deleted sandbox: %v", err)
	}
	if _, err := rt.Metrics(ctx, "sb-../x"); !errcode.Is(err, errcode.InvalidArgument) {
		t.Errorf("metrics of a malformed id: %v", err)
	}
}

// BenchmarkRuncMetrics is the cost of one sample (a scrape of N sandboxes takes N of them, 16
// at a time).
func BenchmarkRuncMetrics(b *testing.B) {
	rt := newRunc(b)
	id := runtimetest.NewID()
	runtimetest.Start(b, rt, runtimetest.DefaultSpec(id))
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := rt.Metrics(ctx, id); err != nil {
			b.Fatal(err)
		}
	}
}

// TestReadCgroupLayouts reads a cgroup v2 and a v1 layout written as plain files (the file
// formats of the kernel's cgroup documentation): this host has one mode, the code reads three.
func TestReadCgroupLayouts(t *testing.T) {
	write := func(dir string, files map[string]string) {
		t.Helper()
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for name, content := range files {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	const rel = "/agentbox/sb-0123456789ab"
	want := func(mode string, h cgroupHierarchies, cpu runtime.CPUMetrics, mem runtime.MemoryMetrics, pids runtime.PidsMetrics) {
		t.Helper()
		fr := new(fileReader)
		c, err := readCPU(fr, h, rel, true)
		if err != nil || c != cpu {
			t.Errorf("%s cpu: %+v %v, want %+v", mode, c, err, cpu)
		}
		m, err := readMemory(fr, h, rel, true)
		if err != nil || m != mem {
			t.Errorf("%s memory: %+v %v, want %+v", mode, m, err, mem)
		}
		p, err := readPids(fr, h, rel, true)
		if err != nil || p != pids {
			t.Errorf("%s pids: %+v %v, want %+v", mode, p, err, pids)
		}
		// Without limits, only usage is read.
		if c, _ := readCPU(fr, h, rel, false); c.LimitCores != 0 || c.UsageSeconds != cpu.UsageSeconds {
			t.Errorf("%s cpu without limit: %+v", mode, c)
		}
	}

	v2 := t.TempDir()
	write(filepath.Join(v2, rel), map[string]string{
		"cpu.stat":       "usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\nnr_periods 0\n",
		"cpu.max":        "150000 100000\n",
		"memory.current": "104857600\n",
		"memory.stat":    "anon 73400320\nfile 31457280\nkernel 1048576\nactive_file 10485760\ninactive_file 20971520\n",
		"memory.max":     "268435456\n",
		"memory.events":  "low 0\nhigh 0\nmax 4\noom 2\noom_kill 2\noom_group_kill 0\n",
		"pids.current":   "12\n",
		"pids.max":       "max\n",
	})
	want("v2", hierarchiesFrom(hostinfo.CgroupV2, []hostinfo.CgroupMount{{Path: v2, Version: 2}}),
		runtime.CPUMetrics{UsageSeconds: 2.5, LimitCores: 1.5},
		runtime.MemoryMetrics{UsedBytes: 104857600 - 20971520, LimitBytes: 268435456, CacheBytes: 31457280, OOMEvents: 2},
		runtime.PidsMetrics{Current: 12})

	v1 := t.TempDir()
	mounts := []hostinfo.CgroupMount{
		{Path: filepath.Join(v1, "cpu,cpuacct"), Version: 1, Options: []string{"cpu", "cpuacct"}},
		{Path: filepath.Join(v1, "memory"), Version: 1, Options: []string{"memory"}},
		{Path: filepath.Join(v1, "pids"), Version: 1, Options: []string{"pids"}},
		{Path: filepath.Join(v1, "unified"), Version: 2},
	}
	write(filepath.Join(v1, "cpu,cpuacct", rel), map[string]string{
		"cpuacct.usage": "750000000\n", "cpu.cfs_quota_us": "-1\n", "cpu.cfs_period_us": "100000\n"})
	write(filepath.Join(v1, "memory", rel), map[string]string{
		"memory.usage_in_bytes": "52428800\n",
		"memory.stat":           "cache 8388608\nrss 41943040\ninactive_file 4194304\ntotal_cache 8388608\ntotal_rss 41943040\ntotal_inactive_file 4194304\n",
		"memory.limit_in_bytes": "9223372036854771712\n",
		"memory.oom_control":    "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n",
	})
	write(filepath.Join(v1, "pids", rel), map[string]string{"pids.current": "3\n", "pids.max": "64\n"})
	want("hybrid", hierarchiesFrom(hostinfo.CgroupHybrid, mounts),
		runtime.CPUMetrics{UsageSeconds: 0.75},
		runtime.MemoryMetrics{UsedBytes: 52428800 - 4194304, CacheBytes: 8388608, OOMEvents: 1},
		runtime.PidsMetrics{Current: 3, Limit: 64})
}
