package sandbox_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/testenv"
)

// plantDisk leaves what a server killed in the middle of a create may leave of a sandbox's
// disk: an ext4 image under sandboxes/<id>/, a loop device on it (attached without autoclear,
// as losetup does) and, when mount is set, the mount at disk/.
func plantDisk(t *testing.T, root, id string, mount bool) (dev string) {
	t.Helper()
	dir := filepath.Join(root, "sandboxes", id)
	if err := os.MkdirAll(filepath.Join(dir, "disk"), 0o700); err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(dir, "disk.img")
	if out, err := exec.Command("truncate", "-s", "16M", img).CombinedOutput(); err != nil {
		t.Fatalf("truncate: %v %s", err, out)
	}
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", img).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v %s", err, out)
	}
	out, err := exec.Command("losetup", "--find", "--show", img).CombinedOutput()
	if err != nil {
		t.Fatalf("losetup: %v %s", err, out)
	}
	dev = strings.TrimSpace(string(out))
	t.Cleanup(func() {
		if b, err := os.ReadFile("/sys/block/" + filepath.Base(dev) + "/loop/backing_file"); err == nil && strings.Contains(string(b), id) {
			_ = exec.Command("losetup", "-d", dev).Run()
		}
	})
	if mount {
		mnt := filepath.Join(dir, "disk")
		if err := unix.Mount(dev, mnt, "ext4", 0, ""); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = unix.Unmount(mnt, unix.MNT_DETACH) })
	}
	return dev
}

// TestReconcileSweepsOrphanDisks: reconcile (and the minute sweep, which shares its code)
// removes images, loop devices and mounts that no record owns, and leaves a live sandbox's.
func TestReconcileSweepsOrphanDisks(t *testing.T) {
	e := newEnv(t, sandbox.Config{})
	ctx := context.Background()
	keep := e.create(t, sandbox.CreateRequest{DiskMB: 64})
	if r := e.exec(t, keep.ID, argv("sh", "-c", "echo data > /workspace/kept")); r.ExitCode != 0 {
		t.Fatalf("%+v", r)
	}
	full := sandbox.NewID()
	plantDisk(t, e.root, full, true)
	// Only a loop device: the image and its directory are gone.
	loopOnly := sandbox.NewID()
	plantDisk(t, e.root, loopOnly, false)
	if err := os.RemoveAll(filepath.Join(e.root, "sandboxes", loopOnly)); err != nil {
		t.Fatal(err)
	}
	if leaks := testenv.Leaks(full, loopOnly); len(leaks) < 3 {
		t.Fatalf("planted orphans not seen by testenv.Leaks: %v", leaks)
	}

	if err := e.svc.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if leaks := testenv.Leaks(full, loopOnly); len(leaks) > 0 {
		t.Errorf("orphans left after reconcile:\n%s", strings.Join(leaks, "\n"))
	}
	if _, err := os.Stat(filepath.Join(e.root, "sandboxes", full)); !os.IsNotExist(err) {
		t.Errorf("orphan dir left: %v", err)
	}
	if r := e.exec(t, keep.ID, argv("cat", "/workspace/kept")); r.Stdout != "data\n" {
		t.Fatalf("the live sandbox's disk after reconcile: %+v", r)
	}
	if leaks := testenv.Leaks(keep.ID); len(leaks) == 0 {
		t.Error("the live sandbox holds no mount or loop device")
	}
}
