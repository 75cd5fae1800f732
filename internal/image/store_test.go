package image_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/image"
	"github.com/agentbox/agentbox/internal/testenv"
	"github.com/agentbox/agentbox/internal/testenv/imagelab"
)

func open(t *testing.T, dir string, opts image.Options) *image.Store {
	t.Helper()
	s, err := image.Open(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// wantErr fails t unless err has code (and, if reason is not "", details.reason).
func wantErr(t *testing.T, err error, code errcode.Code, reason string) *errcode.Error {
	t.Helper()
	e, ok := errcode.As(err)
	if !ok || e.Code != code {
		t.Fatalf("error %v: want code %s", err, code)
	}
	if reason != "" && e.Details["reason"] != reason {
		t.Fatalf("error %v (details %v): want reason %q", err, e.Details, reason)
	}
	return e
}

func TestPullByTagAndDigest(t *testing.T) {
	testenv.RequireRoot(t)
	reg := imagelab.Start(t)
	img := imagelab.Busybox(t)
	dg := reg.Push(t, "lab/busybox:1", img)
	s := open(t, t.TempDir(), image.Options{})
	ctx := context.Background()

	var phases sync.Map
	got, lease, err := s.Resolve(ctx, reg.Ref("lab/busybox:1"), func(p image.Progress) { phases.Store(p.Phase, true) })
	if err != nil {
		t.Fatal(err)
	}
	lease.Release()
	if got.Digest != dg || got.Ref != reg.Ref("lab/busybox:1") || got.Platform != "linux/amd64" {
		t.Fatalf("image %+v: want digest %s", got, dg)
	}
	if got.Config.Labels[imagelab.LabelKey] != imagelab.LabelValue || got.Config.WorkingDir != "/" || len(got.Config.Env) != 1 {
		t.Fatalf("config %+v", got.Config)
	}
	for _, ph := range []string{"resolving", "downloading", "done"} {
		if _, ok := phases.Load(ph); !ok {
			t.Errorf("no %q progress", ph)
		}
	}
	dirs, err := s.LayerDirs(ctx, got)
	if err != nil || len(dirs) != 1 {
		t.Fatal(dirs, err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(dirs[0], "home/agent"), &st); err != nil || st.Uid != 1000 || st.Gid != 1000 {
		t.Fatalf("home/agent: %v %d:%d", err, st.Uid, st.Gid)
	}
	if l, err := os.Readlink(filepath.Join(dirs[0], "bin/sh")); err != nil || l != "busybox" {
		t.Fatalf("bin/sh → %q %v", l, err)
	}
	if fi, err := os.Stat(filepath.Join(dirs[0], "tmp")); err != nil || fi.Mode()&os.ModeSticky == 0 || fi.Mode().Perm() != 0o777 {
		t.Fatalf("tmp: %v %v", fi.Mode(), err)
	}
	// The busybox runs from the layer.
	out, err := exec.Command(filepath.Join(dirs[0], "bin/busybox"), "echo", "hi").Output()
	if err != nil || string(out) != "hi\n" {
		t.Fatalf("busybox: %q %v", out, err)
	}

	// By digest, on a clean cache, and as is from the cache.
	s2 := open(t, t.TempDir(), image.Options{})
	byDigest := reg.Ref("lab/busybox@" + dg)
	got2, err := s2.Pull(ctx, byDigest, nil)
	if err != nil || got2.Digest != dg {
		t.Fatal(got2, err)
	}
	reg.ResetCounts()
	got3, l3, err := s2.Resolve(ctx, byDigest, nil)
	if err != nil || got3.Digest != dg {
		t.Fatal(got3, err)
	}
	l3.Release()
	if n := reg.BlobGets(got.Layers[0].Digest); n != 0 {
		t.Fatalf("a cached digest was fetched again (%d GETs)", n)
	}
	if g, err := s2.Get(ctx, dg); err != nil || g.Digest != dg {
		t.Fatal(g, err)
	}
	u, _ := s2.Usage(ctx)
	if u.Images != 1 || u.Layers != 1 || u.Bytes < 1<<20 {
		t.Fatalf("usage %+v", u)
	}
}

func TestReferenceErrors(t *testing.T) {
	testenv.RequireRoot(t)
	reg := imagelab.Start(t)
	s := open(t, t.TempDir(), image.Options{})
	ctx := context.Background()
	for _, bad := range []string{"", "UPPER/Case:x", "a b", "python:bad tag!", strings.Repeat("a", 2000), "host"} {
		_, _, err := s.Resolve(ctx, bad, nil)
		e := wantErr(t, err, errcode.InvalidArgument, "")
		if !strings.Contains(e.Message, "NAME[:TAG]") && !strings.Contains(e.Message, "at most") {
			t.Errorf("%q: message %q does not say the expected form", bad, e.Message)
		}
	}
	_, _, err := s.Resolve(ctx, reg.Ref("no/such:tag"), nil)
	wantErr(t, err, errcode.ImageNotFound, "")
	_, err = s.Get(ctx, "busybox:latest")
	wantErr(t, err, errcode.ImageNotFound, "")
	// A closed port on loopback.
	ln := imagelab.Start(t)
	host := ln.Host
	ln.Close()
	_, err = s.Pull(ctx, host+"/x/y:z", nil)
	wantErr(t, err, errcode.ImagePullFailed, image.ReasonUnreachable)
	if entries, _ := os.ReadDir(filepath.Join(s.Dir(), "tmp")); len(entries) != 0 {
		t.Fatalf("tmp/ keeps %d entries after failed pulls", len(entries))
	}
}

func TestMultiArchAndMovedTag(t *testing.T) {
	testenv.RequireRoot(t)
	reg := imagelab.Start(t)
	bb := imagelab.Busybox(t)
	amdDigest, _ := bb.Digest()
	reg.PushIndex(t, "lab/multi:1", imagelab.MultiArch(t, bb))
	reg.PushIndex(t, "lab/armonly:1", imagelab.OnlyPlatforms(t, bb))
	s := open(t, t.TempDir(), image.Options{Platform: "linux/amd64"})
	ctx := context.Background()
	got, err := s.Pull(ctx, reg.Ref("lab/multi:1"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if got.Digest != amdDigest.String() || got.Platform != "linux/amd64" || got.Config.Labels[imagelab.LabelKey] != imagelab.LabelValue {
		t.Fatalf("index resolved to %s %s %v; want amd64's %s", got.Digest, got.Platform, got.Config.Labels, amdDigest)
	}
	_, err = s.Pull(ctx, reg.Ref("lab/armonly:1"), nil)
	e := wantErr(t, err, errcode.ImagePullFailed, image.ReasonNoPlatform)
	if !strings.Contains(e.Message, "linux/arm64") {
		t.Fatalf("message %q does not list the platforms", e.Message)
	}

	// A tag that moves: Resolve keeps the cached one, Pull re-pins.
	d1 := reg.Push(t, "lab/moving:v1", bb)
	img, l, err := s.Resolve(ctx, reg.Ref("lab/moving:v1"), nil)
	if err != nil || img.Digest != d1 {
		t.Fatal(img, err)
	}
	l.Release()
	d2 := reg.Push(t, "lab/moving:v1", imagelab.WithLayer(t, bb, imagelab.Reg("new", "2", 0o644)))
	img, l, err = s.Resolve(ctx, reg.Ref("lab/moving:v1"), nil)
	if err != nil || img.Digest != d1 {
		t.Fatalf("Resolve of a cached tag gave %v %v; want the cached %s", img, err, d1)
	}
	l.Release()
	img, err = s.Pull(ctx, reg.Ref("lab/moving:v1"), nil)
	if err != nil || img.Digest != d2 {
		t.Fatalf("Pull gave %v %v; want the moved %s", img, err, d2)
	}
	img, l, err = s.Resolve(ctx, reg.Ref("lab/moving:v1"), nil)
	if err != nil || img.Digest != d2 {
		t.Fatal(img, err)
	}
	l.Release()
	// The old image is still there, by digest, without the moved name.
	old, err := s.Get(ctx, d1)
	if err != nil || slices.Contains(old.Names, reg.Ref("lab/moving:v1")) {
		t.Fatalf("old image %+v %v", old, err)
	}
}

func TestBasicAuth(t *testing.T) {
	testenv.RequireRoot(t)
	reg := imagelab.Start(t, imagelab.WithBasicAuth("alice", "s3cret"))
	reg.Push(t, "private/bb:1", imagelab.Busybox(t))
	ctx := context.Background()
	_, err := open(t, t.TempDir(), image.Options{}).Pull(ctx, reg.Ref("private/bb:1"), nil)
	wantErr(t, err, errcode.ImagePullFailed, image.ReasonUnauthorized)
	_, err = open(t, t.TempDir(), image.Options{Auth: []image.RegistryAuth{{Host: reg.Host, Username: "alice", Password: "wrong"}}}).Pull(ctx, reg.Ref("private/bb:1"), nil)
	wantErr(t, err, errcode.ImagePullFailed, image.ReasonUnauthorized)
	s := open(t, t.TempDir(), image.Options{Auth: []image.RegistryAuth{{Host: reg.Host, Username: "alice", Password: "s3cret"}}})
	if _, err := s.Pull(ctx, reg.Ref("private/bb:1"), nil); err != nil {
		t.Fatal(err)
	}
}

func TestConcurrentResolveOnePull(t *testing.T) {
	testenv.RequireRoot(t)
	reg := imagelab.Start(t)
	img := imagelab.WithLayer(t, imagelab.Busybox(t), imagelab.Reg("a", "second layer", 0o644))
	img = imagelab.WithLayer(t, img, imagelab.Reg("b", "third layer", 0o644))
	reg.Push(t, "lab/conc:1", img)
	reg.ResetCounts()
	s := open(t, t.TempDir(), image.Options{})
	ctx := context.Background()
	var wg sync.WaitGroup
	digests := make([]string, 20)
	errs := make([]error, 20)
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got, l, err := s.Resolve(ctx, reg.Ref("lab/conc:1"), func(image.Progress) {})
			errs[i] = err
			if err == nil {
				digests[i] = got.Digest
				l.Release()
			}
		}()
	}
	wg.Wait()
	for i := range 20 {
		if errs[i] != nil || digests[i] != digests[0] {
			t.Fatalf("resolve %d: %s %v", i, digests[i], errs[i])
		}
	}
	m, _ := img.Manifest()
	for _, l := range m.Layers {
		if n := reg.BlobGets(l.Digest.String()); n != 1 {
			t.Errorf("layer %s fetched %d times; want 1", l.Digest, n)
		}
	}
}

func TestLayerFormat(t *testing.T) {
	testenv.RequireRoot(t)
	reg := imagelab.Start(t)
	img := imagelab.WithLayer(t, imagelab.Busybox(t),
		imagelab.Whiteout("etc/group"),
		imagelab.Opaque("usr/local"),
		imagelab.Reg("usr/local/bin/tool", "#!/bin/sh\necho tool\n", 0o755),
		imagelab.Reg("bin/su", "setuid", 0o4755),
		imagelab.Reg("bin/sg", "setgid", 0o2711),
		imagelab.Hardlink("bin/su-link", "bin/su"),
		imagelab.File{Name: "etc/x", Type: '0', Body: "x", Mode: 0o640, UID: 1000, GID: 1001,
			Xattrs: map[string]string{"user.note": "hi", "trusted.evil": "x", "security.selinux": "system_u:object_r:etc_t:s0"}},
		imagelab.File{Name: "bigid", Body: "x", UID: 200000, GID: 300000},
		imagelab.Dir("usr/lib", 0o755),
		imagelab.Symlink("lib64", "usr/lib"),
		imagelab.Reg("lib64/libx.so", "through a symlink inside the layer", 0o644),
	)
	reg.Push(t, "lab/fmt:1", img)
	s := open(t, t.TempDir(), image.Options{})
	ctx := context.Background()
	got, err := s.Pull(ctx, reg.Ref("lab/fmt:1"), nil)
	if err != nil {
		t.Fatal(err)
	}
	dirs, err := s.LayerDirs(ctx, got)
	if err != nil || len(dirs) != 2 {
		t.Fatal(dirs, err)
	}
	top := dirs[1]
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(top, "etc/group"), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 || st.Uid != 0 || st.Gid != 0 {
		t.Fatalf("whiteout etc/group: %v mode %o rdev %d %d:%d", err, st.Mode, st.Rdev, st.Uid, st.Gid)
	}
	if _, err := os.Lstat(filepath.Join(top, "etc/.wh.group")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf(".wh.group kept: %v", err)
	}
	buf := make([]byte, 8)
	if n, err := unix.Lgetxattr(filepath.Join(top, "usr/local"), "trusted.overlay.opaque", buf); err != nil || string(buf[:n]) != "y" {
		t.Fatalf("opaque usr/local: %q %v", buf[:n], err)
	}
	if _, err := os.Lstat(filepath.Join(top, "usr/local/.wh..wh..opq")); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("opaque marker kept as a file")
	}
	if fi, err := os.Lstat(filepath.Join(top, "bin/su")); err != nil || fi.Mode()&os.ModeSetuid == 0 || fi.Mode().Perm() != 0o755 {
		t.Fatalf("setuid bin/su: %v %v", fi.Mode(), err)
	}
	if fi, err := os.Lstat(filepath.Join(top, "bin/sg")); err != nil || fi.Mode()&os.ModeSetgid == 0 {
		t.Fatalf("setgid bin/sg: %v %v", fi.Mode(), err)
	}
	var a, b unix.Stat_t
	unix.Lstat(filepath.Join(top, "bin/su"), &a)
	unix.Lstat(filepath.Join(top, "bin/su-link"), &b)
	if a.Ino != b.Ino || a.Nlink != 2 {
		t.Fatalf("hardlink: inodes %d %d nlink %d", a.Ino, b.Ino, a.Nlink)
	}
	x := filepath.Join(top, "etc/x")
	if unix.Lstat(x, &st); st.Uid != 1000 || st.Gid != 1001 || st.Mode&0o7777 != 0o640 {
		t.Fatalf("etc/x: %d:%d %o", st.Uid, st.Gid, st.Mode&0o7777)
	}
	if n, err := unix.Lgetxattr(x, "user.note", buf); err != nil || string(buf[:n]) != "hi" {
		t.Fatalf("user.note: %v", err)
	}
	for _, dropped := range []string{"trusted.evil", "security.selinux"} {
		if _, err := unix.Lgetxattr(x, dropped, buf); err == nil {
			// security.selinux may be set by an SELinux host itself; this host has none.
			t.Errorf("xattr %s kept", dropped)
		}
	}
	if unix.Lstat(filepath.Join(top, "bigid"), &st); st.Uid != image.ClampedID || st.Gid != image.ClampedID {
		t.Fatalf("bigid: %d:%d; want clamped to %d", st.Uid, st.Gid, image.ClampedID)
	}
	if b, err := os.ReadFile(filepath.Join(top, "usr/lib/libx.so")); err != nil || string(b) != "through a symlink inside the layer" {
		t.Fatalf("a name through a symlink inside the layer: %q %v", b, err)
	}
	if fi, err := os.Lstat(filepath.Join(top, "usr/local/bin/tool")); err != nil || fi.ModTime().UTC() != imagelab.Epoch {
		t.Fatalf("mtime %v %v", fi.ModTime(), err)
	}
}

// walk lists every path under root.
func walk(t *testing.T, root string) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err == nil {
			out[p] = true
		}
		return nil
	})
	return out
}

func TestMaliciousLayers(t *testing.T) {
	testenv.RequireRoot(t)
	reg := imagelab.Start(t)
	root := t.TempDir()
	cache := filepath.Join(root, "cache")
	outside := filepath.Join(root, "outside")
	os.Mkdir(outside, 0o755)
	secret := filepath.Join(outside, "secret")
	os.WriteFile(secret, []byte("secret"), 0o600)
	s := open(t, cache, image.Options{})
	ctx := context.Background()
	before := walk(t, root)
	for attack, tarb := range imagelab.Malicious(outside) {
		t.Run(attack, func(t *testing.T) {
			reg.Push(t, "evil/"+attack+":1", imagelab.Single(t, tarb))
			got, err := s.Pull(ctx, reg.Ref("evil/"+attack+":1"), nil)
			switch attack {
			case "device":
				if err != nil {
					t.Fatal(err)
				}
				dirs, _ := s.LayerDirs(ctx, got)
				for _, n := range []string{"dev/mem", "dev/sda", "dev/fifo"} {
					if _, err := os.Lstat(filepath.Join(dirs[0], n)); !errors.Is(err, os.ErrNotExist) {
						t.Errorf("%s unpacked: %v", n, err)
					}
				}
				if b, err := os.ReadFile(filepath.Join(dirs[0], "ok")); err != nil || string(b) != "fine" {
					t.Errorf("ok: %q %v", b, err)
				}
			case "huge-size":
				wantErr(t, err, errcode.ImagePullFailed, image.ReasonTooLarge)
			default:
				e := wantErr(t, err, errcode.ImagePullFailed, image.ReasonUnsafeLayer)
				if e.Details["entry"] == nil || !strings.Contains(e.Message, "entry") {
					t.Errorf("message %q names no entry", e.Message)
				}
				if _, err := s.Get(ctx, reg.Ref("evil/"+attack+":1")); !errcode.Is(err, errcode.ImageNotFound) {
					t.Errorf("refused image is in the cache: %v", err)
				}
			}
		})
	}
	for p := range walk(t, root) {
		if !before[p] && !strings.HasPrefix(p, cache+"/") {
			t.Errorf("written outside the cache: %s", p)
		}
	}
	var st unix.Stat_t
	if err := unix.Stat(secret, &st); err != nil || st.Nlink != 1 {
		t.Fatalf("secret: nlink %d %v (a hardlink to it was made)", st.Nlink, err)
	}
	if entries, _ := os.ReadDir(filepath.Join(cache, "tmp")); len(entries) != 0 {
		t.Fatalf("tmp/ keeps %d entries", len(entries))
	}
	// Nothing of a refused layer is kept: only the device layer's.
	if u, _ := s.Usage(ctx); u.Layers != 1 || u.Images != 1 {
		t.Fatalf("usage %+v: want only the device image", u)
	}
}

func TestDigestMismatch(t *testing.T) {
	testenv.RequireRoot(t)
	reg := imagelab.Start(t)
	img := imagelab.WithLayer(t, imagelab.Busybox(t), imagelab.Reg("x", strings.Repeat("x", 100000), 0o644))
	reg.Push(t, "lab/bad:1", img)
	m, _ := img.Manifest()
	reg.Corrupt(m.Layers[1].Digest.String())
	s := open(t, t.TempDir(), image.Options{})
	_, err := s.Pull(context.Background(), reg.Ref("lab/bad:1"), nil)
	wantErr(t, err, errcode.ImagePullFailed, image.ReasonDigestMismatch)
	if _, err := os.Lstat(filepath.Join(s.Dir(), "layers", strings.TrimPrefix(mustDiffID(t, img, 1), "sha256:"))); err == nil {
		t.Fatal("the corrupt layer was unpacked into layers/")
	}
}

func mustDiffID(t *testing.T, img v1.Image, i int) string {
	t.Helper()
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	return cf.RootFS.DiffIDs[i].String()
}

// TestKilledPull: a pull is cut mid-download; a copy of its cache dir taken then is what a
// SIGKILL leaves. Open of that copy wipes tmp/, drops the layer the index never recorded,
// has no image, and pulls it anew.
func TestKilledPull(t *testing.T) {
	testenv.RequireRoot(t)
	reg := imagelab.Start(t)
	img := imagelab.WithLayer(t, imagelab.Busybox(t), imagelab.Reg("big", strings.Repeat("y", 4<<20), 0o644))
	reg.Push(t, "lab/kill:1", img)
	m, _ := img.Manifest()
	release := reg.Hold(m.Layers[1].Digest.String())
	defer release()
	dir := filepath.Join(t.TempDir(), "images")
	s := open(t, dir, image.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := s.Pull(ctx, reg.Ref("lab/kill:1"), nil)
		done <- err
	}()
	// Wait until the first layer is in layers/ and the second is in flight in tmp/.
	deadline := time.Now().Add(20 * time.Second)
	for {
		layers, _ := os.ReadDir(filepath.Join(dir, "layers"))
		tmp, _ := os.ReadDir(filepath.Join(dir, "tmp"))
		if len(layers) == 1 && len(tmp) >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pull did not reach the held layer: layers %d tmp %d", len(layers), len(tmp))
		}
		time.Sleep(20 * time.Millisecond)
	}
	killed := filepath.Join(t.TempDir(), "killed")
	if out, err := exec.Command("cp", "-a", dir, killed).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v %s", err, out)
	}
	cancel()
	select {
	case err := <-done:
		wantErr(t, err, errcode.ImagePullFailed, "cancelled")
	case <-time.After(10 * time.Second):
		t.Fatal("a cancelled pull did not return")
	}
	release()

	s2 := open(t, killed, image.Options{})
	if tmp, _ := os.ReadDir(filepath.Join(killed, "tmp")); len(tmp) != 0 {
		t.Fatalf("tmp/ not wiped: %d entries", len(tmp))
	}
	if layers, _ := os.ReadDir(filepath.Join(killed, "layers")); len(layers) != 0 {
		t.Fatalf("layers/ keeps %d layers the index never recorded", len(layers))
	}
	if _, err := s2.Get(context.Background(), reg.Ref("lab/kill:1")); !errcode.Is(err, errcode.ImageNotFound) {
		t.Fatalf("half-pulled image is present: %v", err)
	}
	got, err := s2.Pull(context.Background(), reg.Ref("lab/kill:1"), nil)
	if err != nil {
		t.Fatal(err)
	}
	dirs, _ := s2.LayerDirs(context.Background(), got)
	if fi, err := os.Stat(filepath.Join(dirs[1], "big")); err != nil || fi.Size() != 4<<20 {
		t.Fatalf("big: %v", err)
	}
	// The original store pulls it too once the registry answers.
	if _, err := s.Pull(context.Background(), reg.Ref("lab/kill:1"), nil); err != nil {
		t.Fatal(err)
	}
}

func TestRemovePruneBudget(t *testing.T) {
	testenv.RequireRoot(t)
	reg := imagelab.Start(t)
	bb := imagelab.Busybox(t)
	refs := map[string]string{}
	for _, n := range []string{"a", "b", "c"} {
		// Each image has its own layers (a distinct busybox layer is not possible: the
		// busybox layer is shared; the second layer is the image's own).
		refs[n] = reg.Push(t, "lab/"+n+":1", imagelab.WithLayer(t, bb, imagelab.Reg(n, strings.Repeat(n, 1<<20), 0o644)))
	}
	var mu sync.Mutex
	inUse := map[string]int{}
	opts := image.Options{InUse: func(context.Context) (map[string]int, error) {
		mu.Lock()
		defer mu.Unlock()
		m := map[string]int{}
		for k, v := range inUse {
			m[k] = v
		}
		return m, nil
	}}
	dir := t.TempDir()
	s := open(t, dir, opts)
	ctx := context.Background()
	a, err := s.Pull(ctx, reg.Ref("lab/a:1"), nil)
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	inUse[a.Digest] = 2
	mu.Unlock()
	list, _ := s.List(ctx)
	if len(list) != 1 || list[0].InUse != 2 || list[0].DiskBytes < 1<<20 {
		t.Fatalf("list %+v", list)
	}
	_, err = s.Remove(ctx, reg.Ref("lab/a:1"), false)
	wantErr(t, err, errcode.Conflict, "")
	_, err = s.Remove(ctx, a.Digest, true)
	wantErr(t, err, errcode.Conflict, "")

	// A budget that fits a and one more: pulling b then c collects b (least recently used),
	// never a.
	u, _ := s.Usage(ctx)
	s = nil
	s = open(t, dir, image.Options{InUse: opts.InUse, BudgetBytes: u.Bytes + (1<<20)*3/2})
	if _, err := s.Pull(ctx, reg.Ref("lab/b:1"), nil); err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond)
	if _, err := s.Pull(ctx, reg.Ref("lab/c:1"), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, reg.Ref("lab/b:1")); !errcode.Is(err, errcode.ImageNotFound) {
		t.Fatalf("b not collected past the budget: %v", err)
	}
	for _, keep := range []string{"a", "c"} {
		img, err := s.Get(ctx, reg.Ref("lab/"+keep+":1"))
		if err != nil {
			t.Fatalf("%s collected: %v", keep, err)
		}
		if _, err := s.LayerDirs(ctx, img); err != nil {
			t.Fatal(err)
		}
	}
	// A budget of 1 byte: everything not in use goes, a stays whole.
	s = open(t, dir, image.Options{InUse: opts.InUse, BudgetBytes: 1})
	rep, err := s.Prune(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Removed) != 1 || rep.FreedBytes <= 0 {
		t.Fatalf("prune %+v", rep)
	}
	img, err := s.Get(ctx, a.Digest)
	if err != nil {
		t.Fatal(err)
	}
	dirs, err := s.LayerDirs(ctx, img)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dirs[0], "bin/busybox")); err != nil {
		t.Fatal(err)
	}
	// Force removes only the name of an image in use; once unused it can go.
	if removed, err := s.Remove(ctx, reg.Ref("lab/a:1"), true); err != nil || len(removed) != 1 {
		t.Fatal(removed, err)
	}
	if _, err := s.Get(ctx, a.Digest); err != nil {
		t.Fatalf("forced remove of a name deleted the image in use: %v", err)
	}
	mu.Lock()
	delete(inUse, a.Digest)
	mu.Unlock()
	rep, err = s.Prune(ctx, true)
	if err != nil || len(rep.Removed) != 1 || rep.CacheBytes != 0 {
		t.Fatalf("prune all: %+v %v", rep, err)
	}
	for _, sub := range []string{"layers", "blobs/sha256", "tmp"} {
		if e, _ := os.ReadDir(filepath.Join(dir, sub)); len(e) != 0 {
			t.Errorf("%s keeps %d entries after prune all", sub, len(e))
		}
	}
}
