package image_test

import (
	"bytes"
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/image"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/testenv"
	"github.com/agentbox/agentbox/internal/testenv/imagelab"
)

func TestImport(t *testing.T) {
	testenv.RequireRoot(t)
	ctx := context.Background()
	img := imagelab.WithLayer(t, imagelab.Busybox(t), imagelab.Reg("etc/imported", "yes", 0o644))
	s := open(t, t.TempDir(), image.Options{})
	got, err := s.Import(ctx, bytes.NewReader(imagelab.DockerSave(t, img, "example.com/lab/saved:1")), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Ref != "example.com/lab/saved:1" || len(got[0].Layers) != 2 {
		t.Fatalf("imported %+v", got)
	}
	byName, err := s.Get(ctx, "example.com/lab/saved:1")
	if err != nil || byName.Digest != got[0].Digest {
		t.Fatal(byName, err)
	}
	dirs, _ := s.LayerDirs(ctx, byName)
	if b, err := os.ReadFile(filepath.Join(dirs[1], "etc/imported")); err != nil || string(b) != "yes" {
		t.Fatalf("etc/imported: %q %v", b, err)
	}
	// An OCI layout tarball of the same image: the same digest.
	want, _ := img.Digest()
	s2 := open(t, t.TempDir(), image.Options{})
	got2, err := s2.Import(ctx, bytes.NewReader(imagelab.OCILayout(t, img, "example.com/lab/layout:2")), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(got2) != 1 || got2[0].Digest != want.String() || got2[0].Ref != "example.com/lab/layout:2" {
		t.Fatalf("layout import %+v; want digest %s", got2, want)
	}
	_, err = s2.Import(ctx, bytes.NewReader([]byte("not a tarball at all")), nil)
	wantErr(t, err, errcode.InvalidArgument, "")
	if e, _ := os.ReadDir(filepath.Join(s2.Dir(), "tmp")); len(e) != 0 {
		t.Fatalf("tmp/ keeps %d entries", len(e))
	}
}

// upper makes an overlayfs upper directory as a sandbox with ids shifted by base leaves it.
func upper(t *testing.T, base uint32) string {
	t.Helper()
	d := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	os.Chown(d, int(base), int(base))
	for _, dir := range []string{"etc", "usr", "usr/local", "usr/local/bin", "home", "home/agent", "tmp", ".agentbox", "bin"} {
		must(os.Mkdir(filepath.Join(d, dir), 0o755))
		must(os.Lchown(filepath.Join(d, dir), int(base), int(base)))
	}
	must(os.Lchown(filepath.Join(d, "home/agent"), int(base)+1000, int(base)+1000))
	must(unix.Setxattr(filepath.Join(d, "usr/local"), "trusted.overlay.opaque", []byte("y"), 0))
	w := func(p, body string, mode os.FileMode, uid int) {
		must(os.WriteFile(filepath.Join(d, p), []byte(body), mode))
		must(os.Lchown(filepath.Join(d, p), int(base)+uid, int(base)+uid))
		must(os.Chmod(filepath.Join(d, p), mode))
	}
	w("etc/motd", "hello from a template\n", 0o644, 0)
	w("home/agent/notes", "agent's\n", 0o600, 1000)
	w("usr/local/bin/new", "#!/bin/sh\necho new\n", 0o755, 0)
	w("bin/suid", "x", 0o4755|os.ModeSetuid, 0)
	w("tmp/scratch", "never committed", 0o644, 0)
	w(".agentbox/sock-ish", "never committed", 0o644, 0)
	must(os.Link(filepath.Join(d, "etc/motd"), filepath.Join(d, "etc/motd.link")))
	must(unix.Mknod(filepath.Join(d, "etc/group"), unix.S_IFCHR, 0)) // a whiteout
	must(os.Lchown(filepath.Join(d, "etc/group"), int(base), int(base)))
	must(os.Symlink("motd", filepath.Join(d, "etc/motd.sym")))
	must(os.Lchown(filepath.Join(d, "etc/motd.sym"), int(base), int(base)))
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(d, "home/agent/sock"), Net: "unix"})
	must(err)
	ln.SetUnlinkOnClose(false)
	ln.Close()
	os.Lchown(filepath.Join(d, "home/agent/sock"), int(base), int(base))
	return d
}

func TestCommitPushPull(t *testing.T) {
	testenv.RequireRoot(t)
	ctx := context.Background()
	reg := imagelab.Start(t)
	reg.Push(t, "lab/base:1", imagelab.Busybox(t))
	s := open(t, t.TempDir(), image.Options{})
	baseImg, err := s.Pull(ctx, reg.Ref("lab/base:1"), nil)
	if err != nil {
		t.Fatal(err)
	}
	const base = 200000
	wl := runtime.WritableLayer{Dir: upper(t, base), IDMap: runtime.IDMap{UIDBase: base, GIDBase: base, Count: 65536}, Exclude: []string{"/tmp", "/.agentbox"}}
	got, err := s.Commit(ctx, baseImg, wl, "mytemplate:v1", &image.Config{Labels: map[string]string{"made": "commit"}})
	if err != nil {
		t.Fatal(err)
	}
	if !got.Committed || got.Parent != baseImg.Digest || got.Ref != "docker.io/library/mytemplate:v1" || len(got.Layers) != 2 ||
		got.Config.Labels["made"] != "commit" || got.Config.Labels[imagelab.LabelKey] != imagelab.LabelValue {
		t.Fatalf("committed %+v", got)
	}
	if got.Layers[1].MediaType != "application/vnd.docker.image.rootfs.diff.tar" && got.Layers[1].MediaType != "application/vnd.oci.image.layer.v1.tar" {
		t.Fatalf("layer media type %s", got.Layers[1].MediaType)
	}
	again, err := s.Get(ctx, "mytemplate:v1")
	if err != nil || again.Digest != got.Digest {
		t.Fatal(again, err)
	}
	dirs, err := s.LayerDirs(ctx, got)
	if err != nil || len(dirs) != 2 {
		t.Fatal(dirs, err)
	}
	baseDirs, _ := s.LayerDirs(ctx, baseImg)
	if dirs[0] != baseDirs[0] {
		t.Fatalf("the base layer was not shared: %s vs %s", dirs[0], baseDirs[0])
	}
	top := dirs[1]
	var st unix.Stat_t
	check := func(p string, uid uint32, mode uint32) {
		t.Helper()
		if err := unix.Lstat(filepath.Join(top, p), &st); err != nil || st.Uid != uid || st.Gid != uid || (mode != 0 && st.Mode&0o7777 != mode) {
			t.Fatalf("%s: %v uid %d gid %d mode %o", p, err, st.Uid, st.Gid, st.Mode&0o7777)
		}
	}
	check("etc/motd", 0, 0o644)
	check("home/agent", 1000, 0o755)
	check("home/agent/notes", 1000, 0o600)
	check("bin/suid", 0, 0o4755)
	if unix.Lstat(filepath.Join(top, "etc/group"), &st); st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
		t.Fatalf("whiteout lost: mode %o", st.Mode)
	}
	buf := make([]byte, 4)
	if n, err := unix.Lgetxattr(filepath.Join(top, "usr/local"), "trusted.overlay.opaque", buf); err != nil || string(buf[:n]) != "y" {
		t.Fatalf("opaque lost: %v", err)
	}
	var a, b unix.Stat_t
	unix.Lstat(filepath.Join(top, "etc/motd"), &a)
	unix.Lstat(filepath.Join(top, "etc/motd.link"), &b)
	if a.Ino != b.Ino {
		t.Fatal("hardlink lost")
	}
	if l, _ := os.Readlink(filepath.Join(top, "etc/motd.sym")); l != "motd" {
		t.Fatalf("symlink %q", l)
	}
	for _, gone := range []string{"tmp", ".agentbox", "home/agent/sock"} {
		if _, err := os.Lstat(filepath.Join(top, gone)); err == nil {
			t.Errorf("%s was committed", gone)
		}
	}

	// A file of an id outside the sandbox's range refuses the commit, and nothing is added.
	bad := upper(t, base)
	os.WriteFile(filepath.Join(bad, "etc/host-owned"), []byte("x"), 0o644) // root of the host
	_, err = s.Commit(ctx, baseImg, runtime.WritableLayer{Dir: bad, IDMap: wl.IDMap}, "bad:1", nil)
	wantErr(t, err, errcode.UnsupportedOp, "")
	if _, err := s.Get(ctx, "bad:1"); !errcode.Is(err, errcode.ImageNotFound) {
		t.Fatal(err)
	}
	_, err = s.Commit(ctx, baseImg, wl, "bad@sha256:"+string(bytes.Repeat([]byte("a"), 64)), nil)
	wantErr(t, err, errcode.InvalidArgument, "")

	// Push, then pull on a clean cache: the same digest.
	if err := s.Push(ctx, "mytemplate:v1", reg.Ref("lab/template:v1"), nil); err != nil {
		t.Fatal(err)
	}
	clean := open(t, t.TempDir(), image.Options{})
	pulled, err := clean.Pull(ctx, reg.Ref("lab/template:v1"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if pulled.Digest != got.Digest {
		t.Fatalf("pulled %s; pushed %s", pulled.Digest, got.Digest)
	}
	pd, _ := clean.LayerDirs(ctx, pulled)
	if b, err := os.ReadFile(filepath.Join(pd[1], "etc/motd")); err != nil || string(b) != "hello from a template\n" {
		t.Fatalf("motd %q %v", b, err)
	}
	err = s.Push(ctx, "nosuch:1", reg.Ref("lab/x:1"), nil)
	wantErr(t, err, errcode.ImageNotFound, "")
}
