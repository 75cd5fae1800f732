package e2e

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/testenv"
	"github.com/agentbox/agentbox/internal/testenv/imagelab"
	"github.com/agentbox/agentbox/internal/wire"
)

// mustExec runs argv in id and returns its stdout; a failure or a non-zero exit fails the test.
func mustExec(t *testing.T, c *client.Client, id string, argv ...string) string {
	t.Helper()
	res, err := c.Exec(context.Background(), id, wire.ExecRequest{Command: argv}, nil)
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("%s in %s: %v %+v", strings.Join(argv, " "), id, err, res)
	}
	return res.Stdout
}

// TestImages drives images end to end through the real binary: an in-process registry on
// loopback (plain HTTP, as for any loopback registry) holding a busybox image and a private
// registry behind basic auth; `agentbox image pull` from the CLI; sandboxes of the image on
// runc, crun and gVisor (exec, root by default, writes into /etc and /usr/local/bin, two
// sandboxes not seeing each other's writes, the writable layer bounded by disk_mb); commit,
// a create from the commit, push to the registry and pull into a clean cache (same digest),
// `docker save` import; then a clean host.
func TestImages(t *testing.T) {
	testenv.RequireRoot(t)
	ctx := context.Background()
	reg := imagelab.Start(t)
	priv := imagelab.Start(t, imagelab.WithBasicAuth("alice", "s3cret"))
	reg.Push(t, "e2e/busybox:1", imagelab.Busybox(t))
	priv.Push(t, "team/busybox:1", imagelab.Busybox(t))
	busybox, private := reg.Ref("e2e/busybox:1"), priv.Ref("team/busybox:1")

	dir := testenv.ShortTempDir(t, "abe2e")
	s := startServer(t, dir, "--registry-auth", priv.Host+"=alice:s3cret")
	c := s.client()
	var ids []string
	defer func() { assertHostClean(t, dir, ids) }()
	defer s.stop()

	// The CLI pulls (plain lines when stdout is not a terminal) and lists.
	if out, errOut, code := s.cli("", "image", "pull", busybox); code != 0 {
		t.Fatalf("image pull: %d %s %s", code, out, errOut)
	}
	out, errOut, code := s.cli("", "image", "ls")
	if code != 0 || !strings.Contains(out, "e2e/busybox") {
		t.Fatalf("image ls: %d %q %s", code, out, errOut)
	}
	img, err := c.InspectImage(ctx, busybox)
	if err != nil || !strings.HasPrefix(img.Digest, "sha256:") {
		t.Fatalf("inspect: %+v %v", img, err)
	}

	// The private registry: the operator's credential works.
	if _, err := c.PullImage(ctx, private, nil); err != nil {
		t.Fatalf("pull from the private registry with --registry-auth: %v", err)
	}
	other := imagelab.Start(t, imagelab.WithBasicAuth("bob", "other"))
	other.Push(t, "team/busybox:1", imagelab.Busybox(t))
	otherRef := other.Ref("team/busybox:1")
	if _, err := c.PullImage(ctx, otherRef, nil); errcode.Of(err) != errcode.ImagePullFailed {
		t.Fatalf("pull from a registry without credentials = %v, want IMAGE_PULL_FAILED", err)
	}
	if _, err := c.Create(ctx, wire.CreateRequest{Image: "no such image!"}); errcode.Of(err) != errcode.InvalidArgument {
		t.Fatalf("create from a malformed reference = %v, want INVALID_ARGUMENT", err)
	}

	for _, rt := range []string{"runc", "crun", "gvisor"} {
		t.Run(rt, func(t *testing.T) {
			a, err := c.Create(ctx, wire.CreateRequest{Runtime: rt, Image: busybox, DiskMB: 64})
			if err != nil {
				t.Fatalf("create: %v", err)
			}
			ids = append(ids, a.ID)
			if a.ImageDigest != img.Digest {
				t.Errorf("record pins %q, want %q", a.ImageDigest, img.Digest)
			}
			if got := mustExec(t, c, a.ID, "id", "-u"); got != "0\n" {
				t.Errorf("an image with no User runs commands as %q, want root", got)
			}
			mustExec(t, c, a.ID, "sh", "-c", "mkdir -p /usr/local/bin && printf '#!/bin/sh\\necho hello from the layer\\n' > /usr/local/bin/hello && chmod 755 /usr/local/bin/hello && echo x > /etc/written")
			if got := mustExec(t, c, a.ID, "/usr/local/bin/hello"); got != "hello from the layer\n" {
				t.Errorf("installed program: %q", got)
			}
			if _, err := c.WriteFile(ctx, a.ID, "/etc/motd", 0o644, strings.NewReader("files API\n")); err != nil {
				t.Errorf("files API write into /etc: %v", err)
			}
			b, err := c.Create(ctx, wire.CreateRequest{Runtime: rt, Image: busybox})
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, b.ID)
			if res, err := c.Exec(ctx, b.ID, wire.ExecRequest{Command: []string{"ls", "/usr/local/bin/hello", "/etc/written"}}, nil); err != nil || res.ExitCode == 0 {
				t.Errorf("a second sandbox of the image sees the first's writes: %+v %v", res, err)
			}
			// The writable layer is on the sandbox's disk: disk_mb bounds it.
			res, err := c.Exec(ctx, a.ID, wire.ExecRequest{Command: []string{"dd", "if=/dev/zero", "of=/fill", "bs=1M", "count=200"}}, nil)
			if err != nil || res.ExitCode == 0 || !strings.Contains(res.Stderr, "No space left") {
				t.Errorf("dd of 200 MiB into the root of a 64 MiB disk: %+v %v", res, err)
			}
			mustExec(t, c, a.ID, "rm", "-f", "/fill")
			if rt == "runc" {
				commitAndShip(t, s, reg, a.ID, img, &ids)
			}
			for _, id := range []string{a.ID, b.ID} {
				if _, err := c.Destroy(ctx, id); err != nil {
					t.Fatal(err)
				}
			}
		})
	}

	// A minimal image without a shell (as distroless ones are): argv exec and the files API
	// work; asking for a shell says what is missing.
	bb, err := os.ReadFile(imagelab.BusyboxPath)
	if err != nil {
		t.Fatal(err)
	}
	reg.Push(t, "e2e/minimal:1", imagelab.Single(t, imagelab.LayerTar(imagelab.Dir("app", 0o755),
		imagelab.Reg("app/busybox", string(bb), 0o755), imagelab.Dir("data", 0o755), imagelab.Reg("data/file.txt", "in the image\n", 0o644))))
	minimal, err := c.Create(ctx, wire.CreateRequest{Image: reg.Ref("e2e/minimal:1")})
	if err != nil {
		t.Fatalf("create from a shell-less image: %v", err)
	}
	ids = append(ids, minimal.ID)
	if got := mustExec(t, c, minimal.ID, "/app/busybox", "echo", "argv works"); got != "argv works\n" {
		t.Errorf("argv exec in a shell-less image: %q", got)
	}
	if rc, _, err := c.ReadFile(ctx, minimal.ID, "/data/file.txt", 0, 0); err != nil {
		t.Errorf("files API in a shell-less image: %v", err)
	} else {
		b, _ := io.ReadAll(rc)
		rc.Close()
		if string(b) != "in the image\n" {
			t.Errorf("files API in a shell-less image read %q", b)
		}
	}
	if res, err := c.Exec(ctx, minimal.ID, wire.ExecRequest{Command: []string{"sh", "-c", "true"}}, nil); err == nil && res.ExitCode == 0 {
		t.Errorf("sh ran in an image without one: %+v", res)
	} else {
		t.Logf("sh in a shell-less image: %v %+v", err, res)
	}
	if _, err := c.Destroy(ctx, minimal.ID); err != nil {
		t.Fatal(err)
	}

	// docker save → import → create.
	saved := filepath.Join(t.TempDir(), "saved.tar")
	if err := os.WriteFile(saved, imagelab.DockerSave(t, imagelab.Busybox(t), "imported/busybox:7"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, errOut, code := s.cli("", "image", "import", saved); code != 0 {
		t.Fatalf("image import: %d %s %s", code, out, errOut)
	}
	sb, err := c.Create(ctx, wire.CreateRequest{Image: "imported/busybox:7"})
	if err != nil {
		t.Fatalf("create from the imported image: %v", err)
	}
	ids = append(ids, sb.ID)
	mustExec(t, c, sb.ID, "true")
	if _, err := c.Destroy(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
}

// commitAndShip commits sandbox id, creates from the commit, pushes it to reg and pulls it
// into a clean cache of a second server.
func commitAndShip(t *testing.T, s *server, reg *imagelab.Registry, id string, base wire.Image, ids *[]string) {
	t.Helper()
	ctx := context.Background()
	c := s.client()
	out, errOut, code := s.cli("", "sandbox", "commit", id, "e2e/template:v1")
	if code != 0 {
		t.Fatalf("sandbox commit: %d %s %s", code, out, errOut)
	}
	tmpl, err := c.InspectImage(ctx, "e2e/template:v1")
	if err != nil {
		t.Fatalf("inspect the commit: %v", err)
	}
	if len(tmpl.Layers) != len(base.Layers)+1 || !tmpl.Committed {
		t.Errorf("the commit has %d layers (committed %v), want the base's %d + 1", len(tmpl.Layers), tmpl.Committed, len(base.Layers))
	}
	sb, err := c.Create(ctx, wire.CreateRequest{Image: "e2e/template:v1"})
	if err != nil {
		t.Fatalf("create from the commit: %v", err)
	}
	*ids = append(*ids, sb.ID)
	if got := mustExec(t, c, sb.ID, "/usr/local/bin/hello"); got != "hello from the layer\n" {
		t.Errorf("the commit's program: %q", got)
	}
	// Nothing agentbox put in the sandbox is in the commit: the agent's socket dir, its binary.
	if res, err := c.Exec(ctx, sb.ID, wire.ExecRequest{Command: []string{"sh", "-c", "ls -a /.agentbox/run; mount | grep -c ' / '"}}, nil); err != nil || res.ExitCode != 0 {
		t.Errorf("the sandbox of the commit: %+v %v", res, err)
	}
	if _, err := c.Destroy(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}

	pushed := reg.Ref("e2e/pushed:v1")
	if out, errOut, code := s.cli("", "image", "push", "e2e/template:v1", pushed); code != 0 {
		t.Fatalf("image push: %d %s %s", code, out, errOut)
	}
	dir2 := testenv.ShortTempDir(t, "abe2e")
	s2 := startServer(t, dir2)
	defer s2.stop()
	c2 := s2.client()
	got, err := c2.PullImage(ctx, pushed, nil)
	if err != nil {
		t.Fatalf("pull the pushed commit into a clean cache: %v", err)
	}
	if got.Digest != tmpl.Digest {
		t.Errorf("pushed then pulled digest %s, committed %s", got.Digest, tmpl.Digest)
	}
	sb2, err := c2.Create(ctx, wire.CreateRequest{Image: pushed})
	if err != nil {
		t.Fatal(err)
	}
	if got := mustExec(t, c2, sb2.ID, "/usr/local/bin/hello"); got != "hello from the layer\n" {
		t.Errorf("the pulled commit's program: %q", got)
	}
	if _, err := c2.Destroy(ctx, sb2.ID); err != nil {
		t.Fatal(err)
	}
	s2.stop()
	assertHostClean(t, dir2, []string{sb2.ID})
}

// TestKillDuringPull: SIGKILL of the server while a layer is half downloaded; after a restart
// the image is absent (no partial layer is ever used), nothing is left in the cache's tmp/, and
// a new pull works and runs.
func TestKillDuringPull(t *testing.T) {
	testenv.RequireRoot(t)
	ctx := context.Background()
	reg := imagelab.Start(t)
	img := imagelab.WithLayer(t, imagelab.Busybox(t), imagelab.Reg("opt/big", strings.Repeat("agentbox", 1<<20), 0o644))
	reg.Push(t, "e2e/slow:1", img)
	ref := reg.Ref("e2e/slow:1")
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	top, err := layers[len(layers)-1].Digest()
	if err != nil {
		t.Fatal(err)
	}
	release := reg.Hold(top.String())
	dir := testenv.ShortTempDir(t, "abe2e")
	s := startServer(t, dir)
	go s.client().PullImage(ctx, ref, nil)
	deadline := time.Now().Add(20 * time.Second)
	for reg.BlobGets(top.String()) == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if reg.BlobGets(top.String()) == 0 {
		t.Fatal("the pull never asked for the held layer")
	}
	time.Sleep(200 * time.Millisecond)
	s.kill()
	release()
	s2 := startServer(t, dir)
	defer s2.stop()
	c := s2.client()
	if _, err := c.InspectImage(ctx, ref); errcode.Of(err) != errcode.ImageNotFound {
		t.Fatalf("after a SIGKILL mid-pull the image = %v, want IMAGE_NOT_FOUND", err)
	}
	if left, _ := os.ReadDir(filepath.Join(dir, "images", "tmp")); len(left) > 0 {
		t.Errorf("the cache's tmp/ holds %d entries after a restart", len(left))
	}
	if _, err := c.PullImage(ctx, ref, nil); err != nil {
		t.Fatalf("pull after the restart: %v", err)
	}
	sb, err := c.Create(ctx, wire.CreateRequest{Image: ref})
	if err != nil {
		t.Fatal(err)
	}
	if got := mustExec(t, c, sb.ID, "sh", "-c", "wc -c < /opt/big"); strings.TrimSpace(got) != "8388608" {
		t.Errorf("the big file has %q bytes", got)
	}
	if _, err := c.Destroy(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	s2.stop()
	assertHostClean(t, dir, []string{sb.ID})
}
