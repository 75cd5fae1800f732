//go:build linux

package microvm

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/guest"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/runtimetest"
	"github.com/agentbox/agentbox/internal/testenv"
)

// TestMain runs the package's tests one at a time unless -parallel says otherwise: every case
// boots VMs under TCG, and a 2-core host booting many at once slows each past the suite's
// ReadyTimeout (the suite's Concurrent case still boots five at once).
func TestMain(m *testing.M) {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		_ = flag.Set("test.parallel", "1")
	}
	os.Exit(m.Run())
}

// newTestRuntime makes a vm runtime under a fresh state dir of the test's own (its own cgroup
// parent too), skipping only when QEMU or the guest kernel is absent (make deps installs both).
func newTestRuntime(t *testing.T) *Runtime {
	t.Helper()
	testenv.RequireRoot(t)
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Skip("qemu-system-x86_64 is not installed (make deps: hack/vm-deps.sh)")
	}
	if _, err := os.Stat(DefaultKernel); err != nil {
		t.Skipf("no guest kernel at %s (make deps: hack/vm-deps.sh)", DefaultKernel)
	}
	root := testenv.ShortTempDir(t, "abvm")
	parent := "agentbox-vmtest-" + filepath.Base(root)
	rt, err := New(context.Background(), Config{Root: root, GuestBinary: testenv.GuestBinary(t), CgroupParent: parent, Accel: os.Getenv("AGENTBOX_TEST_VM_ACCEL")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = rt.Close(context.Background())
		rt.removeParent()
	})
	if caps := rt.Capabilities(); !caps.Available {
		t.Fatalf("vm runtime unavailable: %s", caps.Reason)
	}
	return rt
}

// killer SIGKILLs a VM's QEMU, as a crash would.
func killer(rt *Runtime) runtimetest.Killer {
	return func(t testing.TB, id string) {
		p, ok := rt.readProc(id)
		if !ok {
			t.Fatalf("no qemu process recorded for %s", id)
		}
		if err := syscall.Kill(p.PID, syscall.SIGKILL); err != nil {
			t.Fatalf("kill qemu %d: %v", p.PID, err)
		}
	}
}

func TestBoot(t *testing.T) {
	rt := newTestRuntime(t)
	id := runtimetest.NewID()
	start := time.Now()
	c := runtimetest.Start(t, rt, runtimetest.DefaultSpec(id))
	t.Logf("booted in %s (accel %s)", time.Since(start), rt.Accel())
	res := runtimetest.Exec(t, c, "sh", "-c", "uname -n; id -u; cat /proc/cmdline; echo $AGENTBOX_TEST; ls /sys/bus/virtio/drivers/")
	if !strings.Contains(res.Stdout, id) || !strings.Contains(res.Stdout, "virtio_balloon") {
		t.Fatalf("exec: %s\nconsole:\n%s", res, rt.Console(context.Background(), id))
	}
	t.Logf("%s", res)
	// QEMU runs in the sandbox's cgroup, bounded by the guest's RAM plus QEMU's overhead.
	p, _ := rt.readProc(id)
	// A spec without an id range (doctor's test boot) runs its QEMU as nobody.
	if u, g := procIDs(t, p.PID); u != 65534 || g != 65534 {
		t.Errorf("qemu of a sandbox without an id range runs as uid %d gid %d, want 65534", u, g)
	}
	memFile := filepath.Join(cgroupRoot, rt.cfg.CgroupParent, id, "memory.max")
	if !rt.cg.v2 {
		memFile = filepath.Join(cgroupRoot, "memory", rt.cfg.CgroupParent, id, "memory.limit_in_bytes")
	}
	if b, err := os.ReadFile(memFile); err != nil || strings.TrimSpace(string(b)) != fmt.Sprint((256+qemuOverheadMB)<<20) {
		t.Errorf("the VM's memory limit %s: %q %v", memFile, b, err)
	}
	if b, err := os.ReadFile(filepath.Join(filepath.Dir(memFile), "cgroup.procs")); err != nil || !strings.Contains(" "+strings.Join(strings.Fields(string(b)), " ")+" ", fmt.Sprintf(" %d ", p.PID)) {
		t.Errorf("qemu %d is not in its cgroup: %q %v", p.PID, b, err)
	}
	m, err := rt.Metrics(context.Background(), id)
	if err != nil || m.CPU == nil || m.CPU.UsageSeconds <= 0 || m.Memory == nil || m.Memory.UsedBytes < 32<<20 ||
		m.Disk == nil || m.Disk.TotalBytes != 1024<<20 || m.Disk.UsedBytes <= 0 {
		t.Errorf("metrics of a running VM: %+v %v", m, err)
	}
	if testing.Verbose() {
		time.Sleep(10 * time.Second)
		p, _ := rt.readProc(id)
		st, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.PID))
		for _, l := range strings.Split(string(st), "\n") {
			if strings.HasPrefix(l, "VmRSS") || strings.HasPrefix(l, "Rss") {
				t.Logf("idle QEMU %s", l)
			}
		}
	}
	if testing.Verbose() {
		t.Logf("console:\n%s", rt.Console(context.Background(), id))
	}
}

// TestRuntimeSuite runs the shared runtime suite on real VMs.
func TestRuntimeSuite(t *testing.T) {
	rt := newTestRuntime(t)
	runtimetest.Run(t, rt, killer(rt))
}

// TestPanicReason: a guest kernel panic ends the VM (Wait returns, State says stopped) and
// ExitReason names the panic with the console's last lines.
func TestPanicReason(t *testing.T) {
	rt := newTestRuntime(t)
	id := runtimetest.NewID()
	c := runtimetest.Start(t, rt, runtimetest.DefaultSpec(id))
	if r := rt.ExitReason(context.Background(), id); r != "" {
		t.Fatalf("a running VM's exit reason: %q", r)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// The exec dies with the VM: its error is expected.
	_, _ = c.Exec(ctx, guest.ExecRequest{Argv: []string{"sh", "-c", "echo c > /proc/sysrq-trigger"}, User: "root", TimeoutMs: 5000}, nil)
	wctx, wcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer wcancel()
	if err := rt.Wait(wctx, id); err != nil {
		t.Fatalf("wait after the panic: %v", err)
	}
	if st, _ := rt.State(context.Background(), id); st != runtime.StatusStopped {
		t.Fatalf("state after the panic: %s", st)
	}
	r := rt.ExitReason(context.Background(), id)
	if !strings.Contains(r, "kernel panicked") || !strings.Contains(r, "sysrq") {
		t.Fatalf("exit reason %q, want the kernel's panic with its console lines", r)
	}
	t.Logf("exit reason: %s", r)
}

// procIDs reads a process's real, effective, saved and filesystem uid and gid from
// /proc/PID/status, failing unless each set agrees.
func procIDs(t *testing.T, pid int) (uid, gid uint32) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	var ids [2]uint32
	for _, l := range strings.Split(string(b), "\n") {
		for i, k := range []string{"Uid:", "Gid:"} {
			if f := strings.Fields(l); len(f) == 5 && f[0] == k {
				if f[1] != f[2] || f[1] != f[3] || f[1] != f[4] {
					t.Fatalf("process %d's %s ids differ: %q", pid, k, l)
				}
				v, err := strconv.ParseUint(f[1], 10, 32)
				if err != nil {
					t.Fatal(err)
				}
				ids[i] = uint32(v)
			}
		}
	}
	return ids[0], ids[1]
}

// runAs runs argv as uid and gid (no supplementary groups) and returns its error and output.
func runAs(uid, gid uint32, argv ...string) (string, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid, Groups: []uint32{}}}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestQEMUPerSandboxUID: each VM's QEMU runs as the base of its sandbox's id range, two VMs as
// two uids, and one VM's uid can open none of the other's disk, sockets or console, while its
// own it can. A runtime made anew on the same root (a restarted server) adopts the VM and keeps
// its uid.
func TestQEMUPerSandboxUID(t *testing.T) {
	rt := newTestRuntime(t)
	ctx := context.Background()
	if !rt.Capabilities().TakesIDRange() {
		t.Fatal("the vm runtime does not take an id range")
	}
	// A range QEMU would run as root in is refused before anything is made.
	bad := runtimetest.DefaultSpec(runtimetest.NewID())
	bad.IDMap = runtime.IDMap{Count: 1 << 16}
	if _, err := rt.Create(ctx, bad); errcode.Of(err) != errcode.InvalidArgument {
		t.Fatalf("create with an id range based at 0: %v, want INVALID_ARGUMENT", err)
	}
	if _, err := os.Lstat(rt.dir(bad.ID)); !os.IsNotExist(err) {
		t.Fatalf("a refused create left %s: %v", rt.dir(bad.ID), err)
	}

	type vm struct {
		id   string
		m    runtime.IDMap
		h    runtime.Handle
		pid  int
		disk string
	}
	a := vm{id: runtimetest.NewID(), m: runtimetest.TestIDMap()}
	b := vm{id: runtimetest.NewID(), m: runtimetest.TestIDMap()}
	for b.m.UIDBase == a.m.UIDBase {
		b.m = runtimetest.TestIDMap()
	}
	b.m.GIDBase = b.m.UIDBase + 1<<16 - 1<<15 // gid base apart from uid base: each is used as given
	for _, v := range []*vm{&a, &b} {
		spec := runtimetest.DefaultSpec(v.id)
		spec.IDMap = v.m
		c, h := runtimetest.StartHandle(t, rt, spec)
		res := runtimetest.Exec(t, c, "sh", "-c", "uname -n")
		if !strings.Contains(res.Stdout, v.id) {
			t.Fatalf("exec in %s: %s", v.id, res)
		}
		p, ok := rt.readProc(v.id)
		if !ok {
			t.Fatalf("no qemu recorded for %s", v.id)
		}
		v.h, v.pid, v.disk = h, p.PID, filepath.Join(rt.dir(v.id), "data.ext4")
	}
	for _, v := range []vm{a, b} {
		if u, g := procIDs(t, v.pid); u != v.m.UIDBase || g != v.m.GIDBase {
			t.Errorf("qemu of %s runs as uid %d gid %d, want its range's base %d/%d", v.id, u, g, v.m.UIDBase, v.m.GIDBase)
		}
		var st syscall.Stat_t
		if err := syscall.Stat(v.disk, &st); err != nil {
			t.Fatal(err)
		}
		if st.Uid != v.m.UIDBase || st.Gid != v.m.GIDBase || st.Mode&0o7777 != 0o600 {
			t.Errorf("%s is %d:%d mode %o, want %d:%d mode 600", v.disk, st.Uid, st.Gid, st.Mode&0o7777, v.m.UIDBase, v.m.GIDBase)
		}
	}
	// What QEMU opens: as its own uid, readable; as the other VM's uid, not.
	for _, pair := range [][2]vm{{a, b}, {b, a}} {
		own, other := pair[0], pair[1]
		dir := rt.dir(own.id)
		for _, argv := range [][]string{
			{"head", "-c", "1", own.disk},
			{"ls", filepath.Join(dir, "run", "agent.sock"), filepath.Join(dir, "run", "qmp.sock")},
			{"head", "-c", "1", filepath.Join(dir, "console", "console.log")},
		} {
			if out, err := runAs(own.m.UIDBase, own.m.GIDBase, argv...); err != nil {
				t.Errorf("%v as %s's own uid %d: %v %s", argv, own.id, own.m.UIDBase, err, out)
			}
			out, err := runAs(other.m.UIDBase, other.m.GIDBase, argv...)
			if err == nil || !strings.Contains(out, "Permission denied") {
				t.Errorf("%v as the other VM's uid %d: %v %q, want permission denied", argv, other.m.UIDBase, err, out)
			}
		}
	}
	// The shared read-only assets stay readable by every VM's uid.
	rec, err := rt.readRecord(a.id)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{rec.Kernel, rec.Initramfs, rec.RootDisk} {
		if out, err := runAs(b.m.UIDBase, b.m.GIDBase, "head", "-c", "1", f); err != nil {
			t.Errorf("shared asset %s is not readable by a VM's uid: %v %s", f, err, out)
		}
	}
	// A restarted server's runtime adopts the VM and boots nothing anew as another uid.
	rt2, err := New(ctx, rt.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := rt2.Adopt(ctx, a.id, a.h); err != nil {
		t.Fatalf("adopt %s: %v", a.id, err)
	}
	if err := rt2.Start(ctx, a.id); err != nil { // running: a no-op
		t.Fatal(err)
	}
	rec2, _ := rt2.readRecord(a.id)
	if u, g := rt2.owner(rec2); u != a.m.UIDBase || g != a.m.GIDBase {
		t.Errorf("a new runtime reads %s's owner as %d/%d, want %d/%d", a.id, u, g, a.m.UIDBase, a.m.GIDBase)
	}
	if p, _ := rt2.readProc(a.id); p.PID != a.pid {
		t.Errorf("adopted %s's qemu pid %d, want %d", a.id, p.PID, a.pid)
	}
	_ = rt2.Close(ctx)
}

// TestOCIImage boots a VM from an OCI image's unpacked layers (overlayfs's format: a whiteout
// and an opaque directory in the upper layer): the image's user, workdir and merged files are
// the VM's; a second VM of the same layers boots from the same cached root disk and sees
// nothing the first wrote.
func TestOCIImage(t *testing.T) {
	rt := newTestRuntime(t)
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Fatalf("busybox-static is needed (make deps installs it): %v", err)
	}
	dir := t.TempDir()
	l0, l1 := filepath.Join(dir, "0"), filepath.Join(dir, "1")
	write := func(p string, data []byte, mode os.FileMode) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, mode); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(l0, "bin/busybox"), bb, 0o755)
	for _, a := range []string{"sh", "id", "pwd", "ls", "cat", "test", "echo", "touch"} {
		if err := os.Symlink("busybox", filepath.Join(l0, "bin", a)); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(l0, "etc/passwd"), []byte("root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000:user:/home/user:/bin/sh\n"), 0o644)
	write(filepath.Join(l0, "etc/group"), []byte("root:x:0:\nuser:x:1000:\n"), 0o644)
	write(filepath.Join(l0, "etc/hidden"), []byte("hidden\n"), 0o644)
	write(filepath.Join(l0, "etc/opq/a"), []byte("a\n"), 0o644)
	write(filepath.Join(l1, "etc/opq/b"), []byte("b\n"), 0o644)
	if err := unix.Mknod(filepath.Join(l1, "etc/hidden"), unix.S_IFCHR, 0); err != nil {
		t.Fatal(err)
	}
	if err := unix.Lsetxattr(filepath.Join(l1, "etc/opq"), "trusted.overlay.opaque", []byte("y"), 0); err != nil {
		t.Fatal(err)
	}
	spec := runtimetest.DefaultSpec(runtimetest.NewID())
	spec.Image, spec.Rootfs = "test/busybox:1", &runtime.Rootfs{Layers: []string{l0, l1}, User: "user", Workdir: "/etc"}
	spec.Env = map[string]string{"PATH": "/bin"}
	c := runtimetest.Start(t, rt, spec)
	want := func(res runtimetest.Result, stdout string) {
		t.Helper()
		if res.ExitCode != 0 || strings.TrimSpace(res.Stdout) != stdout {
			t.Errorf("%s, want stdout %q", res, stdout)
		}
	}
	want(runtimetest.Exec(t, c, "id", "-u"), "1000")
	want(runtimetest.Exec(t, c, "pwd"), "/etc")
	want(runtimetest.Exec(t, c, "ls", "/etc/opq"), "b")
	if res := runtimetest.Exec(t, c, "test", "-e", "/etc/hidden"); res.ExitCode == 0 {
		t.Errorf("/etc/hidden is visible through its whiteout")
	}
	if res := runtimetest.Exec(t, c, "touch", "/etc/user-write"); res.ExitCode == 0 {
		t.Errorf("the image's user wrote root's /etc")
	}
	want(runtimetest.ExecRequest(t, c, guest.ExecRequest{Argv: []string{"sh", "-c", "echo new > /etc/new && cat /etc/new"}, User: "root", TimeoutMs: 60000}), "new")
	rec, err := rt.readRecord(spec.ID)
	if err != nil || !strings.HasPrefix(filepath.Base(rec.RootDisk), imageRootPrefix) || rec.Image != spec.Image {
		t.Fatalf("record: %+v %v; want the image's cached root disk", rec, err)
	}
	spec2 := runtimetest.DefaultSpec(runtimetest.NewID())
	spec2.Image, spec2.Rootfs = spec.Image, &runtime.Rootfs{Layers: []string{l0, l1}}
	c2 := runtimetest.Start(t, rt, spec2)
	want(runtimetest.Exec(t, c2, "id", "-u"), "0") // an image naming no user runs as root
	if res := runtimetest.Exec(t, c2, "test", "-e", "/etc/new"); res.ExitCode == 0 {
		t.Errorf("the second VM sees the first's write")
	}
	if rec2, err := rt.readRecord(spec2.ID); err != nil || rec2.RootDisk != rec.RootDisk {
		t.Errorf("the second VM of the same layers boots from %q, want the cached %q", rec2.RootDisk, rec.RootDisk)
	}
}

// TestPidsLimit: a VM's commands start in a cgroup of their own whose pids.max is the spec's
// pids_limit; a command that forks past it meets EAGAIN while the agent goes on answering.
func TestPidsLimit(t *testing.T) {
	rt := newTestRuntime(t)
	spec := runtimetest.DefaultSpec(runtimetest.NewID())
	spec.PidsLimit = 24
	c := runtimetest.Start(t, rt, spec)
	if res := runtimetest.Exec(t, c, "cat", "/sys/fs/cgroup/commands/pids.max"); strings.TrimSpace(res.Stdout) != "24" {
		t.Fatalf("the commands' pids.max: %s", res)
	}
	// 40 sleeps in the background: the ones past the limit cannot fork (the shell says so and
	// gives up).
	res := runtimetest.ExecRequest(t, c, guest.ExecRequest{Argv: []string{"sh", "-c",
		"i=0; while [ $i -lt 40 ]; do sleep 3 & i=$((i+1)); done"}, TimeoutMs: 60000})
	if res.ExitCode == 0 || !strings.Contains(res.Stderr, "Resource temporarily unavailable") {
		t.Fatalf("forking past the limit: %s", res)
	}
	// The agent answers meanwhile (a new command may fail to start until the sleeps end), and
	// runs commands again once they have.
	ctx := context.Background()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		r, err := c.Exec(ctx, guest.ExecRequest{Argv: []string{"cat", "/sys/fs/cgroup/commands/pids.current"}, TimeoutMs: 10000}, nil)
		if err == nil && r.ExitCode == 0 && strings.TrimSpace(string(r.Stdout)) == "1" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a minute after the fork storm: %+v %v", r, err)
		}
	}
}

// TestGuestBounds: a VM's commands meet the bounds the other runtimes set, in the smallest VM
// (128 MiB, much of it the guest kernel's). /tmp, /dev/shm and /run are sized tmpfs, so
// filling them is ENOSPC and commands still run; no command gains privileges by exec; a
// command that exhausts the VM's RAM is the kernel OOM killer's choice before the agent, and
// the exec says oom_killed.
func TestGuestBounds(t *testing.T) {
	rt := newTestRuntime(t)
	spec := runtimetest.DefaultSpec(runtimetest.NewID())
	spec.MemoryMB, spec.PidsLimit = 128, 256
	c := runtimetest.Start(t, rt, spec)
	// (The agent's own value, 0, is not read from inside: while it starts a command it has the
	// command's, which that command can see.)
	res := runtimetest.Exec(t, c, "sh", "-c", "df -m /tmp /dev/shm /run | tail -3 | while read fs size rest; do echo $size; done; grep NoNewPrivs /proc/self/status; cat /proc/self/oom_score_adj")
	f := strings.Fields(res.Stdout)
	t.Logf("/tmp, /dev/shm, /run (MiB), no_new_privs, a command's oom_score_adj: %v", f)
	if len(f) != 6 || f[2] != "16" || strings.Join(f[3:], " ") != "NoNewPrivs: 1 500" {
		t.Fatalf("tmpfs sizes, no_new_privs and oom_score_adj: %q, want /run 16 MiB, NoNewPrivs 1, a command at 500 (the agent's 0 + 500)", res.Stdout)
	}
	// A quarter and an eighth of what the booted guest has left: under 128 MiB of RAM.
	tmp, _ := strconv.Atoi(f[0])
	shm, _ := strconv.Atoi(f[1])
	if tmp < 16 || tmp > 32 || shm < 4 || shm > tmp/2+1 {
		t.Errorf("/tmp %d MiB, /dev/shm %d MiB in a 128 MiB VM", tmp, shm)
	}
	fill := runtimetest.ExecRequest(t, c, guest.ExecRequest{Argv: []string{"sh", "-c",
		"for f in /tmp/fill /dev/shm/fill; do dd if=/dev/zero of=$f bs=1M 2>/dev/null; echo $? $(du -m $f | cut -f1); done"}, TimeoutMs: 120000})
	if got, want := strings.Join(strings.Fields(fill.Stdout), " "), fmt.Sprintf("1 %d 1 %d", tmp, shm); got != want {
		t.Errorf("filling /tmp and /dev/shm: %s, want %q (ENOSPC at their sizes)", fill, want)
	}
	// With both full, a command that needs memory still runs (python's start).
	if r := runtimetest.Exec(t, c, "python3", "-c", "print(sum(range(1000)))"); r.Stdout != "499500\n" {
		t.Fatalf("with /tmp and /dev/shm full: %s\nconsole:\n%s", r, rt.Console(context.Background(), spec.ID))
	}
	runtimetest.Exec(t, c, "rm", "-f", "/tmp/fill", "/dev/shm/fill")
	bomb := runtimetest.ExecRequest(t, c, guest.ExecRequest{Argv: []string{"python3", "-c", "b = []\nwhile True: b.append(bytearray(16 << 20))"}, TimeoutMs: 120000})
	if bomb.Signal != "SIGKILL" || !bomb.OOMKilled {
		t.Errorf("memory bomb: %s, want SIGKILL and oom_killed", bomb)
	}
	if r := runtimetest.Exec(t, c, "echo", "alive"); r.Stdout != "alive\n" {
		t.Fatalf("after the memory bomb: %s\nconsole:\n%s", r, rt.Console(context.Background(), spec.ID))
	}
}
