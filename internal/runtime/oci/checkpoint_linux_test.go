package oci

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/guest"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/runtimetest"
)

// counterJob counts in a shell variable and appends each value to /tmp/count, a file of the
// sandbox's memory (its tmpfs): only a memory restore brings either back.
const counterJob = "job-c0c0c0c0c0c0"

func startCounter(t *testing.T, c *guest.Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := c.StartJob(ctx, guest.JobStartRequest{JobID: counterJob, Argv: []string{"sh", "-c",
		"i=0; while :; do i=$((i+1)); echo $i >> /tmp/count; sleep 0.02; done"}}); err != nil {
		t.Fatal(err)
	}
	waitCount(t, c, 5)
}

// counts reads /tmp/count and checks that it is 1, 2, 3, … without a gap or a restart.
func counts(t *testing.T, c *guest.Client) []int {
	t.Helper()
	r := runtimetest.ExecRequest(t, c, guest.ExecRequest{Argv: []string{"cat", "/tmp/count"}, User: "root"})
	if r.ExitCode != 0 {
		t.Fatalf("cat /tmp/count: %s", r)
	}
	var out []int
	for i, l := range strings.Fields(r.Stdout) {
		n, err := strconv.Atoi(l)
		if err != nil || n != i+1 {
			t.Fatalf("/tmp/count line %d is %q, want %d: the count restarted or skipped", i+1, l, i+1)
		}
		out = append(out, n)
	}
	return out
}

// waitCount waits until the counter has passed n.
func waitCount(t *testing.T, c *guest.Client, n int) int {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		got := counts(t, c)
		if len(got) > n {
			return len(got)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the counter is at %d, not past %d, after 30 s", len(got), n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// debugLog sends the runtime's debug log (every command and its time) to stderr when
// AGENTBOX_TEST_DEBUG is set.
func debugLog(rt *Runtime) {
	if os.Getenv("AGENTBOX_TEST_DEBUG") != "" {
		rt.log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
}

func snapshotDir(t *testing.T, rt *Runtime) string {
	t.Helper()
	dir, err := os.MkdirTemp(rt.root, "snap")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// TestGVisorMemoryFork: a files+memory snapshot of a running gVisor sandbox, taken while a job
// counts in memory, restored into two new sandboxes (new ids, new id ranges): in each the same
// job process goes on counting from the snapshot's value (its log in the sandbox's tmpfs has
// every value from 1, no restart), and the source sandbox runs on, its agent answering.
func TestGVisorMemoryFork(t *testing.T) {
	rt := newFlavor(t, FlavorGVisor)
	if c := rt.Capabilities(); !strings.Contains(strings.Join(c.Snapshots, ","), runtime.SnapshotFilesMemory) || c.MemorySnapshotReason != "" {
		t.Fatalf("gVisor capabilities: snapshots %v, reason %q", c.Snapshots, c.MemorySnapshotReason)
	}
	ctx := context.Background()
	id := runtimetest.NewID()
	spec := runtimetest.DefaultSpec(id)
	spec.IDMap = runtimetest.TestIDMap()
	c := runtimetest.Start(t, rt, spec)
	startCounter(t, c)
	runtimetest.Exec(t, c, "sh", "-c", "echo on-disk > /workspace/marker")
	before := len(counts(t, c))

	dir := snapshotDir(t, rt)
	began := time.Now()
	info, err := rt.Snapshot(ctx, id, dir, runtime.SnapshotOptions{Memory: true})
	if err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	t.Logf("memory snapshot took %v: %+v", time.Since(began), info)
	if info.Kind != runtime.SnapshotFilesMemory || info.SizeBytes <= 0 {
		t.Fatalf("info %+v", info)
	}
	if _, err := os.Stat(filepath.Join(dir, runtime.SnapshotInfoFile)); err != nil {
		t.Fatal(err)
	}
	// The source runs on: its agent answers (a new connection) and its counter goes on.
	c0 := runtimetest.Client(t, rt, id)
	at := waitCount(t, c0, before+3)

	var forks []*guest.Client
	for i := range 2 {
		fid := runtimetest.NewID()
		fspec := runtimetest.DefaultSpec(fid)
		fspec.IDMap = runtimetest.TestIDMap()
		fspec.Snapshot = &runtime.SnapshotSource{Dir: dir, Info: info, Memory: true}
		began := time.Now()
		fc := runtimetest.Start(t, rt, fspec)
		t.Logf("fork %d restored and answering in %v", i, time.Since(began))
		forks = append(forks, fc)
	}
	var saved []int
	for i, fc := range forks {
		got := counts(t, fc)
		if len(got) < before {
			t.Fatalf("fork %d's count is at %d, below the %d counted before the snapshot", i, len(got), before)
		}
		if i == 0 {
			saved = got
		}
		// It goes on counting: the job's process is alive in the fork.
		waitCount(t, fc, len(got)+3)
		st, err := fc.Job(ctx, counterJob)
		if err != nil || st.State != guest.JobRunning {
			t.Fatalf("fork %d: the counter job is %+v %v", i, st, err)
		}
		if r := runtimetest.Exec(t, fc, "cat", "/workspace/marker"); strings.TrimSpace(r.Stdout) != "on-disk" {
			t.Fatalf("fork %d's disk: %s", i, r)
		}
	}
	// Both forks started from one value: the source's count before the snapshot is in each,
	// from 1 without a restart (counts), and each went on from there.
	_ = saved
	if at <= before {
		t.Fatalf("the source's count did not go on after the snapshot: %d, %d before", at, before)
	}
	// Independent after the fork: a file written in one is not in the other.
	runtimetest.Exec(t, forks[0], "sh", "-c", "echo mine > /tmp/only-here")
	if r := runtimetest.Exec(t, forks[1], "test", "-e", "/tmp/only-here"); r.ExitCode == 0 {
		t.Fatal("a file written in one fork is in the other")
	}
}

// TestGVisorSleepWake: a releasing memory snapshot (sleep) leaves nothing of the sandbox on the
// host (no process, no cgroup, no runtime state; List does not name it); a restore in place under
// the same id (wake) brings back the job that was running, counting on from where it was.
func TestGVisorSleepWake(t *testing.T) {
	rt := newFlavor(t, FlavorGVisor)
	debugLog(rt)
	ctx := context.Background()
	id := runtimetest.NewID()
	spec := runtimetest.DefaultSpec(id)
	spec.IDMap = runtimetest.TestIDMap()
	c := runtimetest.Start(t, rt, spec)
	startCounter(t, c)
	// Memory the wake must bring back whole: random bytes on the sandbox's tmpfs (64 MiB with
	// AGENTBOX_TEST_RESIDENT_MB=64, for timing).
	mb := "16"
	if v := os.Getenv("AGENTBOX_TEST_RESIDENT_MB"); v != "" {
		mb = v
	}
	sum := runtimetest.ExecRequest(t, c, guest.ExecRequest{Argv: []string{"sh", "-c", "head -c " + mb + "M /dev/urandom > /tmp/resident && md5sum /tmp/resident"}, User: "root"}).Stdout
	before := len(counts(t, c))

	dir := snapshotDir(t, rt)
	began := time.Now()
	info, err := rt.Snapshot(ctx, id, dir, runtime.SnapshotOptions{Memory: true, Release: true})
	if err != nil {
		t.Fatalf("sleep: %v", err)
	}
	t.Logf("sleep took %v: %+v", time.Since(began), info)
	assertReleased(t, rt, id)

	spec.Snapshot = &runtime.SnapshotSource{Dir: dir, Info: info, Memory: true, InPlace: true}
	began = time.Now()
	wc := runtimetest.Start(t, rt, spec)
	t.Logf("wake took %v", time.Since(began))
	// The control plane removes the snapshot once the sandbox runs; its pages, still read in
	// the background, are not lost.
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if got := runtimetest.ExecRequest(t, wc, guest.ExecRequest{Argv: []string{"md5sum", "/tmp/resident"}, User: "root"}).Stdout; len(sum) < 32 || string(got) != string(sum) {
		t.Fatalf("after wake /tmp/resident sums %q, before sleep %q", got, sum)
	}
	got := counts(t, wc)
	if len(got) < before {
		t.Fatalf("after wake the count is at %d, below the %d counted before sleep", len(got), before)
	}
	waitCount(t, wc, len(got)+3)
	if st, err := wc.Job(ctx, counterJob); err != nil || st.State != guest.JobRunning {
		t.Fatalf("after wake the counter job is %+v %v", st, err)
	}
}

// assertReleased checks from the host that nothing of sandbox id holds memory: no process in
// its cgroups or naming its bundle, no cgroup directory, no runtime state, no bundle.
func assertReleased(t *testing.T, rt *Runtime, id string) {
	t.Helper()
	if p := runtimetest.HostProcesses(t, id); len(p) != 0 {
		t.Errorf("asleep, the host still has processes of the sandbox: %v", p)
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		if b, err := os.ReadFile(p); err == nil && strings.Contains(string(b), rt.sandboxDir(id)) {
			t.Errorf("asleep, %s names the sandbox's bundle: %q", p, b)
		}
	}
	for _, mnt := range rt.cgroupMounts {
		cg := filepath.Join(mnt, cgroupPath(rt.cgroupParent, id))
		if _, err := os.Stat(cg); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("asleep, cgroup %s is still there (%v)", cg, err)
		}
	}
	if rt.stateExists(id) {
		t.Error("asleep, runsc still has state for the sandbox")
	}
	if _, err := os.Stat(rt.sandboxDir(id)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("asleep, the bundle is still there (%v)", err)
	}
	ids, err := rt.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range ids {
		if x == id {
			t.Error("asleep, List still names the sandbox")
		}
	}
}

// TestRuncMemorySnapshotRefused: runc and crun cannot take memory snapshots on this host (CRIU
// 3.17 fails `criu check` on kernels from 6.13 on): Snapshot with Memory is
// UNSUPPORTED_OPERATION with the reason and writes nothing, and a restore with Memory is refused
// the same way.
func TestRuncMemorySnapshotRefused(t *testing.T) {
	for _, f := range []Flavor{FlavorRunc, FlavorCrun} {
		t.Run(string(f), func(t *testing.T) {
			rt := newFlavor(t, f)
			c := rt.Capabilities()
			if strings.Contains(strings.Join(c.Snapshots, ","), runtime.SnapshotFilesMemory) {
				t.Skipf("%s takes memory snapshots on this host (criu check passes): this test is for hosts where it does not", f)
			}
			if c.MemorySnapshotReason == "" || !strings.Contains(c.MemorySnapshotReason, "CRIU") {
				t.Fatalf("MemorySnapshotReason %q", c.MemorySnapshotReason)
			}
			t.Logf("reason: %s", c.MemorySnapshotReason)
			id := runtimetest.NewID()
			runtimetest.Start(t, rt, runtimetest.DefaultSpec(id))
			dir := snapshotDir(t, rt)
			_, err := rt.Snapshot(context.Background(), id, dir, runtime.SnapshotOptions{Memory: true})
			if errcode.Of(err) != errcode.UnsupportedOp || !strings.Contains(err.Error(), c.MemorySnapshotReason) {
				t.Fatalf("Snapshot with memory: %v", err)
			}
			if ents, _ := os.ReadDir(dir); len(ents) != 0 {
				t.Fatalf("a refused memory snapshot left %d entries in its directory", len(ents))
			}
			spec := runtimetest.DefaultSpec(runtimetest.NewID())
			spec.Snapshot = &runtime.SnapshotSource{Dir: dir, Info: runtime.SnapshotInfo{Kind: runtime.SnapshotFilesMemory, DiskMB: 1024}, Memory: true}
			if _, err := rt.Run(context.Background(), spec); errcode.Of(err) != errcode.UnsupportedOp {
				t.Fatalf("Run with a memory restore: %v", err)
			}
		})
	}
}

// TestGVisorAdoptRelistens: a server killed between a memory snapshot's quiesce and its relisten
// leaves the agent deaf; the restarted server's Adopt makes it listen again.
func TestGVisorAdoptRelistens(t *testing.T) {
	rt := newFlavor(t, FlavorGVisor)
	ctx := context.Background()
	id := runtimetest.NewID()
	spec := runtimetest.DefaultSpec(id)
	spec.IDMap = runtimetest.TestIDMap()
	_, h := runtimetest.StartHandle(t, rt, spec)
	if err := rt.quiesceAgent(ctx, id); err != nil { // … and the server dies here
		t.Fatal(err)
	}
	dctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	if c, err := rt.dialer(id)(dctx); err == nil {
		c.Close()
		t.Fatal("a quiesced agent still answers")
	}
	cancel()
	if err := rt.Adopt(ctx, id, h); err != nil {
		t.Fatalf("Adopt: %v", err)
	}
	c := runtimetest.Client(t, rt, id)
	if r := runtimetest.Exec(t, c, "true"); r.ExitCode != 0 {
		t.Fatalf("after Adopt: %s", r)
	}
}
