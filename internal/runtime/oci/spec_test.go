package oci

import (
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/agentbox/agentbox/internal/hostinfo"
)

func testInput() specInput {
	return specInput{
		ID: "sb-0123456789ab", CgroupParent: "agentbox", Rootfs: "/r/rootfs/host", SandboxDir: "/r/sandboxes/sb-0123456789ab",
		GuestBinary: "/opt/agentbox", CPU: 1.5, MemoryMB: 512, PidsLimit: 128,
		Env:         map[string]string{"FOO": "bar", "LANG": "de_DE.UTF-8"},
		HostRlimits: hostinfo.Rlimits{NOFILE: 20000, NPROC: 96365},
		Swap:        true,
		OOMScoreAdj: -998,
		HostBinds: []bindMount{{Source: "/r/sandboxes/sb-0123456789ab/binds/usr", Destination: "/usr", Writable: true},
			{Source: "/etc/ssl/certs", Destination: "/etc/ssl/certs"}},
	}
}

func findMount(s *specs.Spec, dest string) (specs.Mount, bool) {
	for _, m := range s.Mounts {
		if m.Destination == dest {
			return m, true
		}
	}
	return specs.Mount{}, false
}

func TestSpecProcess(t *testing.T) {
	t.Parallel()
	s := buildSpec(testInput())
	p := s.Process
	if got := strings.Join(p.Args, " "); got != "/.agentbox/agentbox guest --socket /.agentbox/run/agent.sock" {
		t.Errorf("args %q", got)
	}
	if p.Cwd != "/workspace" || p.User.UID != 0 || p.User.GID != 0 || !p.NoNewPrivileges || p.Terminal {
		t.Errorf("process %+v", p)
	}
	wantEnv := []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/home/agent",
		"LANG=de_DE.UTF-8", "TERM=xterm", "FOO=bar",
	}
	if !slices.Equal(p.Env, wantEnv) {
		t.Errorf("env %q, want %q", p.Env, wantEnv)
	}
	wantCaps := []string{"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_SETGID",
		"CAP_SETUID", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_KILL"}
	c := p.Capabilities
	for name, set := range map[string][]string{"bounding": c.Bounding, "effective": c.Effective, "permitted": c.Permitted} {
		if !slices.Equal(set, wantCaps) {
			t.Errorf("%s caps %v", name, set)
		}
	}
	if len(c.Ambient) != 0 || len(c.Inheritable) != 0 {
		t.Errorf("ambient %v inheritable %v", c.Ambient, c.Inheritable)
	}
	if p.OOMScoreAdj == nil || *p.OOMScoreAdj != -998 {
		t.Errorf("oomScoreAdj %v", p.OOMScoreAdj)
	}
}

func TestSpecRlimitsClamped(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name              string
		host              hostinfo.Rlimits
		wantNOFILE, wantN uint64
	}{
		{"this host", hostinfo.Rlimits{NOFILE: 20000, NPROC: 96365}, 20000, 96365},
		{"generous host", hostinfo.Rlimits{NOFILE: 1 << 30, NPROC: 1 << 30}, wantNOFILE, wantNPROC},
	} {
		in := testInput()
		in.HostRlimits = tc.host
		got := map[string]specs.POSIXRlimit{}
		for _, r := range buildSpec(in).Process.Rlimits {
			got[r.Type] = r
		}
		if r := got["RLIMIT_NOFILE"]; r.Hard != tc.wantNOFILE || r.Soft != tc.wantNOFILE {
			t.Errorf("%s: NOFILE %+v", tc.name, r)
		}
		if r := got["RLIMIT_NPROC"]; r.Hard != tc.wantN || r.Soft != tc.wantN {
			t.Errorf("%s: NPROC %+v", tc.name, r)
		}
	}
}

func TestSpecRootAndNamespaces(t *testing.T) {
	t.Parallel()
	s := buildSpec(testInput())
	if s.Version != "1.0.2" || s.Hostname != "sb-0123456789ab" {
		t.Errorf("version %q hostname %q", s.Version, s.Hostname)
	}
	if s.Root.Path != "/r/rootfs/host" || !s.Root.Readonly {
		t.Errorf("root %+v", s.Root)
	}
	var ns []string
	for _, n := range s.Linux.Namespaces {
		if n.Path != "" {
			t.Errorf("namespace %s joins %s", n.Type, n.Path)
		}
		ns = append(ns, string(n.Type))
	}
	slices.Sort(ns)
	if got := strings.Join(ns, ","); got != "cgroup,ipc,mount,network,pid,uts" {
		t.Errorf("namespaces %s", got)
	}
	if s.Linux.CgroupsPath != "/agentbox/sb-0123456789ab" {
		t.Errorf("cgroupsPath %q", s.Linux.CgroupsPath)
	}
	for _, p := range []string{"/proc/kcore", "/proc/keys", "/proc/timer_list", "/proc/sched_debug", "/proc/latency_stats", "/proc/acpi", "/proc/scsi", "/sys/firmware"} {
		if !slices.Contains(s.Linux.MaskedPaths, p) {
			t.Errorf("%s not masked", p)
		}
	}
	for _, p := range []string{"/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus", "/proc/fs"} {
		if !slices.Contains(s.Linux.ReadonlyPaths, p) {
			t.Errorf("%s not read-only", p)
		}
	}
	if s.Linux.Seccomp != nil || len(s.Linux.UIDMappings) != 0 {
		t.Error("seccomp and user namespaces are not set without the hook")
	}
}

func TestSpecMounts(t *testing.T) {
	t.Parallel()
	s := buildSpec(testInput())
	for _, tc := range []struct {
		dest, typ, source string
		opts              []string
	}{
		{"/proc", "proc", "proc", nil},
		{"/dev", "tmpfs", "tmpfs", []string{"nosuid", "mode=755", "size=64k"}},
		{"/dev/pts", "devpts", "devpts", []string{"newinstance", "ptmxmode=0666"}},
		{"/dev/shm", "tmpfs", "shm", []string{"size=64m"}},
		{"/dev/mqueue", "mqueue", "mqueue", nil},
		{"/sys", "sysfs", "sysfs", []string{"ro", "nosuid", "noexec", "nodev"}},
		{"/sys/fs/cgroup", "cgroup", "cgroup", []string{"ro"}},
		{"/tmp", "tmpfs", "tmpfs", []string{"nosuid", "nodev", "size=128m"}},
		{"/usr", "bind", "/r/sandboxes/sb-0123456789ab/binds/usr", []string{"rbind", "rw", "nosuid", "nodev"}},
		{"/etc/ssl/certs", "bind", "/etc/ssl/certs", []string{"rbind", "ro", "nosuid", "nodev"}},
		{"/.agentbox/agentbox", "bind", "/opt/agentbox", []string{"ro"}},
		{"/.agentbox/run", "bind", "/r/sandboxes/sb-0123456789ab/disk/run", []string{"rw", "nosuid", "nodev"}},
		{"/workspace", "bind", "/r/sandboxes/sb-0123456789ab/disk/workspace", []string{"rw", "nosuid", "nodev"}},
		{"/home/agent", "bind", "/r/sandboxes/sb-0123456789ab/disk/home", []string{"rw", "nosuid", "nodev"}},
		{"/root", "bind", "/r/sandboxes/sb-0123456789ab/disk/root", []string{"rw", "nosuid", "nodev"}},
	} {
		m, ok := findMount(s, tc.dest)
		if !ok {
			t.Errorf("no mount at %s", tc.dest)
			continue
		}
		if m.Type != tc.typ || m.Source != tc.source {
			t.Errorf("%s: %s from %s", tc.dest, m.Type, m.Source)
		}
		for _, o := range tc.opts {
			if !slices.Contains(m.Options, o) {
				t.Errorf("%s: options %v lack %s", tc.dest, m.Options, o)
			}
		}
		if slices.Contains(tc.opts, "rw") && slices.Contains(m.Options, "ro") {
			t.Errorf("%s: options %v of a writable bind have ro", tc.dest, m.Options)
		}
	}
	// Mount order: a mount's parent comes first.
	seen := map[string]bool{"/": true}
	for _, m := range s.Mounts {
		for p := m.Destination; p != "/"; {
			i := strings.LastIndexByte(p, '/')
			p = p[:max(i, 1)]
			if p == "/" {
				break
			}
			if _, mounted := findMount(s, p); mounted && !seen[p] {
				t.Errorf("%s is mounted before its parent %s", m.Destination, p)
			}
		}
		seen[m.Destination] = true
	}
	in := testInput()
	in.NoCgroupFS = true
	if m, ok := findMount(buildSpec(in), "/sys/fs/cgroup"); ok {
		t.Errorf("NoCgroupFS: %+v is mounted", m)
	}
}

func TestOOMScoreAdjFor(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		capable bool
		own     int
		want    int
	}{{true, 0, -998}, {false, 0, 0}, {false, -500, -500}, {false, -1000, -998}, {true, 300, -998}} {
		if got := oomScoreAdjFor(tc.capable, tc.own); got != tc.want {
			t.Errorf("oomScoreAdjFor(%v, %d) = %d, want %d", tc.capable, tc.own, got, tc.want)
		}
	}
}

func TestTmpSize(t *testing.T) {
	t.Parallel()
	in := testInput()
	in.MemoryMB = 32
	s := buildSpec(in)
	if m, _ := findMount(s, "/dev/shm"); !slices.Contains(m.Options, "size=4m") {
		t.Errorf("/dev/shm must not exceed /tmp: %v", m.Options)
	}
}

// TestTmpWithinMemory: tmpfs pages are charged to the memory cgroup, so /tmp and /dev/shm
// together never promise more than memory_mb.
func TestTmpWithinMemory(t *testing.T) {
	t.Parallel()
	for _, mem := range []int64{32, 33, 48, 64, 100, 127, 128, 256, 512, 1000, 4096, 1 << 20} {
		in := testInput()
		in.MemoryMB = mem
		s := buildSpec(in)
		var total int64
		for _, dest := range []string{"/tmp", "/dev/shm"} {
			m, _ := findMount(s, dest)
			for _, o := range m.Options {
				if v, ok := strings.CutPrefix(o, "size="); ok {
					n, err := strconv.ParseInt(strings.TrimSuffix(v, "m"), 10, 64)
					if err != nil || !strings.HasSuffix(v, "m") {
						t.Fatalf("%s size %q", dest, v)
					}
					total += n
				}
			}
		}
		if total > mem {
			t.Errorf("memory_mb %d: /tmp and /dev/shm may hold %d MiB", mem, total)
		}
	}
}

func TestSpecFileSizeLimit(t *testing.T) {
	t.Parallel()
	fsize := func(in specInput) (specs.POSIXRlimit, bool) {
		for _, r := range buildSpec(in).Process.Rlimits {
			if r.Type == "RLIMIT_FSIZE" {
				return r, true
			}
		}
		return specs.POSIXRlimit{}, false
	}
	in := testInput()
	if _, ok := fsize(in); ok {
		t.Error("RLIMIT_FSIZE without a disk")
	}
	in.DiskMB = 64
	if r, ok := fsize(in); !ok || r.Hard != 64<<20 || r.Soft != 64<<20 {
		t.Errorf("disk_mb 64: %+v %v", r, ok)
	}
	in.HostRlimits.FSIZE = 1 << 20 // a host whose hard limit is lower
	if r, _ := fsize(in); r.Hard != 1<<20 || r.Soft != 1<<20 {
		t.Errorf("not clamped to the host's hard limit: %+v", r)
	}
	in.HostRlimits.FSIZE = ^uint64(0) // RLIM_INFINITY
	if r, _ := fsize(in); r.Hard != 64<<20 {
		t.Errorf("unlimited host: %+v", r)
	}
}

func TestSpecResources(t *testing.T) {
	t.Parallel()
	r := buildSpec(testInput()).Linux.Resources
	if *r.CPU.Quota != 150000 || *r.CPU.Period != 100000 {
		t.Errorf("cpu %d/%d", *r.CPU.Quota, *r.CPU.Period)
	}
	if *r.Memory.Limit != 512<<20 || *r.Memory.Swap != 512<<20 {
		t.Errorf("memory %d swap %d", *r.Memory.Limit, *r.Memory.Swap)
	}
	if *r.Pids.Limit != 128 {
		t.Errorf("pids %d", *r.Pids.Limit)
	}
	if d := r.Devices[0]; d.Allow || d.Access != "rwm" || d.Type != "" {
		t.Errorf("first device rule must deny all: %+v", d)
	}
	var allowed []string
	for _, d := range r.Devices[1:] {
		if !d.Allow || d.Type != "c" {
			t.Errorf("rule %+v", d)
		}
		minor := "*"
		if d.Minor != nil {
			minor = strconv.FormatInt(*d.Minor, 10)
		}
		allowed = append(allowed, strconv.FormatInt(*d.Major, 10)+":"+minor)
	}
	if got := strings.Join(allowed, " "); got != "1:3 1:5 1:7 1:8 1:9 5:0 5:2 136:*" {
		t.Errorf("allowed devices %s", got)
	}

	in := testInput()
	in.CPU, in.MemoryMB, in.PidsLimit, in.Swap = 0, 0, 0, false
	r = buildSpec(in).Linux.Resources
	if r.CPU != nil || r.Memory != nil || r.Pids != nil {
		t.Errorf("zero means unlimited: %+v", r)
	}
	in.MemoryMB, in.CPU = 64, 0.001
	r = buildSpec(in).Linux.Resources
	if r.Memory.Swap != nil {
		t.Error("swap must be omitted where memsw is unsupported")
	}
	if *r.CPU.Quota != 1000 {
		t.Errorf("the smallest quota is 1000 µs, got %d", *r.CPU.Quota)
	}
}

func TestSpecHooks(t *testing.T) {
	t.Parallel()
	in := testInput()
	in.Seccomp = &specs.LinuxSeccomp{DefaultAction: specs.ActErrno}
	in.UIDMappings = []specs.LinuxIDMapping{{ContainerID: 0, HostID: 100000, Size: 65536}}
	in.GIDMappings = in.UIDMappings
	s := buildSpec(in)
	if s.Linux.Seccomp == nil || len(s.Linux.UIDMappings) != 1 || s.Linux.Namespaces[len(s.Linux.Namespaces)-1].Type != specs.UserNamespace {
		t.Errorf("hooks not applied: %+v", s.Linux)
	}
}

func TestSpecJSONRoundTrip(t *testing.T) {
	t.Parallel()
	data, err := json.Marshal(buildSpec(testInput()))
	if err != nil {
		t.Fatal(err)
	}
	var back specs.Spec
	if err := json.Unmarshal(data, &back); err != nil {
		t.Fatal(err)
	}
	if back.Process.Args[0] != guestBinaryPath || back.Linux.Resources.Memory == nil {
		t.Fatalf("round trip lost data: %s", data)
	}
}

func TestValidateEnv(t *testing.T) {
	t.Parallel()
	if err := validateEnv(map[string]string{"OK": "x y"}); err != nil {
		t.Error(err)
	}
	for _, bad := range []map[string]string{{"": "x"}, {"A=B": "x"}, {"A\x00": "x"}, {"A": "x\x00"}} {
		if validateEnv(bad) == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestRuntimeMessage(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		`time="2025-01-01T00:00:00Z" level=error msg="runc create failed: unable to start container process: error setting rlimits for ready process: error setting rlimit type 7: operation not permitted"` + "\n": "runc create failed: unable to start container process: error setting rlimits for ready process: error setting rlimit type 7: operation not permitted",
		"container \"sb-1\" does not exist\n\n":     `container "sb-1" does not exist`,
		`{"level":"error","msg":"boom","time":"x"}`: "boom",
		"": "no error message",
	} {
		if got := runtimeMessage(in); got != want {
			t.Errorf("runtimeMessage(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestParseVersion(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"runc version 1.1.5+ds1\ncommit: x\nspec: 1.0.2-dev\n": "1.1.5+ds1",
		"crun version 1.8.1\ncommit: abc\n":                    "1.8.1",
		"weird":                                                "weird",
	} {
		if got := parseVersion(in); got != want {
			t.Errorf("parseVersion(%q) = %q", in, got)
		}
	}
}

func TestValidID(t *testing.T) {
	t.Parallel()
	for id, want := range map[string]bool{"sb-0123456789ab": true, "sb-0123456789AB": false, "sb-0123": false, "../etc": false, "sb-0123456789ab/..": false} {
		if validID(id) != want {
			t.Errorf("validID(%q) != %v", id, want)
		}
	}
}

// TestSpecEgress: with NetNSPath the spec joins that network namespace, /sys is a small tmpfs
// made read-only (no sysfs, never the host's /sys) and /sys/fs/cgroup stays; resolv.conf and the
// CA directory are bound read-only. Without them the spec is network none's.
func TestSpecEgress(t *testing.T) {
	in := testInput()
	none := buildSpec(in)
	in.NetNSPath, in.ResolvConf, in.CADir = "/r/netns/sb-0123456789ab", "/r/sandboxes/sb-0123456789ab/resolv.conf", "/r/sandboxes/sb-0123456789ab/etc-agentbox"
	s := buildSpec(in)
	var netns *specs.LinuxNamespace
	for i, ns := range s.Linux.Namespaces {
		if ns.Type == specs.NetworkNamespace {
			netns = &s.Linux.Namespaces[i]
		}
	}
	if netns == nil || netns.Path != in.NetNSPath {
		t.Fatalf("network namespace %+v, want path %s", netns, in.NetNSPath)
	}
	mount := func(s *specs.Spec, dst string) *specs.Mount {
		for i, m := range s.Mounts {
			if m.Destination == dst {
				return &s.Mounts[i]
			}
		}
		return nil
	}
	if m := mount(s, "/sys"); m == nil || m.Type != "tmpfs" || m.Source == "/sys" || !slices.Contains(m.Options, "size=16k") {
		t.Errorf("/sys: %+v", m)
	}
	if !slices.Contains(s.Linux.ReadonlyPaths, "/sys") {
		t.Errorf("readonly paths %v lack /sys", s.Linux.ReadonlyPaths)
	}
	if m := mount(s, "/sys/fs/cgroup"); m == nil || m.Type != "cgroup" {
		t.Errorf("/sys/fs/cgroup: %+v", m)
	}
	for dst, src := range map[string]string{"/etc/resolv.conf": in.ResolvConf, "/etc/agentbox": in.CADir} {
		if m := mount(s, dst); m == nil || m.Source != src || m.Type != "bind" || !slices.Contains(m.Options, "ro") {
			t.Errorf("%s: %+v", dst, m)
		}
	}
	if m := mount(none, "/sys"); m == nil || m.Type != "sysfs" || mount(none, "/etc/resolv.conf") != nil || mount(none, "/etc/agentbox") != nil {
		t.Errorf("network none's spec changed: /sys %+v", m)
	}
	for _, ns := range none.Linux.Namespaces {
		if ns.Path != "" {
			t.Errorf("network none joins %+v", ns)
		}
	}
}
