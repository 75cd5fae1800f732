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

	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/oci"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/sandbox/snapshots"
	"github.com/agentbox/agentbox/internal/store/sqlite"
	"github.com/agentbox/agentbox/internal/testenv"
)

// Snapshots on real runc sandboxes: the control plane over the oci runtime's Snapshotter.

func (e *env) sh(t *testing.T, id, script string) string {
	t.Helper()
	res := e.exec(t, id, sandbox.ExecRequest{Argv: []string{"sh", "-c", script}, User: "root"})
	if res.ExitCode != 0 {
		t.Fatalf("%q in %s: exit %d: %s", script, id, res.ExitCode, res.Stderr)
	}
	return res.Stdout
}

// TestSnapshotForkRunc: a snapshot of a runc sandbox, then a fork of 2 from it: both forks hold
// the files as they were at the snapshot (content, modes, owners as the sandbox sees them),
// each fork's writes are its own, and nothing is left on the host once all are gone.
func TestSnapshotForkRunc(t *testing.T) {
	testenv.RequireRoot(t)
	snaps := filepath.Join(testenv.ShortTempDir(t, "absnap"), "snapshots")
	e := newEnv(t, sandbox.Config{SnapshotDir: snaps})
	src := e.create(t, sandbox.CreateRequest{})
	const fingerprint = `cd /workspace && find . -printf '%p %y %#m %U:%G %s\n' | LC_ALL=C sort && find . -type f -exec md5sum {} + | LC_ALL=C sort`
	e.sh(t, src.ID, "mkdir -p /workspace/d && echo at-fork > /workspace/f && head -c 1048576 /dev/urandom > /workspace/d/big && chmod 640 /workspace/f && chown 1000:1000 /workspace/d/big")
	before := e.sh(t, src.ID, fingerprint)
	sn, err := e.snaps.Snapshot(t.Context(), src.ID, sandbox.SnapshotRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if sn.State != sandbox.SnapshotReady || sn.Kind != runtime.SnapshotFiles || sn.SizeBytes < 1<<20 {
		t.Fatalf("snapshot %+v", sn)
	}
	e.sh(t, src.ID, "echo after > /workspace/f")
	res, err := e.snaps.Fork(t.Context(), src.ID, sandbox.ForkRequest{Count: 2, SnapshotID: sn.ID})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Sandboxes) != 2 {
		t.Fatalf("fork made %d sandboxes", len(res.Sandboxes))
	}
	for _, f := range res.Sandboxes {
		if got := e.sh(t, f.ID, fingerprint); got != before {
			t.Fatalf("fork %s's files differ from the snapshot's:\n--- at the snapshot\n%s\n--- fork\n%s", f.ID, before, got)
		}
	}
	a, b := res.Sandboxes[0].ID, res.Sandboxes[1].ID
	e.sh(t, a, "echo only-a > /workspace/f && rm /workspace/d/big")
	if got := e.sh(t, b, "cat /workspace/f && ls /workspace/d"); got != "at-fork\nbig\n" {
		t.Fatalf("fork b after a wrote: %q", got)
	}
	if got := e.sh(t, src.ID, "cat /workspace/f"); got != "after\n" {
		t.Fatalf("source after the fork: %q", got)
	}
	for _, id := range []string{src.ID, a, b} {
		if _, err := e.svc.Destroy(t.Context(), id); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.snaps.DeleteSnapshot(t.Context(), sn.ID); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(snaps); len(ents) != 0 {
		t.Fatalf("snapshot directories left: %v", ents)
	}
}

// realSnapService is a service over the state in dir (SQLite, runc under dir/rt, snapshots in
// dir/snapshots), as newEnv builds it, with its snapshots feature, reconciled: what a
// (re)started server is.
func realSnapService(t *testing.T, dir, guestBin string) (*sandbox.Service, *snapshots.Service, *sqlite.Store, func()) {
	t.Helper()
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(dir, "agentbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	rt, err := oci.New(ctx, oci.Config{Name: "runc", Binary: "runc", Root: filepath.Join(dir, "rt"), GuestBinary: guestBin,
		CgroupParent: "abt-" + filepath.Base(dir), Subreaper: true})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := sandbox.NewService(st, []runtime.Runtime{rt}, sandbox.Config{SnapshotDir: filepath.Join(dir, "snapshots")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	snaps := snapshots.New(svc.Core(), st) // before Reconcile: its Converge finishes what a kill left
	if err := svc.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	return svc, snaps, st, func() { svc.Close(); st.Close() }
}

// TestSnapshotSIGKILLRunc: a server process SIGKILLed in the middle of a snapshot (the runtime
// copying the disk, the sandbox frozen) leaves, after a restart, the snapshot recorded failed,
// its directory gone, the sandbox running and answering, and nothing on the host once it is
// destroyed. The server is a child process (this test binary) the test kills.
func TestSnapshotSIGKILLRunc(t *testing.T) {
	if dir := os.Getenv("AGENTBOX_SNAPKILL_DIR"); dir != "" {
		snapKillChild(t, dir)
		return
	}
	testenv.RequireRoot(t)
	dir := testenv.ShortTempDir(t, "absk")
	guestBin := testenv.GuestBinary(t)
	svc, _, _, closeSvc := realSnapService(t, dir, guestBin)
	sb, err := svc.Create(t.Context(), sandbox.CreateRequest{DiskMB: 2048})
	if err != nil {
		closeSvc()
		t.Fatal(err)
	}
	res, err := svc.Exec(t.Context(), sb.ID, sandbox.ExecRequest{Argv: []string{"sh", "-c", "head -c 402653184 /dev/urandom > /workspace/big && echo kept > /workspace/f"}, Timeout: 2 * time.Minute}, nil)
	if err != nil || res.ExitCode != 0 {
		closeSvc()
		t.Fatalf("fill the disk: %+v %v", res, err)
	}
	closeSvc()

	cmd := exec.Command(os.Args[0], "-test.run", "^TestSnapshotSIGKILLRunc$", "-test.v")
	cmd.Env = append(os.Environ(), "AGENTBOX_SNAPKILL_DIR="+dir, "AGENTBOX_SNAPKILL_SB="+sb.ID, "AGENTBOX_SNAPKILL_GUEST="+guestBin)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(out)
	for sc.Scan() && !strings.Contains(sc.Text(), "SNAPSHOTTING") {
	}
	// Kill once the runtime has begun writing the snapshot's directory and before it is done.
	snapDir := filepath.Join(dir, "snapshots")
	deadline := time.Now().Add(30 * time.Second)
	killedMidway := false
	for time.Now().Before(deadline) {
		ents, _ := os.ReadDir(snapDir)
		if len(ents) == 1 {
			inner, _ := os.ReadDir(filepath.Join(snapDir, ents[0].Name()))
			if _, err := os.Stat(filepath.Join(snapDir, ents[0].Name(), runtime.SnapshotInfoFile)); len(inner) > 0 && os.IsNotExist(err) {
				killedMidway = true
				break
			}
		}
		time.Sleep(2 * time.Millisecond)
	}
	_ = cmd.Process.Kill() // SIGKILL
	_ = cmd.Wait()
	if !killedMidway {
		t.Fatalf("the child's snapshot was never seen midway (snapshot dir: %v)", lsR(snapDir))
	}

	svc, snaps, st2, closeSvc := realSnapService(t, dir, guestBin)
	defer closeSvc()
	list, err := st2.ListSnapshots(t.Context(), sandbox.SnapshotFilter{})
	if err != nil || len(list) != 1 || list[0].State != sandbox.SnapshotFailed || !strings.Contains(list[0].Error, "server stopped") {
		t.Fatalf("snapshot records after the restart: %+v, %v; want one failed, saying the server stopped", list, err)
	}
	if ents, _ := os.ReadDir(snapDir); len(ents) != 0 {
		t.Fatalf("snapshot directories after the restart: %v", lsR(snapDir))
	}
	got, err := svc.Get(t.Context(), sb.ID)
	if err != nil || got.State != sandbox.StateRunning {
		t.Fatalf("sandbox after the restart: %+v, %v", got, err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	r, err := svc.Exec(ctx, sb.ID, sandbox.ExecRequest{Argv: []string{"cat", "/workspace/f"}}, nil)
	if err != nil || r.Stdout != "kept\n" {
		t.Fatalf("the sandbox after a kill during its snapshot (was it left frozen?): %+v, %v", r, err)
	}
	// A snapshot now works, and a fork from it.
	sn, err := snaps.Snapshot(t.Context(), sb.ID, sandbox.SnapshotRequest{})
	if err != nil {
		t.Fatal(err)
	}
	fk, err := snaps.Fork(t.Context(), sb.ID, sandbox.ForkRequest{SnapshotID: sn.ID})
	if err != nil {
		t.Fatal(err)
	}
	ids := []string{sb.ID, fk.Sandboxes[0].ID}
	for _, id := range ids {
		if _, err := svc.Destroy(t.Context(), id); err != nil {
			t.Fatal(err)
		}
	}
	if err := snaps.DeleteSnapshot(t.Context(), sn.ID); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(snapDir); len(ents) != 0 {
		t.Fatalf("snapshot directories left: %v", lsR(snapDir))
	}
	if leaks := testenv.LeaksAfter(5*time.Second, append(ids, dir+"/")...); len(leaks) > 0 {
		t.Fatalf("host leaks:\n%s", strings.Join(leaks, "\n"))
	}
}

// snapKillChild is the server the parent kills: it adopts the sandbox and snapshots it.
func snapKillChild(t *testing.T, dir string) {
	_, snaps, _, closeSvc := realSnapService(t, dir, os.Getenv("AGENTBOX_SNAPKILL_GUEST"))
	defer closeSvc()
	fmt.Println("SNAPSHOTTING")
	if _, err := snaps.Snapshot(context.Background(), os.Getenv("AGENTBOX_SNAPKILL_SB"), sandbox.SnapshotRequest{}); err != nil {
		t.Fatal(err)
	}
	fmt.Println("SNAPSHOT DONE (the parent was too slow to kill it)")
}

func lsR(dir string) []string {
	var out []string
	_ = filepath.Walk(dir, func(p string, _ os.FileInfo, _ error) error {
		out = append(out, p)
		return nil
	})
	return out
}
