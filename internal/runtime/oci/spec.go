package oci

import (
	"fmt"
	"maps"
	"path"
	"slices"
	"sort"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/agentbox/agentbox/internal/hostinfo"
	"github.com/agentbox/agentbox/internal/tmpfs"
)

// diskMountName is the mount point of a sandbox's disk image in its sandbox dir.
const diskMountName = "disk"

// Paths inside every sandbox.
const (
	guestDir        = "/.agentbox"
	guestBinaryPath = "/.agentbox/agentbox"
	guestRunDir     = "/.agentbox/run"
	guestSocketPath = "/.agentbox/run/agent.sock"
	workspaceDir    = "/workspace"
	// agentboxEtcDir holds runtime.CABundlePath (a mount point in the shared rootfs).
	agentboxEtcDir = "/etc/agentbox"
	agentHome      = "/home/agent"
	// rootHome is root's home, writable for `user: "root"` commands (package managers' caches
	// and configuration) and closed to the agent user.
	rootHome = "/root"
)

// Resource defaults and bounds of the spec.
const (
	cpuPeriod = 100000 // µs
	// wantNOFILE and wantNPROC are what a sandbox asks for before clamping to the host's hard
	// limits. NPROC counts per uid across the whole host (no user namespace yet), so it is not
	// a per-sandbox bound: the pids cgroup is.
	wantNOFILE = 1 << 20
	wantNPROC  = 1 << 20
	// agentOOMScoreAdj keeps the agent alive when a workload exhausts memory; the agent sets
	// its commands to 0 (guest.commandOOMScoreAdj). Without CAP_SYS_RESOURCE the runtime may not
	// go below its own value (see oomScoreAdjFor): the agent then sets its commands 500 above
	// its own.
	agentOOMScoreAdj = -998
	// ociVersion is the newest spec version runc 1.1 and crun 1.8 accept; this spec uses
	// nothing newer.
	ociVersion = "1.0.2"
)

// capabilities is the whole capability set of a sandbox's processes: containerd's default
// minus MKNOD, NET_RAW, SYS_CHROOT, SETFCAP and AUDIT_WRITE.
var capabilities = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_SETGID", "CAP_SETUID",
	"CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_KILL",
}

// maskedPaths and readonlyPaths are containerd's and runc's defaults.
var (
	maskedPaths = []string{
		"/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
		"/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi",
		"/sys/firmware", "/sys/devices/virtual/powercap",
	}
	readonlyPaths = []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger",
		// runc mounts a writable tmpfs at /sys/fs/cgroup on a cgroup v1 host, under the
		// read-only per-hierarchy mounts: remount the whole tree read-only.
		"/sys/fs/cgroup"}
)

// hardening names what buildSpec enforces, for Capabilities.Hardening.
var hardening = []string{
	overlayHardening, "no-new-privileges(image-host)", "caps:minimal", "masked-paths", "readonly-paths",
	"netns:loopback-only", "cgroup:memory,cpu,pids", "devices:default-deny", "rlimits:clamped",
	"nosuid-binds", "disk:ext4-image", "rlimits:fsize",
}

// overlayHardening: every sandbox's root is an overlay whose only writable layer is on its disk.
const overlayHardening = "rootfs:overlay(writable-layer-on-disk)"

// bindMount is a host path bound read-only into every sandbox at the same path, or, Writable,
// the sandbox's own overlay of it (rootfs_linux.go: hostBindOverlays) bound read-write.
type bindMount struct {
	Source, Destination string
	Writable            bool
}

// specInput is everything buildSpec needs; it does no I/O.
type specInput struct {
	ID           string
	CgroupParent string // the sandbox's cgroup is /<CgroupParent>/<ID>
	Rootfs       string // the shared read-only root, absolute
	SandboxDir   string // sandboxes/<id>, absolute
	GuestBinary  string // the agent binary on the host (agentbox-guest), absolute
	CPU          float64
	MemoryMB     int64
	// DiskMB is the size of the sandbox's disk; RLIMIT_FSIZE caps a single file at it (0: no cap).
	DiskMB    int64
	PidsLimit int64
	Env       map[string]string
	// HostRlimits are the host's hard limits; the spec never asks for more.
	HostRlimits hostinfo.Rlimits
	// Swap is whether the memory controller can bound memory+swap (memory.memsw.* on v1).
	Swap bool
	// OOMScoreAdj is the agent's oom_score_adj (agentOOMScoreAdj where the host allows it).
	OOMScoreAdj int
	// HostBinds are bound nosuid, nodev and read-only unless Writable (/usr, real /bin-style
	// dirs, etc/ssl/certs…).
	HostBinds []bindMount
	// NetNSPath, when set, is the network namespace the sandbox joins (the egress one the
	// runtime made, owned by the host's user namespace): /sys is then an empty read-only tmpfs,
	// since sysfs cannot be mounted without privilege over the namespace's owner (and the
	// host's /sys is never bound instead).
	NetNSPath string
	// ResolvConf and CADir, when set, are bound read-only at /etc/resolv.conf and /etc/agentbox
	// (network egress).
	ResolvConf string
	CADir      string
	// WritableRoot: Rootfs is the sandbox's own overlay (rootfs_linux.go), not the shared
	// read-only skeleton.
	WritableRoot bool
	// OCIImage: the root is an OCI image's (Spec.Rootfs). Its setuid binaries must work
	// inside, so its processes may gain privileges (no no_new_privs), and GuestUser and
	// GuestWorkdir are the image's.
	OCIImage     bool
	GuestUser    string
	GuestWorkdir string
	// NoCgroupFS leaves /sys/fs/cgroup empty (gVisor: runsc mounts its own cgroupfs controllers
	// read-write under the read-only mount, whatever the spec asks).
	NoCgroupFS bool

	// Hardening hooks for a later change, applied as is when set: a seccomp profile (generated
	// after Process.Capabilities is final) and user-namespace id mappings.
	Seccomp     *specs.LinuxSeccomp
	UIDMappings []specs.LinuxIDMapping
	GIDMappings []specs.LinuxIDMapping
}

// oomScoreAdjFor is the agent's oom_score_adj: agentOOMScoreAdj, unless the runtime lacks
// CAP_SYS_RESOURCE, in which case the kernel refuses values below its own (inherited) one and
// container start would fail ("failed to update /proc/self/oom_score_adj: Permission denied").
func oomScoreAdjFor(hasSysResource bool, own int) int {
	if hasSysResource {
		return agentOOMScoreAdj
	}
	return max(agentOOMScoreAdj, own)
}

func clampRlimit(want, hostHard uint64) uint64 {
	if hostHard != 0 && want > hostHard {
		return hostHard
	}
	return want
}

// baseEnv is the environment every sandbox starts from; Spec.Env adds to and overrides it.
var baseEnv = [][2]string{
	{"PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
	{"HOME", agentHome},
	{"LANG", "C.UTF-8"},
	{"TERM", "xterm"},
}

func buildEnv(extra map[string]string) []string {
	env := make([]string, 0, len(baseEnv)+len(extra))
	for _, kv := range baseEnv {
		v := kv[1]
		if e, ok := extra[kv[0]]; ok {
			v = e
		}
		env = append(env, kv[0]+"="+v)
	}
	keys := make([]string, 0, len(extra))
	for k := range extra {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		base := false
		for _, kv := range baseEnv {
			base = base || kv[0] == k
		}
		if !base {
			env = append(env, k+"="+extra[k])
		}
	}
	return env
}

// validateEnv rejects names and values the kernel's environment format cannot carry.
func validateEnv(env map[string]string) error {
	for k, v := range env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return fmt.Errorf("environment variable name %q must be non-empty and contain no '=' or NUL", k)
		}
		if strings.ContainsRune(v, 0) {
			return fmt.Errorf("environment variable %s contains a NUL byte", k)
		}
	}
	return nil
}

func ptr[T any](v T) *T { return &v }

// buildSpec generates the hardened OCI spec of one sandbox.
func buildSpec(in specInput) *specs.Spec {
	hostNOFILE := clampRlimit(wantNOFILE, in.HostRlimits.NOFILE)
	hostNPROC := clampRlimit(wantNPROC, in.HostRlimits.NPROC)
	tmpMiB := tmpfs.TmpMiB(in.MemoryMB)
	shmMiB := tmpfs.ShmMiB(in.MemoryMB)

	s := &specs.Spec{
		Version:  ociVersion,
		Hostname: in.ID,
		Root:     &specs.Root{Path: in.Rootfs, Readonly: !in.WritableRoot},
		Process: &specs.Process{
			User: specs.User{UID: 0, GID: 0, Umask: ptr(uint32(0o022))},
			Args: []string{guestBinaryPath, "guest", "--socket", guestSocketPath},
			Env:  buildEnv(in.Env),
			Cwd:  workspaceDir,
			Capabilities: &specs.LinuxCapabilities{
				Bounding:  append([]string(nil), capabilities...),
				Effective: append([]string(nil), capabilities...),
				Permitted: append([]string(nil), capabilities...),
			},
			Rlimits: []specs.POSIXRlimit{
				{Type: "RLIMIT_NOFILE", Hard: hostNOFILE, Soft: hostNOFILE},
				{Type: "RLIMIT_NPROC", Hard: hostNPROC, Soft: hostNPROC},
			},
			NoNewPrivileges: true,
			OOMScoreAdj:     ptr(in.OOMScoreAdj),
		},
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=64k"}},
			{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
			{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", fmt.Sprintf("size=%dm", shmMiB)}},
			{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
			{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup", Options: []string{"nosuid", "noexec", "nodev", "relatime", "ro"}},
			{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "mode=1777", fmt.Sprintf("size=%dm", tmpMiB)}},
		},
		Linux: &specs.Linux{
			CgroupsPath: cgroupPath(in.CgroupParent, in.ID),
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace}, {Type: specs.MountNamespace}, {Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace}, {Type: specs.CgroupNamespace},
				// A new network namespace: the runtime brings up lo and nothing else.
				{Type: specs.NetworkNamespace},
			},
			Resources:         buildResources(in),
			RootfsPropagation: "rprivate",
			MaskedPaths:       append([]string(nil), maskedPaths...),
			ReadonlyPaths:     append([]string(nil), readonlyPaths...),
			Seccomp:           in.Seccomp,
		},
	}
	if in.OCIImage {
		workdir := in.GuestWorkdir
		if workdir == "" {
			workdir = workspaceDir
		}
		s.Process.Args = append(s.Process.Args, "--user", in.GuestUser, "--workdir", workdir)
		s.Process.NoNewPrivileges = false
		if _, ok := in.Env["HOME"]; !ok {
			// Commands run as root unless the image names a user (whose home the agent sets).
			env := maps.Clone(in.Env)
			if env == nil {
				env = map[string]string{}
			}
			env["HOME"] = rootHome
			s.Process.Env = buildEnv(env)
		}
	}
	if in.NetNSPath != "" {
		for i, ns := range s.Linux.Namespaces {
			if ns.Type == specs.NetworkNamespace {
				s.Linux.Namespaces[i].Path = in.NetNSPath
			}
		}
		for i, m := range s.Mounts {
			if m.Destination == "/sys" {
				// Writable while the runtime makes the /sys/fs/cgroup mount point in it, then
				// read-only (ReadonlyPaths); nothing else is ever in it.
				s.Mounts[i] = specs.Mount{Destination: "/sys", Type: "tmpfs", Source: "tmpfs",
					Options: []string{"nosuid", "noexec", "nodev", "mode=555", "size=16k", "nr_inodes=64"}}
			}
		}
		s.Linux.ReadonlyPaths = append([]string{"/sys"}, s.Linux.ReadonlyPaths...)
	}
	if in.NoCgroupFS {
		s.Mounts = slices.DeleteFunc(s.Mounts, func(m specs.Mount) bool { return m.Destination == "/sys/fs/cgroup" })
	}
	if in.DiskMB > 0 {
		// No single file may outgrow the disk (SIGXFSZ, or EFBIG where the signal is ignored);
		// it bounds files on /tmp too.
		fsize := clampRlimit(uint64(in.DiskMB)<<20, in.HostRlimits.FSIZE)
		s.Process.Rlimits = append(s.Process.Rlimits, specs.POSIXRlimit{Type: "RLIMIT_FSIZE", Hard: fsize, Soft: fsize})
	}
	for _, b := range in.HostBinds {
		opts := []string{"rbind", "ro", "nosuid", "nodev"}
		if b.Writable {
			opts = []string{"rbind", "rw", "nosuid", "nodev"}
		}
		s.Mounts = append(s.Mounts, specs.Mount{Destination: b.Destination, Type: "bind", Source: b.Source, Options: opts})
	}
	dir := in.SandboxDir
	disk := path.Join(dir, diskMountName) // every writable bind is on the sandbox's disk
	s.Mounts = append(s.Mounts,
		specs.Mount{Destination: guestBinaryPath, Type: "bind", Source: in.GuestBinary, Options: []string{"bind", "ro", "nosuid", "nodev"}},
		specs.Mount{Destination: guestRunDir, Type: "bind", Source: path.Join(disk, "run"), Options: []string{"rbind", "rw", "nosuid", "nodev", "noexec"}},
		specs.Mount{Destination: workspaceDir, Type: "bind", Source: path.Join(disk, "workspace"), Options: []string{"rbind", "rw", "nosuid", "nodev"}},
		specs.Mount{Destination: agentHome, Type: "bind", Source: path.Join(disk, "home"), Options: []string{"rbind", "rw", "nosuid", "nodev"}},
		specs.Mount{Destination: rootHome, Type: "bind", Source: path.Join(disk, "root"), Options: []string{"rbind", "rw", "nosuid", "nodev"}},
	)
	if in.ResolvConf != "" {
		s.Mounts = append(s.Mounts, specs.Mount{Destination: "/etc/resolv.conf", Type: "bind", Source: in.ResolvConf,
			Options: []string{"bind", "ro", "nosuid", "nodev", "noexec"}})
	}
	if in.CADir != "" {
		s.Mounts = append(s.Mounts, specs.Mount{Destination: agentboxEtcDir, Type: "bind", Source: in.CADir,
			Options: []string{"bind", "ro", "nosuid", "nodev", "noexec"}})
	}
	if len(in.UIDMappings) > 0 {
		s.Linux.Namespaces = append(s.Linux.Namespaces, specs.LinuxNamespace{Type: specs.UserNamespace})
		s.Linux.UIDMappings = in.UIDMappings
		s.Linux.GIDMappings = in.GIDMappings
	}
	return s
}

// cgroupPath is the sandbox's cgroup, relative to every hierarchy's root.
func cgroupPath(parent, id string) string { return "/" + parent + "/" + id }

// charDevices are the only devices a sandbox may use: null, zero, full, random, urandom,
// tty, ptmx and the pts of its own devpts.
var charDevices = [][2]int64{{1, 3}, {1, 5}, {1, 7}, {1, 8}, {1, 9}, {5, 0}, {5, 2}, {136, -1}}

func buildResources(in specInput) *specs.LinuxResources {
	r := &specs.LinuxResources{
		Devices: []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}},
	}
	for _, d := range charDevices {
		rule := specs.LinuxDeviceCgroup{Allow: true, Type: "c", Major: ptr(d[0]), Access: "rwm"}
		if d[1] >= 0 {
			rule.Minor = ptr(d[1])
		}
		r.Devices = append(r.Devices, rule)
	}
	if in.CPU > 0 {
		quota := max(int64(in.CPU*cpuPeriod), 1000) // the kernel's smallest quota is 1 ms
		r.CPU = &specs.LinuxCPU{Quota: ptr(quota), Period: ptr(uint64(cpuPeriod))}
	}
	if in.MemoryMB > 0 {
		limit := in.MemoryMB << 20
		r.Memory = &specs.LinuxMemory{Limit: ptr(limit)}
		if in.Swap {
			// memory+swap equal to memory: no swap.
			r.Memory.Swap = ptr(limit)
		}
	}
	if in.PidsLimit > 0 {
		r.Pids = &specs.LinuxPids{Limit: ptr(in.PidsLimit)}
	}
	return r
}
