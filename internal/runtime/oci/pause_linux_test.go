package oci

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/guest"
	"github.com/agentbox/agentbox/internal/hostinfo"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/runtimetest"
	"github.com/agentbox/agentbox/internal/testenv"
)

// TestPause: Pause freezes a sandbox whose shell keeps appending to a file of its writable
// root (the file stops growing on the host, the runtime says paused, and for runc and crun the
// cgroup's freezer says FROZEN); Resume lets it go on; both are idempotent.
func TestPause(t *testing.T) {
	t.Parallel()
	for _, f := range []Flavor{FlavorRunc, FlavorCrun, FlavorGVisor} {
		t.Run(string(f), func(t *testing.T) {
			t.Parallel()
			testPause(t, newFlavor(t, f))
		})
	}
}

func testPause(t *testing.T, rt *Runtime) {
	ctx := context.Background()
	layers := buildTestLayers(t, filepath.Join(rt.root, "layers"))
	spec := runtimetest.DefaultSpec(runtimetest.NewID())
	spec.Image, spec.IDMap, spec.DiskMB = "test/busybox:1", runtimetest.TestIDMap(), 256
	spec.Rootfs = &runtime.Rootfs{Layers: layers}
	spec.Env = map[string]string{"PATH": "/bin"}
	c := runtimetest.Start(t, rt, spec)
	wl, err := rt.WritableLayer(ctx, spec.ID)
	if err != nil {
		t.Fatal(err)
	}
	// The writer runs detached from the exec (the agent returns once sh exits).
	if res := runtimetest.ExecRequest(t, c, guest.ExecRequest{Argv: []string{"sh", "-c",
		"(while :; do echo x >> /f; done) </dev/null >/dev/null 2>&1 &"}, User: "root", TimeoutMs: 10000}); res.ExitCode != 0 {
		t.Fatalf("start the writer: %s", res)
	}
	hostFile := filepath.Join(wl.Dir, "f")
	size := func() int64 {
		t.Helper()
		fi, err := os.Stat(hostFile)
		if err != nil {
			return -1
		}
		return fi.Size()
	}
	grows := func(what string) {
		t.Helper()
		s0 := size()
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if size() > s0 {
				return
			}
		}
		t.Fatalf("%s: %s does not grow (size %d)", what, hostFile, s0)
	}
	grows("before Pause")

	began := time.Now()
	if err := rt.Pause(ctx, spec.ID); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	t.Logf("%s: Pause took %s", rt.name, time.Since(began))
	if err := rt.Pause(ctx, spec.ID); err != nil {
		t.Errorf("Pause of a paused sandbox: %v", err)
	}
	if st, err := rt.rawStatus(ctx, spec.ID); err != nil || st != "paused" {
		t.Errorf("%s state: %q %v, want paused", rt.name, st, err)
	}
	if st, err := rt.State(ctx, spec.ID); err != nil || st != runtime.StatusRunning {
		t.Errorf("State of a paused sandbox: %q %v, want %q", st, err, runtime.StatusRunning)
	}
	if rt.flavor != FlavorGVisor {
		if got := freezerState(t, rt, spec.ID); got != "FROZEN" {
			t.Errorf("freezer state of a paused sandbox: %q, want FROZEN", got)
		}
	}
	s0 := size()
	time.Sleep(500 * time.Millisecond)
	if s1 := size(); s1 != s0 {
		t.Errorf("paused: %s grew from %d to %d bytes", hostFile, s0, s1)
	}
	b, err := os.ReadFile(hostFile)
	if err != nil || len(b) == 0 || strings.Trim(string(b), "x\n") != "" || b[len(b)-1] != '\n' {
		t.Errorf("paused: %s is %d bytes, not whole lines of x: %v", hostFile, len(b), err)
	}

	began = time.Now()
	if err := rt.Resume(ctx, spec.ID); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	t.Logf("%s: Resume took %s", rt.name, time.Since(began))
	if err := rt.Resume(ctx, spec.ID); err != nil {
		t.Errorf("Resume of a running sandbox: %v", err)
	}
	if st, err := rt.rawStatus(ctx, spec.ID); err != nil || st != "running" {
		t.Errorf("%s state after Resume: %q %v, want running", rt.name, st, err)
	}
	if rt.flavor != FlavorGVisor {
		if got := freezerState(t, rt, spec.ID); got != "THAWED" {
			t.Errorf("freezer state after Resume: %q, want THAWED", got)
		}
	}
	grows("after Resume")
	if res := runtimetest.Exec(t, c, "true"); res.ExitCode != 0 {
		t.Errorf("the agent after Resume: %s", res)
	}

	// How long a commit keeps a sandbox paused: 100 MiB written into its root, then Pause, a
	// read of the writable layer as image.Store.Commit reads it (a tar to a file, hashed),
	// Resume.
	if res := runtimetest.ExecRequest(t, c, guest.ExecRequest{Argv: []string{"dd", "if=/dev/zero", "of=/big", "bs=1M", "count=100"},
		User: "root", TimeoutMs: 60000}); res.ExitCode != 0 {
		t.Fatalf("dd: %s", res)
	}
	began = time.Now()
	if err := rt.Pause(ctx, spec.ID); err != nil {
		t.Fatal(err)
	}
	paused := time.Now()
	n := tarLayer(t, wl.Dir, filepath.Join(rt.root, "layer.tar"))
	read := time.Now()
	if err := rt.Resume(ctx, spec.ID); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: a sandbox with 100 MiB written stayed paused %s (pause %s, read of %d bytes %s, resume %s)", rt.name,
		time.Since(began).Round(time.Millisecond), paused.Sub(began).Round(time.Millisecond), n,
		read.Sub(paused).Round(time.Millisecond), time.Since(read).Round(time.Millisecond))

	// Stopped and unknown sandboxes.
	if err := rt.Delete(ctx, spec.ID); err != nil {
		t.Fatal(err)
	}
	if err := rt.Pause(ctx, spec.ID); errcode.Of(err) != errcode.SandboxNotFound {
		t.Errorf("Pause of a deleted sandbox: %v, want SANDBOX_NOT_FOUND", err)
	}
	if err := rt.Resume(ctx, spec.ID); errcode.Of(err) != errcode.SandboxNotFound {
		t.Errorf("Resume of a deleted sandbox: %v, want SANDBOX_NOT_FOUND", err)
	}
}

// TestPauseDeletePaused: a paused sandbox is deleted without a Resume, leaving nothing.
func TestPauseDeletePaused(t *testing.T) {
	t.Parallel()
	for _, f := range []Flavor{FlavorRunc, FlavorCrun, FlavorGVisor} {
		t.Run(string(f), func(t *testing.T) {
			t.Parallel()
			rt := newFlavor(t, f)
			spec := runtimetest.DefaultSpec(runtimetest.NewID())
			runtimetest.Start(t, rt, spec)
			if err := rt.Pause(context.Background(), spec.ID); err != nil {
				t.Fatal(err)
			}
			began := time.Now()
			if err := rt.Delete(context.Background(), spec.ID); err != nil {
				t.Fatalf("Delete of a paused sandbox: %v", err)
			}
			took := time.Since(began)
			t.Logf("%s: Delete of a paused sandbox took %s", f, took)
			if took > stopTimeout/2 {
				t.Errorf("Delete of a paused sandbox took %s: its SIGKILL waited for a thaw", took)
			}
			if leaks := testenv.Leaks(spec.ID); len(leaks) > 0 {
				t.Errorf("after Delete: %v", leaks)
			}
			if ids, _ := rt.List(context.Background()); containsStr(ids, spec.ID) {
				t.Errorf("%s still listed", spec.ID)
			}
		})
	}
}

// freezerState reads the sandbox's v1 freezer.state, or on cgroup v2 "FROZEN"/"THAWED" from
// cgroup.freeze.
func freezerState(t *testing.T, rt *Runtime, id string) string {
	t.Helper()
	mounts, err := hostinfo.CgroupMounts()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range mounts {
		if m.Version == 1 && containsStr(m.Options, "freezer") {
			b, err := os.ReadFile(filepath.Join(m.Path, cgroupPath(rt.cgroupParent, id), "freezer.state"))
			if err != nil {
				t.Fatal(err)
			}
			return strings.TrimSpace(string(b))
		}
	}
	for _, m := range mounts {
		if m.Version == 2 {
			b, err := os.ReadFile(filepath.Join(m.Path, cgroupPath(rt.cgroupParent, id), "cgroup.freeze"))
			if err != nil {
				continue
			}
			if strings.TrimSpace(string(b)) == "1" {
				return "FROZEN"
			}
			return "THAWED"
		}
	}
	t.Fatal("no freezer: neither a v1 freezer hierarchy nor cgroup.freeze")
	return ""
}

// tarLayer writes dir's regular files and directories as a tar to out, hashing it, and returns
// its size: the I/O of image.Store.Commit's read of a writable layer.
func tarLayer(t *testing.T, dir, out string) int64 {
	t.Helper()
	f, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	defer os.Remove(out)
	defer f.Close()
	h := sha256.New()
	cw := &countWriter{w: io.MultiWriter(f, h)}
	tw := tar.NewWriter(cw)
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if !fi.Mode().IsRegular() && !fi.IsDir() {
			return nil
		}
		hdr, err := tar.FileInfoHeader(fi, "")
		if err != nil {
			return err
		}
		hdr.Name, _ = filepath.Rel(dir, p)
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			src, err := os.Open(p)
			if err != nil {
				return err
			}
			defer src.Close()
			if _, err := io.Copy(tw, src); err != nil {
				return err
			}
		}
		return nil
	})
	if err == nil {
		err = tw.Close()
	}
	if err != nil {
		t.Fatal(err)
	}
	return cw.n
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// TestPauseAdoptResumes: a sandbox left paused (the server died during a commit, between Pause
// and Resume) is resumed by the restarted server's Adopt: its agent answers again.
func TestPauseAdoptResumes(t *testing.T) {
	t.Parallel()
	for _, f := range []Flavor{FlavorRunc, FlavorGVisor} {
		t.Run(string(f), func(t *testing.T) {
			t.Parallel()
			rt := newFlavor(t, f)
			spec := runtimetest.DefaultSpec(runtimetest.NewID())
			runtimetest.Start(t, rt, spec)
			ctx := context.Background()
			if err := rt.Pause(ctx, spec.ID); err != nil {
				t.Fatal(err)
			}
			if st, err := rt.rawStatus(ctx, spec.ID); err != nil || st != "paused" {
				t.Fatalf("after Pause the runtime says %q %v", st, err)
			}
			if err := rt.Adopt(ctx, spec.ID, ""); err != nil {
				t.Fatalf("Adopt of a paused sandbox: %v", err)
			}
			if st, err := rt.rawStatus(ctx, spec.ID); err != nil || st != "running" {
				t.Fatalf("after Adopt the runtime says %q %v, want running", st, err)
			}
			dial, err := rt.Agent(ctx, spec.ID)
			if err != nil {
				t.Fatal(err)
			}
			c := guest.NewClient(guest.Dialer(dial))
			defer c.Close()
			hctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			if h, err := c.Health(hctx); err != nil || !h.OK {
				t.Fatalf("the agent after Adopt: %+v %v", h, err)
			}
		})
	}
}
