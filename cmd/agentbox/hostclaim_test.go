//go:build linux

package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/runtime/oci"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/statedir"
	"github.com/agentbox/agentbox/internal/testenv"
	"github.com/agentbox/agentbox/internal/wire"
)

// TestTwoServersOneHost: two servers started with default flags on one host, each with its
// own state dir, keep off each other's sandboxes: each has a cgroup parent of its own (derived
// from its state dir), so the second's start (its reconcile sweeps every sandbox-shaped host
// resource its store does not own) and its own creates and destroys leave the first's sandbox
// running. A third server on the first's state dir, or given the first's cgroup parent, refuses
// to start, naming the first's pid; with the first gone, its state dir serves again and adopts
// its sandbox.
func TestTwoServersOneHost(t *testing.T) {
	testenv.RequireRoot(t)
	ctx := t.Context()
	dirA, dirB := testenv.ShortTempDir(t, "abhsa"), testenv.ShortTempDir(t, "abhsb")
	parentA, _ := statedir.Identity(dirA)
	parentB, _ := statedir.Identity(dirB)
	if parentA == parentB {
		t.Fatalf("two state dirs, one cgroup parent %s", parentA)
	}
	a := testenv.StartServerDefaults(t, dirA, testToken)
	ca := a.Client()
	sb, err := ca.Create(ctx, wire.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	sbParent := runtimeParent(parentA, oci.Flavor(sb.Runtime))
	if _, err := os.Stat(filepath.Join("/sys/fs/cgroup", sbParent, sb.ID)); err != nil && !cgroupV1(sbParent, sb.ID) {
		t.Errorf("the %s sandbox's cgroup is not under the state dir's parent %s: %v", sb.Runtime, sbParent, err)
	}
	alive := func(when string) {
		t.Helper()
		res, err := ca.Exec(ctx, sb.ID, wire.ExecRequest{Command: []string{"echo", "alive"}}, nil)
		if err != nil || res.ExitCode != 0 || strings.TrimSpace(res.Stdout) != "alive" {
			t.Fatalf("%s: the first server's sandbox: %+v %v\nserver A:\n%s", when, res, err, a.Logs)
		}
		if got, err := ca.Get(ctx, sb.ID); err != nil || got.State != wire.StateRunning {
			t.Fatalf("%s: the first server's sandbox is %s (%v)", when, got.State, err)
		}
	}

	// The second server starts (and reconciles: a sweep), creates and destroys a sandbox.
	b := testenv.StartServerDefaults(t, dirB, testToken)
	alive("after the second server's start")
	cb := b.Client()
	other, err := cb.Create(ctx, wire.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cb.Destroy(ctx, other.ID); err != nil {
		t.Fatal(err)
	}
	if list, err := cb.List(ctx, nil, nil); err != nil || len(list) != 0 {
		t.Fatalf("the second server lists %v (%v): the first's sandbox is not its", list, err)
	}
	alive("after the second server's create and destroy")

	// Another server on the first's state dir, or on another state dir with the first's cgroup
	// parent: refused, naming the first's pid; nothing of the first's is touched.
	refused := func(name string, args ...string) {
		t.Helper()
		cctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		cmd := exec.CommandContext(cctx, testenv.Binary(t), append([]string{"serve", "--listen", "127.0.0.1:0"}, args...)...)
		cmd.Env = append(os.Environ(), "AGENTBOX_TOKEN="+testToken)
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), "pid "+strconv.Itoa(a.PID())) {
			t.Fatalf("%s: %v\n%s\nwant a refusal naming pid %d", name, err, out, a.PID())
		}
	}
	refused("same state dir", "--state-dir", dirA)
	dirC := testenv.ShortTempDir(t, "abhsc")
	refused("same cgroup parent", "--state-dir", dirC, "--cgroup-parent", parentA)
	refused("the cgroup parent of the first's crun", "--state-dir", dirC, "--cgroup-parent", parentA+"-crun")
	alive("after the refused servers")

	// The first server stops (its sandbox stays); the state dir serves again and adopts it.
	a.Stop()
	a = testenv.StartServerDefaults(t, dirA, testToken)
	ca = a.Client()
	alive("after the first server's restart")
	if _, err := ca.Destroy(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
}

// cgroupV1 reports whether the sandbox's cgroup is under parent in a v1 hierarchy.
func cgroupV1(parent, id string) bool {
	m, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", parent, id))
	return len(m) > 0
}

// listStore is a sandbox.Store whose ListSandboxes returns its sandboxes (in the states
// asked), and nothing else.
type listStore struct {
	sandbox.Store
	sbs []sandbox.Sandbox
}

func (s listStore) ListSandboxes(_ context.Context, f sandbox.ListFilter) ([]sandbox.Sandbox, error) {
	var out []sandbox.Sandbox
	for _, sb := range s.sbs {
		for _, st := range f.States {
			if sb.State == st {
				out = append(out, sb)
			}
		}
	}
	return out, nil
}

// TestLegacyCgroupParent: a store whose live sandboxes have cgroups under the legacy shared
// parent (or its runtimes' agentbox-crun, agentbox-gvisor) keeps it; sandboxes there that the
// store does not hold live (another server's, destroyed ones) do not count, and an explicit
// --cgroup-parent always wins.
func TestLegacyCgroupParent(t *testing.T) {
	h := t.TempDir() // a hierarchy
	mk := func(parent, id string) {
		if err := os.MkdirAll(filepath.Join(h, parent, id), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	mk(oci.LegacyCgroupParent, "sb-00000000000a")         // another server's
	mk(oci.LegacyCgroupParent+"-crun", "sb-00000000000b") // a destroyed one's leftover
	st := listStore{sbs: []sandbox.Sandbox{
		{ID: "sb-00000000000b", State: sandbox.StateDestroyed},
		{ID: "sb-00000000000c", State: sandbox.StateRunning}, // under the derived parent
	}}
	if n, err := legacySandboxesIn(t.Context(), st, []string{h}); err != nil || n != 0 {
		t.Fatalf("no live sandbox of the store is there: %d %v", n, err)
	}
	mk(oci.LegacyCgroupParent+"-gvisor", "sb-00000000000d")
	st.sbs = append(st.sbs, sandbox.Sandbox{ID: "sb-00000000000d", State: sandbox.StateSleeping})
	if n, err := legacySandboxesIn(t.Context(), st, []string{t.TempDir(), h}); err != nil || n != 1 {
		t.Fatalf("one live sandbox of the store is there: %d %v", n, err)
	}
	dir := t.TempDir()
	if p, err := cgroupParent(t.Context(), "mine", dir, st, nil); err != nil || p != "mine" {
		t.Fatalf("explicit: %q %v", p, err)
	}
	want, _ := statedir.Identity(dir)
	if p, err := cgroupParent(t.Context(), "", dir, listStore{}, nil); err != nil || p != want {
		t.Fatalf("derived: %q %v, want %s", p, err, want)
	}
}
