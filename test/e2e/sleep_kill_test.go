package e2e

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/testenv"
	"github.com/agentbox/agentbox/internal/wire"
)

// every operation survives a server SIGKILL in its middle with nothing leaked. Here
// sandbox_sleep and sandbox_wake: a real `agentbox serve` is SIGKILLed while the runtime is in
// the middle of the operation (runc: files-only; gVisor: files+memory), then started again on
// the same state dir. The sandbox must come back sleeping or running — never lost, creating or
// half-asleep — and usable: woken if asleep, its disk's file and (gVisor) its in-memory file
// intact. Once destroyed, no container, sandbox directory, snapshot directory, mount, loop
// device, cgroup or process of it is left on the host.

func TestKillDuringSleepRunc(t *testing.T)   { killDuringSleepWake(t, "runc", "sleep") }
func TestKillDuringWakeRunc(t *testing.T)    { killDuringSleepWake(t, "runc", "wake") }
func TestKillDuringSleepGVisor(t *testing.T) { killDuringSleepWake(t, "gvisor", "sleep") }
func TestKillDuringWakeGVisor(t *testing.T)  { killDuringSleepWake(t, "gvisor", "wake") }

// TestKillDuringCheckpointGVisor kills the server once `runsc checkpoint` writes the memory image
// (the checkpoint, the server's child, goes on without it and ends the sandbox).
func TestKillDuringCheckpointGVisor(t *testing.T) { killDuringSleepWake(t, "gvisor", "checkpoint") }

// midSleep reports whether a sleep is under way in the runtime: the snapshot directory exists
// and holds something (the runtime writes into it), but not yet its snapshot.json.
func midSleep(snaps string) bool {
	ents, _ := os.ReadDir(snaps)
	if len(ents) != 1 {
		return false
	}
	d := filepath.Join(snaps, ents[0].Name())
	inner, _ := os.ReadDir(d)
	_, err := os.Stat(filepath.Join(d, runtime.SnapshotInfoFile))
	return len(inner) > 0 && errors.Is(err, os.ErrNotExist)
}

func killDuringSleepWake(t *testing.T, rt, op string) {
	testenv.RequireRoot(t)
	dir := testenv.ShortTempDir(t, "absk")
	s := startServer(t, dir)
	ctx := context.Background()
	c := s.client()
	sb, err := c.Create(ctx, wire.CreateRequest{Runtime: rt, MemoryMB: 256})
	if err != nil {
		t.Fatal(err)
	}
	id := sb.ID
	// A file on the disk, and 128 MiB written just before the sleep: the sleep's sync of the
	// disk then takes a while, which widens the window the kill must land in. On gVisor a file
	// in memory (tmpfs) too, which only a memory snapshot keeps.
	script := "echo kept > /workspace/f && head -c 134217728 /dev/zero > /workspace/big"
	if rt == "gvisor" {
		script += " && echo in-memory > /tmp/mem"
	}
	if r, err := c.Exec(ctx, id, apiExec("sh", "-c", script), nil); err != nil || r.ExitCode != 0 {
		t.Fatalf("prepare: %+v %v", r, err)
	}
	snaps := filepath.Join(dir, "snapshots")
	sdir := filepath.Join(dir, "runtimes", rt, "sandboxes", id)
	if op == "wake" {
		if got, err := c.Sleep(ctx, id); err != nil || got.State != wire.StateSleeping {
			t.Fatalf("sleep before the wake: %+v %v", got, err)
		}
		if _, err := os.Stat(sdir); !os.IsNotExist(err) {
			t.Fatalf("a sleeping sandbox's runtime directory %s is there: %v", sdir, err)
		}
	}

	// The operation, and the kill once the runtime is in its middle.
	var replied atomic.Bool
	go func() {
		var err error
		if op != "wake" {
			_, err = c.Sleep(ctx, id)
		} else {
			_, err = c.Wake(ctx, id)
		}
		if err == nil {
			replied.Store(true)
		}
	}()
	midway := func() bool {
		switch op {
		case "sleep":
			return midSleep(snaps)
		case "checkpoint":
			imgs, _ := filepath.Glob(filepath.Join(snaps, "*", "memory", "*.img"))
			return midSleep(snaps) && len(imgs) > 0
		}
		// The wake has made the runtime's sandbox (its directory, the disk linked in) and the
		// sleep snapshot is still whole: the runtime is creating it.
		_, err := os.Stat(sdir)
		return err == nil
	}
	seen := false
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline) && !replied.Load(); time.Sleep(time.Millisecond) {
		if midway() {
			seen = true
			break
		}
	}
	s.kill()
	if !seen || replied.Load() {
		t.Fatalf("the %s was never seen in its middle before it finished (replied %v; snapshots %v)", op, replied.Load(), lsR(snaps))
	}
	t.Logf("killed mid-%s: snapshots %v; runtime dir there: %v", op, lsR(snaps), exists(sdir))

	// Restarted: the sandbox has converged, sleeping or running.
	s2 := startServer(t, dir)
	c2 := s2.client()
	var got wire.Sandbox
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		got, err = c2.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if got.State == wire.StateSleeping || (got.State == wire.StateRunning && got.SleepSnapshot == "") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the restart the sandbox is %s (sleep snapshot %q): %+v\n%s", got.State, got.SleepSnapshot, got, s2.Logs)
		}
	}
	t.Logf("after the restart: %s", got.State)
	memoryKept := true
	if got.State == wire.StateSleeping {
		// A sleep finished after the restart says what it kept, and keeps no less.
		sn, err := c2.GetSnapshot(ctx, got.SleepSnapshot)
		if err != nil || sn.State != wire.SnapshotReady {
			t.Fatalf("the sleep snapshot after the restart: %+v %v", sn, err)
		}
		memoryKept = sn.Kind == runtime.SnapshotFilesMemory
		t.Logf("sleep snapshot kind %s", sn.Kind)
		if rt == "runc" && memoryKept {
			t.Fatalf("runc sleep snapshot claims memory: %+v", sn)
		}
		if got, err = c2.Wake(ctx, id); err != nil || got.State != wire.StateRunning {
			t.Fatalf("wake after the restart: %+v %v\n%s", got, err, s2.Logs)
		}
	}
	want := map[string]string{"/workspace/f": "kept\n"}
	if rt == "gvisor" && memoryKept {
		want["/tmp/mem"] = "in-memory\n"
	}
	for p, w := range want {
		r, err := c2.Exec(ctx, id, apiExec("cat", p), nil)
		if err != nil || r.Stdout != w {
			t.Fatalf("%s after the restart: %+v %v; want %q", p, r, err, w)
		}
	}
	if ents, _ := os.ReadDir(snaps); len(ents) != 0 {
		t.Fatalf("snapshot directories of a running sandbox: %v", lsR(snaps))
	}
	// It sleeps and wakes again.
	if got, err = c2.Sleep(ctx, id); err != nil || got.State != wire.StateSleeping {
		t.Fatalf("sleep after the restart: %+v %v", got, err)
	}
	if got, err = c2.Wake(ctx, id); err != nil || got.State != wire.StateRunning {
		t.Fatalf("wake after the restart: %+v %v", got, err)
	}
	if r, err := c2.Exec(ctx, id, apiExec("cat", "/workspace/f"), nil); err != nil || r.Stdout != "kept\n" {
		t.Fatalf("after a second sleep and wake: %+v %v", r, err)
	}

	// Destroyed: nothing of it anywhere.
	if _, err := c2.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	s2.stop()
	binary := map[string]string{"runc": "runc", "gvisor": "runsc"}[rt]
	out, _ := exec.Command(binary, "--root", filepath.Join(dir, "runtimes", rt, "state"), "list", "-q").Output()
	if s := strings.TrimSpace(string(out)); s != "" {
		t.Errorf("%s containers left: %s", rt, s)
	}
	if d, _ := filepath.Glob(filepath.Join(dir, "runtimes", rt, "sandboxes", "*")); len(d) > 0 {
		t.Errorf("sandbox directories left: %v", d)
	}
	if ents, _ := os.ReadDir(snaps); len(ents) != 0 {
		t.Errorf("snapshot directories left: %v", lsR(snaps))
	}
	if leaks := testenv.LeaksAfter(5*time.Second, id, dir+"/"); len(leaks) > 0 {
		t.Errorf("host leaks:\n%s", strings.Join(leaks, "\n"))
	}
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

func lsR(dir string) []string {
	var out []string
	_ = filepath.Walk(dir, func(p string, _ os.FileInfo, _ error) error {
		out = append(out, strings.TrimPrefix(p, dir))
		return nil
	})
	return out
}
