package sandbox_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/testenv"
)

// TestForkSIGKILLRunc: a server process SIGKILLed while it forks three sandboxes from a
// snapshot (their disks being copied, some maybe started) leaves, after a restart, the source
// running, the snapshot ready, every fork either running and answering or settled (failed or
// destroyed), and nothing on the host once they are destroyed.
func TestForkSIGKILLRunc(t *testing.T) {
	if dir := os.Getenv("AGENTBOX_FORKKILL_DIR"); dir != "" {
		forkKillChild(t, dir)
		return
	}
	testenv.RequireRoot(t)
	dir := testenv.ShortTempDir(t, "abfk")
	guestBin := testenv.GuestBinary(t)
	svc, snaps, _, closeSvc := realSnapService(t, dir, guestBin)
	sb, err := svc.Create(t.Context(), sandbox.CreateRequest{DiskMB: 2048})
	if err != nil {
		closeSvc()
		t.Fatal(err)
	}
	res, err := svc.Exec(t.Context(), sb.ID, sandbox.ExecRequest{Argv: []string{"sh", "-c", "head -c 268435456 /dev/urandom > /workspace/big && echo kept > /workspace/f"}, Timeout: 2 * time.Minute}, nil)
	if err != nil || res.ExitCode != 0 {
		closeSvc()
		t.Fatalf("fill the disk: %+v %v", res, err)
	}
	sn, err := snaps.Snapshot(t.Context(), sb.ID, sandbox.SnapshotRequest{})
	if err != nil {
		closeSvc()
		t.Fatal(err)
	}
	closeSvc()

	cmd := exec.Command(os.Args[0], "-test.run", "^TestForkSIGKILLRunc$", "-test.v")
	cmd.Env = append(os.Environ(), "AGENTBOX_FORKKILL_DIR="+dir, "AGENTBOX_FORKKILL_SB="+sb.ID,
		"AGENTBOX_FORKKILL_SNAP="+sn.ID, "AGENTBOX_FORKKILL_GUEST="+guestBin)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(out)
	for sc.Scan() && !strings.Contains(sc.Text(), "FORKING") {
	}
	// Kill once a fork's sandbox directory exists under the runtime's root (its disk being
	// copied) and before the fork returns.
	deadline := time.Now().Add(30 * time.Second)
	killedMidway := false
	for time.Now().Before(deadline) && !killedMidway {
		_ = filepath.WalkDir(filepath.Join(dir, "rt"), func(p string, d os.DirEntry, err error) error {
			if err != nil || !d.IsDir() {
				return nil
			}
			if strings.Count(strings.TrimPrefix(p, dir), "/") > 3 {
				return filepath.SkipDir
			}
			if n := d.Name(); strings.HasPrefix(n, "sb-") && n != sb.ID {
				killedMidway = true
				return filepath.SkipAll
			}
			return nil
		})
		time.Sleep(2 * time.Millisecond)
	}
	_ = cmd.Process.Kill() // SIGKILL
	_ = cmd.Wait()
	if !killedMidway {
		t.Fatalf("the child's fork was never seen midway (runtime root: %v)", lsR(filepath.Join(dir, "rt")))
	}

	svc, snaps, st2, closeSvc := realSnapService(t, dir, guestBin)
	defer closeSvc()
	if got, err := st2.GetSnapshot(t.Context(), sn.ID); err != nil || got.State != sandbox.SnapshotReady {
		t.Fatalf("the snapshot after the restart: %+v, %v; want ready", got, err)
	}
	all, err := svc.List(t.Context(), sandbox.ListFilter{})
	if err != nil {
		t.Fatal(err)
	}
	ids := []string{sb.ID}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	for _, s := range all {
		if s.ID == sb.ID {
			if s.State != sandbox.StateRunning {
				t.Fatalf("the source after the restart: %s", s.State)
			}
			continue
		}
		ids = append(ids, s.ID)
		// A fork the crash cut is settled (failed, or destroyed by the control loop) or, when it
		// had started, running with the snapshot's files.
		got := s
		for got.State == sandbox.StateCreating && ctx.Err() == nil {
			time.Sleep(100 * time.Millisecond)
			got, _ = svc.Get(ctx, s.ID)
		}
		switch got.State {
		case sandbox.StateRunning:
			r, err := svc.Exec(ctx, s.ID, sandbox.ExecRequest{Argv: []string{"cat", "/workspace/f"}}, nil)
			if err != nil || r.Stdout != "kept\n" {
				t.Fatalf("fork %s running after the restart but not right: %+v, %v", s.ID, r, err)
			}
		case sandbox.StateFailed, sandbox.StateDestroyed, sandbox.StateStopping:
		default:
			t.Fatalf("fork %s after the restart: %s", s.ID, got.State)
		}
		t.Logf("fork %s after the restart: %s", s.ID, got.State)
	}
	if len(ids) == 1 {
		t.Log("no fork record was written before the kill (the fork admits all before it copies)")
	}
	r, err := svc.Exec(ctx, sb.ID, sandbox.ExecRequest{Argv: []string{"cat", "/workspace/f"}}, nil)
	if err != nil || r.Stdout != "kept\n" {
		t.Fatalf("the source after a kill during a fork: %+v, %v", r, err)
	}
	for _, id := range ids {
		if _, err := svc.Destroy(t.Context(), id); err != nil {
			t.Fatal(err)
		}
	}
	if err := snaps.DeleteSnapshot(t.Context(), sn.ID); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(filepath.Join(dir, "snapshots")); len(ents) != 0 {
		t.Fatalf("snapshot directories left: %v", lsR(filepath.Join(dir, "snapshots")))
	}
	if leaks := testenv.LeaksAfter(5*time.Second, append(ids, dir+"/")...); len(leaks) > 0 {
		t.Fatalf("host leaks:\n%s", strings.Join(leaks, "\n"))
	}
}

// forkKillChild is the server the parent kills: it adopts the sandbox and forks three from the
// snapshot.
func forkKillChild(t *testing.T, dir string) {
	_, snaps, _, closeSvc := realSnapService(t, dir, os.Getenv("AGENTBOX_FORKKILL_GUEST"))
	defer closeSvc()
	fmt.Println("FORKING")
	if _, err := snaps.Fork(context.Background(), os.Getenv("AGENTBOX_FORKKILL_SB"),
		sandbox.ForkRequest{SnapshotID: os.Getenv("AGENTBOX_FORKKILL_SNAP"), Count: 3}); err != nil {
		t.Fatal(err)
	}
	fmt.Println("FORK DONE (the parent was too slow to kill it)")
}
