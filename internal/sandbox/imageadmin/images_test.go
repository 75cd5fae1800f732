package imageadmin_test

import (
	"context"
	"errors"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/image"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/fake"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/store/sqlite"
	"github.com/agentbox/agentbox/internal/testenv/imagefake"
)

// Images in the control plane, on the fake runtime and the fake image cache.

func newImageEnv(t *testing.T) (*fakeEnv, *imagefake.Cache) {
	t.Helper()
	c := imagefake.New(t.TempDir())
	e := newFakeEnv(t, sandbox.Config{Images: c})
	c.InUse = func(ctx context.Context) (map[string]int, error) { return e.imgs.ImagesInUse(ctx) }
	return e, c
}

var pyConfig = image.Config{Env: []string{"PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8", "PYTHON_VERSION=3.12.7", "bad name=x", "NOEQUALS"},
	User: "1000:1000", WorkingDir: "/app"}

// TestCreateFromImagePinsDigest: a create with an image resolves it before the record, pins its
// digest on the record, hands the runtime the layers, user, workdir and the image's env under
// the create's env, and releases the lease; a tag moved later leaves the sandbox's digest.
func TestCreateFromImagePinsDigest(t *testing.T) {
	e, c := newImageEnv(t)
	c.AddRemote("python:3.12-slim", pyConfig)
	sb := e.create(t, sandbox.CreateRequest{Image: "python:3.12-slim", Env: map[string]string{"LANG": "en_US.UTF-8", "MINE": "1"}})
	img, err := c.Get(t.Context(), "python:3.12-slim")
	if err != nil {
		t.Fatal(err)
	}
	if sb.ImageDigest != img.Digest || sb.Image != "python:3.12-slim" || c.Pulls() != 1 {
		t.Fatalf("record image %q digest %q, want %q; pulls %d", sb.Image, sb.ImageDigest, img.Digest, c.Pulls())
	}
	if got, _ := e.svc.Get(t.Context(), sb.ID); got.ImageDigest != img.Digest {
		t.Fatalf("stored digest %q", got.ImageDigest)
	}
	if n := c.Leases(); n != 0 {
		t.Fatalf("%d leases outstanding after the create", n)
	}
	rfs := e.rt.Rootfs(sb.ID)
	want, _ := c.LayerDirs(t.Context(), img)
	if rfs == nil || !slices.Equal(rfs.Layers, want) || rfs.User != "1000:1000" || rfs.Workdir != "/app" {
		t.Fatalf("runtime got rootfs %+v, want layers %v user 1000:1000 workdir /app", rfs, want)
	}
	res, err := e.svc.Exec(t.Context(), sb.ID, sandbox.ExecRequest{Argv: []string{"sh", "-c", `printf '%s|%s|%s|%s' "$LANG" "$MINE" "$PYTHON_VERSION" "$NOEQUALS"`}}, nil)
	if err != nil || res.Stdout != "en_US.UTF-8|1|3.12.7|" {
		t.Fatalf("env in the sandbox: %q %v (want the create's LANG over the image's, the image's PYTHON_VERSION)", res.Stdout, err)
	}
	// The tag moves: a new create gets the new digest, the old sandbox keeps its own.
	c.AddRemote("python:3.12-slim", image.Config{Env: []string{"PYTHON_VERSION=3.12.8"}})
	moved, err := e.imgs.PullImage(t.Context(), "python:3.12-slim", nil)
	if err != nil || moved.Digest == img.Digest {
		t.Fatalf("pull: %+v %v", moved, err)
	}
	sb2 := e.create(t, sandbox.CreateRequest{Image: "python:3.12-slim"})
	if sb2.ImageDigest != moved.Digest {
		t.Fatalf("new sandbox digest %q, want the moved tag's %q", sb2.ImageDigest, moved.Digest)
	}
	if got, _ := e.svc.Get(t.Context(), sb.ID); got.ImageDigest != img.Digest {
		t.Fatalf("old sandbox digest changed to %q", got.ImageDigest)
	}
	used, err := e.imgs.ImagesInUse(t.Context())
	if err != nil || !maps.Equal(used, map[string]int{img.Digest: 1, moved.Digest: 1}) {
		t.Fatalf("ImagesInUse = %v %v", used, err)
	}
	list, err := e.imgs.ListImages(t.Context())
	if err != nil || len(list) != 2 {
		t.Fatalf("ListImages: %+v %v", list, err)
	}
	for _, im := range list {
		if im.InUse != 1 {
			t.Errorf("image %s in_use %d, want 1", im.Digest, im.InUse)
		}
	}
	// Destroyed: no longer in use.
	if _, err := e.svc.Destroy(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	if used, _ := e.imgs.ImagesInUse(t.Context()); !maps.Equal(used, map[string]int{moved.Digest: 1}) {
		t.Fatalf("after destroy ImagesInUse = %v", used)
	}
	// The host image: no digest, no rootfs.
	h := e.create(t, sandbox.CreateRequest{})
	if h.Image != "host" || h.ImageDigest != "" || e.rt.Rootfs(h.ID) != nil {
		t.Fatalf("host sandbox: %+v rootfs %+v", h, e.rt.Rootfs(h.ID))
	}
}

// TestCreateImageResolveFailure: a failed resolve (absent image, registry down, a caller who
// hangs up) writes no record, holds no lease and creates nothing in the runtime.
func TestCreateImageResolveFailure(t *testing.T) {
	e, c := newImageEnv(t)
	c.AddRemote("ok:1", image.Config{})
	if _, err := e.svc.Create(t.Context(), sandbox.CreateRequest{Image: "nosuch:1"}); errcode.Of(err) != errcode.ImageNotFound {
		t.Fatalf("absent image: %v, want IMAGE_NOT_FOUND", err)
	}
	c.SetFault(func(op, ref string) error {
		if op == "resolve" {
			return errors.New("connection refused")
		}
		return nil
	})
	if _, err := e.svc.Create(t.Context(), sandbox.CreateRequest{Image: "ok:1"}); errcode.Of(err) != errcode.ImagePullFailed {
		t.Fatalf("registry down: %v, want IMAGE_PULL_FAILED", err)
	}
	// Resolved but its layers unusable: the lease is given back.
	c.SetFault(func(op, ref string) error {
		if op == "layers" {
			return errcode.New(errcode.Internal, "layer missing")
		}
		return nil
	})
	if _, err := e.svc.Create(t.Context(), sandbox.CreateRequest{Image: "ok:1"}); err == nil {
		t.Fatal("create with unusable layers succeeded")
	}
	c.SetFault(nil)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := e.svc.Create(ctx, sandbox.CreateRequest{Image: "ok:1"}); err == nil {
		t.Fatal("create with a canceled context succeeded")
	}
	list, err := e.svc.List(t.Context(), sandbox.ListFilter{})
	if err != nil || len(list) != 0 {
		t.Fatalf("failed creates left records: %+v %v", list, err)
	}
	if n := c.Leases(); n != 0 {
		t.Fatalf("%d leases leaked", n)
	}
	if r := e.rt.Resources(); len(r) != 0 {
		t.Fatalf("runtime resources leaked: %v", r)
	}
	if n := e.rt.Calls(fake.OpRun) + e.rt.Calls(fake.OpCreate); n != 0 {
		t.Fatalf("the runtime was asked to create %d times", n)
	}
}

// TestCreateImageBadInput: a malformed reference is INVALID_ARGUMENT naming the argument, before
// anything is resolved; so is an image on a server without a cache.
func TestCreateImageBadInput(t *testing.T) {
	e, c := newImageEnv(t)
	for _, ref := range []string{"UPPER:1", "a b", "x:", "x@sha256:123", "-lead", "ok:" + strings.Repeat("t", 129), strings.Repeat("a/", 300) + "b", "a//b", "x:1\x00"} {
		_, err := e.svc.Create(t.Context(), sandbox.CreateRequest{Image: ref})
		if errcode.Of(err) != errcode.InvalidArgument || !strings.Contains(err.Error(), "image") {
			t.Errorf("image %q: %v, want INVALID_ARGUMENT naming image", ref, err)
		}
	}
	if c.Pulls() != 0 || c.Leases() != 0 {
		t.Fatalf("bad refs reached the cache: pulls %d leases %d", c.Pulls(), c.Leases())
	}
	for _, ref := range []string{"python:3.12-slim", "ghcr.io/org/img:tag", "localhost:5000/x/y:1", "127.0.0.1:5000/a",
		"busybox@sha256:" + strings.Repeat("ab", 32), "my-template:v1", "[::1]:5000/t:latest"} {
		if err := sandbox.CheckImageRef("image", ref); err != nil {
			t.Errorf("CheckImageRef(%q): %v", ref, err)
		}
	}
	plain := newFakeEnv(t, sandbox.Config{})
	if _, err := plain.svc.Create(t.Context(), sandbox.CreateRequest{Image: "python:3.12"}); errcode.Of(err) != errcode.InvalidArgument {
		t.Fatalf("image without a cache: %v", err)
	}
	if _, err := plain.imgs.ListImages(t.Context()); errcode.Of(err) != errcode.UnsupportedOp {
		t.Fatalf("ListImages without a cache: %v", err)
	}
}

// TestCreateImageIdempotent: a retried create with the same key and image returns the first
// sandbox; the same key with another image is CONFLICT; no lease is left either way.
func TestCreateImageIdempotent(t *testing.T) {
	e, c := newImageEnv(t)
	c.AddRemote("a:1", image.Config{})
	c.AddRemote("b:1", image.Config{})
	first := e.create(t, sandbox.CreateRequest{Image: "a:1", IdempotencyKey: "k"})
	again := e.create(t, sandbox.CreateRequest{Image: "a:1", IdempotencyKey: "k"})
	if again.ID != first.ID || again.ImageDigest != first.ImageDigest {
		t.Fatalf("retry made %s (%s), want %s (%s)", again.ID, again.ImageDigest, first.ID, first.ImageDigest)
	}
	if _, err := e.svc.Create(t.Context(), sandbox.CreateRequest{Image: "b:1", IdempotencyKey: "k"}); errcode.Of(err) != errcode.Conflict {
		t.Fatalf("same key, other image: %v, want CONFLICT", err)
	}
	if _, err := e.svc.Create(t.Context(), sandbox.CreateRequest{IdempotencyKey: "k"}); errcode.Of(err) != errcode.Conflict {
		t.Fatalf("same key, host image: %v, want CONFLICT", err)
	}
	if n := c.Leases(); n != 0 {
		t.Fatalf("%d leases outstanding", n)
	}
	if list, _ := e.svc.List(t.Context(), sandbox.ListFilter{}); len(list) != 1 {
		t.Fatalf("%d records, want 1", len(list))
	}
}

// TestCreateImageRuntimePick: an OCI image needs a runtime whose Capabilities.Images has
// "oci": the server picks one when the default lacks it, and refuses a runtime asked for that
// lacks it.
func TestCreateImageRuntimePick(t *testing.T) {
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	oci, err := fake.New(fake.Config{Name: "crun"})
	if err != nil {
		t.Fatal(err)
	}
	defer oci.Shutdown(context.Background())
	var hostOnly hostOnlyRuntime
	hostOnly.Runtime, err = fake.New(fake.Config{Name: "runc"})
	if err != nil {
		t.Fatal(err)
	}
	defer hostOnly.Runtime.(*fake.Runtime).Shutdown(context.Background())
	c := imagefake.New(t.TempDir())
	c.AddRemote("a:1", image.Config{})
	svc, err := sandbox.NewService(st, []runtime.Runtime{hostOnly, oci}, sandbox.Config{Images: c}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	sb, err := svc.Create(t.Context(), sandbox.CreateRequest{Image: "a:1"})
	if err != nil || sb.Runtime != "crun" {
		t.Fatalf("create: %+v %v, want runtime crun", sb, err)
	}
	defer svc.Destroy(context.Background(), sb.ID)
	if _, err := svc.Create(t.Context(), sandbox.CreateRequest{Image: "a:1", Runtime: "runc"}); errcode.Of(err) != errcode.InvalidArgument || !strings.Contains(err.Error(), "crun") {
		t.Fatalf("runc asked for: %v, want INVALID_ARGUMENT naming crun", err)
	}
	if h, err := svc.Create(t.Context(), sandbox.CreateRequest{}); err != nil || h.Runtime != "runc" {
		t.Fatalf("host create: %+v %v", h, err)
	} else {
		svc.Destroy(context.Background(), h.ID)
	}
}

// hostOnlyRuntime is a fake runtime that declares only the host image.
type hostOnlyRuntime struct{ runtime.Runtime }

func (h hostOnlyRuntime) Capabilities() runtime.Capabilities {
	c := h.Runtime.Capabilities()
	c.Images = []string{"host"}
	return c
}

// TestCommit: a commit reads the runtime's writable layer, adds an image on the sandbox's
// pinned digest, records a commit event, and the commit is a base for a new create. A host
// sandbox is UNSUPPORTED_OPERATION; a bad name is INVALID_ARGUMENT.
func TestCommit(t *testing.T) {
	e, c := newImageEnv(t)
	c.AddRemote("base:1", pyConfig)
	sb := e.create(t, sandbox.CreateRequest{Image: "base:1"})
	layer, err := e.rt.WritableLayer(t.Context(), sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(layer.Dir, "installed"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	img, err := e.imgs.Commit(t.Context(), sb.ID, "tmpl:v1")
	if err != nil {
		t.Fatal(err)
	}
	cm := c.Commits()
	if len(cm) != 1 || cm[0].Base != sb.ImageDigest || cm[0].Layer.Dir != layer.Dir || cm[0].Name != "tmpl:v1" || !slices.Equal(cm[0].Files, []string{"installed"}) {
		t.Fatalf("commits %+v", cm)
	}
	if !img.Committed || img.Parent != sb.ImageDigest {
		t.Fatalf("committed image %+v", img)
	}
	evs := e.eventsOf(t, sb.ID, "commit")
	if len(evs) != 1 || !strings.Contains(evs[0].Reason, "tmpl:v1") || !strings.Contains(evs[0].Reason, img.Digest) {
		t.Fatalf("commit events %+v", evs)
	}
	from := e.create(t, sandbox.CreateRequest{Image: "tmpl:v1"})
	if from.ImageDigest != img.Digest || c.Pulls() != 1 {
		t.Fatalf("create from the commit: digest %q want %q, pulls %d (want 1: the commit is local)", from.ImageDigest, img.Digest, c.Pulls())
	}
	if rfs := e.rt.Rootfs(from.ID); rfs == nil || len(rfs.Layers) != 3 {
		t.Fatalf("rootfs of the commit's sandbox: %+v (want its parent's 2 layers and 1 more)", rfs)
	}

	host := e.create(t, sandbox.CreateRequest{})
	_, err = e.imgs.Commit(t.Context(), host.ID, "h:1")
	if errcode.Of(err) != errcode.UnsupportedOp || !strings.Contains(err.Error(), "OCI image") {
		t.Fatalf("commit of a host sandbox: %v, want UNSUPPORTED_OPERATION saying it needs an OCI image", err)
	}
	for _, name := range []string{"", "Bad:1", "x@sha256:" + strings.Repeat("a", 64), "host", "a b"} {
		if _, err := e.imgs.Commit(t.Context(), sb.ID, name); errcode.Of(err) != errcode.InvalidArgument || !strings.Contains(err.Error(), "name") {
			t.Errorf("commit name %q: %v, want INVALID_ARGUMENT naming name", name, err)
		}
	}
	if _, err := e.imgs.Commit(t.Context(), "sb-0123456789ab", "x:1"); errcode.Of(err) != errcode.SandboxNotFound {
		t.Fatalf("commit of an unknown sandbox: %v", err)
	}
	if _, err := e.svc.Destroy(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := e.imgs.Commit(t.Context(), sb.ID, "late:1"); errcode.Of(err) != errcode.SandboxNotRunning {
		t.Fatalf("commit of a destroyed sandbox: %v", err)
	}
	if len(c.Commits()) != 1 {
		t.Fatalf("refused commits reached the cache: %+v", c.Commits())
	}
}

// TestImageRemoveInUse: removing an image a live sandbox uses is CONFLICT (the cache asks the
// service's ImagesInUse); once the sandbox is gone it goes.
func TestImageRemoveInUse(t *testing.T) {
	e, c := newImageEnv(t)
	c.AddRemote("a:1", image.Config{})
	sb := e.create(t, sandbox.CreateRequest{Image: "a:1"})
	if _, err := e.imgs.RemoveImage(t.Context(), "a:1", false); errcode.Of(err) != errcode.Conflict {
		t.Fatalf("remove in use: %v", err)
	}
	if _, err := e.imgs.RemoveImage(t.Context(), "../../x", false); errcode.Of(err) != errcode.InvalidArgument {
		t.Fatalf("remove of a bad ref: %v", err)
	}
	if _, err := e.svc.Destroy(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	if got, err := e.imgs.RemoveImage(t.Context(), "a:1", false); err != nil || len(got) != 2 {
		t.Fatalf("remove: %v %v", got, err)
	}
}

// TestImageRecordSurvivesRestart: a server restarted (its service replaced without Close, as
// after a crash) still sees the record's pinned digest, and ImagesInUse reports it.
func TestImageRecordSurvivesRestart(t *testing.T) {
	e, c := newImageEnv(t)
	c.AddRemote("a:1", image.Config{})
	sb := e.create(t, sandbox.CreateRequest{Image: "a:1"})
	e.restart(t)
	got, err := e.svc.Get(t.Context(), sb.ID)
	if err != nil || got.ImageDigest != sb.ImageDigest || got.State != sandbox.StateRunning {
		t.Fatalf("after restart: %+v %v", got, err)
	}
	if used, err := e.imgs.ImagesInUse(t.Context()); err != nil || used[sb.ImageDigest] != 1 {
		t.Fatalf("ImagesInUse after restart = %v %v", used, err)
	}
}

// TestImageRecordSurvivesSIGKILL: a server process SIGKILLed right after creating a sandbox of an
// image leaves a record that pins the digest: a new process over the same database reports it in
// use until reconcile finds the sandbox gone (the fake runtime's sandboxes die with their
// process), then not.
func TestImageRecordSurvivesSIGKILL(t *testing.T) {
	if os.Getenv("AGENTBOX_IMAGE_CHILD") != "" {
		imageChild(t)
		return
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestImageRecordSurvivesSIGKILL$", "-test.count=1")
	cmd.Env = append(os.Environ(), "AGENTBOX_IMAGE_CHILD="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ready := filepath.Join(dir, "ready")
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(ready); err == nil {
			break
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatal("the child never created its sandbox")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = out.Close()
	_ = cmd.Wait()
	b, err := os.ReadFile(ready)
	if err != nil {
		t.Fatal(err)
	}
	id, digest, _ := strings.Cut(string(b), " ")
	st, err := sqlite.Open(t.Context(), filepath.Join(dir, "agentbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	sb, err := st.GetSandbox(t.Context(), id)
	if err != nil || sb.ImageDigest != digest || sb.State != sandbox.StateRunning {
		t.Fatalf("record after SIGKILL: %+v %v (want running, digest %s)", sb, err, digest)
	}
	used, err := st.ImagesInUse(t.Context())
	if err != nil || !maps.Equal(used, map[string]int{digest: 1}) {
		t.Fatalf("ImagesInUse after SIGKILL = %v %v", used, err)
	}
	rt, err := fake.New(fake.Config{Name: "runc", Dir: filepath.Join(dir, "rt")})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Shutdown(context.Background())
	svc, err := sandbox.NewService(st, []runtime.Runtime{rt}, sandbox.Config{Images: imagefake.New(t.TempDir())}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	if err := svc.Reconcile(t.Context()); err != nil {
		t.Fatal(err)
	}
	if used, err := st.ImagesInUse(t.Context()); err != nil || len(used) != 0 {
		t.Fatalf("ImagesInUse after reconcile found the sandbox gone = %v %v", used, err)
	}
	if got, _ := svc.Get(t.Context(), id); got.ImageDigest != digest || got.State.Live() {
		t.Fatalf("after reconcile: %+v", got)
	}
}

// imageChild is the process the SIGKILL test kills: it creates a sandbox of an image, says so,
// and waits to die.
func imageChild(t *testing.T) {
	dir := os.Getenv("AGENTBOX_IMAGE_CHILD")
	st, err := sqlite.Open(t.Context(), filepath.Join(dir, "agentbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	rt, err := fake.New(fake.Config{Name: "runc", Dir: filepath.Join(dir, "rt")})
	if err != nil {
		t.Fatal(err)
	}
	c := imagefake.New(filepath.Join(dir, "images"))
	c.AddRemote("a:1", image.Config{})
	svc, err := sandbox.NewService(st, []runtime.Runtime{rt}, sandbox.Config{Images: c}, nil)
	if err != nil {
		t.Fatal(err)
	}
	sb, err := svc.Create(t.Context(), sandbox.CreateRequest{Image: "a:1"})
	if err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(dir, "ready.tmp")
	if err := os.WriteFile(tmp, []byte(sb.ID+" "+sb.ImageDigest), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "ready")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Minute)
	t.Fatal("not killed")
}

// TestCreateImageConcurrent: 20 concurrent creates of an image not yet cached: one pull (the
// cache's singleflight; the fake serialises), every record pins the same digest, no lease is
// left, and ImagesInUse counts 20, then 0 once they are destroyed.
func TestCreateImageConcurrent(t *testing.T) {
	e, c := newImageEnv(t)
	c.AddRemote("busybox:1", image.Config{})
	const n = 20
	var wg sync.WaitGroup
	sbs := make([]sandbox.Sandbox, n)
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() { sbs[i], errs[i] = e.svc.Create(t.Context(), sandbox.CreateRequest{Image: "busybox:1"}) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("create %d: %v", i, err)
		}
		if sbs[i].ImageDigest != sbs[0].ImageDigest || sbs[i].ImageDigest == "" {
			t.Fatalf("create %d pinned %q, create 0 %q", i, sbs[i].ImageDigest, sbs[0].ImageDigest)
		}
	}
	if c.Pulls() != 1 || c.Leases() != 0 {
		t.Fatalf("pulls %d (want 1), leases %d (want 0)", c.Pulls(), c.Leases())
	}
	if used, err := e.imgs.ImagesInUse(t.Context()); err != nil || !maps.Equal(used, map[string]int{sbs[0].ImageDigest: n}) {
		t.Fatalf("ImagesInUse = %v %v", used, err)
	}
	for _, sb := range sbs {
		if _, err := e.svc.Destroy(t.Context(), sb.ID); err != nil {
			t.Fatal(err)
		}
	}
	if used, err := e.imgs.ImagesInUse(t.Context()); err != nil || len(used) != 0 {
		t.Fatalf("ImagesInUse after destroying them = %v %v", used, err)
	}
	if r := e.rt.Resources(); len(r) != 0 {
		t.Fatalf("runtime resources left: %v", r)
	}
}

// TestWakeAfterTagMoved: a sandbox of an OCI image wakes on the image it slept on even when its
// tag moved meanwhile (the wake resolves the record's digest, not the tag: it was refused before).
func TestWakeAfterTagMoved(t *testing.T) {
	c := imagefake.New(t.TempDir())
	e := newFakeEnv(t, sandbox.Config{Images: c, SnapshotDir: filepath.Join(t.TempDir(), "snapshots")})
	c.InUse = func(ctx context.Context) (map[string]int, error) { return e.imgs.ImagesInUse(ctx) }
	c.AddRemote("python:3.12-slim", pyConfig)
	sb := e.create(t, sandbox.CreateRequest{Image: "python:3.12-slim"})
	if _, err := e.svc.Sleep(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	c.AddRemote("python:3.12-slim", image.Config{Env: []string{"PYTHON_VERSION=3.12.8"}})
	if moved, err := e.imgs.PullImage(t.Context(), "python:3.12-slim", nil); err != nil || moved.Digest == sb.ImageDigest {
		t.Fatalf("pull: %+v %v", moved, err)
	}
	woke, err := e.svc.Wake(t.Context(), sb.ID)
	if err != nil {
		t.Fatalf("wake after the tag moved: %v", err)
	}
	if woke.State != sandbox.StateRunning || woke.ImageDigest != sb.ImageDigest {
		t.Fatalf("woke %s on %s, want running on %s", woke.State, woke.ImageDigest, sb.ImageDigest)
	}
	img, err := c.Get(t.Context(), "python:3.12-slim@"+sb.ImageDigest)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := c.LayerDirs(t.Context(), img)
	if rfs := e.rt.Rootfs(sb.ID); rfs == nil || !slices.Equal(rfs.Layers, want) {
		t.Fatalf("woken on layers %+v, want the slept image's %v", rfs, want)
	}
}

// refRuntime is a fake runtime that pulls images itself (runtime.ImageRef, as kubernetes does)
// and records the specs it is given.
type refRuntime struct {
	runtime.Runtime
	mu    sync.Mutex
	specs []runtime.Spec
}

func (r *refRuntime) Capabilities() runtime.Capabilities {
	c := r.Runtime.Capabilities()
	c.Images = []string{runtime.ImageRef}
	return c
}

func (r *refRuntime) Create(ctx context.Context, spec runtime.Spec) (runtime.Handle, error) {
	r.mu.Lock()
	r.specs = append(r.specs, spec)
	r.mu.Unlock()
	spec.Image = "host" // the fake runs only host sandboxes: it stands in for the backend's pull
	return r.Runtime.Create(ctx, spec)
}

// TestCreateImageRefPassThrough: on a runtime that pulls images itself the reference goes to
// it as written: no image cache is needed, nothing is pulled or unpacked, no digest is pinned;
// image "host" is refused (the runtime does not declare it) and a bad reference is
// INVALID_ARGUMENT.
func TestCreateImageRefPassThrough(t *testing.T) {
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	f, err := fake.New(fake.Config{Name: "kubernetes"})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Shutdown(context.Background())
	rt := &refRuntime{Runtime: f}
	svc, err := sandbox.NewService(st, []runtime.Runtime{rt}, sandbox.Config{DefaultRuntime: "kubernetes"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	sb, err := svc.Create(t.Context(), sandbox.CreateRequest{Image: "python:3.12-slim"})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	defer svc.Destroy(context.Background(), sb.ID)
	if sb.Image != "python:3.12-slim" || sb.ImageDigest != "" || sb.Runtime != "kubernetes" {
		t.Fatalf("record %+v", sb)
	}
	rt.mu.Lock()
	specs := slices.Clone(rt.specs)
	rt.mu.Unlock()
	if len(specs) != 1 || specs[0].Image != "python:3.12-slim" || specs[0].Rootfs != nil {
		t.Fatalf("specs %+v", specs)
	}
	if _, err := svc.Create(t.Context(), sandbox.CreateRequest{}); errcode.Of(err) != errcode.InvalidArgument {
		t.Fatalf("image host on a ref-only runtime: %v, want INVALID_ARGUMENT", err)
	}
	if _, err := svc.Create(t.Context(), sandbox.CreateRequest{Image: "Bad Ref"}); errcode.Of(err) != errcode.InvalidArgument {
		t.Fatalf("bad reference: %v, want INVALID_ARGUMENT", err)
	}
}
