//go:build linux

package fake_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/guest"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/fake"
	"github.com/agentbox/agentbox/internal/runtime/runtimetest"
)

// TestSnapshotForkIndependent: a snapshot copies the disk; two sandboxes made from it see its
// files and diverge from each other and from the source.
func TestSnapshotForkIndependent(t *testing.T) {
	rt := newFake(t)
	if c := rt.Capabilities(); !slices.Equal(c.Snapshots, []string{runtime.SnapshotFiles}) || c.MemorySnapshotReason == "" {
		t.Fatalf("capabilities: snapshots %v, memory reason %q", c.Snapshots, c.MemorySnapshotReason)
	}
	spec := runtimetest.DefaultSpec(runtimetest.NewID())
	spec.DiskMB = 64
	src := runtimetest.Start(t, rt, spec)
	runtimetest.Exec(t, src, "sh", "-c", "mkdir d && echo one > d/f && ln -s d/f link && chmod 640 d/f")
	dir := t.TempDir()
	info, err := rt.Snapshot(t.Context(), spec.ID, dir, runtime.SnapshotOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if info.Kind != runtime.SnapshotFiles || info.SizeBytes <= 0 || info.DiskMB != 64 {
		t.Fatalf("info %+v", info)
	}
	if got, err := fake.ReadSnapshotInfo(dir); err != nil || got != info {
		t.Fatalf("snapshot.json = %+v, %v; want %+v", got, err, info)
	}
	runtimetest.Exec(t, src, "sh", "-c", "echo source > d/f")
	var forks []*guest.Client
	for _, inPlace := range []bool{false, true} {
		fs := runtimetest.DefaultSpec(runtimetest.NewID())
		fs.DiskMB = 64
		fs.Snapshot = &runtime.SnapshotSource{Dir: dir, Info: info, InPlace: inPlace}
		forks = append(forks, runtimetest.Start(t, rt, fs))
	}
	a := forks[0]
	if res := runtimetest.Exec(t, a, "sh", "-c", "cat link; stat -c %a d/f"); res.Stdout != "one\n640\n" {
		t.Fatalf("fork reads %+v, want the snapshot's file, link and mode", res)
	}
	runtimetest.Exec(t, a, "sh", "-c", "echo fork-a > d/f")
	if res := runtimetest.Exec(t, forks[1], "cat", "d/f"); res.Stdout != "one\n" {
		t.Fatalf("second fork reads %+v after the first wrote", res)
	}
	if res := runtimetest.Exec(t, src, "cat", "d/f"); res.Stdout != "source\n" {
		t.Fatalf("source reads %+v", res)
	}
	// A fork's DiskMB must be the snapshot's.
	bad := runtimetest.DefaultSpec(runtimetest.NewID())
	bad.DiskMB = 65
	bad.Snapshot = &runtime.SnapshotSource{Dir: dir, Info: info}
	if _, err := rt.Run(t.Context(), bad); !errcode.Is(err, errcode.InvalidArgument) {
		t.Fatalf("create with another disk_mb = %v, want INVALID_ARGUMENT", err)
	}
	// Memory is refused, with the reason, and writes nothing.
	d2 := t.TempDir()
	if _, err := rt.Snapshot(t.Context(), spec.ID, d2, runtime.SnapshotOptions{Memory: true}); !errcode.Is(err, errcode.UnsupportedOp) {
		t.Fatalf("memory snapshot = %v, want UNSUPPORTED_OPERATION", err)
	}
	if ents, _ := os.ReadDir(d2); len(ents) != 0 {
		t.Fatalf("a refused snapshot wrote %v", ents)
	}
}

// TestSnapshotCutOffAndRelease: a fault after the files are saved leaves no snapshot.json (and
// no files); Release moves the disk into the snapshot and deletes the sandbox.
func TestSnapshotCutOffAndRelease(t *testing.T) {
	rt := newFake(t)
	spec := runtimetest.DefaultSpec(runtimetest.NewID())
	src := runtimetest.Start(t, rt, spec)
	runtimetest.Exec(t, src, "sh", "-c", "echo kept > f")
	rt.SetFault(func(ctx context.Context, op fake.Op, id string) error {
		if op == fake.OpSnapshotInfo {
			return errcode.New(errcode.RuntimeUnavailable, "injected")
		}
		return nil
	})
	dir := t.TempDir()
	if _, err := rt.Snapshot(t.Context(), spec.ID, dir, runtime.SnapshotOptions{}); err == nil {
		t.Fatal("snapshot with a fault succeeded")
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("a failed snapshot left %v", ents)
	}
	rt.SetFault(nil)
	info, err := rt.Snapshot(t.Context(), spec.ID, dir, runtime.SnapshotOptions{Release: true})
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(rt.Resources(), spec.ID) {
		t.Fatalf("a released sandbox is still held: %v", rt.Resources())
	}
	if b, err := os.ReadFile(filepath.Join(dir, fake.DiskDir, "workspace", "f")); err != nil || string(b) != "kept\n" {
		t.Fatalf("released snapshot's file: %q, %v", b, err)
	}
	w := runtimetest.DefaultSpec(spec.ID)
	w.Snapshot = &runtime.SnapshotSource{Dir: dir, Info: info, InPlace: true}
	woke := runtimetest.Start(t, rt, w)
	if res := runtimetest.Exec(t, woke, "cat", "f"); res.Stdout != "kept\n" {
		t.Fatalf("woken sandbox reads %+v", res)
	}
	if _, err := rt.Snapshot(t.Context(), runtimetest.NewID(), t.TempDir(), runtime.SnapshotOptions{}); !errcode.Is(err, errcode.SandboxNotFound) {
		t.Fatalf("snapshot of an unknown sandbox = %v, want SANDBOX_NOT_FOUND", err)
	}
}

// TestSnapshotRefusals: the refusals the shared suite (runtimetest.RunSnapshots) asks of every
// runtime; the suite itself runs commands at the sandbox's absolute paths (/workspace,
// /home/agent, chown as root), which the fake's commands, run on the host, must not touch.
func TestSnapshotRefusals(t *testing.T) {
	rt := newFake(t)
	spec := runtimetest.DefaultSpec(runtimetest.NewID())
	runtimetest.Start(t, rt, spec)
	ctx := t.Context()
	for name, dir := range map[string]string{"missing": filepath.Join(t.TempDir(), "missing"), "relative": "relative/dir"} {
		if _, err := rt.Snapshot(ctx, spec.ID, dir, runtime.SnapshotOptions{}); !errcode.Is(err, errcode.InvalidArgument) {
			t.Errorf("snapshot into a %s dir = %v, want INVALID_ARGUMENT", name, err)
		}
	}
	if _, err := rt.Snapshot(ctx, "not-an-id", t.TempDir(), runtime.SnapshotOptions{}); !errcode.Is(err, errcode.InvalidArgument) {
		t.Errorf("snapshot of a malformed id = %v", err)
	}
	idle := runtimetest.DefaultSpec(runtimetest.NewID())
	t.Cleanup(func() { _ = rt.Delete(context.Background(), idle.ID) })
	if _, err := rt.Create(ctx, idle); err != nil {
		t.Fatal(err)
	}
	if _, err := rt.Snapshot(ctx, idle.ID, t.TempDir(), runtime.SnapshotOptions{}); !errcode.Is(err, errcode.SandboxNotRunning) {
		t.Errorf("snapshot of a created sandbox = %v, want SANDBOX_NOT_RUNNING", err)
	}
	dir := t.TempDir()
	info, err := rt.Snapshot(ctx, spec.ID, dir, runtime.SnapshotOptions{})
	if err != nil {
		t.Fatal(err)
	}
	bad := map[string]struct {
		src  runtime.SnapshotSource
		code errcode.Code
	}{
		"incomplete dir": {runtime.SnapshotSource{Dir: t.TempDir(), Info: info}, errcode.InvalidArgument},
		"unknown kind":   {runtime.SnapshotSource{Dir: dir, Info: runtime.SnapshotInfo{Kind: "bogus"}}, errcode.InvalidArgument},
		"relative dir":   {runtime.SnapshotSource{Dir: "snap", Info: info}, errcode.InvalidArgument},
		"memory":         {runtime.SnapshotSource{Dir: dir, Info: info, Memory: true}, errcode.UnsupportedOp},
	}
	for name, b := range bad {
		s := runtimetest.DefaultSpec(runtimetest.NewID())
		s.Snapshot = &b.src
		if _, err := rt.Create(ctx, s); !errcode.Is(err, b.code) {
			t.Errorf("create from %s = %v, want %s", name, err, b.code)
			_ = rt.Delete(ctx, s.ID)
		}
		if slices.Contains(rt.Resources(), s.ID) {
			t.Errorf("create from %s left %s", name, s.ID)
		}
	}
}
