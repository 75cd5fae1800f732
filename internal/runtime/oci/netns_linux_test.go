package oci

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/runtimetest"
)

// TestEgressNetns: the namespace makeEgressNetns pins has lo up, the AnyIP route in the local
// table, no IPv6 route but ::1, ip_unprivileged_port_start 0; netnsRemove removes it and is
// idempotent; the host's own namespace is untouched.
func TestEgressNetns(t *testing.T) {
	if reason := runcUsable(); reason != "" {
		t.Skip(reason)
	}
	if _, err := exec.LookPath("nsenter"); err != nil {
		t.Skip("nsenter is not installed")
	}
	hostNS, _ := os.Readlink("/proc/self/ns/net")
	p := filepath.Join(t.TempDir(), "sb-0123456789ab")
	began := time.Now()
	if err := makeEgressNetns(p); err != nil {
		t.Fatal(err)
	}
	t.Logf("makeEgressNetns took %s", time.Since(began))
	t.Cleanup(func() { _ = netnsRemove(p) })
	if err := makeEgressNetns(p); err == nil {
		t.Error("a second makeEgressNetns on the same path succeeded")
	}
	in := func(args ...string) string {
		t.Helper()
		out, err := exec.Command("nsenter", append([]string{"--net=" + p}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("%v: %v %s", args, err, out)
		}
		return string(out)
	}
	if out := in("ip", "route", "show", "table", "local"); !strings.Contains(out, "local default dev lo") {
		t.Errorf("local table lacks the AnyIP route:\n%s", out)
	}
	if out := in("ip", "link", "show", "lo"); !strings.Contains(out, "UP") {
		t.Errorf("lo is not up: %s", out)
	}
	if out := in("ip", "-6", "route", "show", "table", "all"); strings.Contains(out, "default") || !strings.Contains(out, "::1") {
		t.Errorf("IPv6 routes:\n%s", out)
	}
	if out := in("cat", unprivilegedPortStart); strings.TrimSpace(out) != "0" {
		t.Errorf("ip_unprivileged_port_start in the namespace: %q", out)
	}
	if b, _ := os.ReadFile(unprivilegedPortStart); strings.TrimSpace(string(b)) == "0" {
		t.Errorf("the host's own ip_unprivileged_port_start was changed")
	}
	if ns, _ := os.Readlink("/proc/self/ns/net"); ns != hostNS {
		t.Errorf("this process's namespace changed: %s, was %s", ns, hostNS)
	}
	if err := netnsRemove(p); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); !os.IsNotExist(err) {
		t.Errorf("after remove: %v", err)
	}
	if mi, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(mi), p) {
		t.Error("the namespace is still mounted")
	}
	if err := netnsRemove(p); err != nil {
		t.Errorf("second remove: %v", err)
	}
	// A file left unmounted (a delete that crashed between its steps) is removed too.
	if err := os.WriteFile(p, nil, 0o400); err != nil {
		t.Fatal(err)
	}
	if err := netnsRemove(p); err != nil {
		t.Errorf("remove of an unmounted file: %v", err)
	}
}

// TestRuncEgressCgroups and TestCrunEgressCgroups: in an egress sandbox (whose /sys is a tmpfs,
// not sysfs) the sandbox's cgroups still work: the host's metrics, and the agent's OOM report,
// which reads the memory cgroup under /sys/fs/cgroup inside.
func TestRuncEgressCgroups(t *testing.T) {
	t.Parallel()
	testEgressCgroups(t, newRunc(t))
}

func TestCrunEgressCgroups(t *testing.T) {
	t.Parallel()
	testEgressCgroups(t, newFlavor(t, FlavorCrun))
}

func testEgressCgroups(t *testing.T, rt *Runtime) {
	if !slices.Contains(rt.Capabilities().Hardening, runtime.HardeningTransparentEgress) {
		t.Fatalf("%s lacks the transparent path on this host: %s", rt.Name(), rt.Capabilities().TransparentEgressReason)
	}
	spec := runtimetest.EgressSpec(runtimetest.NewID())
	spec.MemoryMB, spec.PidsLimit = 64, 64
	c := runtimetest.Start(t, rt, spec)
	m := sampleMetrics(t, rt, spec.ID)
	if m.Memory.LimitBytes != 64<<20 || m.Pids.Limit != 64 || m.Pids.Current < 1 {
		t.Errorf("metrics of an egress sandbox: %+v %+v", *m.Memory, *m.Pids)
	}
	res := runtimetest.Exec(t, c, "python3", "-c", "b = bytearray(512 << 20); print(len(b))")
	if res.Signal != "SIGKILL" || !res.OOMKilled {
		t.Fatalf("allocating 512 MiB under a 64 MiB limit: %v (want SIGKILL, oom_killed)", res)
	}
	if m := sampleMetrics(t, rt, spec.ID); m.Memory.OOMEvents < 1 {
		t.Errorf("oom events after an OOM kill: %+v", *m.Memory)
	}
	if res := runtimetest.Exec(t, c, "echo", "alive"); res.Stdout != "alive\n" {
		t.Errorf("after the OOM kill: %v", res)
	}
}

// TestRuncDeleteOrphanNetns: a network namespace file left alone (a create or delete that
// crashed) makes List report its id, and Delete unmounts and removes it; an egress sandbox's
// Delete leaves no namespace mount (testenv.Leaks-style: nothing in mountinfo names the id).
func TestRuncDeleteOrphanNetns(t *testing.T) {
	t.Parallel()
	rt := newRunc(t)
	ctx := context.Background()
	if _, err := rt.ensureLayout(); err != nil {
		t.Fatal(err)
	}
	id := runtimetest.NewID()
	if err := makeEgressNetns(rt.netnsPath(id)); err != nil {
		t.Fatal(err)
	}
	if ids, err := rt.List(ctx); err != nil || !slices.Contains(ids, id) {
		t.Fatalf("List with an orphaned netns of %s: %v %v", id, ids, err)
	}
	if err := rt.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
	if ids, err := rt.List(ctx); err != nil || slices.Contains(ids, id) {
		t.Fatalf("List after Delete: %v %v", ids, err)
	}
	// A live egress sandbox: its namespace is pinned while it runs, gone after Delete.
	spec := runtimetest.EgressSpec(runtimetest.NewID())
	if _, err := rt.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	if !strings.Contains(string(mi), rt.netnsPath(spec.ID)+" ") {
		t.Errorf("the egress sandbox's namespace is not mounted at %s", rt.netnsPath(spec.ID))
	}
	if err := rt.Delete(ctx, spec.ID); err != nil {
		t.Fatal(err)
	}
	if mi, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(mi), spec.ID) {
		t.Errorf("a mount naming %s is left after Delete", spec.ID)
	}
	if _, err := os.Stat(rt.netnsPath(spec.ID)); !os.IsNotExist(err) {
		t.Errorf("the namespace file is left: %v", err)
	}
}
