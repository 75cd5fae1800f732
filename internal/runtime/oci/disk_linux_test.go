package oci

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/guest"
	"github.com/agentbox/agentbox/internal/runtime/runtimetest"
)

// allocated is the host space a file takes (its blocks, not its apparent size).
func allocated(t *testing.T, p string) int64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

func hostFree(t *testing.T, p string) int64 {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(p, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Bavail) * int64(st.Bsize)
}

// syncDisk writes the sandbox's dirty pages through to its image.
func syncDisk(t *testing.T, rt *Runtime, id string) {
	t.Helper()
	f, err := os.Open(filepath.Join(rt.sandboxDir(id), diskMountName))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		t.Fatal(err)
	}
}

func TestRuncDiskLayout(t *testing.T) {
	t.Parallel()
	rt := newRunc(t)
	id := runtimetest.NewID()
	spec := runtimetest.DefaultSpec(id)
	spec.DiskMB = 128
	c := runtimetest.Start(t, rt, spec)
	dir := rt.sandboxDir(id)

	var loop *loopDevice
	for _, l := range loopDevices() {
		if l.Backing == filepath.Join(dir, diskImageName) {
			loop = &l
		}
	}
	if loop == nil {
		t.Fatalf("no loop device backed by %s: %v", filepath.Join(dir, diskImageName), loopDevices())
	}
	dio, _ := os.ReadFile("/sys/block/" + filepath.Base(loop.Dev) + "/loop/dio")
	t.Logf("disk on %s (direct I/O %s)", loop.Dev, strings.TrimSpace(string(dio)))
	mps, err := mountPoints()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(mps, filepath.Join(dir, diskMountName)) {
		t.Fatalf("%s/disk not mounted", dir)
	}
	if ids, _ := rt.diskHolders(); !slices.Contains(ids, id) {
		t.Errorf("diskHolders %v lacks %s", ids, id)
	}
	if img := allocated(t, filepath.Join(dir, diskImageName)); img > 8<<20 {
		t.Errorf("a fresh 128 MiB image takes %d bytes on the host: not sparse", img)
	}
	for _, d := range []string{"workspace", "home"} {
		var st unix.Stat_t
		if err := unix.Stat(filepath.Join(dir, diskMountName, d), &st); err != nil || st.Uid != agentUID || st.Gid != agentGID {
			t.Errorf("%s: uid %d gid %d %v", d, st.Uid, st.Gid, err)
		}
	}
	if target, err := os.Readlink(filepath.Join(dir, "run")); err != nil || target != "disk/run" {
		t.Errorf("run symlink: %q %v", target, err)
	}
	// Inside: /workspace, /home/agent and /.agentbox/run are the one 128 MiB ext4 disk.
	res := runtimetest.Exec(t, c, "sh", "-c", "stat -f -c '%T %b %S' /workspace /home/agent /.agentbox/run; cat /proc/self/limits")
	lines := strings.Split(res.Stdout, "\n")
	for i, p := range []string{"/workspace", "/home/agent", "/.agentbox/run"} {
		f := strings.Fields(lines[i])
		if len(f) != 3 || f[0] != "ext2/ext3" {
			t.Fatalf("%s: %q", p, lines[i])
		}
		blocks, _ := strconv.ParseInt(f[1], 10, 64)
		bsize, _ := strconv.ParseInt(f[2], 10, 64)
		if size := blocks * bsize; size > 128<<20 || size < 100<<20 {
			t.Errorf("%s is %d bytes, want about 128 MiB", p, size)
		}
	}
	if !strings.Contains(res.Stdout, "Max file size             134217728            134217728") {
		t.Errorf("RLIMIT_FSIZE is not disk_mb:\n%s", res.Stdout)
	}
}

// TestRuncDiskFill: dd into /workspace stops with ENOSPC near disk_mb; the host gives no more
// than that; the sandbox still answers; a files-API write then fails with a clear error.
func TestRuncDiskFill(t *testing.T) {
	t.Parallel()
	testDiskFill(t, newRunc(t))
}

// TestGVisorDiskFill: under gVisor the workspace is the same host-mounted disk (the gofer
// writes it), so the same bound holds.
func TestGVisorDiskFill(t *testing.T) {
	t.Parallel()
	testDiskFill(t, newFlavor(t, FlavorGVisor))
}

func TestCrunDiskFill(t *testing.T) {
	t.Parallel()
	testDiskFill(t, newFlavor(t, FlavorCrun))
}

func testDiskFill(t *testing.T, rt *Runtime) {
	id := runtimetest.NewID()
	spec := runtimetest.DefaultSpec(id)
	spec.DiskMB = 64
	c := runtimetest.Start(t, rt, spec)
	img := filepath.Join(rt.sandboxDir(id), diskImageName)
	freeBefore := hostFree(t, rt.root)

	res := runtimetest.ExecRequest(t, c, guest.ExecRequest{Argv: []string{"dd", "if=/dev/zero", "of=/workspace/fill", "bs=1M"}, TimeoutMs: 120000})
	if res.ExitCode == 0 || !strings.Contains(res.Stderr, "No space left on device") {
		t.Fatalf("dd into a 64 MiB disk: %+v", res)
	}
	fi, err := c.Stat(context.Background(), "/workspace/fill")
	size := fi.Size
	if err != nil || size < 48<<20 || size > 64<<20 {
		t.Errorf("the file that filled the disk is %d bytes (%v), want 48–64 MiB", size, err)
	}
	// coreutils' stat and ls -l (statx with AT_NO_AUTOMOUNT, EINVAL under Debian's 2022 runsc).
	if res := runtimetest.Exec(t, c, "sh", "-c", "stat -c %s /workspace/fill && ls -l /workspace >/dev/null"); res.ExitCode != 0 || res.Stdout != fmt.Sprintf("%d\n", size) {
		t.Errorf("stat and ls -l inside: %+v, want %d", res, size)
	}
	syncDisk(t, rt, id)
	if a := allocated(t, img); a > 64<<20 {
		t.Errorf("the image takes %d bytes on the host, more than disk_mb", a)
	}
	// Other tests run in parallel: the bound is loose, but an unbounded dd would take it all.
	if used := freeBefore - hostFree(t, rt.root); used > 256<<20 {
		t.Errorf("the host lost %d MiB of free space to a 64 MiB disk", used>>20)
	}
	t.Logf("filled: file %d MiB, image %d MiB on the host", size>>20, allocated(t, img)>>20)
	// What a restarting server adds back to its disk budget: this disk, not the templates.
	if got, want := mustDisksMiB(t, rt), allocated(t, img)>>20; got != want || got < 48 {
		t.Errorf("DisksMiB %d, want the image's %d MiB", got, want)
	}

	if res := runtimetest.Exec(t, c, "echo", "alive"); res.Stdout != "alive\n" {
		t.Fatalf("sandbox unresponsive on a full disk: %+v", res)
	}
	ctx := context.Background()
	_, err = c.WriteFile(ctx, "/workspace/more.bin", 0o644, bytes.NewReader(make([]byte, 4<<20)))
	e, ok := errcode.As(err)
	if !ok || e.Code != errcode.FileTooLarge || !strings.Contains(e.Message, "disk_mb") || e.Details["reason"] != "disk_full" {
		t.Fatalf("files-API write into a full disk: %v", err)
	}
	t.Logf("files API: %s", e.Message)
	if _, err := c.Stat(ctx, "/workspace/more.bin"); !errcode.Is(err, errcode.FileNotFound) {
		t.Errorf("the failed write left a file: %v", err)
	}
	// Deleting frees the space again.
	runtimetest.Exec(t, c, "rm", "/workspace/fill")
	if _, err := c.WriteFile(ctx, "/workspace/more.bin", 0o644, bytes.NewReader(make([]byte, 4<<20))); err != nil {
		t.Fatalf("write after freeing space: %v", err)
	}
}

// TestRuncFileSizeLimit: RLIMIT_FSIZE (disk_mb) caps one file, also on /tmp (tmpfs).
func TestRuncFileSizeLimit(t *testing.T) {
	t.Parallel()
	testFileSizeLimit(t, newRunc(t))
}

func TestGVisorFileSizeLimit(t *testing.T) {
	t.Parallel()
	testFileSizeLimit(t, newFlavor(t, FlavorGVisor))
}

func testFileSizeLimit(t *testing.T, rt *Runtime) {
	spec := runtimetest.DefaultSpec(runtimetest.NewID())
	spec.DiskMB = 32
	spec.MemoryMB = 256 // /tmp is 128 MiB
	c := runtimetest.Start(t, rt, spec)
	res := runtimetest.Exec(t, c, "dd", "if=/dev/zero", "of=/tmp/big", "bs=1M", "count=48")
	if res.Signal != "SIGXFSZ" && !strings.Contains(res.Stderr, "File too large") {
		t.Fatalf("a 48 MiB file under a 32 MiB RLIMIT_FSIZE: %+v", res)
	}
	if fi, err := c.Stat(context.Background(), "/tmp/big"); err != nil || fi.Size != 32<<20 {
		t.Errorf("/tmp/big is %d bytes (%v), want exactly the limit", fi.Size, err)
	}
	runtimetest.Exec(t, c, "rm", "/tmp/big")
	// The agent writes uploads under the same limit; it ignores SIGXFSZ and reports EFBIG.
	_, err := c.WriteFile(context.Background(), "/tmp/upload", 0o644, io.LimitReader(zeros{}, 40<<20))
	if e, ok := errcode.As(err); !ok || e.Code != errcode.FileTooLarge || e.Details["reason"] != "file_size_limit" {
		t.Fatalf("a 40 MiB upload under a 32 MiB RLIMIT_FSIZE: %v", err)
	}
	if res := runtimetest.Exec(t, c, "echo", "alive"); res.Stdout != "alive\n" {
		t.Fatalf("agent gone after EFBIG: %+v", res)
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// TestRuncInodeExhaustion: creating files until the disk has no inodes left ends in ENOSPC
// inside the sandbox and nothing outside it.
func TestRuncInodeExhaustion(t *testing.T) {
	t.Parallel()
	rt := newRunc(t)
	spec := runtimetest.DefaultSpec(runtimetest.NewID())
	spec.DiskMB = 16
	c := runtimetest.Start(t, rt, spec)
	script := `import errno, os
os.mkdir("/workspace/many")
n = 0
try:
    while n < 1000000:
        open("/workspace/many/%d" % n, "w").close()
        n += 1
except OSError as e:
    print(n, errno.errorcode[e.errno])
`
	res := runtimetest.ExecRequest(t, c, guest.ExecRequest{Argv: []string{"python3", "-c", script}, TimeoutMs: 120000})
	f := strings.Fields(res.Stdout)
	if len(f) != 2 || f[1] != "ENOSPC" {
		t.Fatalf("inode exhaustion: %+v", res)
	}
	if n, _ := strconv.Atoi(f[0]); n > 4096 {
		t.Errorf("%d files fit a 16 MiB disk", n)
	}
	t.Logf("created %s files before ENOSPC", f[0])
	if res := runtimetest.Exec(t, c, "echo", "alive"); res.Stdout != "alive\n" {
		t.Fatalf("sandbox unresponsive without inodes: %+v", res)
	}
	_, err := c.WriteFile(context.Background(), "/workspace/x", 0o644, strings.NewReader("x"))
	if e, ok := errcode.As(err); !ok || e.Code != errcode.FileTooLarge || !strings.Contains(e.Message, "disk_mb") {
		t.Fatalf("files-API write without inodes: %v", err)
	}
}

// plantImage makes a formatted image at p the way Create does, without the runtime.
func plantImage(t *testing.T, rt *Runtime, p string) {
	t.Helper()
	tmpl, err := rt.disks.get(context.Background(), minDiskMB)
	if err != nil {
		t.Fatal(err)
	}
	if err := cloneSparse(tmpl, p, minDiskMB<<20); err != nil {
		t.Fatal(err)
	}
}

// losetup attaches p the way an older tool or a crashed process would: no autoclear.
func losetup(t *testing.T, p string) string {
	t.Helper()
	out, err := exec.Command("losetup", "--find", "--show", p).CombinedOutput()
	if err != nil {
		t.Fatalf("losetup %s: %v %s", p, err, out)
	}
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() { _ = clearLoop(dev) })
	return dev
}

// TestRuncDeleteOrphanDisks: ids that hold only a loop device, only a mount, a busy mount, or
// an image + loop device + mount with no container are listed, and Delete removes them without
// deleting anything through a mount.
func TestRuncDeleteOrphanDisks(t *testing.T) {
	t.Parallel()
	rt := newRunc(t)
	ctx := context.Background()
	if _, err := rt.ensureLayout(); err != nil {
		t.Fatal(err)
	}
	sandboxes := filepath.Join(rt.root, "sandboxes")

	// Only a loop device: its image and directory are gone (backing_file says "(deleted)").
	loopOnly := runtimetest.NewID()
	if err := os.Mkdir(filepath.Join(sandboxes, loopOnly), 0o711); err != nil {
		t.Fatal(err)
	}
	plantImage(t, rt, filepath.Join(sandboxes, loopOnly, diskImageName))
	loopDev := losetup(t, filepath.Join(sandboxes, loopOnly, diskImageName))
	if err := os.RemoveAll(filepath.Join(sandboxes, loopOnly)); err != nil {
		t.Fatal(err)
	}

	// Only a mount: a host directory bound at disk/, holding a canary Delete must not touch.
	mountOnly := runtimetest.NewID()
	canaryDir := t.TempDir()
	canary := filepath.Join(canaryDir, "canary")
	if err := os.WriteFile(canary, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	mnt := filepath.Join(sandboxes, mountOnly, diskMountName)
	if err := os.MkdirAll(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(canaryDir, mnt, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(mnt, unix.MNT_DETACH) })

	// A busy mount: a file on it stays open.
	busy := runtimetest.NewID()
	busyMnt := filepath.Join(sandboxes, busy, diskMountName)
	if err := os.MkdirAll(busyMnt, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", busyMnt, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(busyMnt, unix.MNT_DETACH) })
	held, err := os.Create(filepath.Join(busyMnt, "held"))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()

	// What a server killed mid-create leaves: image, loop device (no autoclear), mount.
	crashed := runtimetest.NewID()
	crashedDir := filepath.Join(sandboxes, crashed)
	if err := os.MkdirAll(filepath.Join(crashedDir, diskMountName), 0o700); err != nil {
		t.Fatal(err)
	}
	plantImage(t, rt, filepath.Join(crashedDir, diskImageName))
	crashedDev := losetup(t, filepath.Join(crashedDir, diskImageName))
	if err := unix.Mount(crashedDev, filepath.Join(crashedDir, diskMountName), "ext4", mountFlags, mountData); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(filepath.Join(crashedDir, diskMountName), unix.MNT_DETACH) })

	ids, err := rt.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{loopOnly, mountOnly, busy, crashed} {
		if !slices.Contains(ids, id) {
			t.Errorf("List %v lacks %s", ids, id)
		}
	}
	if holders, _ := rt.diskHolders(); !slices.Contains(holders, loopOnly) {
		t.Errorf("a loop device whose image is deleted is not found: %v (%v)", holders, loopDevices())
	}
	for _, id := range []string{loopOnly, mountOnly, busy, crashed} {
		start := time.Now()
		if err := rt.Delete(ctx, id); err != nil {
			t.Errorf("delete %s: %v", id, err)
		}
		t.Logf("delete %s took %v", id, time.Since(start))
		assertNoTrace(t, rt, id)
	}
	if b, err := os.ReadFile(canary); err != nil || string(b) != "keep" {
		t.Errorf("Delete removed files through a mount: %q %v", b, err)
	}
	for _, dev := range []string{loopDev, crashedDev} {
		// A detached device may at once be reused by another test's sandbox: only a backing
		// file under this runtime's root is a leftover.
		if b, err := os.ReadFile("/sys/block/" + filepath.Base(dev) + "/loop/backing_file"); err == nil {
			if strings.HasPrefix(strings.TrimSpace(string(b)), rt.root+"/") {
				t.Errorf("%s still attached to %s", dev, b)
			}
		} else if !errors.Is(err, os.ErrNotExist) {
			t.Error(err)
		}
	}
}

func TestDiskTemplatesBounded(t *testing.T) {
	t.Parallel()
	mkfs, err := findMkfs()
	if err != nil {
		t.Skip(err)
	}
	d := newDiskTemplates(filepath.Join(t.TempDir(), "t"), mkfs)
	ctx := context.Background()
	first, err := d.get(ctx, minDiskMB)
	if err != nil {
		t.Fatal(err)
	}
	for size := int64(minDiskMB + 1); size <= minDiskMB+maxDiskTemplates+2; size++ {
		if _, err := d.get(ctx, size); err != nil {
			t.Fatal(err)
		}
	}
	files, _ := filepath.Glob(filepath.Join(d.dir, "*.img"))
	if len(files) > maxDiskTemplates || len(d.entries) > maxDiskTemplates {
		t.Errorf("%d templates kept (%d entries), at most %d", len(files), len(d.entries), maxDiskTemplates)
	}
	if _, err := os.Stat(first); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the least recently used template %s was kept: %v", first, err)
	}
	// A copy from an evicted template gets a fresh one.
	again, err := d.get(ctx, minDiskMB)
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), "img")
	if err := cloneSparse(again, dst, minDiskMB<<20); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("e2fsck", "-n", "-f", dst).CombinedOutput(); err != nil {
		t.Errorf("e2fsck of a copied image: %v\n%s", err, out)
	}
}

// TestMountPointsUnescaped mounts a tmpfs on a path that mountinfo must escape (a space, a tab,
// a backslash) and checks that mountPoints reports it as it is, so that diskHolders finds a
// sandbox's disk under a state dir with such a name.
func TestMountPointsUnescaped(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount; CI runs as root")
	}
	mp := filepath.Join(t.TempDir(), "a b\tc\\d")
	if err := os.Mkdir(mp, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("abtest", mp, "tmpfs", 0, "size=64k"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(mp, unix.MNT_DETACH) })
	mps, err := mountPoints()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(mps, mp) {
		t.Fatalf("mountPoints does not list %q", mp)
	}
}

// TestRuncDiskLatency measures what the disk adds to a create — the template copy, the loop
// device, the mount and the directories on it — against whole creates (create → start → agent
// ready) timed in the same loop, so that both see the same load on a shared machine.
func TestRuncDiskLatency(t *testing.T) {
	rt := newRunc(t)
	ctx := context.Background()
	runtimetest.Start(t, rt, runtimetest.DefaultSpec(runtimetest.NewID())) // rootfs and template
	const n = 21
	var disk, remove, full []time.Duration
	for range n {
		id := runtimetest.NewID()
		dir := rt.sandboxDir(id)
		if err := os.Mkdir(dir, 0o711); err != nil {
			t.Fatal(err)
		}
		t0 := time.Now()
		if err := rt.makeDisk(ctx, dir, DefaultDiskMB); err != nil {
			t.Fatal(err)
		}
		if err := makeSandboxDirs(dir); err != nil {
			t.Fatal(err)
		}
		t1 := time.Now()
		if err := rt.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
		disk, remove = append(disk, t1.Sub(t0)), append(remove, time.Since(t1))

		id = runtimetest.NewID()
		t2 := time.Now()
		if _, err := rt.Create(ctx, runtimetest.DefaultSpec(id)); err != nil {
			t.Fatal(err)
		}
		if err := rt.Start(ctx, id); err != nil {
			t.Fatal(err)
		}
		c := runtimetest.Client(t, rt, id)
		rctx, cancel := context.WithTimeout(ctx, runtimetest.ReadyTimeout)
		err := c.WaitReady(rctx)
		cancel()
		c.Close()
		if err != nil {
			t.Fatal(err)
		}
		full = append(full, time.Since(t2))
		if err := rt.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	med := func(d []time.Duration) time.Duration { s := slices.Clone(d); slices.Sort(s); return s[len(s)/2] }
	t.Logf("median of %d, 1 GiB disk: disk %v of create→agent ready %v (%.1f%%); disk delete %v",
		n, med(disk), med(full), 100*float64(med(disk))/float64(med(full)), med(remove))
}
