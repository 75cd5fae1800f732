package security

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/agentbox/agentbox/internal/wire"
)

// devAllowed is what a sandbox's /dev may hold: the minimal device set, its own devpts, shm and
// mqueue, and the standard links. gvisorDev adds what gVisor's sentry serves itself.
var (
	devAllowed = []string{"null", "zero", "full", "random", "urandom", "tty", "ptmx", "pts", "shm", "mqueue",
		"fd", "stdin", "stdout", "stderr", "core", "console"}
	gvisorDev = []string{"net", "fuse", "char"}
	// cgroupDevices are the devices a sandbox's device cgroup may allow reading or writing: the
	// spec's (null, zero, full, random, urandom, tty, ptmx, pts) and 10:200 (/dev/net/tun),
	// which runc 1.1 adds to every container by itself; the sandbox has no tun node, may not
	// make one and has no CAP_NET_ADMIN.
	cgroupDevices = []string{"1:3", "1:5", "1:7", "1:8", "1:9", "5:0", "5:1", "5:2", "136:*", "10:200"}
)

// allowedFD reports whether a descriptor target seen inside a sandbox is the sandbox's own.
func allowedFD(target string) bool {
	for _, p := range []string{"/dev/null", "/dev/pts/", "/dev/ptmx", "/dev/tty", "/dev/urandom", "/dev/zero", "pipe:", "socket:", "anon_inode:",
		"host:[", "/workspace", "/home/agent", "/tmp/", "/root", "/proc/", "/.agentbox/run"} {
		if strings.HasPrefix(target, p) {
			return true
		}
	}
	return false
}

func privAttacks() []attack {
	return []attack{
		{
			name: "priv-host-devnull",
			does: "as root, chmods its /dev/null to 000, chowns it, and replaces it with a regular file; then chmods and chowns its stdin, stdout and stderr",
			want: "the host's /dev/null is untouched (a character device 1:3, root's, 0666, the same inode): the runtimes never give a sandbox the host's node, neither bound into /dev nor as the init's stdio",
			run: func(a *arena) {
				before := hostDevNull(a.t)
				a.root(`chmod 000 /dev/null; chown 0:0 /dev/null; chmod 000 /proc/1/fd/0 /proc/1/fd/1 /proc/1/fd/2
rm -f /dev/null && : > /dev/null; echo done`)
				if after := hostDevNull(a.t); after != before {
					a.t.Fatalf("the host's /dev/null changed: %s, was %s", after, before)
				}
			},
		},
		{
			name: "priv-mount",
			does: "as root, mounts a tmpfs, bind-mounts /workspace, mounts a new procfs, remounts / read-write, unmounts the masked /proc/kcore and the read-only /proc/sys (mount(8) and mount(2))",
			want: "every call fails; the sandbox's mount table seen from the host (/proc/<init>/mountinfo) is unchanged; / is still read-only and /proc/kcore still empty inside",
			run: func(a *arena) {
				mi := fmt.Sprintf("/proc/%d/mountinfo", a.initPid(a.id))
				before, _ := os.ReadFile(mi)
				res := a.root(`mkdir -p /workspace/m /workspace/p
mount -t tmpfs none /workspace/m 2>/dev/null && echo MOUNTED tmpfs
mount --bind /workspace /workspace/m 2>/dev/null && echo MOUNTED bind
mount -t proc proc /workspace/p 2>/dev/null && echo MOUNTED proc
mount -o remount,rw / 2>/dev/null && echo REMOUNTED /
umount /proc/kcore 2>/dev/null && echo UNMOUNTED kcore
umount -l /proc/sys 2>/dev/null && echo UNMOUNTED sys
true`)
				py := a.pyAs("root", `
for src, dst, typ, flags in [(b"none", b"/workspace/m", b"tmpfs", 0), (b"/", b"/workspace/m", None, 4096 | 16384), (b"none", b"/", None, 32 | 1 << 14)]:
    r, e = call("mount", src, dst, typ, flags, None)
    out("mount", dst.decode(), e)
    if r == 0:
        out("MOUNTED")
`, "")
				if strings.TrimSpace(res.Stdout) != "" || strings.Contains(py.Stdout, "MOUNTED") {
					a.t.Errorf("a mount succeeded: %q %q", res.Stdout, py.Stdout)
				}
				if after, _ := os.ReadFile(mi); string(after) != string(before) {
					a.t.Errorf("HOLE: the sandbox's mount table changed:\n%s\n->\n%s", before, after)
				}
				if r := a.root("head -c 16 /proc/kcore 2>/dev/null | wc -c"); strings.TrimSpace(r.Stdout) != "0" {
					a.t.Errorf("after the mount attempts: %q", r.Stdout)
				}
			},
		},
		{
			name: "priv-unshare",
			does: "as the agent user and as root, unshares user, mount, net, pid, uts, ipc and cgroup namespaces (unshare(1) with -r, and unshare(2) from processes that then hold what they got)",
			want: "every unshare fails; while the holders live, the sandbox's host processes are in no namespace they were not in before",
			run: func(a *arena) {
				for _, u := range users {
					res := a.execIn(a.id, apiExec(u, "sh", "-c", `for f in "-U -r" -n -m "-p -f" -u -i -C "-U -r -m -n"; do unshare $f true 2>/dev/null && echo "UNSHARED $f"; done; true`))
					if strings.TrimSpace(res.Stdout) != "" {
						a.t.Errorf("as %s: %q", userName(u), res.Stdout)
					}
					before := nsLinks(a.hostPids(a.id))
					res = a.holding(u, `
flags = {"user": 0x10000000, "net": 0x40000000, "mnt": 0x00020000, "pid": 0x20000000, "uts": 0x04000000, "ipc": 0x08000000, "cgroup": 0x02000000}
for name, flag in flags.items():
    if os.fork() == 0:
        r, e = call("unshare", flag)
        os.write(1, ("unshare %s %s\n" % (name, e)).encode())
        if r == 0:
            os.write(1, ("UNSHARED %s\n" % name).encode())
        wait_release()
        os._exit(0)
time.sleep(1)
hold()
`, func(out string) {
						for l := range nsLinks(a.hostPids(a.id)) {
							if !before[l] {
								a.t.Errorf("HOLE?: a host process of the sandbox is in a new namespace %s (as %s)", l, userName(u))
							}
						}
					})
					if strings.Contains(res.Stdout, "UNSHARED") {
						a.t.Errorf("as %s: %s", userName(u), res.Stdout)
					}
				}
			},
		},
		{
			name:   "priv-setns",
			does:   "as the agent user and as root, opens /proc/1/ns/* and the namespaces of every visible process and of the test's own host pid, and setns(2)s into each (and nsenter -t 1 -a)",
			want:   "every setns fails and no namespace other than the sandbox's own is visible inside; on the host the sandbox's namespaces are not the host's (runc: the inside inodes are those of /proc/<init>/ns, not of /proc/1/ns)",
			gvisor: "gVisor's nsfs numbers namespaces per task (PID 1 and its child show different inodes for the same namespace), so under gVisor only the setns calls are checked, not the inodes",
			run: func(a *arena) {
				prog := `
own = {}
for ns in ("mnt", "net", "pid", "user", "uts", "ipc", "cgroup"):
    try:
        own[ns] = os.readlink("/proc/self/ns/" + ns)
    except OSError as e:
        out("no /proc/self/ns/" + ns, errname(e))  # gVisor has only some
out("OWN", json.dumps(own))
for p in [p for p in os.listdir("/proc") if p.isdigit()] + [sys.argv[2]]:
    for ns in own:
        try:
            link = os.readlink("/proc/%s/ns/%s" % (p, ns))
        except OSError:
            continue
        if link != own[ns]:
            out("FOREIGN", p, ns, link)
for ns in own:
    try:
        fd = os.open("/proc/1/ns/" + ns, os.O_RDONLY)
    except OSError as e:
        out("open", ns, errname(e)); continue
    r, e = call("setns", fd, 0)
    out("setns", ns, e)
    if r == 0:
        out("ENTERED", ns)
    os.close(fd)
`
				hostNS := map[string]string{}
				for _, ns := range []string{"mnt", "net", "pid", "user", "uts", "ipc", "cgroup"} {
					hostNS[ns], _ = os.Readlink("/proc/1/ns/" + ns)
				}
				for _, u := range users {
					res := a.pyAs(u, prog, "", strconv.Itoa(os.Getpid()))
					// gVisor's nsfs gives every task its own inode number for the same
					// namespace (a child of PID 1 shows net:[157], PID 1 net:[110]): there the
					// inodes say nothing, and only setns is checked.
					foreign := strings.Contains(res.Stdout, "FOREIGN") && !a.gvisor()
					if foreign || strings.Contains(res.Stdout, "ENTERED") || res.ExitCode != 0 {
						a.t.Errorf("as %s:\n%s%s", userName(u), res.Stdout, res.Stderr)
					}
					if n := a.execIn(a.id, apiExec(u, "nsenter", "-t", "1", "-a", "true")); n.ExitCode == 0 {
						a.t.Errorf("as %s, nsenter -t 1 -a succeeded", userName(u))
					}
					if a.gvisor() {
						continue
					}
					for _, l := range strings.Split(res.Stdout, "\n") {
						j, ok := strings.CutPrefix(l, "OWN ")
						if !ok {
							continue
						}
						var own map[string]string
						if err := json.Unmarshal([]byte(j), &own); err != nil {
							a.t.Fatalf("OWN %q: %v", j, err)
						}
						for ns, link := range own {
							if link == hostNS[ns] {
								a.t.Errorf("HOLE: the sandbox shares the host's %s namespace %s", ns, link)
							}
						}
						initNet, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", a.initPid(a.id)))
						if own["net"] != initNet {
							a.t.Errorf("inside, the net namespace is %s; the sandbox's init on the host is in %s", own["net"], initNet)
						}
					}
				}
			},
		},
		{
			name: "priv-chroot-escape",
			does: "as root, chroots into a subdirectory and climbs out with chdir(..) and chroot(.) (the classic breakout), tries pivot_root, and open_by_handle_at with a forged handle of the file system's root inode (\"shocker\"), then reads a host canary by its path",
			want: "chroot, pivot_root and open_by_handle_at fail; the host canary's content never appears",
			run: func(a *arena) {
				_, c := a.hostDir()
				res := a.pyAs("root", `
import struct
escaped = False
r, e = call("chroot", b"/workspace")
out("chroot /workspace", e)
os.makedirs("/workspace/jail/inner", exist_ok=True)
r, e = call("chroot", b"/workspace/jail")
out("chroot jail", e)
if r == 0:
    for i in range(64):
        os.chdir("..")
    r, e = call("chroot", b".")
    out("chroot .", e)
r, e = call("pivot_root", b"/workspace", b"/workspace/jail")
out("pivot_root", e)
escaped |= r == 0
handle = ctypes.create_string_buffer(struct.pack("IiII", 8, 1, 2, 0))
rootfd = os.open("/", os.O_RDONLY)
r, e = call("open_by_handle_at", rootfd, handle, 0)
out("open_by_handle_at", e)
escaped |= r >= 0
try:
    with open(sys.argv[2]) as f:
        out("READ", f.read())
except OSError as ex:
    out("read canary", errname(ex))
out("ESCAPED" if escaped else "CONTAINED")
`, "", c.path)
				if strings.Contains(res.Stdout, strings.TrimSpace(c.content)) || !strings.Contains(res.Stdout, "CONTAINED") || !strings.Contains(res.Stdout, "chroot jail EPERM") {
					a.t.Errorf("chroot escape:\n%s%s", res.Stdout, res.Stderr)
				}
				c.intact(a.t)
			},
		},
		{
			name:   "priv-keyctl",
			does:   "as the agent user and as root, adds a key to its user keyring (add_key), gets its session keyring (keyctl) and requests a key (request_key)",
			want:   "every call fails; on the host, /proc/keys holds no key with the attack's description and /proc/key-users shows no new key of the sandbox's uids (runc itself gives each container a session keyring, owned by its root: that one is expected)",
			gvisor: "the keyring calls never reach the host kernel under gVisor either; the same host checks apply (the sandbox has no host uid range to look for)",
			run: func(a *arena) {
				desc := "absec-key-" + randHex(6)
				base := a.uidBase(a.id)
				before := keyUsers(base)
				for _, u := range users {
					res := a.pyAs(u, `
desc = sys.argv[2].encode()
ok = []
r, e = call("add_key", b"user", desc, b"secret", 6, -4)
out("add_key", e); ok += [r >= 0]
r, e = call("keyctl", 0, -3, 1)
out("keyctl get session", e); ok += [r >= 0]
r, e = call("request_key", b"user", desc, None, 0)
out("request_key", e); ok += [r >= 0]
out("KEYS" if any(ok) else "NOKEYS")
`, "", desc)
					if !strings.Contains(res.Stdout, "NOKEYS") {
						a.t.Errorf("as %s:\n%s%s", userName(u), res.Stdout, res.Stderr)
					}
				}
				if b, _ := os.ReadFile("/proc/keys"); strings.Contains(string(b), desc) {
					a.t.Errorf("HOLE: the host kernel holds the sandbox's key %s", desc)
				}
				if after := keyUsers(base); after != before {
					a.t.Errorf("HOLE: host /proc/key-users entries of the sandbox's uids changed:\n%s\n->\n%s", before, after)
				}
			},
		},
		{
			name: "priv-bpf",
			does: "as the agent user and as root, creates a BPF hash map and loads a socket-filter program with bpf(2), holding any fd it gets",
			want: "both calls fail; while it holds, no host process of the sandbox has a bpf-map or bpf-prog fd",
			run: func(a *arena) {
				for _, u := range users {
					res := a.holding(u, `
class MapAttr(ctypes.Structure):
    _fields_ = [("map_type", ctypes.c_uint32), ("key_size", ctypes.c_uint32), ("value_size", ctypes.c_uint32), ("max_entries", ctypes.c_uint32), ("pad", ctypes.c_uint8 * 112)]
attr = MapAttr(1, 4, 4, 1)
r1, e = call("bpf", 0, ctypes.byref(attr), ctypes.sizeof(attr))
out("BPF_MAP_CREATE", e)
insns = (ctypes.c_uint64 * 2)(0x00000000000000b7, 0x0000000000000095)  # r0 = 0; exit
lic = ctypes.create_string_buffer(b"GPL")
class ProgAttr(ctypes.Structure):
    _fields_ = [("prog_type", ctypes.c_uint32), ("insn_cnt", ctypes.c_uint32), ("insns", ctypes.c_uint64), ("license", ctypes.c_uint64), ("pad", ctypes.c_uint8 * 104)]
pattr = ProgAttr(1, 2, ctypes.addressof(insns), ctypes.addressof(lic))
r2, e = call("bpf", 5, ctypes.byref(pattr), ctypes.sizeof(pattr))
out("BPF_PROG_LOAD", e)
out("GOT-BPF" if r1 >= 0 or r2 >= 0 else "NO-BPF")
hold()
`, func(string) {
						if held := a.heldFDs(a.id, "bpf-map", "bpf-prog"); len(held) != 0 {
							a.t.Errorf("HOLE: host processes of the sandbox hold %v", held)
						}
					})
					if !strings.Contains(res.Stdout, "NO-BPF") {
						a.t.Errorf("as %s:\n%s%s", userName(u), res.Stdout, res.Stderr)
					}
				}
			},
		},
		{
			name:   "priv-io-uring-userfaultfd",
			does:   "as the agent user and as root, sets up an io_uring (io_uring_setup) and a userfaultfd, holding any fd it gets",
			want:   "both calls fail; while it holds, no host process of the sandbox has an io_uring or userfaultfd fd it did not have before",
			gvisor: "runsc (2023 and later) gives the sentry a disabled io_uring of its own at start, to release files asynchronously, and its seccomp filter refuses io_uring calls after start; the workload adds none",
			run: func(a *arena) {
				rings := func() []string { return a.heldFDs(a.id, "io_uring", "userfaultfd") }
				before := rings()
				if len(before) != 0 && !a.gvisor() {
					a.t.Errorf("HOLE: host processes of the sandbox hold %v", before)
				}
				for _, u := range users {
					res := a.holding(u, `
params = ctypes.create_string_buffer(120)
r1, e = call("io_uring_setup", 4, params)
out("io_uring_setup", e)
r2, e = call("userfaultfd", 0)
out("userfaultfd", e)
out("GOT" if r1 >= 0 or r2 >= 0 else "NONE")
hold()
`, func(string) {
						if now := rings(); len(now) > len(before) {
							a.t.Errorf("HOLE: host processes of the sandbox hold %v (before the attack: %v)", now, before)
						}
					})
					if !strings.Contains(res.Stdout, "\nNONE\n") {
						a.t.Errorf("as %s:\n%s%s", userName(u), res.Stdout, res.Stderr)
					}
				}
			},
		},
		{
			name:   "priv-ptrace-and-pids",
			does:   "lists /proc for processes outside the sandbox (a sentinel the test runs on the host, the server, runc/runsc, the test binary); as the agent user ptrace-attaches and kills PID 1 (the agent); as both users ptrace-attaches the sentinel's host pid and, as root, SIGKILLs it",
			want:   "/proc shows only the sandbox's processes (runc: no more than the host sees in its cgroup); every ptrace and kill fails; on the host the sentinel is alive and untraced, and the agent still answers",
			gvisor: "under gVisor /proc is the sentry's and holds only the workload's processes; its count is not compared with the host's (the host sees the sentry and gofer)",
			run: func(a *arena) {
				marker := fmt.Sprintf("3600.%d", 100000+randInt(899999))
				sentinel := exec.Command("sleep", marker)
				if err := sentinel.Start(); err != nil {
					a.t.Fatal(err)
				}
				defer func() { sentinel.Process.Kill(); sentinel.Wait() }()
				spid := strconv.Itoa(sentinel.Process.Pid)
				prog := `
pid, marker = sys.argv[2], sys.argv[3].encode()
pids = [p for p in os.listdir("/proc") if p.isdigit()]
out("PIDS", len(pids))
for p in pids:
    if p == str(os.getpid()):
        continue  # its own command line holds the marker
    try:
        with open("/proc/%s/cmdline" % p, "rb") as f:
            cmd = f.read().replace(b"\0", b" ")
    except OSError:
        continue
    for bad in (marker, b"agentbox serve", b"runsc", b"runc", b"crun", b"security.test", b"containerd"):
        if bad in cmd:
            out("FOREIGN", p, cmd[:120])
r, e = call("ptrace", 16, int(pid), 0, 0)
out("ptrace sentinel", e)
if r == 0:
    out("ATTACHED")
if os.geteuid() == 0:
    r, e = call("kill", int(pid), 9)
    out("kill sentinel", e)
else:
    r, e = call("ptrace", 16, 1, 0, 0)
    out("ptrace 1", e)
    if r == 0:
        out("ATTACHED")
    r, e = call("kill", 1, 9)
    out("kill 1", e)
    if r == 0:
        out("KILLED-1")
`
				for _, u := range users {
					res := a.pyAs(u, prog, "", spid, marker)
					if strings.Contains(res.Stdout, "FOREIGN") || strings.Contains(res.Stdout, "ATTACHED") || strings.Contains(res.Stdout, "KILLED-1") || res.ExitCode != 0 {
						a.t.Errorf("as %s:\n%s%s", userName(u), res.Stdout, res.Stderr)
					}
					var inside int
					fmt.Sscanf(res.Stdout[strings.Index(res.Stdout, "PIDS ")+5:], "%d", &inside)
					if host := len(a.hostPids(a.id)); !a.gvisor() && inside > host+1 {
						a.t.Errorf("the sandbox sees %d processes, its cgroup on the host holds %d", inside, host)
					}
				}
				time.Sleep(100 * time.Millisecond)
				if err := sentinel.Process.Signal(syscall.Signal(0)); err != nil {
					a.t.Errorf("HOLE: the host sentinel is gone: %v", err)
				}
				if tp := statusField(sentinel.Process.Pid, "TracerPid"); tp != "0" {
					a.t.Errorf("HOLE: the host sentinel is traced by %s", tp)
				}
				a.alive(a.id, 10*time.Second)
			},
		},
		{
			name:   "priv-mknod-host-devices",
			does:   "as root, mknods a block device (8:0, sda), /dev/mem (1:1) and /dev/kmsg (1:11) in /workspace and /tmp and opens them; looks for /dev/sda, /dev/vda, /dev/mem, /dev/kmem, /dev/port, /dev/kmsg, loop and dm devices",
			want:   "mknod fails, no host device is present, /dev holds only the minimal set; on the host the sandbox's device cgroup denies everything but the standard character devices",
			gvisor: "gVisor's /dev is served by its sentry and also holds net (tun, on its own netstack with network none) fuse (served by the sentry) and char (links to those devices); none is a host device",
			run: func(a *arena) {
				res := a.pyAs("root", `
made = []
for path, mode, dev in [("/workspace/sda", 0o60600, os.makedev(8, 0)), ("/workspace/mem", 0o20600, os.makedev(1, 1)), ("/tmp/kmsg", 0o20600, os.makedev(1, 11))]:
    try:
        os.mknod(path, mode, dev)
        made.append(path)
        out("MKNOD", path)
        fd = os.open(path, os.O_RDONLY)
        out("OPENED", path, len(os.read(fd, 16)))
    except OSError as e:
        out("mknod", path, errname(e))
for d in ["/dev/sda", "/dev/vda", "/dev/xvda", "/dev/nvme0n1", "/dev/mem", "/dev/kmem", "/dev/port", "/dev/kmsg", "/dev/loop0", "/dev/loop-control", "/dev/dm-0", "/dev/mapper", "/dev/kvm", "/dev/vsock", "/dev/vhost-vsock"]:
    if os.path.lexists(d):
        out("PRESENT", d)
out("DEV", json.dumps(sorted(os.listdir("/dev"))))
`, "")
				// gVisor's root may make a node in the sentry's own tmpfs; it maps to no host
				// device, so opening it fails. Anywhere else a node is a failure.
				mknodOK := !strings.Contains(res.Stdout, "MKNOD") || (a.gvisor() && !strings.Contains(res.Stdout, "OPENED"))
				if !mknodOK || strings.Contains(res.Stdout, "OPENED") || strings.Contains(res.Stdout, "PRESENT") || res.ExitCode != 0 {
					a.t.Errorf("%s%s", res.Stdout, res.Stderr)
				}
				// On the host, no process of the sandbox holds a block device or kernel memory.
				for _, pid := range a.hostPids(a.id) {
					for _, f := range hostFDs(pid) {
						if f.mode&syscall.S_IFMT == syscall.S_IFBLK || slices.Contains([]string{"/dev/mem", "/dev/kmem", "/dev/port", "/dev/kmsg"}, f.target) {
							a.t.Errorf("HOLE: host process %d of the sandbox holds %s", pid, f.target)
						}
					}
				}
				allowed := devAllowed
				if a.gvisor() {
					allowed = append(slices.Clone(devAllowed), gvisorDev...)
				}
				for _, l := range strings.Split(res.Stdout, "\n") {
					if j, ok := strings.CutPrefix(l, "DEV "); ok {
						for _, name := range strings.Split(strings.Trim(j, "[]"), ",") {
							if name = strings.Trim(strings.TrimSpace(name), `"`); name != "" && !slices.Contains(allowed, name) {
								a.t.Errorf("/dev/%s is in the sandbox", name)
							}
						}
					}
				}
				list, err := a.cgroupFile(a.id, "devices", "devices.list")
				if err != nil {
					a.t.Logf("no v1 device cgroup to check (%v)", err)
					return
				}
				if a.gvisor() {
					// runsc leaves the sentry's device cgroup open ("a *:* rwm"): the sentry and
					// gofer run in their own user namespace without capabilities and open no
					// device but the ones checked above, so the workload cannot use it.
					a.t.Logf("gVisor: the sentry's host device cgroup: %q", list)
					return
				}
				for _, l := range lines(list) {
					f := strings.Fields(l) // "c 1:3 rwm"
					if len(f) != 3 || !strings.ContainsAny(f[2], "rw") {
						continue // mknod alone ("b *:* m") grants no access, and CAP_MKNOD is dropped
					}
					if f[0] != "c" || !slices.Contains(cgroupDevices, f[1]) {
						a.t.Errorf("HOLE: the sandbox's host device cgroup allows %q", l)
					}
				}
			},
		},
		{
			name: "priv-raw-packet-vsock-sockets",
			does: "as the agent user and as root, opens AF_INET and AF_INET6 raw sockets, AF_PACKET raw and datagram sockets, an AF_VSOCK stream socket and an AF_ALG socket, holding any it gets",
			want: "every socket call fails; while it holds, the sandbox's network namespace seen from the host (/proc/<init>/net/raw, raw6, packet) holds no socket",
			run: func(a *arena) {
				for _, u := range users {
					res := a.holding(u, `
held = []
for name, fam, typ, proto in [("inet-raw", socket.AF_INET, socket.SOCK_RAW, 1), ("inet6-raw", socket.AF_INET6, socket.SOCK_RAW, 58),
                              ("packet-raw", 17, socket.SOCK_RAW, 0x0300), ("packet-dgram", 17, socket.SOCK_DGRAM, 0x0300),
                              ("vsock", 40, socket.SOCK_STREAM, 0), ("alg", 38, socket.SOCK_SEQPACKET, 0)]:
    try:
        held.append(socket.socket(fam, typ, proto))
        out("OPENED", name)
    except OSError as e:
        out(name, errname(e))
hold()
`, func(string) {
						pid := a.initPid(a.id)
						for _, f := range []string{"raw", "raw6", "packet"} {
							b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/net/%s", pid, f))
							if ls := lines(string(b)); len(ls) > 1 {
								a.t.Errorf("HOLE: the sandbox's netns holds %s sockets:\n%s", f, b)
							}
						}
					})
					if strings.Contains(res.Stdout, "OPENED") {
						a.t.Errorf("as %s:\n%s", userName(u), res.Stdout)
					}
				}
			},
		},
		{
			name: "priv-setuid-binary",
			does: "as root, makes setuid-root copies of /bin/dash in /workspace, /home/agent, /tmp and /dev/shm and sets a file capability (security.capability) on a copy of python3; as the agent user runs them (dash -p) and calls setuid(0)",
			want: "the agent user stays uid 1000 (effective too) everywhere; setting the file capability fails; on the host the sandbox's disk is mounted nosuid, and a setuid file root puts in the sandbox's writable root gives a host user (nobody, 1000) nothing: the sandbox's directory is closed to them or the root is nosuid there",
			run: func(a *arena) {
				a.root(`for d in /workspace /home/agent /tmp /dev/shm; do for b in /bin/dash:rootsh /usr/bin/python3:rootpy; do cp ${b%%:*} $d/${b#*:} 2>/dev/null && chown 0:0 $d/${b#*:} && chmod 4755 $d/${b#*:}; done; done; cp /usr/bin/python3 /workspace/py; true`)
				cap := a.pyAs("root", `
try:
    os.setxattr("/workspace/py", "security.capability", bytes.fromhex("0100000200000080000000000000000000000000"))
    out("SETCAP")
except OSError as e:
    out("setcap", errname(e))
`, "")
				if strings.Contains(cap.Stdout, "SETCAP") {
					a.t.Errorf("root set a file capability: %s", cap.Stdout)
				}
				res := a.sh(`for d in /workspace /home/agent /tmp /dev/shm; do [ -x $d/rootsh ] && $d/rootsh -p -c 'echo "$(id -u) $(id -ru)"' 2>/dev/null; [ -x $d/rootpy ] && $d/rootpy -c 'import os; print(os.geteuid(), os.getuid())' 2>/dev/null; done
/workspace/py -c 'import os; os.setuid(0)' 2>/dev/null && echo SETUID0
python3 -c 'import os; os.setuid(0)' 2>/dev/null && echo SETUID0; true`)
				for _, l := range lines(res.Stdout) {
					if l != "1000 1000" {
						a.t.Errorf("HOLE: the agent user got %q from a setuid binary", l)
					}
				}
				if len(lines(res.Stdout)) == 0 {
					a.t.Errorf("no setuid copy ran: %+v", res)
				}
				disk := filepath.Join(a.sandboxDir(a.id), "disk")
				if opts := hostMountOptions(disk); !strings.Contains(opts, "nosuid") {
					a.t.Errorf("HOLE: the sandbox's disk is mounted on the host at %s without nosuid (%q): the setuid file works for host users", disk, opts)
				}
				// A setuid-root file in the sandbox's writable root (where setuid may work
				// inside an image), run by host users through the host's view of that root.
				a.root(`cp /usr/bin/python3 /rootpy && chown 0:0 /rootpy && chmod 4755 /rootpy; true`)
				merged := filepath.Join(a.sandboxDir(a.id), "rootfs", "rootpy")
				if _, err := os.Stat(merged); err != nil {
					a.t.Fatalf("the setuid copy is not in the sandbox's root seen from the host (the attack did not happen): %v", err)
				}
				for _, uid := range []uint32{65534, 1000} {
					out, ok := asHostUser(uid, uid, merged, "-c", "import os; print(os.geteuid())")
					if ok && strings.TrimSpace(out) != strconv.Itoa(int(uid)) {
						a.t.Errorf("HOLE: host uid %d ran the sandbox's setuid file %s as euid %s", uid, merged, strings.TrimSpace(out))
					}
				}
			},
		},
		{
			name: "priv-overwrite-proc-self-exe",
			does: "as root, opens /proc/1/exe (the agent) and /.agentbox/agentbox for writing (directly, with O_TRUNC, and by reopening an O_PATH fd through /proc/self/fd as in CVE-2019-5736), and cp's over /proc/self/exe, /usr/bin/dash and /proc/1/exe",
			want: "every open of the agent's binary for writing fails (dash, python3 and sleep are the sandbox's own files in its writable root: an image's, or image host's /usr overlay); on the host the sha256 of the agentbox binary (server and the guest copy bound into sandboxes), runc, crun, runsc, dash and python3 are unchanged",
			run: func(a *arena) {
				var bins []string
				for _, p := range []string{a.s.bin, filepath.Join(a.s.stateDir, "runtimes", a.rt, "bin", "agentbox"), "/usr/bin/dash", "/usr/bin/python3"} {
					if r, err := filepath.EvalSymlinks(p); err == nil {
						bins = append(bins, r)
					}
				}
				for _, b := range []string{"runc", "crun", "runsc"} {
					if p, err := exec.LookPath(b); err == nil {
						r, _ := filepath.EvalSymlinks(p)
						bins = append(bins, r)
					}
				}
				sums := map[string]string{}
				for _, b := range bins {
					sums[b] = sha256File(a.t, b)
				}
				// python3, dash and sleep are the sandbox's own files in its writable root (an
				// image's, or image host's /usr overlay): root may write its copies there, which
				// the host's sums below check never reach the host. The agent's binary must
				// refuse every write.
				targets := `["/proc/1/exe", "/.agentbox/agentbox"]`
				res := a.pyAs("root", `
import subprocess
child = subprocess.Popen(["sleep", "30"])
wrote = False
for t in `+targets+`:
    for flags in (os.O_WRONLY, os.O_RDWR | os.O_TRUNC):
        try:
            fd = os.open(t, flags)
            os.write(fd, b"#!/bin/sh\necho pwned\n")
            out("WROTE", t)
            wrote = True
        except OSError as e:
            out(t, errname(e))
    try:
        pfd = os.open(t, os.O_PATH)
        fd = os.open("/proc/self/fd/%d" % pfd, os.O_WRONLY)
        os.write(fd, b"pwned")
        out("WROTE via O_PATH", t)
        wrote = True
    except OSError as e:
        out(t, "via O_PATH", errname(e))
child.kill()
out("WROTE-SOMETHING" if wrote else "NOTHING-WRITTEN")
`, "")
				if !strings.Contains(res.Stdout, "NOTHING-WRITTEN") {
					a.t.Errorf("%s%s", res.Stdout, res.Stderr)
				}
				a.root("cp /bin/true /proc/self/exe 2>/dev/null; cp /bin/true /usr/bin/dash 2>/dev/null; cp /bin/true /proc/1/exe 2>/dev/null; true")
				for _, b := range bins {
					if sha256File(a.t, b) != sums[b] {
						a.t.Errorf("HOLE: host binary %s changed", b)
					}
				}
				a.alive(a.id, 10*time.Second)
			},
		},
		{
			name:   "priv-leaked-fds",
			does:   "lists where every fd of a command (/proc/self/fd, as both users) and of PID 1 (as root) points",
			want:   "nothing points outside the sandbox's own files, pipes, sockets and devices (no state dir, database, token or host path); on the host no process of the sandbox (runc: the agent and its commands; gVisor: the sentry and gofer) holds a file the server holds (same device and inode: database, WAL, lock, listening socket, and a host file the suite's server inherited as fd 3, as from a careless supervisor)",
			gvisor: "gVisor shows the descriptors the runtime donated to its init as host:[N]; they are its stdio (the sandbox's own log on its disk, /dev/null)",
			run: func(a *arena) {
				prog := `
for d in ["/proc/self/fd"] + (["/proc/1/fd"] if os.geteuid() == 0 else []):
    for n in os.listdir(d):
        try:
            out("FD", d, n, os.readlink(d + "/" + n))
        except OSError as e:
            out("FDERR", d, n, errname(e))
`
				for _, u := range users {
					res := a.pyAs(u, prog, "")
					for _, l := range lines(res.Stdout) {
						f := strings.SplitN(l, " ", 4)
						if len(f) < 4 || f[0] != "FD" {
							continue
						}
						t := f[3]
						if strings.Contains(t, a.s.stateDir) || strings.Contains(t, "agentbox.db") || strings.Contains(t, a.s.secretDir) || !allowedFD(t) {
							a.t.Errorf("as %s, fd %s/%s points at %q", userName(u), f[1], f[2], t)
						}
					}
					if len(lines(res.Stdout)) < 3 {
						a.t.Errorf("as %s: no fds listed: %+v", userName(u), res)
					}
				}
				type key struct{ dev, ino uint64 }
				server := map[key]string{}
				for _, f := range hostFDs(a.s.pid()) {
					if f.mode&syscall.S_IFMT == syscall.S_IFCHR || strings.HasPrefix(f.target, "anon_inode:") || f.ino == 0 {
						continue
					}
					server[key{f.dev, f.ino}] = f.target
				}
				if len(server) == 0 {
					a.t.Fatalf("no fds of the server %d", a.s.pid())
				}
				for _, pid := range a.hostPids(a.id) {
					for _, f := range hostFDs(pid) {
						if t, ok := server[key{f.dev, f.ino}]; ok && f.mode&syscall.S_IFMT != syscall.S_IFCHR && !strings.HasPrefix(f.target, "anon_inode:") && f.ino != 0 {
							cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
							a.t.Errorf("HOLE: host process %d (%.60s) of the sandbox holds fd %d = %s, which the server holds (%s)", pid, strings.ReplaceAll(string(cmd), "\x00", " "), f.fd, f.target, t)
						}
					}
				}
			},
		},
		{
			name: "priv-agent-socket-symlink",
			does: "as root, replaces its agent socket /.agentbox/run/agent.sock (its host side is the bundle's run/agent.sock) with a symlink to a host unix socket path, then the host makes 24 API calls to the sandbox, 16 of them at once (new connections)",
			want: "the server never connects to the host socket the sandbox named (the test's listener there accepts nothing): the host never follows a path the sandbox controls",
			run: func(a *arena) {
				sock := filepath.Join(a.s.secretDir, "host-"+randHex(4)+".sock")
				ln, err := net.Listen("unix", sock)
				if err != nil {
					a.t.Fatal(err)
				}
				defer ln.Close()
				var accepted atomic.Int64
				var firstLine atomic.Value
				go func() {
					for {
						c, err := ln.Accept()
						if err != nil {
							return
						}
						accepted.Add(1)
						c.SetReadDeadline(time.Now().Add(time.Second))
						buf := make([]byte, 80)
						n, _ := c.Read(buf)
						firstLine.CompareAndSwap(nil, strings.SplitN(string(buf[:n]), "\r\n", 2)[0])
						c.Close()
					}
				}()
				res := a.pyAs("root", `
os.symlink(sys.argv[2], "/.agentbox/run/swap.sock")
os.rename("/.agentbox/run/swap.sock", "/.agentbox/run/agent.sock")
out("SWAPPED", os.readlink("/.agentbox/run/agent.sock"))
`, "", sock)
				if !strings.Contains(res.Stdout, "SWAPPED") {
					a.t.Fatalf("could not swap the socket (the attack did not happen): %+v", res)
				}
				hammer(a, a.id, 16)
				for i := 0; i < 8; i++ {
					a.tryExecIn(a.id, wire.ExecRequest{Command: []string{"true"}, TimeoutSeconds: 5})
				}
				if n := accepted.Load(); n > 0 {
					a.t.Errorf("HOLE: the server connected %d times to the host socket %s that the sandbox's root named by symlinking its agent socket (first request: %q); a sandbox can point the server at any host unix socket (or another sandbox's agent)", n, sock, firstLine.Load())
				}
			},
		},
		{
			name: "priv-agent-socket-hijacks-other-sandbox",
			does: "as root in sandbox A, replaces A's agent socket with a symlink to the host path of sandbox B's agent socket (same runtime), then A's owner runs commands and writes a file in A",
			want: "nothing A's owner does reaches B: B's marker file is never read through A, and the file written to A does not appear in B",
			run: func(a *arena) {
				victim := a.newSandbox(wire.CreateRequest{})
				a.execIn(victim.ID, apiExec("", "sh", "-c", "echo victim-"+victim.ID+" > /workspace/whoami"))
				a.sh("echo attacker > /workspace/whoami")
				victimSock := filepath.Join(a.sandboxDir(victim.ID), "run", "agent.sock")
				res := a.pyAs("root", `
os.symlink(sys.argv[2], "/.agentbox/run/swap.sock")
os.rename("/.agentbox/run/swap.sock", "/.agentbox/run/agent.sock")
out("SWAPPED")
`, "", victimSock)
				if !strings.Contains(res.Stdout, "SWAPPED") {
					a.t.Fatalf("could not swap the socket: %+v", res)
				}
				var hijacked atomic.Int64
				var wg sync.WaitGroup
				for i := 0; i < 16; i++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						r, err := a.tryExecIn(a.id, wire.ExecRequest{Command: []string{"cat", "/workspace/whoami"}, TimeoutSeconds: 5})
						if err == nil && strings.Contains(r.Stdout, "victim-") {
							hijacked.Add(1)
						}
					}()
				}
				wg.Wait()
				for i := 0; i < 4; i++ {
					a.writeFile(a.id, "/workspace/from-owner-of-A-"+strconv.Itoa(i), []byte("x"))
				}
				if n := hijacked.Load(); n > 0 {
					a.t.Errorf("HOLE: %d of 16 commands sent to sandbox %s ran in sandbox %s (its agent socket was a symlink to the other's)", n, a.id, victim.ID)
				}
				ls := a.execIn(victim.ID, apiExec("", "sh", "-c", "ls /workspace"))
				if strings.Contains(ls.Stdout, "from-owner-of-A") {
					a.t.Errorf("HOLE: files written to sandbox %s landed in sandbox %s: %q", a.id, victim.ID, ls.Stdout)
				}
			},
		},
		{
			name: "host-account-owns-files",
			does: "as the agent user and as root, writes files and directories in /workspace, /home/agent and /root (the sandbox's disk, which the host mounts)",
			want: "on the host every one of them belongs to the sandbox's own uid range (runc: base and base+1000), never to a host account (a uid in the host's /etc/passwd or below 65536), so no host user owns what a sandbox writes",
			run: func(a *arena) {
				a.sh("echo a > /workspace/by-agent; mkdir /workspace/dir-by-agent; echo a > /home/agent/by-agent")
				a.root("echo r > /workspace/by-root; echo r > /root/by-root")
				disk := filepath.Join(a.sandboxDir(a.id), "disk")
				accounts := hostAccounts()
				for _, p := range []string{"workspace", "workspace/by-agent", "workspace/dir-by-agent", "workspace/by-root", "home", "home/by-agent", "root", "root/by-root"} {
					fi, err := os.Lstat(filepath.Join(disk, p))
					if err != nil {
						a.t.Errorf("%s: %v", p, err)
						continue
					}
					st := fi.Sys().(*syscall.Stat_t)
					for _, id := range []int64{int64(st.Uid), int64(st.Gid)} {
						if name, ok := accounts[id]; ok || id < 65536 {
							a.t.Errorf("HOLE: %s (written by the sandbox) belongs on the host to id %d (%s), a host account, not to a sandbox uid range", p, id, name)
							break
						}
					}
				}
			},
		},
		{
			name: "host-user-reaches-sandbox-files",
			does: "a different attacker: an unprivileged host user (nobody, and uid 1000) who learnt the sandbox id (it is in every sandbox process's /proc/PID/cgroup, readable by all) reads, lists and writes the sandbox's workspace and home by their host paths under the state dir",
			want: "every access is denied: the state dir is only searchable (0711), and no host user may read or plant files in a sandbox's disk",
			run: func(a *arena) {
				a.sh("echo AGENT_SECRET=absec > /workspace/.env; echo netrc > /home/agent/.netrc-like")
				disk := filepath.Join(a.sandboxDir(a.id), "disk")
				for _, uid := range []uint32{65534, 1000} {
					for _, argv := range [][]string{
						{"cat", filepath.Join(disk, "workspace", ".env")},
						{"cat", filepath.Join(disk, "home", ".netrc-like")},
						{"ls", filepath.Join(disk, "workspace")},
						{"touch", filepath.Join(disk, "workspace", "planted-by-host-user")},
					} {
						if out, ok := asHostUser(uid, uid, argv...); ok {
							a.t.Errorf("HOLE: host uid %d could %s %s: %q", uid, argv[0], argv[1], strings.TrimSpace(out))
						}
					}
				}
				os.Remove(filepath.Join(disk, "workspace", "planted-by-host-user"))
			},
		},
	}
}

// hammer makes n concurrent stat calls on sandbox id (forcing new connections to its agent).
func hammer(a *arena, id string, n int) {
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			a.s.c.Stat(ctx, id, "/workspace")
		}()
	}
	wg.Wait()
}

// keyUsers returns the lines of the host's /proc/key-users for the uid range [base, base+65536)
// ("" without a range).
func keyUsers(base int64) string {
	if base < 0 {
		return ""
	}
	var out []string
	b, _ := os.ReadFile("/proc/key-users")
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(strings.Replace(l, ":", " ", 1))
		if len(f) > 0 {
			if uid, err := strconv.ParseInt(f[0], 10, 64); err == nil && uid >= base && uid < base+65536 {
				out = append(out, strings.Join(f, " "))
			}
		}
	}
	return strings.Join(out, "\n")
}
