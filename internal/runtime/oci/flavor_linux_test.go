package oci

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/agentbox/agentbox/internal/guest"
	"github.com/agentbox/agentbox/internal/hostinfo"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/runtimetest"
	"golang.org/x/sys/unix"
)

// newFlavor returns a Runtime of flavour f under a fresh short Root and a cgroup parent of its
// own, checked and removed at the end. It skips when not root or when the flavour's binary is
// not installed, and fails when the binary is installed but the runtime does not work:
// `make deps` installs all three, so an unavailable one is a bug here.
func newFlavor(t testing.TB, f Flavor) *Runtime {
	t.Helper()
	if reason := runcUsable(); reason != "" {
		t.Skip(reason)
	}
	if _, err := exec.LookPath(f.Binary()); err != nil {
		t.Skipf("%s is not installed (make deps installs it)", f.Binary())
	}
	if guestBuildErr != nil {
		t.Fatalf("cannot build the agent: %v", guestBuildErr)
	}
	root, err := os.MkdirTemp("", "ab"+string(f[:1]))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) }) // runs last
	parent := "abtest-" + filepath.Base(root)
	rt, err := New(context.Background(), Config{Flavor: f, Root: root, GuestBinary: guestBinary, CgroupParent: parent, Subreaper: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if rt.binary != "" {
			out, err := rt.command(context.Background(), "list", "--quiet")
			if err != nil || strings.TrimSpace(string(out)) != "" {
				t.Errorf("%s still lists containers under %s: %q %v", f, root, out, err)
			}
		}
		if ids, err := rt.List(context.Background()); err != nil || len(ids) != 0 {
			t.Errorf("List after the test: %v %v", ids, err)
		}
		if err := rt.Close(context.Background()); err != nil {
			t.Errorf("Close: %v", err)
		}
		mounts, _ := hostinfo.CgroupMounts()
		for _, m := range mounts {
			p := filepath.Join(m.Path, parent)
			if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
				t.Errorf("cgroup parent %s: %v", p, err)
			}
		}
		if mi, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(mi), root) {
			t.Errorf("a mount under %s is left", root)
		}
		os.RemoveAll(root)
	})
	if c := rt.Capabilities(); !c.Available {
		t.Fatalf("%s is installed but unavailable: %s", f, c.Reason)
	}
	return rt
}

func TestCrunSuite(t *testing.T) {
	t.Parallel()
	rt := newFlavor(t, FlavorCrun)
	runtimetest.Run(t, rt, killInit(rt))
}

func TestGVisorSuite(t *testing.T) {
	t.Parallel()
	rt := newFlavor(t, FlavorGVisor)
	runtimetest.Run(t, rt, killInit(rt))
}

func TestFlavorCapabilities(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		flavor    Flavor
		isolation runtime.Isolation
		hardening []string
	}{
		{FlavorRunc, runtime.IsolationProcess, []string{seccompHardening, capsHardening(), "masked-paths", "devices:default-deny"}},
		{FlavorCrun, runtime.IsolationProcess, []string{seccompHardening, capsHardening(), "masked-paths", "devices:default-deny"}},
		{FlavorGVisor, runtime.IsolationKernel, []string{seccompHardening, capsHardening(), "gvisor:user-space-kernel", "network:none"}},
	} {
		t.Run(string(tc.flavor), func(t *testing.T) {
			t.Parallel()
			rt := newFlavor(t, tc.flavor)
			c := rt.Capabilities()
			if c.Name != string(tc.flavor) || c.Version == "" || c.Isolation != tc.isolation || !slices.Equal(c.NetworkModes, []string{"none", "egress"}) {
				t.Errorf("capabilities %+v", c)
			}
			for _, h := range tc.hardening {
				if !slices.Contains(c.Hardening, h) {
					t.Errorf("hardening %v lacks %s", c.Hardening, h)
				}
			}
			if tc.flavor == FlavorGVisor && !slices.ContainsFunc(c.Hardening, func(s string) bool { return strings.HasPrefix(s, "platform:") }) {
				t.Errorf("hardening %v names no platform", c.Hardening)
			}
			t.Logf("%s %s: %v", c.Name, c.Version, c.Hardening)
		})
	}
	if got := capsHardening(); got != "caps:CHOWN,DAC_OVERRIDE,FSETID,FOWNER,SETGID,SETUID,SETPCAP,NET_BIND_SERVICE,KILL" {
		t.Errorf("caps hardening %q", got)
	}
}

func TestFlavorFor(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cfg  Config
		want Flavor
	}{
		{Config{}, FlavorRunc}, {Config{Name: "runc"}, FlavorRunc}, {Config{Name: "crun"}, FlavorCrun},
		{Config{Name: "gvisor"}, FlavorGVisor}, {Config{Name: "runsc"}, FlavorGVisor},
		{Config{Name: "sandboxed", Flavor: FlavorGVisor}, FlavorGVisor},
	} {
		if got, err := flavorFor(tc.cfg); err != nil || got != tc.want {
			t.Errorf("%+v: %s %v, want %s", tc.cfg, got, err, tc.want)
		}
	}
	if _, err := flavorFor(Config{Flavor: "kata"}); err == nil {
		t.Error("unknown flavour accepted")
	}
	if _, err := New(context.Background(), Config{Flavor: "kata", Root: t.TempDir(), GuestBinary: "/bin/true"}); err == nil {
		t.Error("New accepted an unknown flavour")
	}
}

// seccompScript tries the syscalls the profile denies and prints one line per attempt.
const seccompScript = `import ctypes, errno, os, socket
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def sc(name, nr, *args):
    buf = ctypes.create_string_buffer(256)
    a = [ctypes.c_long(x) if isinstance(x, int) else x for x in args]
    r = libc.syscall(ctypes.c_long(nr), *a)
    e = ctypes.get_errno()
    print(name, r, errno.errorcode.get(e, e) if r < 0 else "OK")
params = ctypes.create_string_buffer(120)
sc("io_uring_setup", 425, 8, params)
sc("io_uring_enter", 426, 0, 0, 0, 0, 0, 0)
sc("io_uring_register", 427, 0, 0, 0, 0)
sc("userfaultfd", 323, 0)
sc("keyctl", 250, 0, 0, 0, 0, 0)
sc("add_key", 248, ctypes.c_char_p(b"user"), ctypes.c_char_p(b"k"), ctypes.c_char_p(b"v"), 1, -2)
sc("request_key", 249, ctypes.c_char_p(b"user"), ctypes.c_char_p(b"k"), 0, 0)
sc("bpf", 321, 0, params, 120)
for fam, name in ((40, "AF_VSOCK"), (38, "AF_ALG")):
    try:
        socket.socket(fam, socket.SOCK_STREAM if fam == 40 else socket.SOCK_SEQPACKET)
        print("socket_" + name, 0, "OK")
    except OSError as e:
        print("socket_" + name, -1, errno.errorcode.get(e.errno, e.errno))
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
print("socket_AF_INET", 0, "OK")
`

// int80Script makes a 32-bit syscall (getpid through int 0x80) from a 64-bit process.
const int80Script = `import ctypes, mmap
code = b"\xb8\x14\x00\x00\x00\xcd\x80\xc3"  # mov eax, 20; int 0x80; ret
m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
m.write(code)
f = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(m)))
print("int 0x80 getpid:", f())
`

// int80OnHost runs int80Script on the host, with no seccomp filter: "" when the 32-bit
// syscall answers there, else the signal that killed it.
func int80OnHost(t *testing.T) string {
	t.Helper()
	err := exec.Command("/usr/bin/python3", "-c", int80Script).Run()
	var ee *exec.ExitError
	if err == nil {
		return ""
	}
	if !errors.As(err, &ee) {
		t.Fatalf("python3 on the host: %v", err)
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() {
		t.Fatalf("int 0x80 on the host: %v", err)
	}
	return unix.SignalName(ws.Signal())
}

// TestSeccompEnforced runs the denied syscalls from inside a runc, a crun and a gVisor
// sandbox. gVisor answers every seccomp errno rule with EPERM.
func TestSeccompEnforced(t *testing.T) {
	t.Parallel()
	if goruntime.GOARCH != "amd64" {
		t.Skipf("the script uses x86_64 syscall numbers; this host is %s", goruntime.GOARCH)
	}
	for _, f := range []Flavor{FlavorRunc, FlavorCrun, FlavorGVisor} {
		t.Run(string(f), func(t *testing.T) {
			t.Parallel()
			rt := newFlavor(t, f)
			c := runtimetest.Start(t, rt, runtimetest.DefaultSpec(runtimetest.NewID()))
			res := runtimetest.Exec(t, c, "python3", "-c", seccompScript)
			if res.ExitCode != 0 {
				t.Fatalf("script: %+v", res)
			}
			got := map[string]string{}
			for _, line := range strings.Split(strings.TrimSpace(res.Stdout), "\n") {
				if f := strings.Fields(line); len(f) == 3 {
					got[f[0]] = f[2]
				}
			}
			denied, family := []string{"ENOSYS"}, []string{"EAFNOSUPPORT"}
			if f == FlavorGVisor {
				denied, family = []string{"EPERM"}, []string{"EPERM"}
			}
			want := map[string][]string{
				"io_uring_setup": denied, "io_uring_enter": denied, "io_uring_register": denied,
				"userfaultfd": denied, "keyctl": denied, "add_key": denied, "request_key": denied,
				"bpf": denied, "socket_AF_VSOCK": family, "socket_AF_ALG": family,
				"socket_AF_INET": {"OK"},
			}
			for name, ok := range want {
				if !slices.Contains(ok, got[name]) {
					t.Errorf("%s: %q, want one of %v", name, got[name], ok)
				}
			}
			t.Logf("%s", strings.ReplaceAll(strings.TrimSpace(res.Stdout), "\n", "; "))
			if f != FlavorGVisor {
				// The profile names the native architecture only: a 32-bit syscall kills with
				// SIGSYS. A kernel that serves no 32-bit syscalls at all (int 0x80 faults on
				// the host itself, as on some VMs) answers SIGSEGV before seccomp sees it.
				want := []string{"SIGSYS"}
				if host := int80OnHost(t); host != "" {
					t.Logf("int 0x80 on the host itself: %s; this kernel serves no 32-bit syscalls", host)
					want = append(want, host)
				}
				if r := runtimetest.Exec(t, c, "python3", "-c", int80Script); !slices.Contains(want, r.Signal) {
					t.Errorf("a 32-bit syscall (int 0x80): %+v, want a signal in %v", r, want)
				}
			}
			if st := runtimetest.Exec(t, c, "grep", "^Seccomp:", "/proc/self/status"); !strings.Contains(st.Stdout, "2") {
				t.Errorf("seccomp mode of a command: %q", st.Stdout)
			}
		})
	}
}

// TestThreadsWork guards against a profile that breaks threads: glibc's pthread_create tries
// clone3 and falls back to clone only on ENOSYS.
func TestThreadsWork(t *testing.T) {
	t.Parallel()
	for _, f := range []Flavor{FlavorRunc, FlavorCrun, FlavorGVisor} {
		t.Run(string(f), func(t *testing.T) {
			t.Parallel()
			c := runtimetest.Start(t, newFlavor(t, f), runtimetest.DefaultSpec(runtimetest.NewID()))
			res := runtimetest.Exec(t, c, "python3", "-c",
				"import threading; r = []; ts = [threading.Thread(target=r.append, args=(i,)) for i in range(8)]; [x.start() for x in ts]; [x.join() for x in ts]; print(len(r))")
			if strings.TrimSpace(res.Stdout) != "8" {
				t.Errorf("threads: %+v", res)
			}
		})
	}
}

// hardeningScript prints the process's capability bounding set, no_new_privs and seccomp mode,
// the size of the masked files that exist, whether /proc/sys is writable, and /dev.
const hardeningScript = `grep -E '^(CapBnd|NoNewPrivs|Seccomp):' /proc/self/status
for p in /proc/kcore /proc/keys /proc/timer_list /proc/sched_debug /proc/latency_stats; do [ -e $p ] && echo masked $p $(head -c 4096 $p 2>/dev/null | wc -c); done
(echo x > /proc/sys/kernel/domainname) 2>/dev/null && echo procsys writable
echo dev $(python3 -c 'import os; print(" ".join(sorted(os.listdir("/dev"))))')
true`

// TestHardeningApplied checks the hardened spec from inside a sandbox of every flavour: the
// capability set, no_new_privs (not visible under gVisor), seccomp, masked and read-only /proc
// paths, and a minimal /dev.
func TestHardeningApplied(t *testing.T) {
	t.Parallel()
	// fd, stdin, stdout, stderr and core (crun) are symlinks. gVisor's sentry serves net (tun on
	// its own netstack), fuse, and char (links to the devices it serves).
	allowed := []string{"core", "fd", "full", "mqueue", "null", "ptmx", "pts", "random", "shm", "stderr", "stdin", "stdout", "tty", "urandom", "zero"}
	for _, f := range []Flavor{FlavorRunc, FlavorCrun, FlavorGVisor} {
		t.Run(string(f), func(t *testing.T) {
			t.Parallel()
			allowedDev := allowed
			if f == FlavorGVisor {
				allowedDev = append(slices.Clone(allowed), "net", "fuse", "char")
			}
			c := runtimetest.Start(t, newFlavor(t, f), runtimetest.DefaultSpec(runtimetest.NewID()))
			res := runtimetest.Exec(t, c, "sh", "-c", hardeningScript)
			fields := map[string]string{}
			var masked int
			for _, line := range strings.Split(res.Stdout, "\n") {
				if k, v, ok := strings.Cut(line, ":"); ok {
					fields[k] = strings.TrimSpace(v)
				}
				if w := strings.Fields(line); len(w) == 3 && w[0] == "masked" {
					masked++
					if w[2] != "0" {
						t.Errorf("%s is not masked: %s bytes", w[1], w[2])
					}
				}
				if rest, ok := strings.CutPrefix(line, "dev "); ok {
					for _, d := range strings.Fields(rest) {
						if !slices.Contains(allowedDev, d) {
							t.Errorf("/dev/%s exists", d)
						}
					}
				}
			}
			if fields["CapBnd"] != "00000000000005fb" || fields["Seccomp"] != "2" {
				t.Errorf("CapBnd %q Seccomp %q: %+v", fields["CapBnd"], fields["Seccomp"], res)
			}
			if f != FlavorGVisor && (fields["NoNewPrivs"] != "1" || masked == 0) {
				t.Errorf("NoNewPrivs %q, %d masked files seen: %+v", fields["NoNewPrivs"], masked, res)
			}
			if strings.Contains(res.Stdout, "procsys writable") {
				t.Error("/proc/sys is writable")
			}
		})
	}
}

// TestGVisorIDMappedFiles: a gVisor sandbox with an id range sees its files as 0 and 1000,
// while on the host they belong to base and base+1000; the view goes with the sandbox.
func TestGVisorIDMappedFiles(t *testing.T) {
	t.Parallel()
	rt := newFlavor(t, FlavorGVisor)
	if !rt.Capabilities().IDMappedFiles || !slices.Contains(rt.Capabilities().Hardening, idmapHardening) {
		t.Fatalf("gVisor without id-mapped files (the kernel has them since 5.12): %+v", rt.Capabilities())
	}
	id := runtimetest.NewID()
	spec := runtimetest.DefaultSpec(id)
	m := runtimetest.TestIDMap()
	spec.IDMap = m
	c := runtimetest.Start(t, rt, spec)
	res := runtimetest.Exec(t, c, "sh", "-c", `echo a > /workspace/by-agent && mkdir /workspace/d && python3 -c "import os,sys
for p in sys.argv[1:]: s = os.lstat(p); print(\"%d:%d\" % (s.st_uid, s.st_gid))" /workspace/by-agent /workspace /home/agent`)
	if res.Stdout != "1000:1000\n1000:1000\n1000:1000\n" {
		t.Errorf("inside, as the agent: %+v", res)
	}
	res = runtimetest.ExecRequest(t, c, guest.ExecRequest{Argv: []string{"sh", "-c", `echo r > /root/by-root && echo r > /workspace/by-root && chown 1000:1000 /workspace/by-root && python3 -c "import os,sys
for p in sys.argv[1:]: s = os.lstat(p); print(\"%d:%d\" % (s.st_uid, s.st_gid))" /root/by-root /workspace/by-root`}, User: "root", TimeoutMs: 60000})
	if res.Stdout != "0:0\n1000:1000\n" {
		t.Errorf("inside, as root: %+v", res)
	}
	disk := filepath.Join(rt.sandboxDir(id), diskMountName)
	for p, want := range map[string]uint32{
		"workspace/by-agent": m.UIDBase + 1000, "workspace/d": m.UIDBase + 1000, "workspace": m.UIDBase + 1000,
		"home": m.UIDBase + 1000, "root/by-root": m.UIDBase, "workspace/by-root": m.UIDBase + 1000, "root": m.UIDBase, ".": m.UIDBase,
	} {
		var st syscall.Stat_t
		if err := syscall.Lstat(filepath.Join(disk, p), &st); err != nil {
			t.Errorf("%s: %v", p, err)
			continue
		}
		if st.Uid != want || st.Gid != want-m.UIDBase+m.GIDBase {
			t.Errorf("on the host %s is %d:%d, want %d (the sandbox's range starts at %d)", p, st.Uid, st.Gid, want, m.UIDBase)
		}
	}
	if err := rt.Delete(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	if mi, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(mi), rt.sandboxDir(id)) {
		t.Errorf("a mount of the sandbox is left after Delete")
	}
}

// TestGVisorOOMGuard: a gVisor sandbox sees memory_mb, its cgroup allows the guard's slack
// above it, and a command that fills memory_mb is killed (oom_killed) while the sandbox lives.
func TestGVisorOOMGuard(t *testing.T) {
	t.Parallel()
	rt, id, c := startGuardedGVisor(t)
	if res := runtimetest.Exec(t, c, "head", "-1", "/proc/meminfo"); !strings.Contains(res.Stdout, " 131072 kB") {
		t.Errorf("the sandbox's MemTotal: %+v, want 128 MiB", res)
	}
	b, err := os.ReadFile(filepath.Join(rt.memoryCgroup, cgroupPath(rt.cgroupParent, id), "memory.limit_in_bytes"))
	if want := fmt.Sprint((128 + oomSlackMB(128)) << 20); err != nil || strings.TrimSpace(string(b)) != want {
		t.Errorf("cgroup memory limit %q %v, want %s", b, err, want)
	}
	for i := 0; i < 3; i++ {
		res := runtimetest.ExecRequest(t, c, memoryBomb)
		if res.Signal != "SIGKILL" || !res.OOMKilled {
			t.Fatalf("memory bomb %d: %+v, want SIGKILL and oom_killed", i, res)
		}
	}
	if res := runtimetest.Exec(t, c, "echo", "alive"); res.Stdout != "alive\n" {
		t.Fatalf("after the bombs: %+v", res)
	}
	// The guard made the stubs, not the sentry or the gofer, the host OOM killer's first choice.
	assertStubsFirst(t, rt, id)
}

// assertStubsFirst checks that in sandbox id's memory cgroup every descendant of the sentry
// (systrap's stubs) has oom_score_adj 1000 and no other process has.
func assertStubsFirst(t *testing.T, rt *Runtime, id string) {
	t.Helper()
	sentry := readPid(filepath.Join(rt.sandboxDir(id), "init.pid"))
	b, err := os.ReadFile(filepath.Join(rt.memoryCgroup, cgroupPath(rt.cgroupParent, id), "cgroup.procs"))
	if err != nil || sentry <= 0 {
		t.Fatalf("the sandbox's processes: %v (sentry %d)", err, sentry)
	}
	parent := map[int]int{}
	for _, f := range strings.Fields(string(b)) {
		pid, _ := strconv.Atoi(f)
		if _, pp, ok := procState(pid); ok {
			parent[pid] = pp
		}
	}
	stubs, others := 0, 0
	for pid, pp := range parent {
		adj, _ := os.ReadFile(fmt.Sprintf("/proc/%d/oom_score_adj", pid))
		first := strings.TrimSpace(string(adj)) == "1000"
		// A stub's parent is the sentry or another stub; the sentry's and the gofer's are
		// outside the sandbox's cgroup.
		_, inside := parent[pp]
		switch {
		case inside && !first:
			t.Errorf("process %d (parent %d) of the sandbox is not the OOM killer's first choice: oom_score_adj %q", pid, pp, adj)
		case !inside && first:
			t.Errorf("process %d (parent %d, the sentry is %d) is the OOM killer's first choice", pid, pp, sentry)
		case inside:
			stubs++
		default:
			others++
		}
	}
	if stubs == 0 || others != 2 {
		t.Errorf("%d stubs and %d other processes in the sandbox's cgroup; want some and two (the sentry, the gofer)", stubs, others)
	}
}

// memoryBomb allocates 16 MiB blocks until something kills it.
var memoryBomb = guest.ExecRequest{Argv: []string{"python3", "-c", "b = []\nwhile True: b.append(bytearray(16 << 20))"}, TimeoutMs: 60000}

// startGuardedGVisor starts a 128 MiB gVisor sandbox with its OOM guard (a cgroup v1 host has
// one).
func startGuardedGVisor(t *testing.T) (*Runtime, string, *guest.Client) {
	t.Helper()
	rt := newFlavor(t, FlavorGVisor)
	if !slices.Contains(rt.Capabilities().Hardening, oomGuardHardening) {
		t.Fatalf("gVisor without the OOM guard on a cgroup v1 host: %v", rt.Capabilities().Hardening)
	}
	id := runtimetest.NewID()
	spec := runtimetest.DefaultSpec(id)
	spec.MemoryMB = 128
	return rt, id, runtimetest.Start(t, rt, spec)
}

// TestGVisorSentryUnprivileged: the sentry, the process that runs the sandbox's code, is host
// nobody with no capability and no file of the host reachable by id: its user namespace maps
// nobody alone (runsc's directfs would make it root of a namespace mapping every host id).
func TestGVisorSentryUnprivileged(t *testing.T) {
	t.Parallel()
	rt := newFlavor(t, FlavorGVisor)
	id := runtimetest.NewID()
	runtimetest.Start(t, rt, runtimetest.DefaultSpec(id))
	pid := readPid(filepath.Join(rt.sandboxDir(id), "init.pid"))
	if pid <= 0 || !rt.ownsProcess(pid, id) {
		t.Fatalf("init.pid %d is not the sandbox's sentry", pid)
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	fields := map[string]string{}
	for _, l := range strings.Split(string(status), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok {
			fields[k] = strings.Join(strings.Fields(v), " ")
		}
	}
	if fields["Uid"] != "65534 65534 65534 65534" || fields["Gid"] != "65534 65534 65534 65534" {
		t.Errorf("the sentry runs as uid %q gid %q on the host, want nobody", fields["Uid"], fields["Gid"])
	}
	for _, c := range []string{"CapEff", "CapPrm", "CapAmb"} {
		if fields[c] != "0000000000000000" {
			t.Errorf("the sentry's %s is %s, want none", c, fields[c])
		}
	}
	if fields["NoNewPrivs"] != "1" || fields["Seccomp"] != "2" {
		t.Errorf("the sentry's NoNewPrivs %q Seccomp %q", fields["NoNewPrivs"], fields["Seccomp"])
	}
	m, err := os.ReadFile(fmt.Sprintf("/proc/%d/uid_map", pid))
	if err != nil {
		t.Fatal(err)
	}
	if f := strings.Fields(string(m)); !slices.Equal(f, []string{"65534", "65534", "1"}) {
		t.Errorf("the sentry's uid_map is %q, want nobody alone", m)
	}
	if !slices.Contains(rt.Capabilities().Hardening, "gvisor:directfs=false") {
		t.Errorf("hardening %v lacks gvisor:directfs=false", rt.Capabilities().Hardening)
	}
}
