//go:build linux

package guest_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/guest"
)

// newJobID returns a fresh job id of the host's shape.
func newJobID() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return "job-" + hex.EncodeToString(b)
}

// jobsAgent is an agent under test with a jobs dir of the test's choosing; stop ends it early.
type jobsAgent struct {
	*agent
	jobsDir string
	stop    func()
}

// startJobsAgent runs an agent whose jobs live in jobsDir ("" : a temp dir).
func startJobsAgent(t *testing.T, jobsDir string) *jobsAgent {
	t.Helper()
	if jobsDir == "" {
		jobsDir = t.TempDir()
	}
	sockDir, err := os.MkdirTemp("", "ag")
	if err != nil {
		t.Fatal(err)
	}
	a := &agent{socket: filepath.Join(sockDir, "a.sock"), workdir: t.TempDir()}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	log := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	go func() {
		done <- guest.Run(ctx, guest.ServerConfig{Socket: a.socket, Workdir: a.workdir, Logger: log, ShutdownGrace: time.Second, JobsDir: jobsDir})
	}()
	a.c = guest.NewUnixClient(a.socket)
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		a.c.Close()
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("Run did not return after its context ended")
		}
		_ = os.RemoveAll(sockDir)
	}
	t.Cleanup(stop)
	if err := a.c.WaitReady(ctxT(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	return &jobsAgent{agent: a, jobsDir: jobsDir, stop: stop}
}

func (a *jobsAgent) start(t *testing.T, argv ...string) guest.JobInfo {
	t.Helper()
	ji, err := a.c.StartJob(ctxT(t, 10*time.Second), guest.JobStartRequest{JobID: newJobID(), Argv: argv})
	if err != nil {
		t.Fatalf("StartJob(%q): %v", argv, err)
	}
	if ji.State != guest.JobRunning && ji.State != guest.JobExited {
		t.Fatalf("StartJob: state %s", ji.State)
	}
	return ji
}

func (a *jobsAgent) wait(t *testing.T, id string) guest.JobInfo {
	t.Helper()
	ji, err := a.c.WaitJob(ctxT(t, 70*time.Second), id, time.Minute)
	if err != nil {
		t.Fatalf("WaitJob: %v", err)
	}
	if ji.State == guest.JobRunning {
		t.Fatalf("job %s still running after a minute", id)
	}
	return ji
}

func wantExited(t *testing.T, ji guest.JobInfo, code int) {
	t.Helper()
	if ji.State != guest.JobExited || ji.ExitCode == nil || *ji.ExitCode != code || ji.FinishedAt == nil {
		t.Fatalf("want exited %d, got %+v", code, ji)
	}
}

// readAll pages through a job's log, max bytes at a time.
func (a *jobsAgent) readAll(t *testing.T, id, stream string, max int64) []byte {
	t.Helper()
	var all []byte
	for off := int64(0); ; {
		l, err := a.c.JobLogs(ctxT(t, 10*time.Second), id, guest.JobLogsRequest{Stream: stream, Offset: off, Max: max})
		if err != nil {
			t.Fatalf("JobLogs(%s, %d): %v", stream, off, err)
		}
		if l.Offset != off || int64(len(l.Data)) > max {
			t.Fatalf("page at %d: offset %d, %d bytes", off, l.Offset, len(l.Data))
		}
		all = append(all, l.Data...)
		if l.NextOffset == l.TotalBytes {
			return all
		}
		off = l.NextOffset
	}
}

func TestJobOutlivesRequestAndClient(t *testing.T) {
	a := startJobsAgent(t, "")
	marker := filepath.Join(a.workdir, "marker")
	// A client of its own, whose request context ends with the reply and which is then closed.
	c := guest.NewUnixClient(a.socket)
	ctx, cancel := context.WithCancel(context.Background())
	id := newJobID()
	ji, err := c.StartJob(ctx, guest.JobStartRequest{JobID: id, Argv: []string{"sh", "-c", "echo start; sleep 1; echo end; sleep 0.2; echo err >&2; touch " + marker}, Cwd: a.workdir})
	cancel()
	c.Close()
	if err != nil {
		t.Fatal(err)
	}
	if ji.State != guest.JobRunning || ji.JobID != id || ji.StartedAt.IsZero() || ji.FinishedAt != nil || ji.Argv[0] != "sh" {
		t.Fatalf("start: %+v", ji)
	}
	c2 := guest.NewUnixClient(a.socket)
	defer c2.Close()
	got, err := c2.Job(ctxT(t, 5*time.Second), id)
	if err != nil || got.State != guest.JobRunning {
		t.Fatalf("Job: %+v %v", got, err)
	}
	done, err := c2.WaitJob(ctxT(t, 20*time.Second), id, 15*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	wantExited(t, done, 0)
	if _, err := os.Stat(marker); err != nil {
		t.Fatalf("the job did not run to its end: %v", err)
	}
	if out := a.readAll(t, id, guest.JobStreamAll, guest.MaxJobLogBytes); string(out) != "start\nend\nerr\n" {
		t.Fatalf("output %q", out)
	}
	if done.LogBytes != int64(len("start\nend\nerr\n")) || done.LogTruncated {
		t.Fatalf("log_bytes %d truncated %v", done.LogBytes, done.LogTruncated)
	}
	if out := a.readAll(t, id, guest.JobStreamStderr, 100); string(out) != "err\n" {
		t.Fatalf("stderr %q", out)
	}
	if out := a.readAll(t, id, guest.JobStreamStdout, 100); string(out) != "start\nend\n" {
		t.Fatalf("stdout %q", out)
	}
	// The record is on the disk, written atomically.
	b, err := os.ReadFile(filepath.Join(a.jobsDir, id, "exit.json"))
	if err != nil || !bytes.Contains(b, []byte(`"state":"exited"`)) {
		t.Fatalf("exit.json: %s %v", b, err)
	}
	for _, f := range []string{"output", "stdout", "stderr"} {
		if _, err := os.Stat(filepath.Join(a.jobsDir, id, f)); err != nil {
			t.Fatal(err)
		}
	}
	list, err := c2.Jobs(ctxT(t, 5*time.Second))
	if err != nil || len(list) != 1 || list[0].JobID != id {
		t.Fatalf("Jobs: %+v %v", list, err)
	}
	// A restarted agent on the same disk still knows the finished job.
	a.stop()
	b2 := startJobsAgent(t, a.jobsDir)
	again, err := b2.c.Job(ctxT(t, 5*time.Second), id)
	if err != nil || again.State != guest.JobExited || *again.ExitCode != 0 || again.LogBytes != done.LogBytes {
		t.Fatalf("after a restart: %+v %v", again, err)
	}
	if out := b2.readAll(t, id, guest.JobStreamAll, 7); string(out) != "start\nend\nerr\n" {
		t.Fatalf("output after a restart %q", out)
	}
}

func TestJobLogsPagingBinary(t *testing.T) {
	a := startJobsAgent(t, "")
	data := make([]byte, 3<<20+12345)
	_, _ = rand.Read(data)
	src := filepath.Join(a.workdir, "data")
	if err := os.WriteFile(src, data, 0o644); err != nil {
		t.Fatal(err)
	}
	out := a.start(t, "cat", src)
	errJob := a.start(t, "sh", "-c", "cat "+src+" >&2")
	wantExited(t, a.wait(t, out.JobID), 0)
	wantExited(t, a.wait(t, errJob.JobID), 0)
	for _, tc := range []struct {
		id, stream string
		want       []byte
		max        int64
	}{
		{out.JobID, guest.JobStreamAll, data, guest.MaxJobLogBytes},
		{out.JobID, guest.JobStreamStdout, data, 100003},
		{out.JobID, guest.JobStreamStderr, nil, 1000},
		{errJob.JobID, guest.JobStreamStderr, data, 77777},
		{errJob.JobID, guest.JobStreamAll, data, guest.MaxJobLogBytes},
	} {
		if got := a.readAll(t, tc.id, tc.stream, tc.max); !bytes.Equal(got, tc.want) {
			t.Fatalf("%s %s: %d bytes, not the %d written", tc.id, tc.stream, len(got), len(tc.want))
		}
	}
	// Past the end: empty, next_offset = total.
	l, err := a.c.JobLogs(ctxT(t, 5*time.Second), out.JobID, guest.JobLogsRequest{Offset: int64(len(data)) + 500})
	if err != nil || len(l.Data) != 0 || l.NextOffset != int64(len(data)) || l.TotalBytes != int64(len(data)) {
		t.Fatalf("past the end: %d bytes, next %d, total %d, %v", len(l.Data), l.NextOffset, l.TotalBytes, err)
	}
	// Default max: the largest slice.
	l, err = a.c.JobLogs(ctxT(t, 5*time.Second), out.JobID, guest.JobLogsRequest{})
	if err != nil || len(l.Data) != guest.MaxJobLogBytes || !bytes.Equal(l.Data, data[:guest.MaxJobLogBytes]) {
		t.Fatalf("default slice: %d bytes %v", len(l.Data), err)
	}
}

func TestJobTailLines(t *testing.T) {
	a := startJobsAgent(t, "")
	seq := a.start(t, "sh", "-c", "seq 1 1000; seq 5001 5003 >&2")
	wantExited(t, a.wait(t, seq.JobID), 0)
	tail := func(stream string, n int, max int64) guest.JobLogs {
		t.Helper()
		l, err := a.c.JobLogs(ctxT(t, 5*time.Second), seq.JobID, guest.JobLogsRequest{Stream: stream, TailLines: n, Max: max})
		if err != nil {
			t.Fatal(err)
		}
		if l.NextOffset != l.TotalBytes || l.Offset+int64(len(l.Data)) != l.TotalBytes {
			t.Fatalf("tail: offset %d + %d bytes, total %d", l.Offset, len(l.Data), l.TotalBytes)
		}
		return l
	}
	if l := tail(guest.JobStreamStdout, 3, 0); string(l.Data) != "998\n999\n1000\n" {
		t.Fatalf("tail 3: %q", l.Data)
	}
	if l := tail(guest.JobStreamStderr, 2, 0); string(l.Data) != "5002\n5003\n" {
		t.Fatalf("stderr tail 2: %q", l.Data)
	}
	// The combined log interleaves the two pipes as the agent read them (stdout's last lines
	// may land after stderr's on a loaded host): its tail is the last lines of the whole log.
	all, err := a.c.JobLogs(ctxT(t, 5*time.Second), seq.JobID, guest.JobLogsRequest{Max: guest.MaxJobLogBytes})
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(strings.TrimSuffix(string(all.Data), "\n"), "\n")
	want := strings.Join(lines[len(lines)-2:], "") + "\n"
	if l := tail("", 2, 0); string(l.Data) != want || strings.Count(string(all.Data), "\n") != 1003 {
		t.Fatalf("all tail 2: %q, want %q (the combined log's last lines; %d lines)", l.Data, want, strings.Count(string(all.Data), "\n"))
	}
	if l := tail(guest.JobStreamStdout, 10000, 0); !strings.HasPrefix(string(l.Data), "1\n2\n") || l.Offset != 0 {
		t.Fatalf("tail past the start: offset %d %q", l.Offset, l.Data[:10])
	}
	// max bounds the tail and keeps its end (a line cut by the bound starts it).
	if l := tail(guest.JobStreamStdout, 100, 8); string(l.Data) != "99\n1000\n" {
		t.Fatalf("bounded tail: %q", l.Data)
	}
	nonl := a.start(t, "printf", `a\nb\nc`)
	wantExited(t, a.wait(t, nonl.JobID), 0)
	l, err := a.c.JobLogs(ctxT(t, 5*time.Second), nonl.JobID, guest.JobLogsRequest{TailLines: 2})
	if err != nil || string(l.Data) != "b\nc" || l.Offset != 2 {
		t.Fatalf("tail without a final newline: %q at %d %v", l.Data, l.Offset, err)
	}
}

func TestJobWaitTimeoutThenExit(t *testing.T) {
	a := startJobsAgent(t, "")
	ji := a.start(t, "sh", "-c", "sleep 1.5; exit 7")
	t0 := time.Now()
	w, err := a.c.WaitJob(ctxT(t, 10*time.Second), ji.JobID, 200*time.Millisecond)
	if err != nil || w.State != guest.JobRunning || w.ExitCode != nil {
		t.Fatalf("wait 200ms: %+v %v", w, err)
	}
	if d := time.Since(t0); d < 150*time.Millisecond || d > 1200*time.Millisecond {
		t.Fatalf("a wait of 200 ms took %v", d)
	}
	w, err = a.c.WaitJob(ctxT(t, 10*time.Second), ji.JobID, 0)
	if err != nil || w.State != guest.JobRunning {
		t.Fatalf("wait 0: %+v %v", w, err)
	}
	wantExited(t, a.wait(t, ji.JobID), 7)
	// A command that cannot start is a job that exited 127, as exec reports it.
	nf := a.start(t, "no-such-command-xyz")
	wantExited(t, a.wait(t, nf.JobID), 127)
	l, err := a.c.JobLogs(ctxT(t, 5*time.Second), nf.JobID, guest.JobLogsRequest{Stream: guest.JobStreamStderr})
	if err != nil || !strings.Contains(string(l.Data), "command not found") {
		t.Fatalf("stderr of a missing command: %q %v", l.Data, err)
	}
	// Killed by a signal.
	k := a.start(t, "sh", "-c", "kill -9 $$")
	if got := a.wait(t, k.JobID); got.State != guest.JobKilled || got.Signal != "SIGKILL" || got.ExitCode != nil || got.OOMKilled {
		t.Fatalf("killed: %+v", got)
	}
}

// readPid reads a pid a job wrote to a file, waiting for it.
func readPid(t *testing.T, path string) int {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, err := os.ReadFile(path)
		if pid, perr := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && perr == nil && pid > 0 {
			return pid
		}
		if time.Now().After(deadline) {
			t.Fatalf("no pid in %s", path)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestJobCancelKillsWholeTree(t *testing.T) {
	a := startJobsAgent(t, "")
	w := a.workdir
	// The job and all it starts ignore SIGTERM; one daemon leaves the process group and session
	// (setsid) from a double fork, so that it is an orphan no process group holds.
	script := fmt.Sprintf(`trap "" TERM
echo $$ > %[1]s/main.pid
( setsid sh -c 'echo $$ > %[1]s/daemon.pid; exec sleep 1000' & ) 
sleep 1000 & echo $! > %[1]s/child.pid
echo ready
wait`, w)
	ji := a.start(t, "sh", "-c", script)
	pids := map[string]int{}
	for _, n := range []string{"main", "daemon", "child"} {
		pids[n] = readPid(t, filepath.Join(w, n+".pid"))
	}
	// The daemon really left: another session, and not a child of the job's shell.
	if sid, _ := unix.Getsid(pids["daemon"]); sid == pids["main"] {
		t.Fatalf("the daemon is in the job's session")
	}
	if _, ppid, _ := procStat(pids["daemon"]); ppid == pids["main"] {
		t.Fatalf("the daemon is the job's child")
	}
	t0 := time.Now()
	got, err := a.c.CancelJob(ctxT(t, 30*time.Second), ji.JobID, 500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(t0); d < 450*time.Millisecond {
		t.Fatalf("a tree that ignores SIGTERM was killed after %v, before its grace", d)
	}
	if got.State != guest.JobCanceled || got.Signal != "SIGKILL" || got.FinishedAt == nil {
		t.Fatalf("cancel: %+v", got)
	}
	for n, pid := range pids {
		if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err == nil {
			t.Errorf("%s (pid %d) is still there after the cancel (state %s)", n, pid, procState(pid))
		}
	}
	// A cancel of a finished job returns it as it is.
	again, err := a.c.CancelJob(ctxT(t, 5*time.Second), ji.JobID, 0)
	if err != nil || again.State != guest.JobCanceled || !again.FinishedAt.Equal(*got.FinishedAt) {
		t.Fatalf("second cancel: %+v %v", again, err)
	}
	done := a.start(t, "true")
	wantExited(t, a.wait(t, done.JobID), 0)
	if c, err := a.c.CancelJob(ctxT(t, 5*time.Second), done.JobID, time.Second); err != nil || c.State != guest.JobExited {
		t.Fatalf("cancel of an exited job: %+v %v", c, err)
	}
	// A job that obeys SIGTERM ends at once.
	obey := a.start(t, "sleep", "1000")
	t0 = time.Now()
	got, err = a.c.CancelJob(ctxT(t, 30*time.Second), obey.JobID, 20*time.Second)
	if err != nil || got.State != guest.JobCanceled || got.Signal != "SIGTERM" || time.Since(t0) > 5*time.Second {
		t.Fatalf("cancel of sleep: %+v %v after %v", got, err, time.Since(t0))
	}
}

func TestJobLimit(t *testing.T) {
	a := startJobsAgent(t, "")
	var ids []string
	for range guest.MaxRunningJobs {
		ids = append(ids, a.start(t, "sleep", "1000").JobID)
	}
	_, err := a.c.StartJob(ctxT(t, 5*time.Second), guest.JobStartRequest{JobID: newJobID(), Argv: []string{"true"}})
	wantCode(t, err, errcode.JobLimitExceeded, "64")
	// Finished jobs do not count: one ends, and one more may start.
	if _, err := a.c.CancelJob(ctxT(t, 10*time.Second), ids[0], 0); err != nil {
		t.Fatal(err)
	}
	a.start(t, "true")
	list, err := a.c.Jobs(ctxT(t, 5*time.Second))
	if err != nil || len(list) != guest.MaxRunningJobs+1 || list[len(list)-1].JobID != ids[0] {
		t.Fatalf("Jobs: %d %v", len(list), err)
	}
}

func TestJobBadArguments(t *testing.T) {
	a := startJobsAgent(t, "")
	ji := a.start(t, "sleep", "1000")
	id := ji.JobID
	ctx := ctxT(t, 30*time.Second)
	for _, tc := range []struct{ path, arg string }{
		{"/jobs/" + id + "/logs?max=0", "max"},
		{"/jobs/" + id + "/logs?max=262145", "max"},
		{"/jobs/" + id + "/logs?max=abc", "max"},
		{"/jobs/" + id + "/logs?offset=-1", "offset"},
		{"/jobs/" + id + "/logs?tail_lines=0", "tail_lines"},
		{"/jobs/" + id + "/logs?tail_lines=10001", "tail_lines"},
		{"/jobs/" + id + "/logs?tail_lines=5&offset=3", "offset"},
		{"/jobs/" + id + "/logs?stream=both", "stream"},
		{"/jobs/" + id + "/wait?timeout_ms=-1", "timeout_ms"},
		{"/jobs/" + id + "/wait?timeout_ms=3600001", "timeout_ms"},
		{"/jobs/job-XYZ/wait", "job_id"},
	} {
		code, eb := a.raw(t, "GET", tc.path, "")
		if code != 400 || eb.Code != string(errcode.InvalidArgument) || !strings.Contains(eb.Message, tc.arg) {
			t.Errorf("GET %s: %d %+v", tc.path, code, eb)
		}
	}
	for _, body := range []string{`{"grace_ms": -1}`, `{"grace_ms": 600001}`} {
		code, eb := a.raw(t, "POST", "/jobs/"+id+"/cancel", body)
		if code != 400 || eb.Code != string(errcode.InvalidArgument) || !strings.Contains(eb.Message, "grace_ms") || !strings.Contains(eb.Message, "600000") {
			t.Errorf("cancel %s: %d %+v", body, code, eb)
		}
	}
	_, err := a.c.WaitJob(ctx, id, -time.Second)
	wantCode(t, err, errcode.InvalidArgument, "timeout_ms")
	_, err = a.c.JobLogs(ctx, id, guest.JobLogsRequest{Max: guest.MaxJobLogBytes + 1})
	wantCode(t, err, errcode.InvalidArgument, "262144")
	_, err = a.c.JobLogs(ctx, id, guest.JobLogsRequest{TailLines: -3})
	wantCode(t, err, errcode.InvalidArgument, "tail_lines")
	_, err = a.c.CancelJob(ctx, id, -time.Millisecond)
	wantCode(t, err, errcode.InvalidArgument, "grace_ms")
	_, err = a.c.Job(ctx, "job-000000000000")
	wantCode(t, err, errcode.JobNotFound, "job-000000000000")
	_, err = a.c.Job(ctx, "../../etc")
	wantCode(t, err, errcode.InvalidArgument, "job_id")
	_, err = a.c.StartJob(ctx, guest.JobStartRequest{JobID: id, Argv: []string{"true"}})
	wantCode(t, err, errcode.Conflict, id)
	_, err = a.c.StartJob(ctx, guest.JobStartRequest{JobID: newJobID(), Argv: []string{"echo", strings.Repeat("x", guest.MaxJobArgvBytes)}})
	wantCode(t, err, errcode.InvalidArgument, "argv")
	_, err = a.c.StartJob(ctx, guest.JobStartRequest{JobID: newJobID()})
	wantCode(t, err, errcode.InvalidArgument, "argv")
	_, err = a.c.StartJob(ctx, guest.JobStartRequest{JobID: newJobID(), Argv: []string{"true"}, Cwd: "/no/such/dir"})
	wantCode(t, err, errcode.InvalidArgument, "/no/such/dir")
	// Nothing of the refused starts was created or left running.
	ents, _ := os.ReadDir(a.jobsDir)
	list, _ := a.c.Jobs(ctx)
	if len(ents) != 1 || len(list) != 1 {
		t.Fatalf("refused starts left %d dirs and %d jobs", len(ents), len(list))
	}
	// The job the bad calls named is untouched.
	if got, err := a.c.Job(ctx, id); err != nil || got.State != guest.JobRunning {
		t.Fatalf("job after bad calls: %+v %v", got, err)
	}
}

// TestJobDiskFull gives the agent a tiny tmpfs for its jobs: the log stops, the job does not.
func TestJobDiskFull(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=128k"); err != nil {
		t.Fatalf("mount a tmpfs: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	a := startJobsAgent(t, dir)
	marker := filepath.Join(a.workdir, "finished")
	// 4 MiB of output into 128 KiB of disk, then a sign that the job ran to its end.
	ji := a.start(t, "sh", "-c", "head -c 4194304 /dev/zero; echo more >&2; touch "+marker+"; exit 3")
	got := a.wait(t, ji.JobID)
	wantExited(t, got, 3)
	if !got.LogTruncated || got.LogBytes >= 4<<20 || got.LogBytes == 0 {
		t.Fatalf("log_truncated %v, log_bytes %d", got.LogTruncated, got.LogBytes)
	}
	if _, err := os.Stat(marker); err != nil {
		t.Fatalf("the job did not run to its end: %v", err)
	}
	l, err := a.c.JobLogs(ctxT(t, 5*time.Second), ji.JobID, guest.JobLogsRequest{})
	if err != nil || !l.Truncated || l.TotalBytes != got.LogBytes || !bytes.Equal(l.Data, make([]byte, len(l.Data))) {
		t.Fatalf("logs: truncated %v total %d (log_bytes %d) %v", l.Truncated, l.TotalBytes, got.LogBytes, err)
	}
	// With the disk full, a new job still starts and runs, without logs.
	again := a.start(t, "sh", "-c", "echo hi; exit 4")
	if g := a.wait(t, again.JobID); g.State != guest.JobExited || *g.ExitCode != 4 || !g.LogTruncated {
		t.Fatalf("job on a full disk: %+v", g)
	}
}

// TestJobListSamplesCPU: a list of jobs samples each running job's CPU time (in one pass over
// /proc): a job burning CPU shows it, one sleeping shows none, and the list agrees with a get.
func TestJobListSamplesCPU(t *testing.T) {
	a := startJobsAgent(t, "")
	busy := a.start(t, "sh", "-c", "while :; do :; done").JobID
	idle := a.start(t, "sleep", "1000").JobID
	var got map[string]float64
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		list, err := a.c.Jobs(ctxT(t, 30*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		got = map[string]float64{}
		for _, j := range list {
			got[j.JobID] = j.CPUSeconds
		}
		if got[busy] >= 0.2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the busy job's cpu_seconds in the list stayed %g", got[busy])
		}
	}
	if got[idle] > 0.05 {
		t.Errorf("the sleeping job shows %g s of CPU", got[idle])
	}
	j, err := a.c.Job(ctxT(t, 30*time.Second), busy)
	if err != nil || j.CPUSeconds < got[busy] {
		t.Errorf("get after the list: %g s (%v), the list said %g s", j.CPUSeconds, err, got[busy])
	}
}
