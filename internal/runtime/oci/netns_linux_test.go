package oci

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
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
