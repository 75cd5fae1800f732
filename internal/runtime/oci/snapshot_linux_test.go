package oci

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/guest"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/runtimetest"
	"github.com/agentbox/agentbox/internal/testenv"
)

func snapshotConfig() runtimetest.SnapshotConfig {
	return runtimetest.SnapshotConfig{Leaks: testenv.Leaks}
}

func TestRuncSnapshots(t *testing.T) {
	t.Parallel()
	rt := newRunc(t)
	runtimetest.RunSnapshots(t, rt, snapshotConfig())
}

func TestCrunSnapshots(t *testing.T) {
	t.Parallel()
	rt := newFlavor(t, FlavorCrun)
	runtimetest.RunSnapshots(t, rt, snapshotConfig())
}

func TestGVisorSnapshots(t *testing.T) {
	t.Parallel()
	rt := newFlavor(t, FlavorGVisor)
	runtimetest.RunSnapshots(t, rt, snapshotConfig())
}

// TestSnapshotCapabilities: every flavour lists files snapshots and, for memory, a reason.
func TestSnapshotCapabilities(t *testing.T) {
	t.Parallel()
	rt := newRunc(t)
	c := rt.Capabilities()
	if !slices.Equal(c.Snapshots, []string{runtime.SnapshotFiles}) || c.MemorySnapshotReason == "" {
		t.Errorf("snapshots %v, memory reason %q", c.Snapshots, c.MemorySnapshotReason)
	}
}

// TestSnapshotHostOwners: a fork's files belong, on the host, to the fork's range (base+n for a
// file of n), and the files of ids outside the old range keep their ids.
func TestSnapshotHostOwners(t *testing.T) {
	t.Parallel()
	rt := newRunc(t)
	ctx := context.Background()
	spec := runtimetest.DefaultSpec(runtimetest.NewID())
	spec.IDMap = runtimetest.TestIDMap()
	c := runtimetest.Start(t, rt, spec)
	res := runtimetest.ExecRequest(t, c, guestRoot("set -e; mkdir -p /workspace/o; echo a > /workspace/o/a; chown 1000:1000 /workspace/o/a; echo r > /workspace/o/r; echo s > /workspace/o/s; chown 1000:1000 /workspace/o/s; chmod 6755 /workspace/o/s; ln -s a /workspace/o/l; chown -h 1000:1000 /workspace/o/l; sync"))
	if res.ExitCode != 0 {
		t.Fatal(res)
	}
	// An id outside the range (nobody's overflow id cannot be written from inside): set from the host.
	alien := filepath.Join(rt.sandboxDir(spec.ID), diskMountName, "workspace", "o", "alien")
	if err := os.WriteFile(alien, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(alien, 12345, 12345); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	info, err := rt.Snapshot(ctx, spec.ID, dir, runtime.SnapshotOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fork := runtimetest.DefaultSpec(runtimetest.NewID())
	fork.IDMap = runtimetest.TestIDMap()
	for fork.IDMap.UIDBase == spec.IDMap.UIDBase {
		fork.IDMap = runtimetest.TestIDMap()
	}
	fork.Snapshot = &runtime.SnapshotSource{Dir: dir, Info: info}
	runtimetest.Start(t, rt, fork)
	o := filepath.Join(rt.sandboxDir(fork.ID), diskMountName, "workspace", "o")
	ub, gb := fork.IDMap.UIDBase, fork.IDMap.GIDBase
	for name, want := range map[string][3]uint32{"a": {ub + 1000, gb + 1000, 0o644}, "r": {ub, gb, 0o644}, "s": {ub + 1000, gb + 1000, 0o6755},
		"l": {ub + 1000, gb + 1000, 0o777}, "alien": {12345, 12345, 0o644}} {
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(o, name), &st); err != nil {
			t.Fatal(err)
		}
		if st.Uid != want[0] || st.Gid != want[1] || st.Mode&0o7777 != want[2] {
			t.Errorf("%s: %d:%d mode %o on the host, want %d:%d mode %o", name, st.Uid, st.Gid, st.Mode&0o7777, want[0], want[1], want[2])
		}
	}
}

// TestSnapshotSweepsSnapMounts: a snapshot mount left by a crash (SnapshotFiles never released)
// is removed when the runtime is next made.
func TestSnapshotSweepsSnapMounts(t *testing.T) {
	t.Parallel()
	rt := newRunc(t)
	ctx := context.Background()
	spec := runtimetest.DefaultSpec(runtimetest.NewID())
	runtimetest.Start(t, rt, spec)
	dir := t.TempDir()
	info, err := rt.Snapshot(ctx, spec.ID, dir, runtime.SnapshotOptions{})
	if err != nil {
		t.Fatal(err)
	}
	f, release, err := rt.SnapshotFiles(ctx, dir, info)
	if err != nil {
		t.Fatal(err)
	}
	_ = release // a crash: never called
	mnt := filepath.Dir(f.Trees[0].Dir)
	if !isMountPoint(mnt) {
		t.Fatalf("%s is not mounted", mnt)
	}
	rt2, err := New(ctx, Config{Root: rt.root, GuestBinary: guestBinary, CgroupParent: rt.cgroupParent})
	if err != nil {
		t.Fatal(err)
	}
	if !rt2.Capabilities().Available {
		t.Fatal(rt2.Capabilities().Reason)
	}
	if isMountPoint(mnt) {
		t.Errorf("New left the snapshot mount %s", mnt)
	}
	if _, err := os.Stat(mnt); err == nil {
		t.Errorf("New left the mount point %s", mnt)
	}
	if l := testenv.LeaksAfter(5*time.Second, dir); len(l) > 0 {
		t.Errorf("left: %v", l)
	}
	if ids, _ := rt.List(ctx); !slices.Equal(ids, []string{spec.ID}) {
		t.Errorf("List = %v, want only %s", ids, spec.ID)
	}
}

// TestShiftIDs: shiftIDs moves ids in the old range, leaves others, keeps setuid/setgid, never
// follows a symlink (one pointing out of the tree leaves its target alone), and shifts a file of
// two links once even when the ranges overlap.
func TestShiftIDs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to chown")
	}
	t.Parallel()
	root, outside := t.TempDir(), t.TempDir()
	target := filepath.Join(outside, "target")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(target, nil, 0o644))
	must(os.Lchown(target, 100, 100))
	must(os.MkdirAll(filepath.Join(root, "d", "e"), 0o755))
	must(os.WriteFile(filepath.Join(root, "d", "e", "f"), nil, 0o644))
	must(os.Link(filepath.Join(root, "d", "e", "f"), filepath.Join(root, "g")))
	must(os.WriteFile(filepath.Join(root, "s"), nil, 0o644))
	must(os.Chmod(filepath.Join(root, "s"), 0o755|os.ModeSetuid|os.ModeSetgid))
	must(os.WriteFile(filepath.Join(root, "out"), nil, 0o644))
	must(os.Symlink(target, filepath.Join(root, "l")))
	from := runtime.IDMap{UIDBase: 0, GIDBase: 0, Count: 65536}
	to := runtime.IDMap{UIDBase: 1000, GIDBase: 2000, Count: 65536} // overlapping ranges
	for _, p := range []string{"", "d", "d/e", "d/e/f", "s", "l"} {
		must(os.Lchown(filepath.Join(root, p), 100, 100))
	}
	must(os.Chmod(filepath.Join(root, "s"), 0o755|os.ModeSetuid|os.ModeSetgid))
	must(os.Lchown(filepath.Join(root, "out"), 70000, 70000))
	n, err := shiftIDs(context.Background(), root, from, to)
	if err != nil {
		t.Fatal(err)
	}
	if n != 8 {
		t.Errorf("visited %d inodes, want 8", n)
	}
	for p, want := range map[string][3]uint32{"": {1100, 2100, 0}, "d": {1100, 2100, 0}, "d/e/f": {1100, 2100, 0o644}, "g": {1100, 2100, 0o644},
		"s": {1100, 2100, 0o6755}, "l": {1100, 2100, 0}, "out": {70000, 70000, 0o644}} {
		var st unix.Stat_t
		must(unix.Lstat(filepath.Join(root, p), &st))
		if st.Uid != want[0] || st.Gid != want[1] || (want[2] != 0 && st.Mode&0o7777 != want[2]) {
			t.Errorf("%q: %d:%d %o, want %d:%d %o", p, st.Uid, st.Gid, st.Mode&0o7777, want[0], want[1], want[2])
		}
	}
	var st unix.Stat_t
	must(unix.Lstat(target, &st))
	if st.Uid != 100 {
		t.Errorf("the symlink's target outside the tree was chowned to %d", st.Uid)
	}
}

func guestRoot(script string) guest.ExecRequest {
	return guest.ExecRequest{Argv: []string{"sh", "-c", script}, User: "root", TimeoutMs: 60000}
}

// BenchmarkShiftIDs measures shiftIDs over 20,000 files in 200 directories on the state dir's
// file system (inodes/s): what a create from a snapshot under another id range pays per file.
func BenchmarkShiftIDs(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root to chown")
	}
	root := b.TempDir()
	for d := range 200 {
		dir := filepath.Join(root, "d"+strconv.Itoa(d))
		if err := os.Mkdir(dir, 0o755); err != nil {
			b.Fatal(err)
		}
		for f := range 100 {
			if err := os.WriteFile(filepath.Join(dir, strconv.Itoa(f)), nil, 0o644); err != nil {
				b.Fatal(err)
			}
		}
	}
	ranges := []runtime.IDMap{{Count: 65536}, {UIDBase: 1 << 20, GIDBase: 1 << 20, Count: 65536}}
	b.ResetTimer()
	var n int
	for i := 0; i < b.N; i++ {
		k, err := shiftIDs(context.Background(), root, ranges[i%2], ranges[(i+1)%2])
		if err != nil {
			b.Fatal(err)
		}
		n += k
	}
	b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "inodes/s")
}

// TestSnapshotReleaseWhileMountHeldElsewhere: a sleep (Release) whose disk is still held after
// the unmount by a copy of its mount in another mount namespace (made while the sandbox ran, as a
// concurrent create's or `ip netns exec`'s is) copies the synced image instead of failing with
// the sandbox already stopped (it failed, "still held by /dev/loopN", before), and the wake under
// the same id finds every write, the unsynced one too.
func TestSnapshotReleaseWhileMountHeldElsewhere(t *testing.T) {
	t.Parallel()
	rt := newRunc(t)
	ctx := context.Background()
	spec := runtimetest.DefaultSpec(runtimetest.NewID())
	spec.IDMap = runtimetest.TestIDMap()
	c := runtimetest.Start(t, rt, spec)
	if res := runtimetest.Exec(t, c, "sh", "-c", "echo kept > /workspace/f"); res.ExitCode != 0 {
		t.Fatal(res)
	}
	holder := exec.Command("unshare", "--mount", "--propagation", "private", "sleep", "300")
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	stopHolder := func() { _ = holder.Process.Kill(); _ = holder.Wait() }
	defer stopHolder()
	disk := filepath.Join(rt.sandboxDir(spec.ID), diskMountName)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		mi, _ := os.ReadFile("/proc/" + strconv.Itoa(holder.Process.Pid) + "/mountinfo")
		if strings.Contains(string(mi), disk) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the holder's namespace never showed the disk's mount")
		}
	}
	dir := t.TempDir()
	info, err := rt.Snapshot(ctx, spec.ID, dir, runtime.SnapshotOptions{Release: true})
	if err != nil {
		t.Fatalf("release while the disk is held elsewhere: %v", err)
	}
	stopHolder()
	if st, _ := rt.State(ctx, spec.ID); st != runtime.StatusAbsent {
		t.Errorf("after release the sandbox is %s, want absent", st)
	}
	wake := spec
	wake.Snapshot = &runtime.SnapshotSource{Dir: dir, Info: info, InPlace: true}
	c = runtimetest.Start(t, rt, wake)
	if res := runtimetest.Exec(t, c, "cat", "/workspace/f"); res.Stdout != "kept\n" {
		t.Errorf("after wake /workspace/f = %q (exit %d, %s), want kept", res.Stdout, res.ExitCode, res.Stderr)
	}
}
