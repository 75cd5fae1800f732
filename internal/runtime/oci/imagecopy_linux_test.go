package oci

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/runtimetest"
)

// TestCopyImage: copyImage copies a sparse image's data byte for byte, at the same offsets,
// leaves its holes holes, and refuses an existing destination; the file system here (the
// state dir's) has no reflinks on this host, so the extent copy is what runs.
func TestCopyImage(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	src, dst := filepath.Join(dir, "src.img"), filepath.Join(dir, "dst.img")
	const size = 64<<20 + 1000 // an unaligned end: its last chunk goes through the page cache
	f, err := os.OpenFile(src, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	// Extents: a page at 0; 3.5 MiB across chunk boundaries from an unaligned offset; an odd
	// length; the image's last bytes.
	for _, e := range [][2]int64{{0, 4096}, {5<<20 + 512, 7 << 19}, {20 << 20, 12345}, {size - 100, 100}} {
		b := make([]byte, e[1])
		if _, err := rand.Read(b); err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt(b, e[0]); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	direct, err := copyImageDirect(src, dst, size)
	if err != nil {
		t.Fatalf("copyImage: %v", err)
	}
	// ext4 here: every chunk, widened to whole 4 KiB blocks, goes straight to the device but
	// the unaligned last one (the image's end), which goes through the page cache.
	if want := int64(4096 + (7<<19 + 4096) + 16384); direct != want {
		t.Errorf("%d bytes written with direct I/O, want %d", direct, want)
	}
	a, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(dst)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, b) {
		t.Fatal("the copy differs from the image")
	}
	var sst, dstt unix.Stat_t
	if err := unix.Stat(src, &sst); err != nil {
		t.Fatal(err)
	}
	if err := unix.Stat(dst, &dstt); err != nil {
		t.Fatal(err)
	}
	if dstt.Size != size || dstt.Mode&0o777 != 0o600 {
		t.Errorf("copy size %d mode %o, want %d 600", dstt.Size, dstt.Mode&0o777, size)
	}
	// A reflink shares blocks; a data copy allocates what the source's extents hold, not the
	// holes between them (a few blocks of slack for the file system's own allocation).
	if dstt.Blocks > sst.Blocks+64 {
		t.Errorf("the copy holds %d blocks, the image %d: holes were filled", dstt.Blocks, sst.Blocks)
	}
	if err := copyImage(src, dst, size); !errors.Is(err, fs.ErrExist) {
		t.Errorf("copy onto an existing file: %v, want it to exist already", err)
	}
}

// TestSnapshotFreezerConverges: a files snapshot of a runc or crun sandbox freezes its cgroup itself
// (pauseForCopy) with the paused marker written first; the runtime sees the sandbox paused,
// and a server killed before the thaw (the marker left) has the sandbox thawed by Adopt's
// resumeIfPaused. The thaw of a live server removes the marker.
func TestSnapshotFreezerConverges(t *testing.T) {
	t.Parallel()
	t.Run("runc", func(t *testing.T) { t.Parallel(); testFreezerConverges(t, newRunc(t)) })
	t.Run("crun", func(t *testing.T) { t.Parallel(); testFreezerConverges(t, newFlavor(t, FlavorCrun)) })
}

func testFreezerConverges(t *testing.T, rt *Runtime) {
	ctx := context.Background()
	spec := runtimetest.DefaultSpec(runtimetest.NewID())
	spec.IDMap = runtimetest.TestIDMap()
	runtimetest.Start(t, rt, spec)
	ref, _ := rt.initOf(spec.ID)
	if _, ok := rt.freezerOf(spec.ID, ref.pid); !ok {
		t.Fatal("no freezer cgroup holds the sandbox's init")
	}
	marker := filepath.Join(rt.sandboxDir(spec.ID), pausedMarker)
	status := func() string {
		t.Helper()
		st, err := rt.rawStatus(ctx, spec.ID)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	thaw, err := rt.pauseForCopy(ctx, spec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if st := status(); st != "paused" || !rt.frozen(spec.ID) {
		t.Fatalf("after pauseForCopy runc says %s (frozen %v), want paused", st, rt.frozen(spec.ID))
	}
	if _, err := os.Stat(marker); err != nil {
		t.Fatalf("no paused marker while frozen: %v", err)
	}
	if err := thaw(ctx); err != nil {
		t.Fatal(err)
	}
	if st := status(); st != "running" {
		t.Fatalf("after the thaw runc says %s, want running", st)
	}
	if _, err := os.Stat(marker); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the paused marker outlived the thaw: %v", err)
	}
	// The server dies frozen: only the marker and the frozen cgroup are left.
	if _, err := rt.pauseForCopy(ctx, spec.ID); err != nil {
		t.Fatal(err)
	}
	if err := rt.resumeIfPaused(ctx, spec.ID); err != nil {
		t.Fatalf("resumeIfPaused: %v", err)
	}
	if st := status(); st != "running" || rt.frozen(spec.ID) {
		t.Fatalf("after resumeIfPaused runc says %s (frozen %v), want running", st, rt.frozen(spec.ID))
	}
	if st, err := rt.State(ctx, spec.ID); err != nil || st != runtime.StatusRunning {
		t.Errorf("State %s %v, want running", st, err)
	}
}

// TestPendingWrites: a sandbox disk with data written and not yet placed has pending writes;
// after a syncfs it has none.
func TestPendingWrites(t *testing.T) {
	t.Parallel()
	rt := newRunc(t)
	spec := runtimetest.DefaultSpec(runtimetest.NewID())
	runtimetest.Start(t, rt, spec)
	disk := filepath.Join(rt.sandboxDir(spec.ID), diskMountName)
	if err := syncFS(disk); err != nil {
		t.Fatal(err)
	}
	if pendingWrites(disk) {
		t.Error("a synced disk has pending writes")
	}
	if err := os.WriteFile(filepath.Join(disk, "pending"), make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	if !pendingWrites(disk) {
		t.Error("1 MiB written and not synced: no pending writes")
	}
	if err := syncFS(disk); err != nil {
		t.Fatal(err)
	}
	if pendingWrites(disk) {
		t.Error("pending writes after a syncfs")
	}
	if !pendingWrites(t.TempDir() + "/absent") {
		t.Error("an unknown file system must count as having pending writes")
	}
}

// TestForkCopyTurns: disks from snapshots are copied forkCopySlots at a time; a create waiting
// for its turn gives up with its context.
func TestForkCopyTurns(t *testing.T) {
	var held []func()
	for range forkCopySlots {
		release, err := acquireForkCopy(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, release)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := acquireForkCopy(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a copy past the slots: %v, want it to wait until its deadline", err)
	}
	held[0]()
	release, err := acquireForkCopy(context.Background())
	if err != nil {
		t.Fatalf("after a release: %v", err)
	}
	release()
	for _, r := range held[1:] {
		r()
	}
}
