package runtimetest

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/guest"
	"github.com/agentbox/agentbox/internal/runtime"
)

// testMemorySnapshot (runtimes listing runtime.SnapshotFilesMemory): a job counting in memory
// (a shell variable, each value appended to /tmp/count on the sandbox's tmpfs) is running when a
// files+memory snapshot is taken; the sandbox runs on; a fork (new id, new id range) restored
// with Memory has the same job process counting on from where the snapshot caught it (every
// value from 1, none skipped or restarted); and a sleep (Release) then wake (InPlace, same id)
// of the source brings its job back counting on.
func testMemorySnapshot(t *testing.T, rt runtime.Runtime, snap runtime.Snapshotter, cfg SnapshotConfig) {
	ctx := context.Background()
	spec := snapshotSpec(rt, NewID())
	c := Start(t, rt, spec)
	job := testJobID()
	if _, err := c.StartJob(ctx, guest.JobStartRequest{JobID: job, Argv: []string{"sh", "-c",
		"i=0; while :; do i=$((i+1)); echo $i >> /tmp/count; sleep 0.02; done"}}); err != nil {
		t.Fatal(err)
	}
	before := memCountPast(t, c, 5)
	dir := cfg.Dir(t)
	info, err := snap.Snapshot(ctx, spec.ID, dir, runtime.SnapshotOptions{Memory: true})
	if err != nil {
		t.Fatalf("memory snapshot: %v", err)
	}
	if info.Kind != runtime.SnapshotFilesMemory {
		t.Fatalf("a memory snapshot says kind %q", info.Kind)
	}
	c = Client(t, rt, spec.ID) // the source runs on; its agent answers new connections
	memCountPast(t, c, before)

	fspec := snapshotSpec(rt, NewID())
	fc := createFrom(t, rt, fspec, &runtime.SnapshotSource{Dir: dir, Info: info, Memory: true})
	at := len(memCounts(t, fc))
	if at < before {
		t.Fatalf("the fork's count is at %d, below the %d counted before the snapshot", at, before)
	}
	memCountPast(t, fc, at+2)
	if st, err := fc.Job(ctx, job); err != nil || st.State != guest.JobRunning {
		t.Fatalf("the fork's counting job: %+v %v", st, err)
	}

	// Sleep and wake the source.
	sleepAt := memCountPast(t, c, 0)
	sdir := cfg.Dir(t)
	sinfo, err := snap.Snapshot(ctx, spec.ID, sdir, runtime.SnapshotOptions{Memory: true, Release: true})
	if err != nil {
		t.Fatalf("memory snapshot with release: %v", err)
	}
	wantState(t, rt, spec.ID, runtime.StatusAbsent)
	wc := createFrom(t, rt, spec, &runtime.SnapshotSource{Dir: sdir, Info: sinfo, Memory: true, InPlace: true})
	woke := len(memCounts(t, wc))
	if woke < sleepAt {
		t.Fatalf("after wake the count is at %d, below the %d before sleep", woke, sleepAt)
	}
	memCountPast(t, wc, woke+2)
	if st, err := wc.Job(ctx, job); err != nil || st.State != guest.JobRunning {
		t.Fatalf("after wake the counting job: %+v %v", st, err)
	}
}

// memCounts reads /tmp/count, failing unless it is 1, 2, 3, … without a gap or a restart.
func memCounts(t testing.TB, c *guest.Client) []int {
	t.Helper()
	r := rootExec(t, c, "cat /tmp/count")
	if r.ExitCode != 0 {
		t.Fatalf("cat /tmp/count: %s", r)
	}
	var out []int
	for i, l := range strings.Fields(r.Stdout) {
		if n, err := strconv.Atoi(l); err != nil || n != i+1 {
			t.Fatalf("/tmp/count line %d is %q: the count restarted or skipped", i+1, l)
		}
		out = append(out, i+1)
	}
	return out
}

// memCountPast waits (30 s at most) until the count has passed n and returns it.
func memCountPast(t testing.TB, c *guest.Client, n int) int {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if got := len(memCounts(t, c)); got > n {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("the count did not pass %d within 30 s", n)
		}
	}
}
