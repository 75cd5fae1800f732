package e2e

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/testenv"
	"github.com/agentbox/agentbox/internal/wire"
)

func freeBytes(t *testing.T, p string) int64 {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(p, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Bavail) * int64(st.Bsize)
}

// TestDiskBoundedAcrossRestart: a sandbox's disk_mb holds against dd through the REST API; the
// files API then says the disk is full; a killed and restarted server adopts the sandbox with
// its disk (content intact) and sweeps an orphaned image, loop device and mount at start;
// destroy leaves no loop device, mount or image.
func TestDiskBoundedAcrossRestart(t *testing.T) {
	testenv.RequireRoot(t)
	dir := testenv.ShortTempDir(t, "abe2e")
	s := startServer(t, dir)
	ctx := context.Background()
	c := s.client()
	sb, err := c.Create(ctx, wire.CreateRequest{DiskMB: 64})
	if err != nil {
		t.Fatal(err)
	}
	if sb.DiskMB != 64 {
		t.Fatalf("disk_mb %d", sb.DiskMB)
	}
	if res, err := c.Exec(ctx, sb.ID, apiExec("sh", "-c", "echo kept > /workspace/marker"), nil); err != nil || res.ExitCode != 0 {
		t.Fatalf("%+v %v", res, err)
	}
	free := freeBytes(t, dir)
	res, err := c.Exec(ctx, sb.ID, apiExec("dd", "if=/dev/zero", "of=/workspace/fill", "bs=1M"), nil)
	if err != nil || res.ExitCode == 0 || !strings.Contains(res.Stderr, "No space left on device") {
		t.Fatalf("dd into a 64 MiB disk: %+v %v", res, err)
	}
	if res, err := c.Exec(ctx, sb.ID, apiExec("sync"), nil); err != nil || res.ExitCode != 0 {
		t.Fatalf("sync: %+v %v", res, err)
	}
	if used := free - freeBytes(t, dir); used > 128<<20 {
		t.Errorf("the host lost %d MiB to a 64 MiB disk", used>>20)
	}
	_, err = c.WriteFile(ctx, sb.ID, "/workspace/more.txt", 0o644, bytes.NewReader(make([]byte, 4<<20)))
	if e, ok := errcode.As(err); !ok || e.Code != errcode.FileTooLarge || !strings.Contains(e.Message, "disk_mb") {
		t.Fatalf("files-API write into a full disk: %v", err)
	}

	s.kill()
	// While the server is down, plant what a crash in the middle of a create leaves.
	orphan := sandbox.NewID()
	odir := filepath.Join(dir, "runtimes", "runc", "sandboxes", orphan)
	if err := os.MkdirAll(filepath.Join(odir, "disk"), 0o700); err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(odir, "disk.img")
	for _, argv := range [][]string{{"truncate", "-s", "16M", img}, {"mkfs.ext4", "-q", "-F", img}} {
		if out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v %s", argv, err, out)
		}
	}
	out, err := exec.Command("losetup", "--find", "--show", img).CombinedOutput()
	if err != nil {
		t.Fatalf("losetup: %v %s", err, out)
	}
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() { _ = exec.Command("losetup", "-d", dev).Run() })
	if err := unix.Mount(dev, filepath.Join(odir, "disk"), "ext4", 0, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(filepath.Join(odir, "disk"), unix.MNT_DETACH) })

	s2 := startServer(t, dir)
	c2 := s2.client()
	if got, err := c2.Get(ctx, sb.ID); err != nil || got.State != wire.StateRunning {
		t.Fatalf("after restart: %+v %v\n%s", got, err, s2.Logs)
	}
	if res, err := c2.Exec(ctx, sb.ID, apiExec("cat", "/workspace/marker"), nil); err != nil || res.Stdout != "kept\n" {
		t.Fatalf("workspace after restart: %+v %v", res, err)
	}
	if leaks := testenv.Leaks(orphan); len(leaks) > 0 {
		t.Errorf("orphan not swept at start:\n%s\nserver log:\n%s", strings.Join(leaks, "\n"), s2.Logs)
	}
	if _, err := os.Stat(odir); !os.IsNotExist(err) {
		t.Errorf("orphan dir left: %v", err)
	}
	if _, err := c2.Destroy(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	s2.stop()
	assertHostClean(t, dir, []string{sb.ID, orphan})
}
