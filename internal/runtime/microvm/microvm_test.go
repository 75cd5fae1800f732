//go:build linux

package microvm

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

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
