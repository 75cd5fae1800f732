package mcpserver_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/image"
	"github.com/agentbox/agentbox/internal/mcpserver"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/fake"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/sandbox/imageadmin"
	"github.com/agentbox/agentbox/internal/sandbox/jobs"
	"github.com/agentbox/agentbox/internal/store/sqlite"
	"github.com/agentbox/agentbox/internal/testenv/imagefake"
)

// imageService is the control plane over real SQLite, the fake runtime and the fake image cache.
func imageService(t *testing.T) (jobs.Sandboxes, *fake.Runtime, *imagefake.Cache) {
	t.Helper()
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "agentbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	rt, err := fake.New(fake.Config{Name: "runc"})
	if err != nil {
		t.Fatal(err)
	}
	cache := imagefake.New(t.TempDir())
	svc, err := sandbox.NewService(st, []runtime.Runtime{rt}, sandbox.Config{Images: cache}, nil)
	if err != nil {
		t.Fatal(err)
	}
	svj := jobs.With(svc)
	t.Cleanup(func() {
		svc.Close()
		rt.Shutdown(context.Background())
		st.Close()
	})
	return svj, rt, cache
}

// TestImageTools: image_pull (with progress notifications when the call has a progress token,
// none without), image_list with in_use, sandbox_create with an image, sandbox_commit and its
// refusals, typed errors.
func TestImageTools(t *testing.T) {
	svc, rt, cache := imageService(t)
	cache.AddRemote("python:3.12-slim", image.Config{User: "1000", WorkingDir: "/app"})
	srv := mcpserver.New(svc, mcpserver.Options{Images: imageadmin.New(svc.Core(), svc.Core().Store())})
	defer srv.Close()
	c := connect(t, srv, "2025-11-25")

	var pulled mcpserver.ImageInfo
	c.ok("image_pull", obj{"ref": "python:3.12-slim"}, &pulled)
	if pulled.Digest == "" || pulled.Layers != 2 || pulled.WorkingDir != "/app" {
		t.Fatalf("image_pull: %+v", pulled)
	}
	if n := len(c.progressMessages()); n != 0 {
		t.Fatalf("%d progress notifications without a progress token", n)
	}
	res := c.callCtx(t.Context(), "image_pull", obj{"ref": "python:3.12-slim"}, "pull-1")
	if res.IsError {
		t.Fatalf("image_pull with a token: %s", text(res))
	}
	msgs := c.progressMessages()
	if len(msgs) == 0 || !strings.Contains(strings.Join(msgs, "\n"), "downloading") {
		t.Fatalf("progress messages %q: want layer reports", msgs)
	}
	c.fails("image_pull", obj{"ref": "NOT a ref"}, "INVALID_ARGUMENT")
	c.fails("image_pull", obj{"ref": "nosuch:1"}, "IMAGE_NOT_FOUND")
	c.fails("image_pull", obj{}, "INVALID_ARGUMENT")

	// A create that pulls reports the pull with a progress token.
	cache.AddRemote("node:22", image.Config{})
	before := len(c.progressMessages())
	if res := c.callCtx(t.Context(), "sandbox_create", obj{"image": "node:22"}, "create-1"); res.IsError {
		t.Fatalf("sandbox_create with a token: %s", text(res))
	}
	if after := c.progressMessages(); len(after) == before || !strings.Contains(after[len(after)-1], "done") {
		t.Fatalf("progress of a create that pulled: %q", after[before:])
	}

	var sb mcpserver.SandboxInfo
	c.ok("sandbox_create", obj{"image": "python:3.12-slim"}, &sb)
	if sb.Image != "python:3.12-slim" || sb.ImageDigest == "" || sb.ImageDigest == pulled.Digest { // the second pull re-pinned the tag
		t.Fatalf("sandbox_create with an image: %+v", sb)
	}
	var list mcpserver.ImageListOut
	c.ok("image_list", nil, &list)
	if list.Count != 3 {
		t.Fatalf("image_list: %+v", list)
	}
	inUse := 0
	for _, im := range list.Images {
		inUse += im.InUse
	}
	if inUse != 2 {
		t.Fatalf("image_list in_use total %d, want 1: %+v", inUse, list)
	}

	layer, err := rt.WritableLayer(t.Context(), sb.SandboxID)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(layer.Dir, "installed"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	var cm mcpserver.CommitOut
	c.ok("sandbox_commit", obj{"sandbox_id": sb.SandboxID, "name": "my-env:v1"}, &cm)
	if cm.SandboxID != sb.SandboxID || cm.Image.Parent == "" || !cm.Image.Committed || cm.Image.Layers != 3 {
		t.Fatalf("sandbox_commit: %+v", cm)
	}
	var from mcpserver.SandboxInfo
	c.ok("sandbox_create", obj{"image": "my-env:v1"}, &from)
	var host mcpserver.SandboxInfo
	c.ok("sandbox_create", nil, &host)
	if msg := c.fails("sandbox_commit", obj{"sandbox_id": host.SandboxID, "name": "x:1"}, "UNSUPPORTED_OPERATION"); !strings.Contains(msg, "OCI image") {
		t.Fatalf("commit of a host sandbox: %q", msg)
	}
	if msg := c.fails("sandbox_commit", obj{"sandbox_id": sb.SandboxID, "name": "Bad Name"}, "INVALID_ARGUMENT"); !strings.Contains(msg, "name") {
		t.Fatalf("bad name: %q", msg)
	}
	c.fails("sandbox_commit", obj{"sandbox_id": sb.SandboxID}, "INVALID_ARGUMENT")
	c.fails("sandbox_create", obj{"image": "nosuch:2"}, "IMAGE_NOT_FOUND")
	if len(cache.Commits()) != 1 {
		t.Fatalf("commits %+v", cache.Commits())
	}
}

// TestImageToolsWithoutCache: a server without an image cache answers UNSUPPORTED_OPERATION.
func TestImageToolsWithoutCache(t *testing.T) {
	svc := fakeService(t)
	srv := mcpserver.New(svc, mcpserver.Options{Images: imageadmin.New(svc.Core(), svc.Core().Store())})
	defer srv.Close()
	c := connect(t, srv, "2025-11-25")
	c.fails("image_list", nil, "UNSUPPORTED_OPERATION")
	c.fails("image_pull", obj{"ref": "python:3"}, "UNSUPPORTED_OPERATION")
}
