package storetest

import (
	"bytes"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/store"
)

// jobTests are the cases of the job records (sandbox.JobStore); Run runs them with the rest.
var jobTests = []struct {
	name string
	run  func(t *testing.T, s store.Store)
}{
	{"JobRoundTrip", testJobRoundTrip},
	{"JobUnknown", testJobUnknown},
	{"JobListNewestFirstOmitted", testJobListNewestFirst},
	{"JobUpdateVersionAndEvent", testJobUpdateVersionAndEvent},
	{"JobActiveBound", testJobActiveBound},
	{"JobActiveBoundConcurrent", testJobActiveBoundConcurrent},
	{"JobRecordsBounded", testJobRecordsBounded},
	{"JobPrune", testJobPrune},
	{"JobCountByState", testJobCountByState},
}

func newJob(sb sandbox.Sandbox, at time.Time) sandbox.Job {
	return sandbox.Job{ID: sandbox.NewJobID(), SandboxID: sb.ID, Argv: []string{"sh", "-c", "echo 'hi'; sleep 1"},
		EnvNames: []string{"A", "TOKEN"}, Cwd: "/workspace/x", User: "root", State: sandbox.JobStarting,
		StartedAt: at, UpdatedAt: at, Version: 1}
}

func mustCreateJob(t *testing.T, s store.Store, j sandbox.Job) sandbox.Job {
	t.Helper()
	if err := s.CreateJob(t.Context(), j, 0); err != nil {
		t.Fatalf("CreateJob(%s): %v", j.ID, err)
	}
	return j
}

func mustGetJob(t *testing.T, s store.Store, sb, id string) sandbox.Job {
	t.Helper()
	j, err := s.GetJob(t.Context(), sb, id)
	if err != nil {
		t.Fatalf("GetJob(%s): %v", id, err)
	}
	return j
}

func checkJob(t *testing.T, want, got sandbox.Job) {
	t.Helper()
	if got.ID != want.ID || got.SandboxID != want.SandboxID || !slices.Equal(got.Argv, want.Argv) ||
		!slices.Equal(got.EnvNames, want.EnvNames) || got.Cwd != want.Cwd || got.User != want.User ||
		got.State != want.State || got.Signal != want.Signal || got.OOMKilled != want.OOMKilled ||
		got.LogBytes != want.LogBytes || got.LogTruncated != want.LogTruncated || got.Error != want.Error ||
		got.Version != want.Version || !bytes.Equal(got.Tail, want.Tail) || got.CPUSeconds != want.CPUSeconds {
		t.Errorf("job = %+v\nwant %+v", got, want)
	}
	if (got.ExitCode == nil) != (want.ExitCode == nil) || got.ExitCode != nil && *got.ExitCode != *want.ExitCode {
		t.Errorf("exit code = %v, want %v", got.ExitCode, want.ExitCode)
	}
	checkTime(t, "started_at", want.StartedAt, got.StartedAt)
	checkTime(t, "updated_at", want.UpdatedAt, got.UpdatedAt)
	if (got.FinishedAt == nil) != (want.FinishedAt == nil) {
		t.Errorf("finished_at = %v, want %v", got.FinishedAt, want.FinishedAt)
	} else if got.FinishedAt != nil {
		checkTime(t, "finished_at", *want.FinishedAt, *got.FinishedAt)
	}
}

func testJobRoundTrip(t *testing.T, s store.Store) {
	sb := mustCreate(t, s, newSandbox(1, sandbox.StateRunning, base(), nil))
	j := mustCreateJob(t, s, newJob(sb, base()))
	checkJob(t, j, mustGetJob(t, s, sb.ID, j.ID))

	// Every field of an ended job, the 64 KiB tail at its bound included.
	j.Version++
	j.State, j.Signal, j.OOMKilled = sandbox.JobKilled, "SIGKILL", true
	code := 137
	j.ExitCode = &code
	fin := base().Add(time.Minute)
	j.FinishedAt, j.UpdatedAt = &fin, fin
	j.LogBytes, j.LogTruncated, j.Error, j.CPUSeconds = 1<<30, true, "why", 1234.567
	j.Tail = bytes.Repeat([]byte{0, 0xff, '\n'}, sandbox.TailBytes/3)
	if err := s.UpdateJob(t.Context(), j, sandbox.Event{}); err != nil {
		t.Fatalf("UpdateJob: %v", err)
	}
	checkJob(t, j, mustGetJob(t, s, sb.ID, j.ID))

	j.Version++
	j.Tail = make([]byte, sandbox.TailBytes+1)
	if err := s.UpdateJob(t.Context(), j, sandbox.Event{}); !errcode.Is(err, errcode.InvalidArgument) {
		t.Errorf("UpdateJob with a tail past %d bytes: %v, want INVALID_ARGUMENT", sandbox.TailBytes, err)
	}
	if err := s.CreateJob(t.Context(), newJob(sandbox.Sandbox{ID: sandbox.NewID()}, base()), 0); !errcode.Is(err, errcode.SandboxNotFound) {
		t.Errorf("CreateJob of an unknown sandbox: %v, want SANDBOX_NOT_FOUND", err)
	}
	if err := s.CreateJob(t.Context(), mustGetJob(t, s, sb.ID, j.ID), 0); !errcode.Is(err, errcode.InvalidArgument) && !errcode.Is(err, errcode.Conflict) {
		t.Errorf("CreateJob of an existing job: %v, want CONFLICT (or INVALID_ARGUMENT for its version)", err)
	}
	dup := newJob(sb, base())
	dup.ID = j.ID
	if err := s.CreateJob(t.Context(), dup, 0); !errcode.Is(err, errcode.Conflict) {
		t.Errorf("CreateJob of an existing id: %v, want CONFLICT", err)
	}
}

func testJobUnknown(t *testing.T, s store.Store) {
	sb := mustCreate(t, s, newSandbox(1, sandbox.StateRunning, base(), nil))
	other := mustCreate(t, s, newSandbox(2, sandbox.StateRunning, base(), nil))
	j := mustCreateJob(t, s, newJob(sb, base()))
	if _, err := s.GetJob(t.Context(), sb.ID, sandbox.NewJobID()); !errcode.Is(err, errcode.JobNotFound) {
		t.Errorf("GetJob(unknown) = %v, want JOB_NOT_FOUND", err)
	}
	if _, err := s.GetJob(t.Context(), other.ID, j.ID); !errcode.Is(err, errcode.JobNotFound) {
		t.Errorf("GetJob through another sandbox = %v, want JOB_NOT_FOUND", err)
	}
	j.Version++
	j.SandboxID = other.ID
	if err := s.UpdateJob(t.Context(), j, sandbox.Event{}); !errcode.Is(err, errcode.JobNotFound) {
		t.Errorf("UpdateJob through another sandbox = %v, want JOB_NOT_FOUND", err)
	}
}

func testJobListNewestFirst(t *testing.T, s store.Store) {
	sb := mustCreate(t, s, newSandbox(1, sandbox.StateRunning, base(), nil))
	other := mustCreate(t, s, newSandbox(2, sandbox.StateRunning, base(), nil))
	var want []string
	for i := range 7 {
		j := newJob(sb, base().Add(time.Duration(i)*time.Second))
		if i%2 == 1 {
			j.State = sandbox.JobRunning
		}
		mustCreateJob(t, s, j)
		want = append([]string{j.ID}, want...)
	}
	mustCreateJob(t, s, newJob(other, base()))
	got, omitted, err := s.ListJobs(t.Context(), sb.ID, nil, 0)
	if err != nil || omitted != 0 || !slices.Equal(jobIDs(got), want) {
		t.Fatalf("ListJobs = %v, omitted %d, %v; want %v newest first", jobIDs(got), omitted, err, want)
	}
	got, omitted, err = s.ListJobs(t.Context(), sb.ID, nil, 3)
	if err != nil || omitted != 4 || !slices.Equal(jobIDs(got), want[:3]) {
		t.Errorf("ListJobs limit 3 = %v, omitted %d, %v; want %v and 4 omitted", jobIDs(got), omitted, err, want[:3])
	}
	got, omitted, err = s.ListJobs(t.Context(), sb.ID, []sandbox.JobState{sandbox.JobRunning}, 2)
	if err != nil || omitted != 1 || len(got) != 2 || got[0].State != sandbox.JobRunning {
		t.Errorf("ListJobs running, limit 2 = %v, omitted %d, %v; want 2 and 1 omitted", jobIDs(got), omitted, err)
	}
	if got, omitted, err := s.ListJobs(t.Context(), sandbox.NewID(), nil, 0); err != nil || len(got) != 0 || omitted != 0 {
		t.Errorf("ListJobs of an unknown sandbox = %v, %d, %v; want none", got, omitted, err)
	}
}

func jobIDs(js []sandbox.Job) []string {
	var out []string
	for _, j := range js {
		out = append(out, j.ID)
	}
	return out
}

func testJobUpdateVersionAndEvent(t *testing.T, s store.Store) {
	sb := mustCreate(t, s, newSandbox(1, sandbox.StateRunning, base(), nil))
	j := mustCreateJob(t, s, newJob(sb, base()))
	stale := j
	j.Version++
	j.State = sandbox.JobRunning
	at := base().Add(time.Second)
	if err := s.UpdateJob(t.Context(), j, sandbox.Event{SandboxID: sb.ID, Type: "job", Reason: j.ID + " started", At: at}); err != nil {
		t.Fatalf("UpdateJob: %v", err)
	}
	stale.Version++
	stale.State = sandbox.JobFailed
	if err := s.UpdateJob(t.Context(), stale, sandbox.Event{SandboxID: sb.ID, Type: "job", Reason: "stale"}); !errcode.Is(err, errcode.Conflict) {
		t.Errorf("UpdateJob with a stale version = %v, want CONFLICT", err)
	}
	if got := mustGetJob(t, s, sb.ID, j.ID); got.State != sandbox.JobRunning || got.Version != 2 {
		t.Errorf("after a refused update: %s v%d, want running v2", got.State, got.Version)
	}
	evs := mustEvents(t, s, sandbox.EventFilter{SandboxID: sb.ID})
	if len(evs) != 2 {
		t.Fatalf("events = %+v, want the create and one job event", evs)
	}
	ev := evs[1]
	if ev.Type != "job" || ev.Reason != j.ID+" started" || ev.From != sandbox.StateRunning || ev.To != sandbox.StateRunning {
		t.Errorf("job event = %+v, want type job, the reason, from/to the sandbox's state", ev)
	}
	checkTime(t, "event at", at, ev.At)
}

func testJobActiveBound(t *testing.T, s store.Store) {
	sb := mustCreate(t, s, newSandbox(1, sandbox.StateRunning, base(), nil))
	var jobs []sandbox.Job
	for i := range 3 {
		j := newJob(sb, base().Add(time.Duration(i)*time.Millisecond))
		if err := s.CreateJob(t.Context(), j, 3); err != nil {
			t.Fatalf("CreateJob %d of 3: %v", i+1, err)
		}
		jobs = append(jobs, j)
	}
	fourth := newJob(sb, base())
	if err := s.CreateJob(t.Context(), fourth, 3); !errcode.Is(err, errcode.JobLimitExceeded) {
		t.Fatalf("CreateJob past the bound = %v, want JOB_LIMIT_EXCEEDED", err)
	}
	if _, err := s.GetJob(t.Context(), sb.ID, fourth.ID); !errcode.Is(err, errcode.JobNotFound) {
		t.Errorf("a refused job was recorded: %v", err)
	}
	// An ended job frees its place.
	j := jobs[0]
	j.Version++
	j.State = sandbox.JobExited
	if err := s.UpdateJob(t.Context(), j, sandbox.Event{}); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateJob(t.Context(), fourth, 3); err != nil {
		t.Errorf("CreateJob after one ended: %v", err)
	}
	// The bound is per sandbox.
	other := mustCreate(t, s, newSandbox(2, sandbox.StateRunning, base(), nil))
	if err := s.CreateJob(t.Context(), newJob(other, base()), 3); err != nil {
		t.Errorf("CreateJob on another sandbox: %v", err)
	}
}

func testJobActiveBoundConcurrent(t *testing.T, s store.Store) {
	sb := mustCreate(t, s, newSandbox(1, sandbox.StateRunning, base(), nil))
	const bound, tries = 5, 20
	var wg sync.WaitGroup
	var mu sync.Mutex
	ok, refused := 0, 0
	for range tries {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := s.CreateJob(t.Context(), newJob(sb, base()), bound)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				ok++
			case errcode.Is(err, errcode.JobLimitExceeded):
				refused++
			default:
				t.Errorf("CreateJob: %v", err)
			}
		}()
	}
	wg.Wait()
	if ok != bound || refused != tries-bound {
		t.Errorf("%d concurrent creates with a bound of %d: %d recorded, %d refused", tries, bound, ok, refused)
	}
}

func testJobRecordsBounded(t *testing.T, s store.Store) {
	sb := mustCreate(t, s, newSandbox(1, sandbox.StateRunning, base(), nil))
	running := newJob(sb, base())
	running.State = sandbox.JobRunning
	mustCreateJob(t, s, running)
	var newest string
	for i := range sandbox.MaxJobRecords + 5 {
		j := newJob(sb, base().Add(time.Duration(i+1)*time.Millisecond))
		j.State = sandbox.JobExited
		mustCreateJob(t, s, j)
		newest = j.ID
	}
	got, omitted, err := s.ListJobs(t.Context(), sb.ID, nil, 1000)
	if err != nil {
		t.Fatal(err)
	}
	// The trim runs on insert and keeps MaxJobRecords finished jobs plus every active one.
	if total := len(got) + omitted; total != sandbox.MaxJobRecords+1 {
		t.Errorf("%d records kept, want %d finished + 1 running", total, sandbox.MaxJobRecords)
	}
	if got[0].ID != newest {
		t.Errorf("newest = %s, want %s", got[0].ID, newest)
	}
	if _, err := s.GetJob(t.Context(), sb.ID, running.ID); err != nil {
		t.Errorf("the running (oldest) job was trimmed: %v", err)
	}
}

func testJobPrune(t *testing.T, s store.Store) {
	cutoff := base().Add(24 * time.Hour)
	live := mustCreate(t, s, newSandbox(1, sandbox.StateRunning, base(), nil))
	old := newJob(live, base())
	old.State = sandbox.JobExited
	old.UpdatedAt = cutoff.Add(-time.Hour)
	mustCreateJob(t, s, old)
	recent := newJob(live, base())
	recent.State = sandbox.JobCanceled
	recent.UpdatedAt = cutoff.Add(time.Hour)
	mustCreateJob(t, s, recent)
	running := newJob(live, base())
	running.State = sandbox.JobRunning
	running.UpdatedAt = cutoff.Add(-48 * time.Hour)
	mustCreateJob(t, s, running)
	n, err := s.PruneJobs(t.Context(), cutoff)
	if err != nil || n != 1 {
		t.Errorf("PruneJobs = %d, %v; want 1", n, err)
	}
	for _, c := range []struct {
		j    sandbox.Job
		kept bool
	}{{old, false}, {recent, true}, {running, true}} {
		_, err := s.GetJob(t.Context(), live.ID, c.j.ID)
		if c.kept != (err == nil) {
			t.Errorf("job %s (%s): kept=%v, GetJob: %v", c.j.ID, c.j.State, c.kept, err)
		}
	}

	// A pruned sandbox's jobs go with it.
	gone := newSandbox(2, sandbox.StateDestroyed, base(), nil)
	gone.UpdatedAt = cutoff.Add(-time.Hour)
	mustCreate(t, s, gone)
	gj := newJob(gone, base())
	gj.State = sandbox.JobCanceled
	gj.UpdatedAt = cutoff.Add(time.Hour)
	mustCreateJob(t, s, gj)
	if n, err := s.PruneSandboxes(t.Context(), cutoff); err != nil || n != 1 {
		t.Fatalf("PruneSandboxes = %d, %v; want 1", n, err)
	}
	if _, err := s.GetJob(t.Context(), gone.ID, gj.ID); !errcode.Is(err, errcode.JobNotFound) {
		t.Errorf("a pruned sandbox's job: %v, want JOB_NOT_FOUND", err)
	}
}

func testJobCountByState(t *testing.T, s store.Store) {
	if got, err := s.CountJobs(t.Context()); err != nil || len(got) != 0 {
		t.Fatalf("CountJobs of an empty store = %v, %v; want none", got, err)
	}
	sb := mustCreate(t, s, newSandbox(1, sandbox.StateRunning, base(), nil))
	for i := range 3 {
		j := mustCreateJob(t, s, newJob(sb, base().Add(time.Duration(i)*time.Millisecond)))
		if i == 0 {
			j.Version++
			j.State = sandbox.JobExited
			if err := s.UpdateJob(t.Context(), j, sandbox.Event{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	got, err := s.CountJobs(t.Context())
	if err != nil || got[sandbox.JobStarting] != 2 || got[sandbox.JobExited] != 1 || len(got) != 2 {
		t.Fatalf("CountJobs = %v, %v; want 2 starting, 1 exited", got, err)
	}
	// ActiveJobsBySandbox: the starting and running ones, per sandbox; one with none is absent.
	other := mustCreate(t, s, newSandbox(2, sandbox.StateRunning, base(), nil))
	oj := mustCreateJob(t, s, newJob(other, base()))
	oj.Version++
	oj.State = sandbox.JobRunning
	if err := s.UpdateJob(t.Context(), oj, sandbox.Event{}); err != nil {
		t.Fatal(err)
	}
	mustCreate(t, s, newSandbox(3, sandbox.StateRunning, base(), nil))
	active, err := s.ActiveJobsBySandbox(t.Context())
	if err != nil || len(active) != 2 || active[sb.ID] != 2 || active[other.ID] != 1 {
		t.Fatalf("ActiveJobsBySandbox = %v, %v; want %s: 2, %s: 1", active, err, sb.ID, other.ID)
	}
}
