package sandbox_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/fake"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// Snapshots and forks on the fake runtime (control-plane logic; the real-runtime test is
// TestSnapshotForkRunc).

func newSnapEnv(t *testing.T, cfg sandbox.Config) *fakeEnv {
	t.Helper()
	if cfg.SnapshotDir == "" {
		cfg.SnapshotDir = filepath.Join(t.TempDir(), "snapshots")
	}
	return newFakeEnv(t, cfg)
}

func (e *fakeEnv) sh(t *testing.T, id, script string) string {
	t.Helper()
	res, err := e.svc.Exec(t.Context(), id, sandbox.ExecRequest{Argv: []string{"sh", "-c", script}}, nil)
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("exec %q in %s: %+v, %v", script, id, res, err)
	}
	return res.Stdout
}

func (e *fakeEnv) snapDirs(t *testing.T) []string {
	t.Helper()
	ents, err := os.ReadDir(e.cfg.SnapshotDir)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []string
	for _, en := range ents {
		out = append(out, en.Name())
	}
	return out
}

func wantSnapCode(t *testing.T, what string, err error, code errcode.Code, mentions ...string) {
	t.Helper()
	if !errcode.Is(err, code) {
		t.Fatalf("%s = %v, want %s", what, err, code)
	}
	for _, m := range mentions {
		if !strings.Contains(err.Error(), m) {
			t.Errorf("%s = %q; it should mention %q", what, err, m)
		}
	}
}

// TestSnapshotForkFilesIdenticalThenIndependent: a snapshot is a record and a directory; a
// fork of 2 from it sees the files as they were, and each fork's writes are its own.
func TestSnapshotForkFilesIdenticalThenIndependent(t *testing.T) {
	e := newSnapEnv(t, sandbox.Config{})
	src := e.create(t, sandbox.CreateRequest{DiskMB: 256, Labels: map[string]string{"team": "a"}})
	e.sh(t, src.ID, "echo at-fork > f && mkdir -p d && echo deep > d/g")
	sn, err := e.snaps.Snapshot(t.Context(), src.ID, sandbox.SnapshotRequest{Labels: map[string]string{"step": "1"}})
	if err != nil {
		t.Fatal(err)
	}
	if sn.State != sandbox.SnapshotReady || sn.Kind != runtime.SnapshotFiles || sn.SizeBytes <= 0 || sn.DiskMB != 256 ||
		sn.SandboxID != src.ID || !strings.HasPrefix(sn.ID, "snap-") || sn.Labels["step"] != "1" {
		t.Fatalf("snapshot %+v", sn)
	}
	if _, err := os.Stat(filepath.Join(e.cfg.SnapshotDir, sn.ID, runtime.SnapshotInfoFile)); err != nil {
		t.Fatalf("snapshot's directory: %v", err)
	}
	if fi, err := os.Stat(filepath.Join(e.cfg.SnapshotDir, sn.ID)); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("snapshot's directory mode: %v, %v; want 0700", fi.Mode(), err)
	}
	if evs := e.eventsOf(t, src.ID, "snapshot"); len(evs) != 1 || !strings.Contains(evs[0].Reason, sn.ID) || !strings.Contains(evs[0].Reason, "files") {
		t.Fatalf("snapshot events %+v", evs)
	}
	e.sh(t, src.ID, "echo after > f")

	res, err := e.snaps.Fork(t.Context(), src.ID, sandbox.ForkRequest{Count: 2, SnapshotID: sn.ID, Labels: map[string]string{"fork": "yes"}, TTLSeconds: 600})
	if err != nil {
		t.Fatal(err)
	}
	if res.SnapshotID != sn.ID || res.Kind != runtime.SnapshotFiles || len(res.Sandboxes) != 2 {
		t.Fatalf("fork result %+v", res)
	}
	a, b := res.Sandboxes[0], res.Sandboxes[1]
	for _, f := range res.Sandboxes {
		if f.State != sandbox.StateRunning || f.FromSnapshot != sn.ID || f.DiskMB != 256 || f.Labels["team"] != "a" || f.Labels["fork"] != "yes" || f.ID == src.ID {
			t.Fatalf("fork record %+v", f)
		}
		if ttl := f.ExpiresAt.Sub(f.CreatedAt); ttl != 600*time.Second {
			t.Errorf("fork ttl %v, want 600s", ttl)
		}
		if got := e.sh(t, f.ID, "cat f d/g"); got != "at-fork\ndeep\n" {
			t.Fatalf("fork %s reads %q, want the files at the fork point", f.ID, got)
		}
	}
	e.sh(t, a.ID, "echo only-a > f")
	if got := e.sh(t, b.ID, "cat f"); got != "at-fork\n" {
		t.Fatalf("fork b reads %q after a wrote", got)
	}
	if got := e.sh(t, src.ID, "cat f"); got != "after\n" {
		t.Fatalf("source reads %q", got)
	}
	// Create from the snapshot works like a fork of 1.
	c := e.create(t, sandbox.CreateRequest{Snapshot: sn.ID})
	if c.FromSnapshot != sn.ID || c.DiskMB != 256 || e.sh(t, c.ID, "cat f") != "at-fork\n" {
		t.Fatalf("create from snapshot: %+v", c)
	}

	// List, get, delete.
	list, err := e.snaps.ListSnapshots(t.Context(), sandbox.SnapshotFilter{SandboxID: src.ID})
	if err != nil || len(list) != 1 || list[0].ID != sn.ID {
		t.Fatalf("ListSnapshots = %+v, %v", list, err)
	}
	if got, err := e.snaps.GetSnapshot(t.Context(), sn.ID); err != nil || got.ID != sn.ID {
		t.Fatalf("GetSnapshot = %+v, %v", got, err)
	}
	if err := e.snaps.DeleteSnapshot(t.Context(), sn.ID); err != nil {
		t.Fatal(err)
	}
	_, err = e.snaps.GetSnapshot(t.Context(), sn.ID)
	wantSnapCode(t, "GetSnapshot after delete", err, errcode.SnapshotNotFound, sn.ID, "snapshot_list")
	if d := e.snapDirs(t); len(d) != 0 {
		t.Fatalf("snapshot directories left after delete: %v", d)
	}
	// The forks live on without it.
	if got := e.sh(t, a.ID, "cat f"); got != "only-a\n" {
		t.Fatalf("fork a after the delete reads %q", got)
	}
}

// TestSnapshotRefusals: every bad input and impossible case is a typed error naming what to do.
func TestSnapshotRefusals(t *testing.T) {
	e := newSnapEnv(t, sandbox.Config{})
	src := e.create(t, sandbox.CreateRequest{})
	other := e.create(t, sandbox.CreateRequest{})
	ctx := t.Context()

	_, err := e.snaps.Snapshot(ctx, src.ID, sandbox.SnapshotRequest{Memory: true})
	wantSnapCode(t, "memory snapshot on the fake", err, errcode.UnsupportedOp, "runc", "keeps no memory")
	_, err = e.snaps.Snapshot(ctx, "nope", sandbox.SnapshotRequest{})
	wantSnapCode(t, "Snapshot(bad id)", err, errcode.InvalidArgument)
	_, err = e.snaps.GetSnapshot(ctx, "snap-xyz")
	wantSnapCode(t, "GetSnapshot(bad id)", err, errcode.InvalidArgument, "snapshot_id")
	_, err = e.snaps.GetSnapshot(ctx, sandbox.NewSnapshotID())
	wantSnapCode(t, "GetSnapshot(unknown)", err, errcode.SnapshotNotFound, "snapshot_list")
	err = e.snaps.DeleteSnapshot(ctx, sandbox.NewSnapshotID())
	wantSnapCode(t, "DeleteSnapshot(unknown)", err, errcode.SnapshotNotFound)
	_, err = e.snaps.ListSnapshots(ctx, sandbox.SnapshotFilter{Limit: 1001})
	wantSnapCode(t, "ListSnapshots(limit 1001)", err, errcode.InvalidArgument, "1000")
	for _, n := range []int{-1, 21} {
		_, err = e.snaps.Fork(ctx, src.ID, sandbox.ForkRequest{Count: n})
		wantSnapCode(t, "Fork(count out of range)", err, errcode.InvalidArgument, "count", "20")
	}
	sn, err := e.snaps.Snapshot(ctx, src.ID, sandbox.SnapshotRequest{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.snaps.Fork(ctx, other.ID, sandbox.ForkRequest{SnapshotID: sn.ID})
	wantSnapCode(t, "Fork of another sandbox's snapshot", err, errcode.InvalidArgument, "snapshot_id", src.ID)
	_, err = e.svc.Create(ctx, sandbox.CreateRequest{Snapshot: sn.ID, DiskMB: 2048})
	wantSnapCode(t, "Create from snapshot with another disk_mb", err, errcode.InvalidArgument, "disk_mb")
	_, err = e.svc.Create(ctx, sandbox.CreateRequest{Snapshot: sn.ID, Runtime: "gvisor"})
	wantSnapCode(t, "Create from snapshot with another runtime", err, errcode.InvalidArgument, "runtime")
	_, err = e.svc.Create(ctx, sandbox.CreateRequest{Snapshot: sandbox.NewSnapshotID()})
	wantSnapCode(t, "Create from an unknown snapshot", err, errcode.SnapshotNotFound)

	if _, err := e.svc.Destroy(ctx, other.ID); err != nil {
		t.Fatal(err)
	}
	_, err = e.snaps.Snapshot(ctx, other.ID, sandbox.SnapshotRequest{})
	wantSnapCode(t, "Snapshot of a destroyed sandbox", err, errcode.SandboxNotRunning, "destroyed", "running")
	_, err = e.snaps.Fork(ctx, other.ID, sandbox.ForkRequest{})
	wantSnapCode(t, "Fork of a destroyed sandbox", err, errcode.SandboxNotRunning)

	// A server without a snapshot directory takes none.
	plain := newFakeEnv(t, sandbox.Config{})
	p := plain.create(t, sandbox.CreateRequest{})
	_, err = plain.snaps.Snapshot(ctx, p.ID, sandbox.SnapshotRequest{})
	wantSnapCode(t, "Snapshot without a snapshot directory", err, errcode.UnsupportedOp)
}

// TestSnapshotRuntimeFailureLeavesNothing: a snapshot the runtime fails in its middle leaves
// no directory and a failed record; the sandbox runs on.
func TestSnapshotRuntimeFailureLeavesNothing(t *testing.T) {
	e := newSnapEnv(t, sandbox.Config{})
	src := e.create(t, sandbox.CreateRequest{})
	e.sh(t, src.ID, "echo x > f")
	clear := failOn(e.rt, fake.OpSnapshotInfo, src.ID)
	_, err := e.snaps.Snapshot(t.Context(), src.ID, sandbox.SnapshotRequest{})
	clear()
	if err == nil {
		t.Fatal("Snapshot with a failing runtime succeeded")
	}
	if d := e.snapDirs(t); len(d) != 0 {
		t.Fatalf("a failed snapshot left directories %v", d)
	}
	all, err := e.st.ListSnapshots(t.Context(), sandbox.SnapshotFilter{})
	if err != nil || len(all) != 1 || all[0].State != sandbox.SnapshotFailed || all[0].Error == "" {
		t.Fatalf("records after a failed snapshot: %+v, %v; want one failed with its reason", all, err)
	}
	if e.state(t, src.ID) != sandbox.StateRunning || e.sh(t, src.ID, "cat f") != "x\n" {
		t.Fatal("the sandbox did not run on after a failed snapshot")
	}
	// Failed ones are not what create or fork take.
	_, err = e.svc.Create(t.Context(), sandbox.CreateRequest{Snapshot: all[0].ID})
	wantSnapCode(t, "Create from a failed snapshot", err, errcode.Conflict, "failed")
}

// TestSnapshotBudgetRetiresOldest: under a budget the oldest ready snapshots are retired (and
// said so) to make room; one larger than the whole budget is refused and leaves nothing.
func TestSnapshotBudgetRetiresOldest(t *testing.T) {
	e := newSnapEnv(t, sandbox.Config{SnapshotBudgetBytes: 250 << 10})
	src := e.create(t, sandbox.CreateRequest{})
	e.sh(t, src.ID, "head -c 102400 /dev/urandom > blob")
	var ids []string
	for range 3 {
		e.clock.Add(time.Second) // oldest first is by created_at
		sn, err := e.snaps.Snapshot(t.Context(), src.ID, sandbox.SnapshotRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if sn.SizeBytes < 100<<10 || sn.SizeBytes > 150<<10 {
			t.Fatalf("snapshot size %d, want about 100 KiB", sn.SizeBytes)
		}
		ids = append(ids, sn.ID)
	}
	// 3 × ~100 KiB do not fit in 250 KiB: the third retired the first.
	list, err := e.snaps.ListSnapshots(t.Context(), sandbox.SnapshotFilter{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, sn := range list {
		got = append(got, sn.ID)
	}
	if !slices.Equal(got, ids[1:]) {
		t.Fatalf("snapshots after 3 under the budget: %v, want the newest two %v", got, ids[1:])
	}
	evs := e.eventsOf(t, src.ID, "snapshot")
	if last := evs[len(evs)-1]; !strings.Contains(last.Reason, "retired "+ids[0]) {
		t.Fatalf("the snapshot that retired %s says %q", ids[0], last.Reason)
	}
	if d := e.snapDirs(t); len(d) != 2 {
		t.Fatalf("directories %v, want the 2 kept", d)
	}
	// Larger than the whole budget: refused, nothing written, nothing retired.
	e.sh(t, src.ID, "head -c 409600 /dev/urandom > big")
	_, err = e.snaps.Snapshot(t.Context(), src.ID, sandbox.SnapshotRequest{})
	wantSnapCode(t, "a snapshot larger than the budget", err, errcode.CapacityUnavailable, "budget", "--snapshot-budget-mb")
	if d := e.snapDirs(t); len(d) != 2 {
		t.Fatalf("directories after the refusal %v, want the 2 kept", d)
	}
	if list, _ := e.snaps.ListSnapshots(t.Context(), sandbox.SnapshotFilter{States: []sandbox.SnapshotState{sandbox.SnapshotReady}}); len(list) != 2 {
		t.Fatalf("ready snapshots after the refusal: %d, want 2", len(list))
	}
}

// TestForkAllOrNone: a fork the capacity cannot take in full makes none; one whose create
// fails midway destroys what it made; a snapshot a fork is using cannot be deleted.
func TestForkAllOrNone(t *testing.T) {
	e := newSnapEnv(t, sandbox.Config{MaxSandboxes: 3})
	src := e.create(t, sandbox.CreateRequest{})
	sn, err := e.snaps.Snapshot(t.Context(), src.ID, sandbox.SnapshotRequest{})
	if err != nil {
		t.Fatal(err)
	}
	live := func() int {
		l, err := e.svc.List(t.Context(), sandbox.ListFilter{States: []sandbox.State{sandbox.StateCreating, sandbox.StateRunning}})
		if err != nil {
			t.Fatal(err)
		}
		return len(l)
	}
	runs := e.rt.Calls(fake.OpRun)
	_, err = e.snaps.Fork(t.Context(), src.ID, sandbox.ForkRequest{Count: 3, SnapshotID: sn.ID})
	wantSnapCode(t, "Fork of 3 with room for 2", err, errcode.CapacityUnavailable, "fork of 3", "none was made")
	if n := e.rt.Calls(fake.OpRun); n != runs || live() != 1 {
		t.Fatalf("a refused fork made sandboxes: %d runs, %d live", n-runs, live())
	}

	// The second create fails: the first is destroyed.
	var n atomic.Int32
	e.rt.SetFault(func(ctx context.Context, op fake.Op, id string) error {
		if op == fake.OpRun && n.Add(1) == 2 {
			return errInjected
		}
		return nil
	})
	_, err = e.snaps.Fork(t.Context(), src.ID, sandbox.ForkRequest{Count: 2, SnapshotID: sn.ID})
	e.rt.SetFault(nil)
	if err == nil {
		t.Fatal("a fork whose create failed succeeded")
	}
	if live() != 1 {
		t.Fatalf("%d live sandboxes after a failed fork, want the source alone", live())
	}

	// While a fork's create is in flight, its snapshot cannot be deleted.
	release := make(chan struct{})
	started := make(chan struct{}, 1)
	e.rt.SetFault(func(ctx context.Context, op fake.Op, id string) error {
		if op == fake.OpRun {
			select {
			case started <- struct{}{}:
			default:
			}
			<-release
		}
		return nil
	})
	done := make(chan error, 1)
	go func() {
		_, err := e.snaps.Fork(context.Background(), src.ID, sandbox.ForkRequest{SnapshotID: sn.ID})
		done <- err
	}()
	<-started
	err = e.snaps.DeleteSnapshot(t.Context(), sn.ID)
	wantSnapCode(t, "DeleteSnapshot during a fork", err, errcode.Conflict, "in use")
	close(release)
	if err := <-done; err != nil {
		t.Fatalf("fork: %v", err)
	}
	e.rt.SetFault(nil)
	if err := e.snaps.DeleteSnapshot(t.Context(), sn.ID); err != nil {
		t.Fatalf("DeleteSnapshot after the fork: %v", err)
	}
}

// TestForkTakesSnapshotNow: a fork without snapshot_id snapshots the sandbox first.
func TestForkTakesSnapshotNow(t *testing.T) {
	e := newSnapEnv(t, sandbox.Config{})
	src := e.create(t, sandbox.CreateRequest{})
	e.sh(t, src.ID, "echo now > f")
	res, err := e.snaps.Fork(t.Context(), src.ID, sandbox.ForkRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Sandboxes) != 1 || res.Kind != runtime.SnapshotFiles || res.SnapshotID == "" {
		t.Fatalf("fork %+v", res)
	}
	if got := e.sh(t, res.Sandboxes[0].ID, "cat f"); got != "now\n" {
		t.Fatalf("fork reads %q", got)
	}
	if sn, err := e.snaps.GetSnapshot(t.Context(), res.SnapshotID); err != nil || sn.State != sandbox.SnapshotReady || sn.SandboxID != src.ID {
		t.Fatalf("fork's snapshot %+v, %v", sn, err)
	}
}

// TestSnapshotReconcileAfterCrash: what a crash leaves in each step is settled at the next
// start — a creating record's partial directory removed and the record failed, a deleting
// record's delete finished, a directory without a record removed, a ready record whose files
// are gone failed — while a ready snapshot is kept and usable.
func TestSnapshotReconcileAfterCrash(t *testing.T) {
	e := newSnapEnv(t, sandbox.Config{})
	src := e.create(t, sandbox.CreateRequest{})
	e.sh(t, src.ID, "echo kept > f")
	good, err := e.snaps.Snapshot(t.Context(), src.ID, sandbox.SnapshotRequest{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	mk := func(state sandbox.SnapshotState, withDir bool) sandbox.Snapshot {
		sn := good
		sn.ID, sn.State, sn.Version = sandbox.NewSnapshotID(), sandbox.SnapshotCreating, 1
		if err := e.st.CreateSnapshot(ctx, sn); err != nil {
			t.Fatal(err)
		}
		if state != sandbox.SnapshotCreating {
			sn.State, sn.Version = state, 2
			if err := e.st.UpdateSnapshot(ctx, sn); err != nil {
				t.Fatal(err)
			}
		}
		if withDir {
			if err := os.MkdirAll(filepath.Join(e.cfg.SnapshotDir, sn.ID, fake.DiskDir), 0o700); err != nil {
				t.Fatal(err)
			}
		}
		return sn
	}
	half := mk(sandbox.SnapshotCreating, true)     // killed while the runtime wrote
	deleting := mk(sandbox.SnapshotDeleting, true) // killed between the record and the files
	gone := mk(sandbox.SnapshotReady, false)       // its files were removed behind our back
	orphan := sandbox.NewSnapshotID()              // killed after the dir, before... or a record pruned
	if err := os.MkdirAll(filepath.Join(e.cfg.SnapshotDir, orphan), 0o700); err != nil {
		t.Fatal(err)
	}

	e.restart(t)

	if got, err := e.st.GetSnapshot(ctx, half.ID); err != nil || got.State != sandbox.SnapshotFailed || !strings.Contains(got.Error, "server stopped") {
		t.Errorf("half-taken snapshot after restart: %+v, %v; want failed, saying the server stopped", got, err)
	}
	if _, err := e.st.GetSnapshot(ctx, deleting.ID); !errcode.Is(err, errcode.SnapshotNotFound) {
		t.Errorf("half-deleted snapshot after restart: %v, want its record gone", err)
	}
	if got, err := e.st.GetSnapshot(ctx, gone.ID); err != nil || got.State != sandbox.SnapshotFailed {
		t.Errorf("ready snapshot without files after restart: %+v, %v; want failed", got, err)
	}
	if d := e.snapDirs(t); !slices.Equal(d, []string{good.ID}) {
		t.Errorf("snapshot directories after restart: %v, want only %s", d, good.ID)
	}
	c := e.create(t, sandbox.CreateRequest{Snapshot: good.ID})
	if got := e.sh(t, c.ID, "cat f"); got != "kept\n" {
		t.Fatalf("create from the kept snapshot reads %q", got)
	}
}

// TestSnapshotConvergeLeavesInFlight: the control loop and the sweep leave a snapshot being
// taken alone, and finish nothing of it until it is over.
func TestSnapshotConvergeLeavesInFlight(t *testing.T) {
	e := newSnapEnv(t, sandbox.Config{SweepInterval: time.Hour})
	src := e.create(t, sandbox.CreateRequest{})
	release := make(chan struct{})
	at := make(chan struct{})
	e.rt.SetFault(func(ctx context.Context, op fake.Op, id string) error {
		if op == fake.OpSnapshotInfo {
			close(at)
			<-release
		}
		return nil
	})
	done := make(chan error, 1)
	go func() {
		_, err := e.snaps.Snapshot(context.Background(), src.ID, sandbox.SnapshotRequest{})
		done <- err
	}()
	<-at
	e.clock.Add(time.Hour)
	if err := e.svc.Converge(t.Context()); err != nil {
		t.Fatal(err)
	}
	e.svc.SweepOnce(t.Context())
	list, _ := e.st.ListSnapshots(t.Context(), sandbox.SnapshotFilter{})
	if len(list) != 1 || list[0].State != sandbox.SnapshotCreating || len(e.snapDirs(t)) != 1 {
		t.Fatalf("in-flight snapshot after converge and sweep: %+v, dirs %v", list, e.snapDirs(t))
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	e.rt.SetFault(nil)
	if sn, _ := e.st.GetSnapshot(t.Context(), list[0].ID); sn.State != sandbox.SnapshotReady {
		t.Fatalf("snapshot after it finished: %+v", sn)
	}
}

// TestSnapshotMemoryKindShape: a files+memory snapshot (the fake pretends to take one) gives a
// sandbox made from it the source's cpu and memory_mb too; asking for others is refused, naming
// the field; the reply says what was captured.
func TestSnapshotMemoryKindShape(t *testing.T) {
	cfg := sandbox.Config{SnapshotDir: filepath.Join(t.TempDir(), "snapshots")}
	e := newFakeEnvWith(t, cfg, fake.Config{MemorySnapshots: true})
	src := e.create(t, sandbox.CreateRequest{CPU: 0.5, MemoryMB: 256})
	sn, err := e.snaps.Snapshot(t.Context(), src.ID, sandbox.SnapshotRequest{Memory: true})
	if err != nil {
		t.Fatal(err)
	}
	if sn.Kind != runtime.SnapshotFilesMemory || sn.CPU != 0.5 || sn.MemoryMB != 256 {
		t.Fatalf("memory snapshot %+v", sn)
	}
	_, err = e.svc.Create(t.Context(), sandbox.CreateRequest{Snapshot: sn.ID, MemoryMB: 1024})
	wantSnapCode(t, "Create from a memory snapshot with another memory_mb", err, errcode.InvalidArgument, "memory_mb")
	_, err = e.svc.Create(t.Context(), sandbox.CreateRequest{Snapshot: sn.ID, CPU: 2})
	wantSnapCode(t, "Create from a memory snapshot with another cpu", err, errcode.InvalidArgument, "cpu")
	res, err := e.snaps.Fork(t.Context(), src.ID, sandbox.ForkRequest{SnapshotID: sn.ID, Memory: true})
	if err != nil {
		t.Fatal(err)
	}
	if f := res.Sandboxes[0]; res.Kind != runtime.SnapshotFilesMemory || f.CPU != 0.5 || f.MemoryMB != 256 {
		t.Fatalf("memory fork %+v: %+v", res, f)
	}
	// A files snapshot cannot be forked with memory.
	files, err := e.snaps.Snapshot(t.Context(), src.ID, sandbox.SnapshotRequest{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.snaps.Fork(t.Context(), src.ID, sandbox.ForkRequest{SnapshotID: files.ID, Memory: true})
	wantSnapCode(t, "Fork with memory of a files snapshot", err, errcode.InvalidArgument, "memory")
}
