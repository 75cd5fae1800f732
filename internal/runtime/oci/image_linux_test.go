package oci

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/guest"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/runtimetest"
	"github.com/agentbox/agentbox/internal/testenv"
)

// euidSource prints the real and effective uid: installed setuid root in the test image.
const euidSource = `#include <stdio.h>
#include <unistd.h>
int main(void) { printf("%d %d\n", (int)getuid(), (int)geteuid()); return 0; }
`

var (
	euidOnce sync.Once
	euidBin  string
	euidErr  error
)

// euidBinary compiles euidSource statically, once.
func euidBinary(t *testing.T) string {
	euidOnce.Do(func() {
		dir, err := os.MkdirTemp("", "abeuid")
		if err != nil {
			euidErr = err
			return
		}
		src := filepath.Join(dir, "euid.c")
		if euidErr = os.WriteFile(src, []byte(euidSource), 0o644); euidErr != nil {
			return
		}
		euidBin = filepath.Join(dir, "euid")
		if out, err := exec.Command("gcc", "-static", "-O2", "-o", euidBin, src).CombinedOutput(); err != nil {
			euidErr = fmt.Errorf("gcc -static: %v: %s", err, out)
		}
	})
	if euidErr != nil {
		t.Fatalf("cannot build the setuid test program (gcc is installed by make deps): %v", euidErr)
	}
	return euidBin
}

// busyboxApplets are linked to /bin/busybox in the test image.
var busyboxApplets = []string{"sh", "id", "ls", "stat", "cat", "echo", "test", "mkdir", "cp", "dd", "touch", "pwd", "env", "rm", "sync", "true"}

// buildTestLayers makes a two-layer image in overlayfs format under dir (0700): layer 0 has
// busybox, its applets, /etc/passwd, /etc/hidden and /etc/opq/a; layer 1 whites out
// /etc/hidden (a 0:0 character device), makes /etc/opq opaque with only b in it, and adds
// /bin/euid setuid root.
func buildTestLayers(t *testing.T, dir string) []string {
	t.Helper()
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Fatalf("busybox-static is needed (make deps installs it): %v", err)
	}
	euid, err := os.ReadFile(euidBinary(t))
	if err != nil {
		t.Fatal(err)
	}
	l0, l1 := filepath.Join(dir, "0"), filepath.Join(dir, "1")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	write := func(p string, data []byte, mode os.FileMode) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(l0, "bin/busybox"), bb, 0o755)
	for _, a := range busyboxApplets {
		if err := os.Symlink("busybox", filepath.Join(l0, "bin", a)); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(l0, "etc/passwd"), []byte("root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000:user:/home/user:/bin/sh\n"), 0o644)
	write(filepath.Join(l0, "etc/group"), []byte("root:x:0:\nuser:x:1000:\n"), 0o644)
	write(filepath.Join(l0, "etc/hidden"), []byte("hidden\n"), 0o644)
	write(filepath.Join(l0, "etc/opq/a"), []byte("a\n"), 0o644)
	if err := os.MkdirAll(filepath.Join(l0, "usr/local"), 0o755); err != nil {
		t.Fatal(err)
	}
	write(filepath.Join(l1, "etc/opq/b"), []byte("b\n"), 0o644)
	if err := unix.Mknod(filepath.Join(l1, "etc/hidden"), unix.S_IFCHR|0o000, 0); err != nil {
		t.Fatal(err)
	}
	if err := unix.Lsetxattr(filepath.Join(l1, "etc/opq"), "trusted.overlay.opaque", []byte("y"), 0); err != nil {
		t.Fatal(err)
	}
	write(filepath.Join(l1, "bin/euid"), euid, 0o755)
	if err := os.Chmod(filepath.Join(l1, "bin/euid"), 0o4755|os.ModeSetuid); err != nil {
		t.Fatal(err)
	}
	return []string{l0, l1}
}

// treeDigest describes every entry under dir (type, mode, owner, size, content, link target,
// device, overlay xattrs, mtime) as one string, to tell that nothing in it changed.
func treeDigest(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		fmt.Fprintf(&b, "%s %o %d:%d %d %d %d.%d", strings.TrimPrefix(p, dir), st.Mode, st.Uid, st.Gid, st.Size, st.Rdev, st.Mtim.Sec, st.Mtim.Nsec)
		if d.Type().IsRegular() {
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			sum := sha256.Sum256(data)
			b.WriteString(" " + hex.EncodeToString(sum[:]))
		}
		if d.Type()&fs.ModeSymlink != 0 {
			target, _ := os.Readlink(p)
			b.WriteString(" -> " + target)
		}
		buf := make([]byte, 64)
		if n, err := unix.Lgetxattr(p, "trusted.overlay.opaque", buf); err == nil {
			b.WriteString(" opaque=" + string(buf[:n]))
		}
		b.WriteByte('\n')
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func TestImageRootfs(t *testing.T) {
	t.Parallel()
	for _, f := range []Flavor{FlavorRunc, FlavorCrun, FlavorGVisor} {
		t.Run(string(f), func(t *testing.T) {
			t.Parallel()
			testImageRootfs(t, newFlavor(t, f))
		})
	}
}

func testImageRootfs(t *testing.T, rt *Runtime) {
	if c := rt.Capabilities(); !containsStr(c.Images, runtime.ImageOCI) {
		t.Fatalf("Capabilities.Images %v lacks %q: %s", c.Images, runtime.ImageOCI, c.OCIImageReason)
	}
	layers := buildTestLayers(t, filepath.Join(rt.root, "layers"))
	before := treeDigest(t, filepath.Dir(layers[0]))
	m := runtimetest.TestIDMap()
	spec := runtimetest.DefaultSpec(runtimetest.NewID())
	spec.Image, spec.IDMap, spec.DiskMB = "test/busybox:1", m, 64
	spec.Rootfs = &runtime.Rootfs{Layers: layers, User: "user", Workdir: "/etc"}
	spec.Env = map[string]string{"PATH": "/usr/local/bin:/bin"}
	c := runtimetest.Start(t, rt, spec)
	root := func(argv ...string) runtimetest.Result {
		return runtimetest.ExecRequest(t, c, guest.ExecRequest{Argv: argv, User: "root", TimeoutMs: 60000})
	}
	want := func(res runtimetest.Result, stdout string) {
		t.Helper()
		if res.ExitCode != 0 || strings.TrimSpace(res.Stdout) != stdout {
			t.Errorf("%s, want stdout %q", res, stdout)
		}
	}
	// The image's user, workdir and PATH; the image's files as root's.
	want(runtimetest.Exec(t, c, "id", "-u"), "1000")
	want(runtimetest.Exec(t, c, "pwd"), "/etc")
	want(runtimetest.Exec(t, c, "sh", "-c", "echo $PATH"), "/usr/local/bin:/bin")
	want(root("stat", "-c", "%u:%g %a", "/bin/busybox"), "0:0 755")
	if res := runtimetest.Exec(t, c, "ls", "/"); res.ExitCode != 0 || !strings.Contains(res.Stdout, "bin") || !strings.Contains(res.Stdout, "workspace") {
		t.Errorf("ls /: %s", res)
	}
	// Whiteout and opaque directory.
	if res := runtimetest.Exec(t, c, "test", "-e", "/etc/hidden"); res.ExitCode == 0 {
		t.Errorf("/etc/hidden is visible through its whiteout")
	}
	want(runtimetest.Exec(t, c, "ls", "/etc/opq"), "b")
	// A setuid-root binary of a layer works for the image's user.
	// (gVisor's sentry does not honour setuid bits at all: google/gvisor#5299.)
	wantEUID := "1000 0"
	if rt.flavor == FlavorGVisor {
		wantEUID = "1000 1000"
	}
	want(runtimetest.Exec(t, c, "/bin/euid"), wantEUID)
	// The agent's binary stays read-only, the layers are not the sandbox's to write.
	if res := root("touch", guestBinaryPath); res.ExitCode == 0 {
		t.Errorf("the agent binary is writable")
	}
	if res := runtimetest.Exec(t, c, "touch", "/etc/user-write"); res.ExitCode == 0 {
		t.Errorf("the image's user wrote root's /etc")
	}
	// Root writes /etc and /usr/local/bin: into the writable layer, as base+n on the host.
	want(root("sh", "-c", "echo new > /etc/new && mkdir -p /usr/local/bin && cp /bin/busybox /usr/local/bin/busybox && echo ok"), "ok")
	want(runtimetest.Exec(t, c, "/usr/local/bin/busybox", "echo", "from-usr-local"), "from-usr-local")
	upper := filepath.Join(rt.sandboxDir(spec.ID), diskMountName, diskRootfsDir, "upper")
	for _, p := range []string{"etc/new", "usr/local/bin/busybox"} {
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(upper, p), &st); err != nil {
			t.Errorf("%s is not in the writable layer: %v", p, err)
		} else if st.Uid != m.UIDBase || st.Gid != m.GIDBase {
			t.Errorf("%s is %d:%d on the host, want the sandbox's root %d", p, st.Uid, st.Gid, m.UIDBase)
		}
	}
	wl, err := rt.WritableLayer(context.Background(), spec.ID)
	if err != nil || wl.Dir != upper || wl.IDMap != m || !containsStr(wl.Exclude, guestBinaryPath) || !containsStr(wl.Exclude, "/workspace") || !containsStr(wl.Exclude, "/proc") {
		t.Errorf("WritableLayer: %+v %v", wl, err)
	}
	// A second sandbox of the same layers sees none of it.
	spec2 := runtimetest.DefaultSpec(runtimetest.NewID())
	spec2.Image, spec2.IDMap, spec2.Rootfs = spec.Image, runtimetest.TestIDMap(), &runtime.Rootfs{Layers: layers}
	c2 := runtimetest.Start(t, rt, spec2)
	want(runtimetest.Exec(t, c2, "id", "-u"), "0") // no user: root
	if res := runtimetest.Exec(t, c2, "test", "-e", "/etc/new"); res.ExitCode == 0 {
		t.Errorf("the second sandbox sees the first's /etc/new")
	}
	// The writable layer counts against disk_mb.
	res := root("dd", "if=/dev/zero", "of=/big", "bs=1M", "count=100")
	if res.ExitCode == 0 || !strings.Contains(res.Stderr, "No space left") {
		t.Errorf("dd past disk_mb into /: %s", res)
	}
	// The layers are closed to other host users.
	cmd := exec.Command("/bin/busybox", "stat", filepath.Join(layers[1], "bin/euid"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	if out, err := cmd.CombinedOutput(); err == nil {
		t.Errorf("host user nobody reaches a layer's setuid file: %s", out)
	}
	for _, id := range []string{spec.ID, spec2.ID} {
		if err := rt.Delete(context.Background(), id); err != nil {
			t.Fatal(err)
		}
		if leaks := testenv.Leaks(id); len(leaks) > 0 {
			t.Errorf("after Delete of %s: %v", id, leaks)
		}
		if _, err := rt.WritableLayer(context.Background(), id); errcode.Of(err) != errcode.SandboxNotFound {
			t.Errorf("WritableLayer after Delete: %v", err)
		}
	}
	if after := treeDigest(t, filepath.Dir(layers[0])); after != before {
		t.Errorf("the layers changed:\nbefore\n%s\nafter\n%s", before, after)
	}
}

func containsStr(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// TestImageRootfsInvalid: bad layers are INVALID_ARGUMENT and leave nothing behind.
func TestImageRootfsInvalid(t *testing.T) {
	t.Parallel()
	rt := newRunc(t)
	file := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	many := make([]string, runtime.MaxRootfsLayers+1)
	for i := range many {
		many[i] = "/"
	}
	for name, rf := range map[string]*runtime.Rootfs{
		"none":     {},
		"too many": {Layers: many},
		"relative": {Layers: []string{"layers/0"}},
		"unclean":  {Layers: []string{"/tmp/../tmp"}},
		"missing":  {Layers: []string{"/nonexistent-layer"}},
		"file":     {Layers: []string{file}},
		"colon":    {Layers: []string{"/tmp/a:b"}},
		"workdir":  {Layers: []string{"/tmp"}, Workdir: "rel"},
	} {
		spec := runtimetest.DefaultSpec(runtimetest.NewID())
		spec.Image, spec.Rootfs = "x:1", rf
		if _, err := rt.Create(context.Background(), spec); errcode.Of(err) != errcode.InvalidArgument {
			t.Errorf("%s: %v, want INVALID_ARGUMENT", name, err)
		}
		if _, err := os.Stat(rt.sandboxDir(spec.ID)); err == nil {
			t.Errorf("%s: the sandbox's dir was made", name)
		}
	}
	spec := runtimetest.DefaultSpec(runtimetest.NewID())
	spec.Image = "python:3.12"
	if _, err := rt.Create(context.Background(), spec); errcode.Of(err) != errcode.InvalidArgument || !strings.Contains(err.Error(), "no rootfs layers") {
		t.Errorf("an OCI image without layers: %v", err)
	}
}

// TestImageRootfsCrashConverges: a sandbox whose container is gone (a crash between Delete's
// steps, or during create) but whose root and lowers are still mounted is listed, and Delete
// removes it all.
func TestImageRootfsCrashConverges(t *testing.T) {
	t.Parallel()
	rt := newRunc(t)
	layers := buildTestLayers(t, filepath.Join(rt.root, "layers"))
	spec := runtimetest.DefaultSpec(runtimetest.NewID())
	spec.Image, spec.IDMap, spec.Rootfs = "test/busybox:1", runtimetest.TestIDMap(), &runtime.Rootfs{Layers: layers}
	c := runtimetest.Start(t, rt, spec)
	runtimetest.Exec(t, c, "true")
	ctx := context.Background()
	if _, err := rt.command(ctx, "delete", "--force", spec.ID); err != nil {
		t.Fatal(err)
	}
	// What is left: the overlay, its lowers, the disk, no container and no spec.
	if err := os.Remove(filepath.Join(rt.sandboxDir(spec.ID), "config.json")); err != nil {
		t.Fatal(err)
	}
	if leaks := testenv.Leaks(spec.ID); len(leaks) == 0 {
		t.Fatal("testenv.Leaks sees no mount of the sandbox")
	}
	ids, err := rt.List(ctx)
	if err != nil || !containsStr(ids, spec.ID) {
		t.Fatalf("List %v %v: the sandbox holding mounts is not listed", ids, err)
	}
	if err := rt.Delete(ctx, spec.ID); err != nil {
		t.Fatal(err)
	}
	if err := rt.Delete(ctx, spec.ID); err != nil {
		t.Fatalf("second Delete: %v", err)
	}
	if leaks := testenv.Leaks(spec.ID); len(leaks) > 0 {
		t.Errorf("after Delete: %v", leaks)
	}
}
