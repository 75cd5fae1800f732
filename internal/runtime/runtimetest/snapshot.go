package runtimetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/guest"
	"github.com/agentbox/agentbox/internal/runtime"
)

// SnapshotConfig is what RunSnapshots needs beyond the runtime.
type SnapshotConfig struct {
	// Dir returns a new empty snapshot directory on the runtime's file system (the control
	// plane's job); nil: t.TempDir().
	Dir func(t testing.TB) string
	// Leaks, when set, returns the host resources that still mention any of needles (sandbox
	// ids, directories): testenv.Leaks for a runtime with host resources.
	Leaks func(needles ...string) []string
}

// RunSnapshots runs the snapshot cases on a runtime that is a runtime.Snapshotter and lists
// runtime.SnapshotFiles in its Capabilities. Files are read through the agent (exec), so that a
// runtime without containers passes them too.
func RunSnapshots(t *testing.T, rt runtime.Runtime, cfg SnapshotConfig) {
	snap, ok := rt.(runtime.Snapshotter)
	if !ok || !slices.Contains(rt.Capabilities().Snapshots, runtime.SnapshotFiles) {
		t.Fatalf("runtime %s takes no files snapshots (capabilities %v)", rt.Name(), rt.Capabilities().Snapshots)
	}
	if cfg.Dir == nil {
		cfg.Dir = func(t testing.TB) string { return t.TempDir() }
	}
	t.Run("ForkFromRunning", func(t *testing.T) { t.Parallel(); testSnapshotFork(t, rt, snap, cfg) })
	t.Run("ReleaseWakeInPlace", func(t *testing.T) { t.Parallel(); testSnapshotRelease(t, rt, snap, cfg) })
	t.Run("BadInput", func(t *testing.T) { t.Parallel(); testSnapshotBadInput(t, rt, snap, cfg) })
	t.Run("MemoryRefused", func(t *testing.T) {
		t.Parallel()
		if slices.Contains(rt.Capabilities().Snapshots, runtime.SnapshotFilesMemory) {
			t.Skipf("runtime %s takes memory snapshots (its own tests cover them)", rt.Name())
		}
		testSnapshotMemoryRefused(t, rt, snap, cfg)
	})
	t.Run("Memory", func(t *testing.T) {
		t.Parallel()
		if !slices.Contains(rt.Capabilities().Snapshots, runtime.SnapshotFilesMemory) {
			t.Skipf("runtime %s takes no memory snapshots: %s", rt.Name(), rt.Capabilities().MemorySnapshotReason)
		}
		testMemorySnapshot(t, rt, snap, cfg) // memsnapshot.go
	})
	if fr, ok := rt.(runtime.FilesReader); ok {
		t.Run("FilesReader", func(t *testing.T) { t.Parallel(); testSnapshotFiles(t, rt, snap, fr, cfg) })
	}
}

// snapshotSpec is DefaultSpec with an id range where the runtime takes one.
func snapshotSpec(rt runtime.Runtime, id string) runtime.Spec {
	spec := DefaultSpec(id)
	if rt.Capabilities().TakesIDRange() {
		spec.IDMap = TestIDMap()
	}
	return spec
}

// snapSetup makes, as root, a tree that exercises what a copy can lose: content, modes
// (setuid, setgid, sticky), owners (root's and the agent's), a hard link, symlinks (relative,
// absolute, dangling), an empty file, a 1 MiB random file, nested directories, a file in the
// agent's home and in root's home.
const snapSetup = `set -e
mkdir -p /workspace/snap/d/e/f
cd /workspace/snap
echo hello > a; ln a hard; ln -s a sym; ln -s /etc/hostname abs; ln -s nowhere dangling
: > empty
printf x > suid; printf y > sgid
mkdir sticky; chmod 1777 sticky
echo secret > rootonly; chmod 600 rootonly
head -c 1048576 /dev/urandom > d/e/f/big
chown -R 1000:1000 d a suid sgid empty
chown -h 1000:1000 sym
chmod 4755 suid; chmod 2755 sgid
echo home > /home/agent/snapfile; chown 1000:1000 /home/agent/snapfile
echo roothome > /root/snapfile
sync
`

// snapFingerprint lists the tree (path, type, mode, owner as the sandbox sees it, size, link
// target, link count) and every regular file's digest, and says whether the hard link holds.
const snapFingerprint = `cd /workspace/snap && find . -printf '%p %y %#m %U:%G %s %l %n\n' | LC_ALL=C sort &&
find . -type f -exec md5sum {} + | LC_ALL=C sort && [ a -ef hard ] && echo hardlinked &&
test -u suid && test -g sgid && test -k sticky && echo modes-kept &&
stat -c '%n %U:%G %s' /home/agent/snapfile /root/snapfile && cat /home/agent/snapfile /root/snapfile`

func rootExec(t testing.TB, c *guest.Client, script string) Result {
	t.Helper()
	res := ExecRequest(t, c, guest.ExecRequest{Argv: []string{"sh", "-c", script}, User: "root", TimeoutMs: 60000})
	if res.ExitCode != 0 {
		t.Fatalf("%q as root: %s", script, res)
	}
	return res
}

func agentExec(t testing.TB, c *guest.Client, script string) Result {
	t.Helper()
	return ExecRequest(t, c, guest.ExecRequest{Argv: []string{"sh", "-c", script}, TimeoutMs: 60000})
}

// createFrom creates and starts a sandbox from snapshot src, deleted when the test ends.
func createFrom(t testing.TB, rt runtime.Runtime, spec runtime.Spec, src *runtime.SnapshotSource) *guest.Client {
	t.Helper()
	spec.Snapshot = src
	return Start(t, rt, spec)
}

// testSnapshotFork: what was written before Snapshot is in it and the sandbox runs on; a sandbox
// made from it (another id, another id range) holds the same files, owned by its own users and
// writable by them, and the two are independent from then on.
func testSnapshotFork(t *testing.T, rt runtime.Runtime, snap runtime.Snapshotter, cfg SnapshotConfig) {
	ctx := context.Background()
	spec := snapshotSpec(rt, NewID())
	c := Start(t, rt, spec)
	rootExec(t, c, snapSetup)
	// A write nobody synced is in the snapshot too (the runtime syncs the sandbox's file
	// system while it is frozen). The fingerprint lists it.
	rootExec(t, c, "printf unsynced > /workspace/snap/unsynced; dd if=/dev/urandom of=/workspace/snap/d/big2 bs=64k count=16 status=none")
	before := rootExec(t, c, snapFingerprint).Stdout
	// A job running at the snapshot (its output is on the disk) and one that ended.
	running, err := c.StartJob(ctx, guest.JobStartRequest{JobID: testJobID(), Argv: []string{"sh", "-c", "echo started; sleep 600"}})
	if err != nil {
		t.Fatal(err)
	}
	ended, err := c.StartJob(ctx, guest.JobStartRequest{JobID: testJobID(), Argv: []string{"true"}})
	if err != nil {
		t.Fatal(err)
	}
	if ji, err := c.WaitJob(ctx, ended.JobID, 30*time.Second); err != nil || ji.State != guest.JobExited {
		t.Fatalf("job %s: %+v %v", ended.JobID, ji, err)
	}
	dir := cfg.Dir(t)
	info, err := snap.Snapshot(ctx, spec.ID, dir, runtime.SnapshotOptions{})
	if err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	if info.Kind != runtime.SnapshotFiles || info.DiskMB != spec.DiskMB || info.SizeBytes <= 0 || info.IDMap != spec.IDMap {
		t.Errorf("snapshot info %+v; want kind files, disk_mb %d, size > 0, id map %+v", info, spec.DiskMB, spec.IDMap)
	}
	if _, err := os.Stat(filepath.Join(dir, runtime.SnapshotInfoFile)); err != nil {
		t.Errorf("the snapshot has no %s: %v", runtime.SnapshotInfoFile, err)
	}
	// The sandbox runs on, and a write after the snapshot is not in it.
	wantState(t, rt, spec.ID, runtime.StatusRunning)
	rootExec(t, c, "echo after > /workspace/snap/after")

	fork := snapshotSpec(rt, NewID())
	if spec.IDMap.Count > 0 {
		for fork.IDMap.UIDBase == spec.IDMap.UIDBase {
			fork.IDMap = TestIDMap()
		}
	}
	fc := createFrom(t, rt, fork, &runtime.SnapshotSource{Dir: dir, Info: info})
	if got := rootExec(t, fc, snapFingerprint).Stdout; got != before {
		t.Errorf("the fork's files differ from the snapshotted sandbox's:\n--- before\n%s\n--- fork\n%s", before, got)
	}
	// The fork's agent is new: the job running in the original is not running in it (its
	// processes were not copied); the original's job runs on.
	jobs, err := fc.Jobs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range jobs {
		if j.State == guest.JobRunning {
			t.Errorf("the fork reports job %s of the original as running: %+v", j.JobID, j)
		}
	}
	if ji, err := c.Job(ctx, running.JobID); err != nil || ji.State != guest.JobRunning {
		t.Errorf("the original's job after the snapshot: %+v %v", ji, err)
	}
	if res := agentExec(t, fc, "test -e /workspace/snap/after"); res.ExitCode == 0 {
		t.Errorf("a write made after the snapshot is in the fork")
	}
	// The sandbox's users own their files and write them.
	if res := agentExec(t, fc, "set -e; id -u; stat -c %u:%g /workspace/snap/d/e/f/big /workspace /home/agent; echo more >> /workspace/snap/a; touch /workspace/snap/d/new /home/agent/new; cat /workspace/snap/a"); res.ExitCode != 0 ||
		res.Stdout != "1000\n1000:1000\n1000:1000\n1000:1000\nhello\nmore\n" {
		t.Errorf("the agent user in the fork: %s", res)
	}
	if res := rootExec(t, fc, "stat -c %u:%g /workspace/snap/rootonly /root/snapfile; touch /root/new"); res.Stdout != "0:0\n0:0\n" {
		t.Errorf("root's files in the fork: %s", res)
	}
	// Independent: a write in one is not seen in the other.
	if res := agentExec(t, c, "cat /workspace/snap/a; test ! -e /workspace/snap/d/new"); res.ExitCode != 0 || res.Stdout != "hello\n" {
		t.Errorf("a write in the fork is seen in the original: %s", res)
	}
	if res := agentExec(t, fc, "test ! -e /workspace/snap/after"); res.ExitCode != 0 {
		t.Errorf("a write in the original is seen in the fork: %s", res)
	}
	// A second fork from the same snapshot starts from the same point.
	fork2 := snapshotSpec(rt, NewID())
	fc2 := createFrom(t, rt, fork2, &runtime.SnapshotSource{Dir: dir, Info: info})
	if got := rootExec(t, fc2, snapFingerprint).Stdout; got != before {
		t.Errorf("the second fork's files differ:\n%s", got)
	}
}

// testSnapshotRelease: Release saves the disk and removes the sandbox; a create under the same id
// and id range from the snapshot InPlace (wake) has its files, and the snapshot dir stays whole.
func testSnapshotRelease(t *testing.T, rt runtime.Runtime, snap runtime.Snapshotter, cfg SnapshotConfig) {
	ctx := context.Background()
	spec := snapshotSpec(rt, NewID())
	c := Start(t, rt, spec)
	rootExec(t, c, snapSetup)
	before := rootExec(t, c, snapFingerprint).Stdout
	dir := cfg.Dir(t)
	info, err := snap.Snapshot(ctx, spec.ID, dir, runtime.SnapshotOptions{Release: true})
	if err != nil {
		t.Fatalf("snapshot with release: %v", err)
	}
	wantState(t, rt, spec.ID, runtime.StatusAbsent)
	if listed(t, rt, spec.ID) {
		t.Errorf("sandbox %s is still listed after a releasing snapshot", spec.ID)
	}
	if cfg.Leaks != nil {
		if l := cfg.Leaks(spec.ID); len(l) > 0 {
			t.Errorf("host resources of the released sandbox: %v", l)
		}
	}
	files := snapshotFiles(t, dir)
	wc := createFrom(t, rt, spec, &runtime.SnapshotSource{Dir: dir, Info: info, InPlace: true})
	if got := rootExec(t, wc, snapFingerprint).Stdout; got != before {
		t.Errorf("the woken sandbox's files differ:\n--- before\n%s\n--- woken\n%s", before, got)
	}
	if res := agentExec(t, wc, "echo more >> /workspace/snap/a && cat /workspace/snap/a"); res.ExitCode != 0 || res.Stdout != "hello\nmore\n" {
		t.Errorf("the agent user writes in the woken sandbox: %s", res)
	}
	if got := snapshotFiles(t, dir); !slices.Equal(got, files) {
		t.Errorf("the snapshot dir changed under an in-place create: %v, was %v", got, files)
	}
	if err := rt.Delete(ctx, spec.ID); err != nil {
		t.Fatal(err)
	}
	if got := snapshotFiles(t, dir); !slices.Equal(got, files) {
		t.Errorf("the snapshot dir changed when the woken sandbox was deleted: %v, was %v", got, files)
	}
	if cfg.Leaks != nil {
		if l := cfg.Leaks(spec.ID, dir); len(l) > 0 {
			t.Errorf("host resources left: %v", l)
		}
	}
}

// snapshotFiles lists the names in dir.
func snapshotFiles(t testing.TB, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

func wantCode(t testing.TB, err error, code errcode.Code, what string) {
	t.Helper()
	if !errcode.Is(err, code) {
		t.Errorf("%s: %v, want %s", what, err, code)
	}
}

// testSnapshotBadInput: bad arguments are refused with their codes and leave nothing.
func testSnapshotBadInput(t *testing.T, rt runtime.Runtime, snap runtime.Snapshotter, cfg SnapshotConfig) {
	ctx := context.Background()
	spec := snapshotSpec(rt, NewID())
	c := Start(t, rt, spec)
	rootExec(t, c, "echo x > /workspace/x")

	_, err := snap.Snapshot(ctx, "not-an-id", cfg.Dir(t), runtime.SnapshotOptions{})
	wantCode(t, err, errcode.InvalidArgument, "a malformed id")
	_, err = snap.Snapshot(ctx, NewID(), cfg.Dir(t), runtime.SnapshotOptions{})
	wantCode(t, err, errcode.SandboxNotFound, "an unknown id")
	missing := filepath.Join(cfg.Dir(t), "missing")
	_, err = snap.Snapshot(ctx, spec.ID, missing, runtime.SnapshotOptions{})
	wantCode(t, err, errcode.InvalidArgument, "a missing dir")
	if _, serr := os.Stat(missing); serr == nil {
		t.Errorf("a refused snapshot made its dir")
	}
	full := cfg.Dir(t)
	if err := os.WriteFile(filepath.Join(full, "keep"), []byte("k"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = snap.Snapshot(ctx, spec.ID, full, runtime.SnapshotOptions{})
	wantCode(t, err, errcode.InvalidArgument, "a dir that is not empty")
	if got := snapshotFiles(t, full); !slices.Equal(got, []string{"keep"}) {
		t.Errorf("a refused snapshot changed its dir: %v", got)
	}
	_, err = snap.Snapshot(ctx, spec.ID, "relative/dir", runtime.SnapshotOptions{})
	wantCode(t, err, errcode.InvalidArgument, "a relative dir")

	// A created, never started sandbox is not running.
	idle := snapshotSpec(rt, NewID())
	t.Cleanup(func() { _ = rt.Delete(context.Background(), idle.ID) })
	if _, err := rt.Create(ctx, idle); err != nil {
		t.Fatal(err)
	}
	empty := cfg.Dir(t)
	_, err = snap.Snapshot(ctx, idle.ID, empty, runtime.SnapshotOptions{})
	wantCode(t, err, errcode.SandboxNotRunning, "a sandbox not started")
	if got := snapshotFiles(t, empty); len(got) != 0 {
		t.Errorf("a refused snapshot left %v", got)
	}

	// Creates from bad snapshots leave no sandbox.
	dir := cfg.Dir(t)
	info, err := snap.Snapshot(ctx, spec.ID, dir, runtime.SnapshotOptions{})
	if err != nil {
		t.Fatal(err)
	}
	bad := map[string]struct {
		src  runtime.SnapshotSource
		disk int64
	}{
		"incomplete dir": {src: runtime.SnapshotSource{Dir: cfg.Dir(t), Info: info}},
		"other disk_mb":  {src: runtime.SnapshotSource{Dir: dir, Info: info}, disk: info.DiskMB * 2},
		"unknown kind":   {src: runtime.SnapshotSource{Dir: dir, Info: runtime.SnapshotInfo{Kind: "bogus", DiskMB: info.DiskMB, IDMap: info.IDMap}}},
		"relative dir":   {src: runtime.SnapshotSource{Dir: "snap", Info: info}},
	}
	for name, b := range bad {
		s := snapshotSpec(rt, NewID())
		s.DiskMB, s.Snapshot = b.disk, &b.src
		_, err := rt.Create(ctx, s)
		wantCode(t, err, errcode.InvalidArgument, "create from "+name)
		if err == nil {
			_ = rt.Delete(ctx, s.ID)
		}
		if listed(t, rt, s.ID) {
			t.Errorf("create from %s left sandbox %s", name, s.ID)
		}
	}
	// The sandbox still runs after the refusals.
	if res := agentExec(t, c, "cat /workspace/x"); res.Stdout != "x\n" {
		t.Errorf("the sandbox after refused snapshots: %s", res)
	}
}

// testSnapshotMemoryRefused: a runtime without SnapshotFilesMemory refuses memory: true as
// UNSUPPORTED_OPERATION and saves nothing; the sandbox runs on.
func testSnapshotMemoryRefused(t *testing.T, rt runtime.Runtime, snap runtime.Snapshotter, cfg SnapshotConfig) {
	ctx := context.Background()
	spec := snapshotSpec(rt, NewID())
	c := Start(t, rt, spec)
	dir := cfg.Dir(t)
	_, err := snap.Snapshot(ctx, spec.ID, dir, runtime.SnapshotOptions{Memory: true})
	wantCode(t, err, errcode.UnsupportedOp, "a memory snapshot")
	if err != nil && rt.Capabilities().MemorySnapshotReason != "" && !strings.Contains(err.Error(), rt.Capabilities().MemorySnapshotReason) {
		t.Errorf("the refusal %q does not give the reason %q", err, rt.Capabilities().MemorySnapshotReason)
	}
	if got := snapshotFiles(t, dir); len(got) != 0 {
		t.Errorf("a refused memory snapshot left %v", got)
	}
	if res := agentExec(t, c, "true"); res.ExitCode != 0 {
		t.Errorf("the sandbox after a refused memory snapshot: %s", res)
	}
	// A create asking to restore memory is refused the same way.
	files := cfg.Dir(t)
	info, err := snap.Snapshot(ctx, spec.ID, files, runtime.SnapshotOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s := snapshotSpec(rt, NewID())
	s.Snapshot = &runtime.SnapshotSource{Dir: files, Info: info, Memory: true}
	_, err = rt.Create(ctx, s)
	wantCode(t, err, errcode.UnsupportedOp, "a memory restore")
	if err == nil {
		_ = rt.Delete(ctx, s.ID)
	}
}

// testSnapshotFiles: SandboxFiles shows the running sandbox's trees, SnapshotFiles a snapshot's
// (read-only), and release unmounts them (twice is fine).
func testSnapshotFiles(t *testing.T, rt runtime.Runtime, snap runtime.Snapshotter, fr runtime.FilesReader, cfg SnapshotConfig) {
	ctx := context.Background()
	spec := snapshotSpec(rt, NewID())
	c := Start(t, rt, spec)
	rootExec(t, c, snapSetup)
	live, err := fr.SandboxFiles(ctx, spec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if live.IDMap != spec.IDMap {
		t.Errorf("SandboxFiles id map %+v, want %+v", live.IDMap, spec.IDMap)
	}
	ws := treeAt(t, live, "/workspace")
	if b, err := os.ReadFile(filepath.Join(ws.Dir, "snap", "a")); err != nil || string(b) != "hello\n" {
		t.Errorf("the live workspace's file: %q %v", b, err)
	}
	if _, err := fr.SandboxFiles(ctx, NewID()); !errcode.Is(err, errcode.SandboxNotFound) {
		t.Errorf("SandboxFiles of an unknown sandbox: %v", err)
	}
	dir := cfg.Dir(t)
	info, err := snap.Snapshot(ctx, spec.ID, dir, runtime.SnapshotOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rootExec(t, c, "echo changed > /workspace/snap/a")
	f, release, err := fr.SnapshotFiles(ctx, dir, info)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = release() })
	if f.IDMap != info.IDMap {
		t.Errorf("SnapshotFiles id map %+v, want %+v", f.IDMap, info.IDMap)
	}
	sws := treeAt(t, f, "/workspace")
	p := filepath.Join(sws.Dir, "snap", "a")
	if b, err := os.ReadFile(p); err != nil || string(b) != "hello\n" {
		t.Errorf("the snapshot's workspace file: %q %v", b, err)
	}
	if err := os.WriteFile(filepath.Join(sws.Dir, "snap", "w"), nil, 0o600); err == nil {
		t.Errorf("the snapshot's files are writable")
	}
	if h := treeAt(t, f, "/home/agent"); h.Dir == "" {
		t.Errorf("no /home/agent tree")
	}
	if err := release(); err != nil {
		t.Errorf("release: %v", err)
	}
	if err := release(); err != nil {
		t.Errorf("second release: %v", err)
	}
	if _, err := os.Stat(p); err == nil {
		t.Errorf("the snapshot's files are still there after release")
	}
	if cfg.Leaks != nil {
		if l := cfg.Leaks(dir); len(l) > 0 {
			t.Errorf("host resources left after release: %v", l)
		}
	}
}

func treeAt(t testing.TB, f runtime.Files, path string) runtime.FileTree {
	t.Helper()
	for _, tr := range f.Trees {
		if tr.Path == path {
			return tr
		}
	}
	t.Fatalf("no tree at %s in %+v", path, f.Trees)
	return runtime.FileTree{}
}

// testJobID is a fresh job id ("job-" and 12 hex digits: the host assigns them).
func testJobID() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "job-" + hex.EncodeToString(b[:])
}
