package imageadmin_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/image"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/testenv/imagelab"
)

// TestCreateFromRealStore: the control plane over the real image cache and a loopback registry
// (the fake runtime: no root for the sandbox): a create pulls and pins the digest, the runtime
// gets the unpacked layers, an image in use cannot be removed, a commit of the writable layer
// is a base for a new create whose top layer holds the committed file.
func TestCreateFromRealStore(t *testing.T) {
	reg := imagelab.Start(t)
	reg.Push(t, "bb:1", imagelab.Busybox(t))
	var e *fakeEnv
	st, err := image.Open(filepath.Join(t.TempDir(), "images"), image.Options{InUse: func(ctx context.Context) (map[string]int, error) { return e.imgs.ImagesInUse(ctx) }})
	if err != nil {
		t.Fatal(err)
	}
	e = newFakeEnv(t, sandbox.Config{Images: st})
	sb := e.create(t, sandbox.CreateRequest{Image: reg.Ref("bb:1")})
	img, err := st.Get(t.Context(), reg.Ref("bb:1"))
	if err != nil || sb.ImageDigest != img.Digest {
		t.Fatalf("pinned %q, cache %+v %v", sb.ImageDigest, img, err)
	}
	rfs := e.rt.Rootfs(sb.ID)
	if rfs == nil || len(rfs.Layers) == 0 {
		t.Fatalf("rootfs %+v", rfs)
	}
	if _, err := os.Stat(filepath.Join(rfs.Layers[0], "bin")); err != nil {
		t.Fatalf("the unpacked layer: %v", err)
	}
	if _, err := e.imgs.RemoveImage(t.Context(), reg.Ref("bb:1"), false); errcode.Of(err) != errcode.Conflict {
		t.Fatalf("remove in use: %v", err)
	}
	layer, err := e.rt.WritableLayer(t.Context(), sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(layer.Dir, "etc"), 0o755)
	if err := os.WriteFile(filepath.Join(layer.Dir, "etc", "added"), []byte("hi"), 0o644); err != nil {
		t.Fatal(err)
	}
	committed, err := e.imgs.Commit(t.Context(), sb.ID, "tmpl:v1")
	if err != nil || committed.Parent != sb.ImageDigest {
		t.Fatalf("commit: %+v %v", committed, err)
	}
	sb2 := e.create(t, sandbox.CreateRequest{Image: "tmpl:v1"})
	rfs2 := e.rt.Rootfs(sb2.ID)
	if b, err := os.ReadFile(filepath.Join(rfs2.Layers[len(rfs2.Layers)-1], "etc", "added")); err != nil || string(b) != "hi" {
		t.Fatalf("the commit's layer: %q %v", b, err)
	}
	if used, _ := e.imgs.ImagesInUse(t.Context()); used[sb.ImageDigest] != 1 || used[committed.Digest] != 1 {
		t.Fatalf("ImagesInUse = %v", used)
	}
}
