package sandbox_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/hostinfo"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/oci"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/store/sqlite"
	"github.com/agentbox/agentbox/internal/testenv"
)

// runtimesEnv is a real service over runc (the default), crun, gVisor and a runtime whose
// binary is missing, each with its own root and cgroup parent.
type runtimesEnv struct {
	svc *sandbox.Service
	st  *sqlite.Store
	rts map[string]*oci.Runtime
}

func newRuntimesEnv(t *testing.T) *runtimesEnv {
	t.Helper()
	testenv.RequireRoot(t)
	dir := testenv.ShortTempDir(t, "absvr")
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(dir, "agentbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	e := &runtimesEnv{st: st, rts: map[string]*oci.Runtime{}}
	var rts []runtime.Runtime
	for _, c := range []oci.Config{
		{Name: "runc"}, {Name: "crun"}, {Name: "gvisor"},
		{Name: "gvisor-missing", Flavor: oci.FlavorGVisor, Binary: "/nonexistent/runsc"},
	} {
		c.Root = filepath.Join(dir, c.Name)
		c.GuestBinary = testenv.GuestBinary(t)
		c.CgroupParent = "abt-" + filepath.Base(dir) + "-" + c.Name
		c.Subreaper = true
		rt, err := oci.New(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		caps := rt.Capabilities()
		if !caps.Available && c.Binary == "" {
			// make deps installs all three: an installed runtime that does not work is a bug.
			t.Fatalf("runtime %s is unavailable: %s", c.Name, caps.Reason)
		}
		e.rts[c.Name] = rt
		rts = append(rts, rt)
	}
	if e.svc, err = sandbox.NewService(st, rts, sandbox.Config{}, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		list, _ := e.svc.List(ctx, sandbox.ListFilter{})
		for _, sb := range list {
			e.svc.Destroy(ctx, sb.ID)
		}
		defer e.svc.Close()
		all, _ := st.ListSandboxes(ctx, sandbox.ListFilter{Limit: 100000})
		var ids []string
		for _, sb := range all {
			ids = append(ids, sb.ID)
		}
		if len(ids) > 0 {
			if leaks := testenv.Leaks(ids...); len(leaks) > 0 {
				t.Errorf("leaked host resources:\n%s", strings.Join(leaks, "\n"))
			}
		}
		for name, rt := range e.rts {
			if left, err := rt.List(ctx); err != nil || len(left) > 0 {
				t.Errorf("runtime %s still holds %v (%v)", name, left, err)
			}
		}
		mounts, _ := hostinfo.CgroupMounts()
		for _, m := range mounts {
			for name := range e.rts {
				p := filepath.Join(m.Path, "abt-"+filepath.Base(dir)+"-"+name)
				if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
					t.Errorf("cgroup parent %s: %v", p, err)
				}
			}
		}
		st.Close()
	})
	return e
}

func TestRuntimeRequirements(t *testing.T) {
	e := newRuntimesEnv(t)
	ctx := context.Background()

	t.Run("Runtimes", func(t *testing.T) {
		got := map[string]runtime.Capabilities{}
		for _, c := range e.svc.Runtimes() {
			got[c.Name] = c
		}
		for name, iso := range map[string]runtime.Isolation{"runc": "process", "crun": "process", "gvisor": "kernel"} {
			if c := got[name]; !c.Available || c.Isolation != iso || len(c.Hardening) == 0 {
				t.Errorf("%s: %+v", name, c)
			}
		}
		if c := got["gvisor-missing"]; c.Available || !strings.Contains(c.Reason, "not found") {
			t.Errorf("gvisor-missing: %+v", c)
		}
	})

	created := func(t *testing.T, req sandbox.CreateRequest, runtimeName string, iso runtime.Isolation) sandbox.Sandbox {
		t.Helper()
		sb, err := e.svc.Create(ctx, req)
		if err != nil {
			t.Fatalf("create %+v: %v", req, err)
		}
		t.Cleanup(func() { e.svc.Destroy(context.Background(), sb.ID) })
		if sb.Runtime != runtimeName || sb.Isolation != string(iso) || sb.State != sandbox.StateRunning {
			t.Fatalf("create %+v: runtime %s isolation %s state %s, want %s %s", req, sb.Runtime, sb.Isolation, sb.State, runtimeName, iso)
		}
		rec, err := e.svc.Get(ctx, sb.ID)
		if err != nil || rec.Runtime != runtimeName || rec.Isolation != string(iso) {
			t.Fatalf("record of %s: %+v %v", sb.ID, rec, err)
		}
		return sb
	}
	kernelOf := func(t *testing.T, id string) string {
		t.Helper()
		res, err := e.svc.Exec(ctx, id, sandbox.ExecRequest{Argv: []string{"cat", "/proc/version"}}, nil)
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("exec in %s: %+v %v", id, res, err)
		}
		return res.Stdout
	}
	host, _ := os.ReadFile("/proc/version")

	t.Run("KernelPicksGVisor", func(t *testing.T) {
		sb := created(t, sandbox.CreateRequest{Requirements: sandbox.Requirements{Isolation: "kernel"}}, "gvisor", runtime.IsolationKernel)
		if v := kernelOf(t, sb.ID); v == string(host) {
			t.Errorf("a kernel-isolated sandbox runs on the host's kernel: %q", v)
		}
	})
	t.Run("ExplicitGVisorWithKernel", func(t *testing.T) {
		created(t, sandbox.CreateRequest{Runtime: "gvisor", Requirements: sandbox.Requirements{Isolation: "kernel"}}, "gvisor", runtime.IsolationKernel)
	})
	t.Run("ProcessPicksTheDefault", func(t *testing.T) {
		sb := created(t, sandbox.CreateRequest{Requirements: sandbox.Requirements{Isolation: "process"}}, "runc", runtime.IsolationProcess)
		if v := kernelOf(t, sb.ID); v != string(host) {
			t.Errorf("a runc sandbox does not share the host's kernel: %q vs %q", v, host)
		}
	})
	t.Run("NoRequirementsIsTheDefault", func(t *testing.T) {
		created(t, sandbox.CreateRequest{}, "runc", runtime.IsolationProcess)
	})
	t.Run("CrunWithProcess", func(t *testing.T) {
		created(t, sandbox.CreateRequest{Runtime: "crun", Requirements: sandbox.Requirements{Isolation: "process"}}, "crun", runtime.IsolationProcess)
	})

	before, _ := e.st.ListSandboxes(ctx, sandbox.ListFilter{Limit: 100000})
	for _, tc := range []struct {
		name string
		req  sandbox.CreateRequest
		code errcode.Code
		msg  string
	}{
		{"ExplicitRuncWithKernel", sandbox.CreateRequest{Runtime: "runc", Requirements: sandbox.Requirements{Isolation: "kernel"}}, errcode.RuntimeUnavailable, "weaker than the required kernel"},
		{"ExplicitCrunWithKernel", sandbox.CreateRequest{Runtime: "crun", Requirements: sandbox.Requirements{Isolation: "kernel"}}, errcode.RuntimeUnavailable, "ask for runtime gvisor"},
		{"VM", sandbox.CreateRequest{Requirements: sandbox.Requirements{Isolation: "vm"}}, errcode.RuntimeUnavailable, "no vm runtime on this host"},
		{"ExplicitGVisorWithVM", sandbox.CreateRequest{Runtime: "gvisor", Requirements: sandbox.Requirements{Isolation: "vm"}}, errcode.RuntimeUnavailable, "weaker than the required vm"},
		{"UnknownIsolation", sandbox.CreateRequest{Requirements: sandbox.Requirements{Isolation: "strong"}}, errcode.InvalidArgument, "process, kernel, vm"},
		{"UnavailableRuntime", sandbox.CreateRequest{Runtime: "gvisor-missing"}, errcode.RuntimeUnavailable, "not found"},
		{"UnknownRuntime", sandbox.CreateRequest{Runtime: "kata"}, errcode.RuntimeUnavailable, "not configured"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.svc.Create(ctx, tc.req)
			if errcode.Of(err) != tc.code || !strings.Contains(errcode.Message(err), tc.msg) {
				t.Fatalf("create %+v: %v, want %s containing %q", tc.req, err, tc.code, tc.msg)
			}
		})
	}
	after, _ := e.st.ListSandboxes(ctx, sandbox.ListFilter{Limit: 100000})
	if len(after) != len(before) {
		t.Errorf("refused creates left %d records", len(after)-len(before))
	}
	if slices.ContainsFunc(after, func(sb sandbox.Sandbox) bool { return sb.Runtime == "gvisor-missing" }) {
		t.Error("a record names the unavailable runtime")
	}
}
