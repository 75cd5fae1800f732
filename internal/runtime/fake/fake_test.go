//go:build linux

package fake_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/fake"
	"github.com/agentbox/agentbox/internal/runtime/runtimetest"
)

func newFake(t *testing.T) *fake.Runtime {
	t.Helper()
	rt, err := fake.New(fake.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if left := rt.Resources(); len(left) != 0 {
			t.Errorf("sandboxes left after the test: %v", left)
		}
		if err := rt.Shutdown(context.Background()); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	return rt
}

// TestContract runs the runtime suite's contract cases against the fake: no root, no
// containers, in -short.
func TestContract(t *testing.T) {
	rt := newFake(t)
	runtimetest.RunContract(t, rt, func(t testing.TB, id string) { rt.Kill(id) })
}

func TestCapabilities(t *testing.T) {
	rt := newFake(t)
	c := rt.Capabilities()
	if !c.Available || c.Isolation != runtime.IsolationProcess || c.UserNamespaces || c.TakesIDRange() ||
		!slices.Equal(c.Images, []string{"host", runtime.ImageOCI}) || !slices.Equal(c.NetworkModes, []string{"none", "egress"}) || len(c.Hardening) != 0 {
		t.Fatalf("capabilities %+v", c)
	}
}

// TestTakesIDRange: with Config.TakesIDRange the fake declares it, refuses a spec without a
// range, and records the range it is given; without it, it refuses one.
func TestTakesIDRange(t *testing.T) {
	ctx := context.Background()
	m := runtime.IDMap{UIDBase: 200000, GIDBase: 200000, Count: 65536}
	plain := newFake(t)
	spec := runtimetest.DefaultSpec(runtimetest.NewID())
	spec.IDMap = m
	if _, err := plain.Create(ctx, spec); !errcode.Is(err, errcode.InvalidArgument) {
		t.Fatalf("create with an id map on a fake that takes none: %v, want INVALID_ARGUMENT", err)
	}
	rt, err := fake.New(fake.Config{TakesIDRange: true})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Shutdown(ctx)
	if !rt.Capabilities().TakesIDRange() {
		t.Fatal("Capabilities().TakesIDRange() is false")
	}
	if _, err := rt.Create(ctx, runtimetest.DefaultSpec(runtimetest.NewID())); !errcode.Is(err, errcode.InvalidArgument) {
		t.Fatalf("create without an id map: %v, want INVALID_ARGUMENT", err)
	}
	if _, err := rt.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if got, ok := rt.IDMap(spec.ID); !ok || got != m {
		t.Fatalf("IDMap = %+v, %v; want %+v", got, ok, m)
	}
	if err := rt.Delete(ctx, spec.ID); err != nil {
		t.Fatal(err)
	}
	if _, ok := rt.IDMap(spec.ID); ok {
		t.Fatal("IDMap of a deleted sandbox")
	}
}

// TestEgressCABundle: an egress sandbox's CA bundle is in its directory, read-only; a none
// sandbox gets none; delete removes it with the directory.
func TestEgressCABundle(t *testing.T) {
	rt := newFake(t)
	ctx := context.Background()
	spec := runtimetest.EgressSpec(runtimetest.NewID())
	if _, err := rt.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	p := rt.CABundlePath(spec.ID)
	b, err := os.ReadFile(p)
	if err != nil || !bytes.Equal(b, spec.CABundle) {
		t.Fatalf("CA bundle %q %v, want %q", b, err, spec.CABundle)
	}
	if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o444 {
		t.Errorf("CA bundle mode: %v %v", fi.Mode(), err)
	}
	none := runtimetest.DefaultSpec(runtimetest.NewID())
	none.CABundle = spec.CABundle // ignored outside egress
	if _, err := rt.Create(ctx, none); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(rt.CABundlePath(none.ID)); !os.IsNotExist(err) {
		t.Errorf("a none sandbox got a CA bundle: %v", err)
	}
	for _, id := range []string{spec.ID, none.ID} {
		if err := rt.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if res := rt.Resources(); len(res) != 0 {
		t.Fatalf("left: %v", res)
	}
}

// TestFaultFailsBeforeAnything: a failing fault on create leaves nothing; one on start leaves
// the created sandbox; Calls counts both.
func TestFaultFailsBeforeAnything(t *testing.T) {
	rt := newFake(t)
	ctx := context.Background()
	boom := errcode.New(errcode.RuntimeUnavailable, "injected")
	rt.SetFault(func(_ context.Context, op fake.Op, _ string) error {
		if op == fake.OpRun || op == fake.OpStart {
			return boom
		}
		return nil
	})
	id := runtimetest.NewID()
	if _, err := runtime.CreateAndStart(ctx, rt, runtimetest.DefaultSpec(id)); !errors.Is(err, boom) {
		t.Fatalf("run with a fault: %v", err)
	}
	if left := rt.Resources(); len(left) != 0 {
		t.Fatalf("a faulted run left %v", left)
	}
	if _, err := rt.Create(ctx, runtimetest.DefaultSpec(id)); err != nil {
		t.Fatal(err)
	}
	if err := rt.Start(ctx, id); !errors.Is(err, boom) {
		t.Fatalf("start with a fault: %v", err)
	}
	if st, err := rt.State(ctx, id); err != nil || st != runtime.StatusCreated {
		t.Fatalf("state after a faulted start: %v %v", st, err)
	}
	if rt.Calls(fake.OpRun) != 1 || rt.Calls(fake.OpStart) != 1 || rt.Calls(fake.OpCreate) != 1 {
		t.Fatalf("calls: run %d start %d create %d", rt.Calls(fake.OpRun), rt.Calls(fake.OpStart), rt.Calls(fake.OpCreate))
	}
	rt.SetFault(nil)
	if err := rt.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
}

// TestFaultHangs: a fault that blocks until ctx ends simulates a hung runtime; the call returns
// the context's error and does nothing.
func TestFaultHangs(t *testing.T) {
	rt := newFake(t)
	entered := make(chan fake.Op, 1)
	rt.SetFault(func(ctx context.Context, op fake.Op, _ string) error {
		entered <- op
		<-ctx.Done()
		return ctx.Err()
	})
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	id := runtimetest.NewID()
	go func() { _, err := rt.Run(ctx, runtimetest.DefaultSpec(id)); errc <- err }()
	if op := <-entered; op != fake.OpRun {
		t.Fatalf("fault saw %s", op)
	}
	select {
	case err := <-errc:
		t.Fatalf("run returned %v while the fault hangs", err)
	case <-time.After(100 * time.Millisecond):
	}
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("run after the caller hung up: %v", err)
	}
	rt.SetFault(nil)
	if left := rt.Resources(); len(left) != 0 {
		t.Fatalf("a hung run left %v", left)
	}
}

// TestKillKeepsResources: a killed sandbox is stopped and its agent silent, but it is still
// listed, with its workspace, until Delete.
func TestKillKeepsResources(t *testing.T) {
	rt := newFake(t)
	ctx := context.Background()
	id := runtimetest.NewID()
	c := runtimetest.Start(t, rt, runtimetest.DefaultSpec(id))
	if res := runtimetest.Exec(t, c, "sh", "-c", "echo kept > kept && pwd"); res.ExitCode != 0 {
		t.Fatalf("exec: %+v", res)
	}
	rt.Kill(id)
	if st, _ := rt.State(ctx, id); st != runtime.StatusStopped {
		t.Fatalf("state after kill: %s", st)
	}
	if ids, _ := rt.List(ctx); len(ids) != 1 || ids[0] != id {
		t.Fatalf("list after kill: %v", ids)
	}
	dial, err := rt.Agent(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if conn, err := dial(ctx); err == nil {
		conn.Close()
		t.Fatal("the agent of a killed sandbox still accepts connections")
	}
	var found bool
	_ = filepath.WalkDir(os.TempDir(), func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Name() == "kept" && filepath.Base(filepath.Dir(filepath.Dir(p))) == id {
			found = true
		}
		if err == nil && d.IsDir() && p != os.TempDir() && filepath.Dir(p) == os.TempDir() && !hasPrefix(d.Name(), "abfake") {
			return filepath.SkipDir
		}
		return nil
	})
	if !found {
		t.Error("the killed sandbox's workspace file is gone before Delete")
	}
	if err := rt.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
	if left := rt.Resources(); len(left) != 0 {
		t.Fatalf("left after delete: %v", left)
	}
}

func hasPrefix(s, p string) bool { return len(s) >= len(p) && s[:len(p)] == p }

// TestSpecEnvAndWorkspace: commands see the spec's env over the process's and run in the
// sandbox's own workspace, which another sandbox does not share.
func TestSpecEnvAndWorkspace(t *testing.T) {
	rt := newFake(t)
	a := runtimetest.DefaultSpec(runtimetest.NewID())
	a.Env = map[string]string{"WHO": "a"}
	b := runtimetest.DefaultSpec(runtimetest.NewID())
	b.Env = map[string]string{"WHO": "b"}
	ca, cb := runtimetest.Start(t, rt, a), runtimetest.Start(t, rt, b)
	runtimetest.Exec(t, ca, "sh", "-c", "echo $WHO > mine")
	runtimetest.Exec(t, cb, "sh", "-c", "echo $WHO > mine")
	if res := runtimetest.Exec(t, ca, "cat", "mine"); res.Stdout != "a\n" {
		t.Fatalf("sandbox a reads %+v", res)
	}
	if res := runtimetest.Exec(t, cb, "cat", "mine"); res.Stdout != "b\n" {
		t.Fatalf("sandbox b reads %+v", res)
	}
}
