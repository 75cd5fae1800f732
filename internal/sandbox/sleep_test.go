package sandbox_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/fake"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// Sleep and wake on the fake runtime (control-plane logic and every crash point; the
// real-runtime test is TestSleepWakeRunc).

func newSleepEnv(t *testing.T, cfg sandbox.Config, fc fake.Config) *fakeEnv {
	t.Helper()
	if cfg.SnapshotDir == "" {
		cfg.SnapshotDir = filepath.Join(t.TempDir(), "snapshots")
	}
	return newFakeEnvWith(t, cfg, fc)
}

func (e *fakeEnv) sleep(t *testing.T, id string) sandbox.Sandbox {
	t.Helper()
	sb, err := e.svc.Sleep(t.Context(), id)
	if err != nil {
		t.Fatalf("Sleep %s: %v", id, err)
	}
	if sb.State != sandbox.StateSleeping || sb.SleepSnapshot == "" || sb.SleptAt.IsZero() {
		t.Fatalf("Sleep = state %s, snapshot %q, slept_at %v; want sleeping with both", sb.State, sb.SleepSnapshot, sb.SleptAt)
	}
	return sb
}

func (e *fakeEnv) wake(t *testing.T, id string) sandbox.Sandbox {
	t.Helper()
	sb, err := e.svc.Wake(t.Context(), id)
	if err != nil {
		t.Fatalf("Wake %s: %v", id, err)
	}
	if sb.State != sandbox.StateRunning || sb.SleepSnapshot != "" || !sb.SleptAt.IsZero() {
		t.Fatalf("Wake = state %s, snapshot %q, slept_at %v; want running without them", sb.State, sb.SleepSnapshot, sb.SleptAt)
	}
	return sb
}

// rewrite changes a sandbox's stored record behind the service's back (what a server killed
// between two writes leaves).
func (e *fakeEnv) rewrite(t *testing.T, id string, f func(sb *sandbox.Sandbox)) {
	t.Helper()
	sb, err := e.st.GetSandbox(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	f(&sb)
	sb.Version++
	if err := e.st.UpdateSandbox(context.Background(), sb, sandbox.Event{}); err != nil {
		t.Fatal(err)
	}
}

func (e *fakeEnv) hasSnapshotDir(id string) bool {
	_, err := os.Stat(filepath.Join(e.cfg.SnapshotDir, id))
	return err == nil
}

func (e *fakeEnv) onHost(id string) bool { return slices.Contains(e.rt.Resources(), id) }

func wantNotRunningSleeping(t *testing.T, what string, err error) {
	t.Helper()
	ae, ok := errcode.As(err)
	if !ok || ae.Code != errcode.SandboxNotRunning || !strings.Contains(ae.Message, "sleeping") || !strings.Contains(ae.Message, "sandbox_wake") || ae.Details["state"] != "sleeping" {
		t.Fatalf("%s on a sleeping sandbox = %v; want SANDBOX_NOT_RUNNING saying it sleeps and to call sandbox_wake, state sleeping", what, err)
	}
}

func TestSleepWakeFiles(t *testing.T) {
	e := newSleepEnv(t, sandbox.Config{}, fake.Config{})
	sb := e.create(t, sandbox.CreateRequest{})
	e.sh(t, sb.ID, "echo kept > /workspace/f 2>/dev/null || echo kept > f")
	j := startJob(t, e, sb.ID, "sleep", "1000")

	slept := e.sleep(t, sb.ID)
	if e.onHost(sb.ID) {
		t.Fatal("a sleeping sandbox still has host resources in the runtime")
	}
	snap := slept.SleepSnapshot
	if _, err := os.Stat(filepath.Join(e.cfg.SnapshotDir, snap, runtime.SnapshotInfoFile)); err != nil {
		t.Fatalf("sleep snapshot not complete: %v", err)
	}
	rec, err := e.st.GetSnapshot(t.Context(), snap)
	if err != nil || rec.Purpose != sandbox.SnapshotPurposeSleep || rec.State != sandbox.SnapshotReady || rec.Kind != runtime.SnapshotFiles {
		t.Fatalf("sleep snapshot record = %+v, %v; want purpose sleep, ready, files", rec, err)
	}
	// Without memory the job's processes ended: unknown, saying why.
	if r := record(t, e, sb.ID, j.ID); r.State != sandbox.JobUnknown || !strings.Contains(r.Error, "slept without memory") {
		t.Fatalf("job after a files-only sleep: %s %q; want unknown saying the sandbox slept without memory", r.State, r.Error)
	}
	// Capacity: live and disk, not cpu and memory.
	c, err := e.svc.Capacity(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if c.Live != 1 || c.Sleeping != 1 || c.CPUUsed != 0 || c.MemoryUsedMB != 0 || c.DiskUsedMB != sb.DiskMB {
		t.Fatalf("capacity with one sleeping sandbox = %+v; want live 1, sleeping 1, cpu 0, memory 0, disk %d", c, sb.DiskMB)
	}
	// Calls that need it running say it sleeps (no auto_wake).
	_, err = e.svc.Exec(t.Context(), sb.ID, sandbox.ExecRequest{Argv: []string{"true"}}, nil)
	wantNotRunningSleeping(t, "exec", err)
	_, err = e.svc.Stat(t.Context(), sb.ID, "f")
	wantNotRunningSleeping(t, "stat", err)
	_, err = e.jobs.StartJob(t.Context(), sb.ID, sandbox.JobStartRequest{Argv: []string{"true"}})
	wantNotRunningSleeping(t, "job_start", err)
	_, err = e.svc.PTY(t.Context(), sb.ID, sandbox.PTYRequest{})
	wantNotRunningSleeping(t, "pty", err)
	if again := e.sleep(t, sb.ID); again.Version != slept.Version {
		t.Fatal("Sleep of a sleeping sandbox changed it")
	}

	// Sleeping time does not count against the TTL by default.
	e.clock.Add(10 * time.Minute)
	if err := e.svc.Converge(t.Context()); err != nil {
		t.Fatal(err)
	}
	woke := e.wake(t, sb.ID)
	if got, want := woke.ExpiresAt.Sub(sb.ExpiresAt), 10*time.Minute; got != want {
		t.Fatalf("expiry moved by %s at wake; want the time slept, %s", got, want)
	}
	if out := e.sh(t, sb.ID, "cat /workspace/f 2>/dev/null || cat f"); out != "kept\n" {
		t.Fatalf("file after wake = %q; want kept", out)
	}
	if e.hasSnapshotDir(snap) {
		t.Fatal("the sleep snapshot's directory outlived the wake")
	}
	if _, err := e.st.GetSnapshot(t.Context(), snap); !errcode.Is(err, errcode.SnapshotNotFound) {
		t.Fatalf("sleep snapshot record after wake: %v; want SNAPSHOT_NOT_FOUND", err)
	}
	if again := e.wake(t, sb.ID); again.Version != woke.Version {
		t.Fatal("Wake of a running sandbox changed it")
	}
	var path []string
	for _, ev := range e.eventsOf(t, sb.ID, "state") {
		path = append(path, string(ev.To))
	}
	if want := "creating running sleeping creating running"; strings.Join(path, " ") != want {
		t.Fatalf("state events %q; want %q", path, want)
	}
	c, _ = e.svc.Capacity(t.Context())
	if c.Sleeping != 0 || c.MemoryUsedMB != sb.MemoryMB {
		t.Fatalf("capacity after wake = %+v", c)
	}
}

func TestSleepWithMemoryKeepsJobsRunning(t *testing.T) {
	e := newSleepEnv(t, sandbox.Config{}, fake.Config{MemorySnapshots: true})
	sb := e.create(t, sandbox.CreateRequest{})
	j := startJob(t, e, sb.ID, "sleep", "1000")
	slept := e.sleep(t, sb.ID)
	rec, err := e.st.GetSnapshot(t.Context(), slept.SleepSnapshot)
	if err != nil || rec.Kind != runtime.SnapshotFilesMemory {
		t.Fatalf("sleep snapshot = %+v, %v; want files+memory where the runtime lists it", rec, err)
	}
	time.Sleep(100 * time.Millisecond) // the job's watch, had it settled the record, has run
	if r := record(t, e, sb.ID, j.ID); r.State != sandbox.JobRunning {
		t.Fatalf("job of a sandbox asleep with memory: %s %q; want running", r.State, r.Error)
	}
	// A status call does not wake it, nor settle the job.
	if got, err := e.jobs.JobStatus(t.Context(), sb.ID, j.ID); err != nil || got.State != sandbox.JobRunning {
		t.Fatalf("JobStatus while asleep = %s, %v; want running", got.State, err)
	}
	if e.state(t, sb.ID) != sandbox.StateSleeping {
		t.Fatal("a job status call woke a sandbox without auto_wake")
	}
	// Destroyed while asleep, its jobs are settled and its snapshot goes.
	if _, err := e.svc.Destroy(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	if r := record(t, e, sb.ID, j.ID); r.State.Active() {
		t.Fatalf("job of a sandbox destroyed asleep: %s", r.State)
	}
	if e.hasSnapshotDir(slept.SleepSnapshot) {
		t.Fatal("destroy left the sleep snapshot's directory")
	}
}

func TestAutoWake(t *testing.T) {
	e := newSleepEnv(t, sandbox.Config{PreviewURL: func(id string, port int) string { return "https://preview.invalid/" + id }}, fake.Config{})
	sb := e.create(t, sandbox.CreateRequest{AutoWake: true})
	if !sb.AutoWake {
		t.Fatal("auto_wake not on the record")
	}
	e.sh(t, sb.ID, "echo a > f")
	e.sleep(t, sb.ID)
	if out := e.sh(t, sb.ID, "cat f"); out != "a\n" {
		t.Fatalf("exec after auto-wake = %q", out)
	}
	if e.state(t, sb.ID) != sandbox.StateRunning {
		t.Fatal("exec did not wake the sandbox")
	}
	e.sleep(t, sb.ID)
	if fi, err := e.svc.Stat(t.Context(), sb.ID, "f"); err != nil || fi.Size != 2 {
		t.Fatalf("stat after auto-wake = %+v, %v", fi, err)
	}
	e.sleep(t, sb.ID)
	if _, err := e.net.Expose(t.Context(), sb.ID, 8080, true); err != nil || e.state(t, sb.ID) != sandbox.StateRunning {
		t.Fatalf("expose of a sleeping auto_wake sandbox = %v, state %s; want it woken and exposed", err, e.state(t, sb.ID))
	}
	// A call marked WithoutAutoWake (a watch stream's poll) does not wake it.
	e.sleep(t, sb.ID)
	_, err := e.svc.Exec(sandbox.WithoutAutoWake(t.Context()), sb.ID, sandbox.ExecRequest{Argv: []string{"true"}}, nil)
	wantNotRunningSleeping(t, "exec without auto-wake", err)
	// Without auto_wake, expose says to wake it.
	other := e.create(t, sandbox.CreateRequest{})
	e.sleep(t, other.ID)
	_, err = e.net.Expose(t.Context(), other.ID, 8080, true)
	wantNotRunningSleeping(t, "expose", err)
}

func TestWakeAdmission(t *testing.T) {
	e := newSleepEnv(t, sandbox.Config{MemoryBudgetMB: 1024, MaxSandboxes: 3}, fake.Config{})
	a := e.create(t, sandbox.CreateRequest{MemoryMB: 512})
	e.sleep(t, a.ID)
	// Asleep, a holds no memory: two more fit.
	e.create(t, sandbox.CreateRequest{MemoryMB: 512})
	c := e.create(t, sandbox.CreateRequest{MemoryMB: 512})
	// It still counts against the live bound.
	if _, err := e.svc.Create(t.Context(), sandbox.CreateRequest{MemoryMB: 128}); !errcode.Is(err, errcode.CapacityUnavailable) {
		t.Fatalf("create past the live bound with a sleeping sandbox = %v; want CAPACITY_UNAVAILABLE", err)
	}
	got, err := e.svc.Wake(t.Context(), a.ID)
	if ae, ok := errcode.As(err); !ok || ae.Code != errcode.CapacityUnavailable || ae.Details["state"] != "sleeping" || !strings.Contains(ae.Message, "sleeps on") {
		t.Fatalf("wake past the memory budget = %v; want CAPACITY_UNAVAILABLE saying it sleeps on", err)
	}
	if got.State != sandbox.StateSleeping || e.state(t, a.ID) != sandbox.StateSleeping || e.onHost(a.ID) {
		t.Fatal("a refused wake left the sandbox awake or on the host")
	}
	if _, err := e.svc.Destroy(t.Context(), c.ID); err != nil {
		t.Fatal(err)
	}
	e.wake(t, a.ID)
}

func TestSleepTTL(t *testing.T) {
	e := newSleepEnv(t, sandbox.Config{}, fake.Config{TakesIDRange: true})
	paused := e.create(t, sandbox.CreateRequest{TTLSeconds: 60})
	running := e.create(t, sandbox.CreateRequest{TTLSeconds: 60, TTLWhileSleeping: true})
	if !running.TTLWhileSleeping {
		t.Fatal("ttl_while_sleeping not on the record")
	}
	e.sleep(t, paused.ID)
	slept := e.sleep(t, running.ID)
	e.clock.Add(2 * time.Minute)
	// A pass skips a sandbox another call holds (its exit watch, just ended); the loop's next
	// tick takes it.
	for deadline := time.Now().Add(5 * time.Second); e.state(t, running.ID) != sandbox.StateDestroyed && time.Now().Before(deadline); {
		if err := e.svc.Converge(t.Context()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if st := e.state(t, paused.ID); st != sandbox.StateSleeping {
		t.Fatalf("sleeping sandbox past its TTL (paused while asleep) is %s; want sleeping", st)
	}
	if st := e.state(t, running.ID); st != sandbox.StateDestroyed {
		t.Fatalf("sleeping sandbox past its TTL with ttl_while_sleeping is %s; want destroyed", st)
	}
	if e.hasSnapshotDir(slept.SleepSnapshot) {
		t.Fatal("the expired sleeping sandbox's snapshot is left")
	}
	ranges, err := e.svc.IDRanges(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range ranges {
		if r.SandboxID == running.ID {
			t.Fatal("the expired sleeping sandbox's id range is still held")
		}
	}
	if !slices.ContainsFunc(ranges, func(r sandbox.IDRange) bool { return r.SandboxID == paused.ID }) {
		t.Fatal("a sleeping sandbox lost its id range")
	}
	// The paused one wakes with its minute still ahead of it, under the same id range.
	woke := e.wake(t, paused.ID)
	if left := woke.ExpiresAt.Sub(e.clock.Now()); left < 59*time.Second || left > 60*time.Second {
		t.Fatalf("TTL left after wake = %s; want the minute it had", left)
	}
}

// TestOnExpirySleep: a sandbox created with on_expiry sleep sleeps at its TTL instead of being
// destroyed, its files kept; a wake gives it its TTL again; a plain one beside it is destroyed.
func TestOnExpirySleep(t *testing.T) {
	e := newSleepEnv(t, sandbox.Config{}, fake.Config{})
	sb := e.create(t, sandbox.CreateRequest{TTLSeconds: 60, OnExpiry: sandbox.OnExpirySleep, AutoWake: true})
	if sb.OnExpiry != sandbox.OnExpirySleep || sb.TTLSeconds != 60 {
		t.Fatalf("record: on_expiry %q ttl_seconds %d; want sleep 60", sb.OnExpiry, sb.TTLSeconds)
	}
	plain := e.create(t, sandbox.CreateRequest{TTLSeconds: 60})
	e.sh(t, sb.ID, "echo kept > f")
	e.clock.Add(61 * time.Second)
	for deadline := time.Now().Add(5 * time.Second); (e.state(t, sb.ID) != sandbox.StateSleeping || e.state(t, plain.ID) != sandbox.StateDestroyed) && time.Now().Before(deadline); {
		if err := e.svc.Converge(t.Context()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if st := e.state(t, sb.ID); st != sandbox.StateSleeping {
		t.Fatalf("a sandbox with on_expiry sleep past its TTL is %s; want sleeping", st)
	}
	if st := e.state(t, plain.ID); st != sandbox.StateDestroyed {
		t.Fatalf("a plain sandbox past its TTL is %s; want destroyed", st)
	}
	if evs := e.eventsOf(t, sb.ID, "sleep"); len(evs) == 0 || !strings.Contains(evs[len(evs)-1].Reason, "ttl expired") {
		t.Fatalf("sleep events %+v; want one saying the TTL expired", evs)
	}
	// Asleep past its expiry, it stays (the TTL does not run while it sleeps).
	e.clock.Add(time.Hour)
	if err := e.svc.Converge(t.Context()); err != nil {
		t.Fatal(err)
	}
	if st := e.state(t, sb.ID); st != sandbox.StateSleeping {
		t.Fatalf("an hour later it is %s; want sleeping", st)
	}
	// An exec wakes it (auto_wake), with its files and a fresh minute.
	if out := e.sh(t, sb.ID, "cat f"); out != "kept\n" {
		t.Fatalf("after the wake: %q; want the file written before the sleep", out)
	}
	woke, err := e.svc.Get(t.Context(), sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if left := woke.ExpiresAt.Sub(e.clock.Now()); woke.State != sandbox.StateRunning || left < 59*time.Second || left > 60*time.Second {
		t.Fatalf("after the wake: %s with %s left; want running with its 60 s TTL again", woke.State, left)
	}
	// Bad requests: an unknown value, ttl_while_sleeping beside it, a runtime that cannot sleep.
	for _, req := range []sandbox.CreateRequest{{OnExpiry: "pause"}, {OnExpiry: sandbox.OnExpirySleep, TTLWhileSleeping: true}} {
		if _, err := e.svc.Create(t.Context(), req); !errcode.Is(err, errcode.InvalidArgument) {
			t.Fatalf("create %+v = %v; want INVALID_ARGUMENT", req, err)
		}
	}
	noSnap := newFakeEnv(t, sandbox.Config{}) // no snapshot directory
	if _, err := noSnap.svc.Create(t.Context(), sandbox.CreateRequest{OnExpiry: sandbox.OnExpirySleep}); !errcode.Is(err, errcode.InvalidArgument) || !strings.Contains(err.Error(), "cannot") {
		t.Fatalf("on_expiry sleep where sandboxes cannot sleep = %v; want INVALID_ARGUMENT saying so", err)
	}
}

func TestSleepRefusals(t *testing.T) {
	e := newFakeEnv(t, sandbox.Config{}) // no snapshot directory
	sb := e.create(t, sandbox.CreateRequest{})
	if _, err := e.svc.Sleep(t.Context(), sb.ID); !errcode.Is(err, errcode.UnsupportedOp) {
		t.Fatalf("sleep without a snapshot directory = %v; want UNSUPPORTED_OPERATION", err)
	}
	if _, err := e.svc.Wake(t.Context(), sb.ID); err != nil {
		t.Fatalf("wake of a running sandbox = %v; want it as it is", err)
	}
	e.svc.Destroy(t.Context(), sb.ID)
	if _, err := e.svc.Sleep(t.Context(), sb.ID); !errcode.Is(err, errcode.SandboxNotRunning) {
		t.Fatalf("sleep of a destroyed sandbox = %v; want SANDBOX_NOT_RUNNING", err)
	}
	if _, err := e.svc.Wake(t.Context(), sb.ID); !errcode.Is(err, errcode.SandboxNotRunning) {
		t.Fatalf("wake of a destroyed sandbox = %v; want SANDBOX_NOT_RUNNING", err)
	}
}

func TestSleepFailureRunsOn(t *testing.T) {
	e := newSleepEnv(t, sandbox.Config{}, fake.Config{})
	sb := e.create(t, sandbox.CreateRequest{})
	clear := failOn(e.rt, fake.OpSnapshot, sb.ID)
	_, err := e.svc.Sleep(t.Context(), sb.ID)
	clear()
	if !errcode.Is(err, errcode.RuntimeUnavailable) || !strings.Contains(err.Error(), "runs on") {
		t.Fatalf("failed sleep = %v; want RUNTIME_UNAVAILABLE saying it runs on", err)
	}
	cur, _ := e.svc.Get(t.Context(), sb.ID)
	if cur.State != sandbox.StateRunning || cur.SleepSnapshot != "" || len(e.snapDirs(t)) != 0 {
		t.Fatalf("after a failed sleep: %s, snapshot %q, dirs %v; want running, none", cur.State, cur.SleepSnapshot, e.snapDirs(t))
	}
	e.sh(t, sb.ID, "true")
}

func TestWakeFailureSleepsOn(t *testing.T) {
	e := newSleepEnv(t, sandbox.Config{}, fake.Config{})
	sb := e.create(t, sandbox.CreateRequest{})
	e.sh(t, sb.ID, "echo x > f")
	slept := e.sleep(t, sb.ID)
	clear := failOn(e.rt, fake.OpAgent, sb.ID)
	got, err := e.svc.Wake(t.Context(), sb.ID)
	clear()
	if err == nil || got.State != sandbox.StateSleeping || e.onHost(sb.ID) {
		t.Fatalf("failed wake = %s, %v, on host %v; want an error, sleeping, nothing on the host", got.State, err, e.onHost(sb.ID))
	}
	if _, err := os.Stat(filepath.Join(e.cfg.SnapshotDir, slept.SleepSnapshot, runtime.SnapshotInfoFile)); err != nil {
		t.Fatalf("a failed wake broke the snapshot: %v", err)
	}
	e.wake(t, sb.ID)
	if out := e.sh(t, sb.ID, "cat f"); out != "x\n" {
		t.Fatalf("file after a failed then a good wake = %q", out)
	}
}

// Crash points: the store and host as a server killed at each point leaves them, then a
// restarted server (Reconcile) and its control loop.

func TestSleepCrashBeforeRelease(t *testing.T) {
	// Intent written, the runtime had not released: the sandbox runs on, the partial snapshot goes.
	e := newSleepEnv(t, sandbox.Config{}, fake.Config{})
	sb := e.create(t, sandbox.CreateRequest{})
	snap := sandbox.NewSnapshotID()
	e.rewrite(t, sb.ID, func(s *sandbox.Sandbox) { s.SleepSnapshot = snap })
	if err := os.MkdirAll(filepath.Join(e.cfg.SnapshotDir, snap, fake.DiskDir), 0o700); err != nil {
		t.Fatal(err)
	}
	e.restart(t)
	cur, _ := e.svc.Get(t.Context(), sb.ID)
	if cur.State != sandbox.StateRunning || cur.SleepSnapshot != "" || e.hasSnapshotDir(snap) {
		t.Fatalf("after a crash before release: %s, snapshot %q, dir left %v; want running, none", cur.State, cur.SleepSnapshot, e.hasSnapshotDir(snap))
	}
	e.sh(t, sb.ID, "true")
}

func TestSleepCrashMidSnapshot(t *testing.T) {
	// The runtime had stopped the sandbox and was saving it when the server died: no
	// snapshot.json, so the sandbox is lost and nothing is left.
	e := newSleepEnv(t, sandbox.Config{}, fake.Config{TakesIDRange: true})
	sb := e.create(t, sandbox.CreateRequest{})
	snap := sandbox.NewSnapshotID()
	e.rewrite(t, sb.ID, func(s *sandbox.Sandbox) { s.SleepSnapshot = snap })
	if err := os.MkdirAll(filepath.Join(e.cfg.SnapshotDir, snap, fake.DiskDir), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := e.rt.Stop(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	e.restart(t)
	cur, _ := e.svc.Get(t.Context(), sb.ID)
	if cur.State != sandbox.StateLost || e.hasSnapshotDir(snap) || e.onHost(sb.ID) {
		t.Fatalf("after a crash mid-snapshot: %s, dir left %v, on host %v; want lost, nothing left", cur.State, e.hasSnapshotDir(snap), e.onHost(sb.ID))
	}
}

func TestSleepCrashAfterSnapshot(t *testing.T) {
	// The snapshot was complete and the sandbox released; the record still said running.
	e := newSleepEnv(t, sandbox.Config{}, fake.Config{})
	sb := e.create(t, sandbox.CreateRequest{})
	e.sh(t, sb.ID, "echo y > f")
	slept := e.sleep(t, sb.ID)
	e.rewrite(t, sb.ID, func(s *sandbox.Sandbox) { s.State, s.SleptAt = sandbox.StateRunning, time.Time{} })
	e.restart(t)
	cur, _ := e.svc.Get(t.Context(), sb.ID)
	if cur.State != sandbox.StateSleeping || cur.SleepSnapshot != slept.SleepSnapshot {
		t.Fatalf("after a crash after the snapshot: %s, snapshot %q; want sleeping on %s", cur.State, cur.SleepSnapshot, slept.SleepSnapshot)
	}
	e.wake(t, sb.ID)
	if out := e.sh(t, sb.ID, "cat f"); out != "y\n" {
		t.Fatalf("file = %q", out)
	}
}

func TestWakeCrashMidCreate(t *testing.T) {
	// The wake had left sleeping and the runtime had made the sandbox from the snapshot (in
	// place) when the server died: leftovers deleted, sleeping again, snapshot whole.
	e := newSleepEnv(t, sandbox.Config{}, fake.Config{})
	sb := e.create(t, sandbox.CreateRequest{})
	e.sh(t, sb.ID, "echo z > f")
	slept := e.sleep(t, sb.ID)
	dir := filepath.Join(e.cfg.SnapshotDir, slept.SleepSnapshot)
	info, err := fake.ReadSnapshotInfo(dir)
	if err != nil {
		t.Fatal(err)
	}
	e.rewrite(t, sb.ID, func(s *sandbox.Sandbox) { s.State = sandbox.StateCreating })
	if _, err := e.rt.Run(t.Context(), runtime.Spec{ID: sb.ID, DiskMB: info.DiskMB,
		Snapshot: &runtime.SnapshotSource{Dir: dir, Info: info, InPlace: true}}); err != nil {
		t.Fatal(err)
	}
	e.restart(t)
	cur, _ := e.svc.Get(t.Context(), sb.ID)
	if cur.State != sandbox.StateSleeping || e.onHost(sb.ID) {
		t.Fatalf("after a crash mid-wake: %s, on host %v; want sleeping, nothing on the host", cur.State, e.onHost(sb.ID))
	}
	e.wake(t, sb.ID)
	if out := e.sh(t, sb.ID, "cat f"); out != "z\n" {
		t.Fatalf("file after a crashed then a good wake = %q", out)
	}
}

func TestWakeCrashBeforeSnapshotDeleted(t *testing.T) {
	// The sandbox ran again but its snapshot was not yet deleted.
	e := newSleepEnv(t, sandbox.Config{}, fake.Config{})
	sb := e.create(t, sandbox.CreateRequest{})
	e.sleep(t, sb.ID)
	e.wake(t, sb.ID)
	snap := sandbox.NewSnapshotID()
	if err := os.MkdirAll(filepath.Join(e.cfg.SnapshotDir, snap, fake.DiskDir), 0o700); err != nil {
		t.Fatal(err)
	}
	e.rewrite(t, sb.ID, func(s *sandbox.Sandbox) { s.SleepSnapshot = snap })
	e.restart(t)
	cur, _ := e.svc.Get(t.Context(), sb.ID)
	if cur.State != sandbox.StateRunning || cur.SleepSnapshot != "" || e.hasSnapshotDir(snap) {
		t.Fatalf("after a crash before the snapshot's delete: %s, %q, dir %v; want running, deleted", cur.State, cur.SleepSnapshot, e.hasSnapshotDir(snap))
	}
}

func TestSleepingWithoutSnapshotIsLost(t *testing.T) {
	e := newSleepEnv(t, sandbox.Config{}, fake.Config{})
	sb := e.create(t, sandbox.CreateRequest{})
	slept := e.sleep(t, sb.ID)
	if err := os.RemoveAll(filepath.Join(e.cfg.SnapshotDir, slept.SleepSnapshot)); err != nil {
		t.Fatal(err)
	}
	e.restart(t)
	if st := e.state(t, sb.ID); st != sandbox.StateLost {
		t.Fatalf("sleeping sandbox whose snapshot is gone is %s after restart; want lost", st)
	}
}

func TestSleepingSurvivesRestart(t *testing.T) {
	e := newSleepEnv(t, sandbox.Config{}, fake.Config{TakesIDRange: true})
	sb := e.create(t, sandbox.CreateRequest{})
	e.sh(t, sb.ID, "echo w > f")
	idm, _ := e.rt.IDMap(sb.ID)
	e.sleep(t, sb.ID)
	e.restart(t)
	if err := e.svc.Converge(t.Context()); err != nil {
		t.Fatal(err)
	}
	if st := e.state(t, sb.ID); st != sandbox.StateSleeping {
		t.Fatalf("sleeping sandbox after restart is %s", st)
	}
	e.wake(t, sb.ID)
	if got, _ := e.rt.IDMap(sb.ID); got != idm || got.Count == 0 {
		t.Fatalf("id map after wake %+v; want the same range %+v", got, idm)
	}
	if out := e.sh(t, sb.ID, "cat f"); out != "w\n" {
		t.Fatalf("file = %q", out)
	}
}

// TestWakeReopensEgress: a woken egress sandbox's network session is open again when the wake
// returns (the network's Woken hook), under the policy it slept with.
func TestWakeReopensEgress(t *testing.T) {
	port := upstream(t)
	e := newSleepEnv(t, netConfig(func(string) error { return nil }), fake.Config{})
	sb := e.create(t, sandbox.CreateRequest{Network: policy(fmt.Sprintf("allowed.test:%d", port))})
	e.sleep(t, sb.ID)
	e.wake(t, sb.ID)
	reply, err := e.net.SessionReply(t.Context(), sb.ID)
	if err != nil {
		t.Fatalf("woken egress sandbox's session: %v", err)
	}
	if code, body := viaProxy(t, reply.ProxyAddr, "allowed.test", port); code != 200 || body != "hello from upstream" {
		t.Errorf("after the wake, allowed.test = %d %q; want its policy to allow it", code, body)
	}
	if code, _ := viaProxy(t, reply.ProxyAddr, "other.test", port); code != http.StatusForbidden {
		t.Errorf("after the wake, other.test = %d; want 403", code)
	}
}
