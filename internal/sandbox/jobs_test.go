package sandbox_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// Jobs' control-plane logic on the fake runtime, whose sandboxes run real in-process agents.

func startJob(t *testing.T, e *fakeEnv, id string, argv ...string) sandbox.Job {
	t.Helper()
	j, err := e.jobs.StartJob(t.Context(), id, sandbox.JobStartRequest{Argv: argv})
	if err != nil {
		t.Fatalf("StartJob %q: %v", argv, err)
	}
	if j.State != sandbox.JobRunning || !sandbox.ValidJobID(j.ID) || j.SandboxID != id {
		t.Fatalf("StartJob = %+v, want a running job-… of %s", j, id)
	}
	return j
}

// record reads a job's stored record, behind the service's back.
func record(t *testing.T, e *fakeEnv, sb, job string) sandbox.Job {
	t.Helper()
	j, err := e.st.GetJob(context.Background(), sb, job)
	if err != nil {
		t.Fatalf("GetJob: %v", err)
	}
	return j
}

func TestJobRunsAndSettles(t *testing.T) {
	e := newFakeEnv(t, sandbox.Config{})
	sb := e.create(t, sandbox.CreateRequest{})
	j := startJob(t, e, sb.ID, "sh", "-c", "for i in 1 2 3; do echo line$i; done; echo err >&2; exit 3")
	if r := record(t, e, sb.ID, j.ID); r.State != sandbox.JobRunning && r.State != sandbox.JobExited {
		t.Errorf("record after start: %s", r.State)
	}
	w, err := e.jobs.WaitJob(t.Context(), sb.ID, j.ID, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if w.State != sandbox.JobExited || w.ExitCode == nil || *w.ExitCode != 3 || w.Success || w.FinishedAt == nil {
		t.Fatalf("WaitJob = %+v, want exited 3, not success", w)
	}
	r := record(t, e, sb.ID, j.ID)
	if r.State != sandbox.JobExited || r.LogBytes != int64(len("line1\nline2\nline3\nerr\n")) || !bytes.Contains(r.Tail, []byte("line3")) {
		t.Errorf("record = %s, %d bytes, tail %q", r.State, r.LogBytes, r.Tail)
	}
	lg, err := e.jobs.JobLogs(t.Context(), sb.ID, j.ID, sandbox.JobLogsRequest{})
	if err != nil || len(lg.Data) != 22 || !strings.Contains(string(lg.Data), "line3\n") || !strings.Contains(string(lg.Data), "err\n") || lg.Source != "agent" || lg.NextOffset != lg.TotalBytes {
		t.Errorf("JobLogs default = %q %+v, %v", lg.Data, lg, err)
	}
	two := 2
	lg, err = e.jobs.JobLogs(t.Context(), sb.ID, j.ID, sandbox.JobLogsRequest{Stream: "stdout", TailLines: &two})
	if err != nil || string(lg.Data) != "line2\nline3\n" {
		t.Errorf("JobLogs stdout tail 2 = %q, %v", lg.Data, err)
	}
	evs := e.eventsOf(t, sb.ID, "job")
	var reasons []string
	for _, ev := range evs {
		reasons = append(reasons, ev.Reason)
	}
	if !containsStr(reasons, "job "+j.ID+" started") || !containsStr(reasons, "job "+j.ID+" exited 3") {
		t.Errorf("job events = %q", reasons)
	}
	l, err := e.jobs.ListJobs(t.Context(), sb.ID, 0)
	if err != nil || len(l.Jobs) != 1 || l.Jobs[0].ID != j.ID || l.Omitted != 0 {
		t.Errorf("ListJobs = %+v, %v", l, err)
	}
}

func containsStr(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// A job the agent refuses is recorded (the record is written before the agent is asked).
func TestJobRecordBeforeAct(t *testing.T) {
	e := newFakeEnv(t, sandbox.Config{})
	sb := e.create(t, sandbox.CreateRequest{})
	// The agent refuses an argv past its bound (64 KiB); the host does not check that.
	_, err := e.jobs.StartJob(t.Context(), sb.ID, sandbox.JobStartRequest{Argv: []string{"echo", strings.Repeat("x", 70<<10)}})
	if !errcode.Is(err, errcode.InvalidArgument) {
		t.Fatalf("starting a job the agent refuses: %v", err)
	}
	l, lerr := e.jobs.ListJobs(t.Context(), sb.ID, 0)
	if lerr != nil || len(l.Jobs) != 1 {
		t.Fatalf("ListJobs after a refused start = %+v, %v; want its record", l, lerr)
	}
	j := l.Jobs[0]
	if j.State != sandbox.JobFailed || !strings.Contains(j.Error, "start failed") || j.Success {
		t.Errorf("refused job's record = %+v, want failed with the reason", j)
	}
	if evs := e.eventsOf(t, sb.ID, "job"); len(evs) != 1 || !strings.Contains(evs[0].Reason, "failed to start") {
		t.Errorf("job events = %+v", evs)
	}
	// A job in a sandbox that is not running is refused before any record.
	e.svc.Destroy(t.Context(), sb.ID)
	if _, err := e.jobs.StartJob(t.Context(), sb.ID, sandbox.JobStartRequest{Argv: []string{"true"}}); !errcode.Is(err, errcode.SandboxNotRunning) {
		t.Errorf("StartJob in a destroyed sandbox: %v", err)
	}
	if l, _ := e.jobs.ListJobs(t.Context(), sb.ID, 0); len(l.Jobs) != 1 {
		t.Errorf("a refused start left a record: %+v", l)
	}
}

func TestJobLimit(t *testing.T) {
	e := newFakeEnv(t, sandbox.Config{})
	sb := e.create(t, sandbox.CreateRequest{})
	for i := range sandbox.DefaultMaxJobs {
		if _, err := e.jobs.StartJob(t.Context(), sb.ID, sandbox.JobStartRequest{Argv: []string{"sleep", "60"}}); err != nil {
			t.Fatalf("job %d: %v", i+1, err)
		}
	}
	_, err := e.jobs.StartJob(t.Context(), sb.ID, sandbox.JobStartRequest{Argv: []string{"sleep", "60"}})
	if !errcode.Is(err, errcode.JobLimitExceeded) {
		t.Fatalf("job %d: %v, want JOB_LIMIT_EXCEEDED", sandbox.DefaultMaxJobs+1, err)
	}
	l, err := e.jobs.ListJobs(t.Context(), sb.ID, 1000)
	if err != nil || len(l.Jobs) != sandbox.DefaultMaxJobs {
		t.Errorf("records = %d, %v; want %d (the refused one is not recorded)", len(l.Jobs), err, sandbox.DefaultMaxJobs)
	}
	l, err = e.jobs.ListJobs(t.Context(), sb.ID, 0)
	if err != nil || len(l.Jobs) != sandbox.DefaultJobList || l.Omitted != sandbox.DefaultMaxJobs-sandbox.DefaultJobList {
		t.Errorf("ListJobs default = %d jobs, %d omitted, %v", len(l.Jobs), l.Omitted, err)
	}
	// One ended frees a place.
	if _, err := e.jobs.CancelJob(t.Context(), sb.ID, l.Jobs[0].ID, new(time.Duration)); err != nil {
		t.Fatal(err)
	}
	if _, err := e.jobs.StartJob(t.Context(), sb.ID, sandbox.JobStartRequest{Argv: []string{"true"}}); err != nil {
		t.Errorf("after a cancel: %v", err)
	}
}

// The host checks the bound itself (the agent would take more).
func TestJobLimitOnHost(t *testing.T) {
	e := newFakeEnv(t, sandbox.Config{MaxJobsPerSandbox: 2})
	sb := e.create(t, sandbox.CreateRequest{})
	startJob(t, e, sb.ID, "sleep", "60")
	startJob(t, e, sb.ID, "sleep", "60")
	_, err := e.jobs.StartJob(t.Context(), sb.ID, sandbox.JobStartRequest{Argv: []string{"sleep", "60"}})
	if !errcode.Is(err, errcode.JobLimitExceeded) {
		t.Fatalf("third job with a bound of 2: %v", err)
	}
}

func TestJobBounds(t *testing.T) {
	e := newFakeEnv(t, sandbox.Config{})
	sb := e.create(t, sandbox.CreateRequest{})
	j := startJob(t, e, sb.ID, "sleep", "30")
	i64 := func(v int64) *int64 { return &v }
	in := func(v int) *int { return &v }
	dur := func(d time.Duration) *time.Duration { return &d }
	cases := []struct {
		name, arg string
		call      func() error
	}{
		{"limit -1", "limit", func() error { _, err := e.jobs.ListJobs(t.Context(), sb.ID, -1); return err }},
		{"limit 1001", "limit", func() error { _, err := e.jobs.ListJobs(t.Context(), sb.ID, 1001); return err }},
		{"offset -1", "offset_bytes", func() error {
			_, err := e.jobs.JobLogs(t.Context(), sb.ID, j.ID, sandbox.JobLogsRequest{Offset: i64(-1)})
			return err
		}},
		{"max_bytes 0", "max_bytes", func() error {
			_, err := e.jobs.JobLogs(t.Context(), sb.ID, j.ID, sandbox.JobLogsRequest{MaxBytes: i64(0)})
			return err
		}},
		{"max_bytes 262145", "max_bytes", func() error {
			_, err := e.jobs.JobLogs(t.Context(), sb.ID, j.ID, sandbox.JobLogsRequest{MaxBytes: i64(262145)})
			return err
		}},
		{"tail_lines 0", "tail_lines", func() error {
			_, err := e.jobs.JobLogs(t.Context(), sb.ID, j.ID, sandbox.JobLogsRequest{TailLines: in(0)})
			return err
		}},
		{"tail_lines 10001", "tail_lines", func() error {
			_, err := e.jobs.JobLogs(t.Context(), sb.ID, j.ID, sandbox.JobLogsRequest{TailLines: in(10001)})
			return err
		}},
		{"tail and offset", "tail_lines", func() error {
			_, err := e.jobs.JobLogs(t.Context(), sb.ID, j.ID, sandbox.JobLogsRequest{TailLines: in(1), Offset: i64(0)})
			return err
		}},
		{"stream", "stream", func() error {
			_, err := e.jobs.JobLogs(t.Context(), sb.ID, j.ID, sandbox.JobLogsRequest{Stream: "both"})
			return err
		}},
		{"wait -1s", "timeout_seconds", func() error { _, err := e.jobs.WaitJob(t.Context(), sb.ID, j.ID, -time.Second); return err }},
		{"wait 3601s", "timeout_seconds", func() error {
			_, err := e.jobs.WaitJob(t.Context(), sb.ID, j.ID, 3601*time.Second)
			return err
		}},
		{"grace -1s", "grace_seconds", func() error { _, err := e.jobs.CancelJob(t.Context(), sb.ID, j.ID, dur(-time.Second)); return err }},
		{"grace 601s", "grace_seconds", func() error { _, err := e.jobs.CancelJob(t.Context(), sb.ID, j.ID, dur(601*time.Second)); return err }},
		{"job id", "job_id", func() error { _, err := e.jobs.JobStatus(t.Context(), sb.ID, "job-XYZ"); return err }},
		{"empty argv", "command", func() error {
			_, err := e.jobs.StartJob(t.Context(), sb.ID, sandbox.JobStartRequest{})
			return err
		}},
	}
	// A numeric argument's refusal states the range it must be in.
	ranges := map[string]string{
		"limit":           "between 1 and 1000",
		"offset_bytes":    "at least 0",
		"max_bytes":       "between 1 and 262144",
		"tail_lines":      "between 1 and 10000",
		"timeout_seconds": "between 0 and 3600",
		"grace_seconds":   "between 0 and 600",
	}
	for _, c := range cases {
		err := c.call()
		if !errcode.Is(err, errcode.InvalidArgument) || !strings.Contains(errcode.Message(err), c.arg) {
			t.Errorf("%s: %v; want INVALID_ARGUMENT naming %s", c.name, err, c.arg)
		}
		if want, ok := ranges[c.arg]; ok && c.name != "tail and offset" && !strings.Contains(errcode.Message(err), want) {
			t.Errorf("%s: %q does not state the range (%s)", c.name, errcode.Message(err), want)
		}
	}
	// Nothing was canceled or created by the refused calls.
	if st, err := e.jobs.JobStatus(t.Context(), sb.ID, j.ID); err != nil || st.State != sandbox.JobRunning {
		t.Errorf("job after refused calls: %+v, %v", st, err)
	}
	if l, _ := e.jobs.ListJobs(t.Context(), sb.ID, 0); len(l.Jobs) != 1 {
		t.Errorf("jobs after refused calls: %d", len(l.Jobs))
	}
	// A wait that times out is not an error.
	w, err := e.jobs.WaitJob(t.Context(), sb.ID, j.ID, 0)
	if err != nil || w.State != sandbox.JobRunning {
		t.Errorf("WaitJob 0 = %s, %v; want running", w.State, err)
	}
	if _, err := e.jobs.JobStatus(t.Context(), sb.ID, sandbox.NewJobID()); !errcode.Is(err, errcode.JobNotFound) {
		t.Errorf("unknown job: %v", err)
	}
}

func TestJobUnknownWhenSandboxLost(t *testing.T) {
	e := newFakeEnv(t, sandbox.Config{})
	sb := e.create(t, sandbox.CreateRequest{})
	j := startJob(t, e, sb.ID, "sleep", "60")
	e.rt.Kill(sb.ID)
	deadline := time.Now().Add(10 * time.Second)
	for e.state(t, sb.ID) != sandbox.StateLost {
		if time.Now().After(deadline) {
			t.Fatal("the sandbox was not recorded lost")
		}
		time.Sleep(10 * time.Millisecond)
	}
	st, err := e.jobs.JobStatus(t.Context(), sb.ID, j.ID)
	if err != nil {
		t.Fatal(err)
	}
	if st.State != sandbox.JobUnknown || st.Success || st.ExitCode != nil || !strings.Contains(st.Message, "NOT treat it as a success") {
		t.Errorf("job of a lost sandbox = %+v; want unknown, never success, and said so", st)
	}
	w, err := e.jobs.WaitJob(t.Context(), sb.ID, j.ID, time.Second)
	if err != nil || w.State != sandbox.JobUnknown {
		t.Errorf("WaitJob = %s, %v", w.State, err)
	}
}

func TestJobCanceledWhenSandboxDestroyed(t *testing.T) {
	e := newFakeEnv(t, sandbox.Config{})
	sb := e.create(t, sandbox.CreateRequest{})
	j := startJob(t, e, sb.ID, "sh", "-c", "echo before; sleep 60")
	waitLog(t, e, sb.ID, j.ID, "before")
	if _, err := e.svc.Destroy(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	st, err := e.jobs.JobStatus(t.Context(), sb.ID, j.ID)
	if err != nil {
		t.Fatal(err)
	}
	if st.State != sandbox.JobCanceled || !strings.Contains(st.Error, "destroy requested") || st.Success {
		t.Errorf("job of a destroyed sandbox = %+v; want canceled, saying why", st)
	}
	// Its kept output answers after the sandbox is gone.
	lg, err := e.jobs.JobLogs(t.Context(), sb.ID, j.ID, sandbox.JobLogsRequest{})
	if err != nil || string(lg.Data) != "before\n" || lg.Source != "record" {
		t.Errorf("JobLogs after destroy = %q (%s), %v", lg.Data, lg.Source, err)
	}
	if l, err := e.jobs.ListJobs(t.Context(), sb.ID, 0); err != nil || len(l.Jobs) != 1 {
		t.Errorf("ListJobs after destroy = %+v, %v", l, err)
	}
}

func TestJobCanceledWhenTTLExpires(t *testing.T) {
	e := newFakeEnv(t, sandbox.Config{})
	sb := e.create(t, sandbox.CreateRequest{TTLSeconds: 60})
	j := startJob(t, e, sb.ID, "sleep", "60")
	e.clock.Add(2 * time.Minute)
	if err := e.svc.Converge(t.Context()); err != nil {
		t.Fatal(err)
	}
	st, err := e.jobs.JobStatus(t.Context(), sb.ID, j.ID)
	if err != nil || st.State != sandbox.JobCanceled || !strings.Contains(st.Error, "ttl expired") {
		t.Errorf("job after the TTL = %+v, %v", st, err)
	}
}

func waitLog(t *testing.T, e *fakeEnv, sb, job, want string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		lg, err := e.jobs.JobLogs(t.Context(), sb, job, sandbox.JobLogsRequest{})
		if err == nil && strings.Contains(string(lg.Data), want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("job output never held %q: %q, %v", want, lg.Data, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A restarted server re-attaches to running jobs: their records settle without any call.
func TestJobReattachAfterRestart(t *testing.T) {
	e := newFakeEnv(t, sandbox.Config{})
	sb := e.create(t, sandbox.CreateRequest{})
	j := startJob(t, e, sb.ID, "sh", "-c", "sleep 1; echo done")
	e.restart(t)
	deadline := time.Now().Add(15 * time.Second)
	for {
		r := record(t, e, sb.ID, j.ID)
		if r.State == sandbox.JobExited {
			if r.ExitCode == nil || *r.ExitCode != 0 || string(r.Tail) != "done\n" {
				t.Errorf("settled record = %+v (tail %q)", r, r.Tail)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the job's record was never settled after the restart: %s", r.State)
		}
		time.Sleep(20 * time.Millisecond)
	}
	st, err := e.jobs.JobStatus(t.Context(), sb.ID, j.ID)
	if err != nil || !st.Success {
		t.Errorf("JobStatus = %+v, %v", st, err)
	}
	_ = fmt.Sprint
}
