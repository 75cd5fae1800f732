//go:build linux

package guest_test

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/guest"
)

// TestJobLogsLongPoll: a log read with a wait (wait_ms) holds the request while the job runs
// and has written nothing past the offset, and answers as soon as the job writes (not at the
// bound), at the bound with nothing when nothing is written, and at once when the job ends.
// The job is `cat` of a FIFO the test writes, so every write is the test's.
func TestJobLogsLongPoll(t *testing.T) {
	a := startJobsAgent(t, "")
	fifo := filepath.Join(t.TempDir(), "in")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	ji := a.start(t, "cat", fifo)
	// Opening the FIFO for writing waits for cat to open it: the job is running by then.
	wf, err := os.OpenFile(fifo, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer wf.Close()

	type reply struct {
		l   guest.JobLogs
		err error
		at  time.Time
	}
	poll := func(offset int64, wait time.Duration) <-chan reply {
		ch := make(chan reply, 1)
		go func() {
			l, err := a.c.JobLogs(ctxT(t, wait+30*time.Second), ji.JobID, guest.JobLogsRequest{Offset: offset, Wait: wait})
			ch <- reply{l, err, time.Now()}
		}()
		return ch
	}

	// 1. A write wakes a long poll of 20 s at once.
	started := time.Now()
	ch := poll(0, 20*time.Second)
	time.Sleep(300 * time.Millisecond) // the request is held by now (it would have answered)
	select {
	case r := <-ch:
		t.Fatalf("the long poll answered before any write: %+v %v", r.l, r.err)
	default:
	}
	wrote := time.Now()
	if _, err := wf.WriteString("hello\n"); err != nil {
		t.Fatal(err)
	}
	r := <-ch
	if r.err != nil {
		t.Fatal(r.err)
	}
	if string(r.l.Data) != "hello\n" || r.l.Offset != 0 || r.l.NextOffset != 6 || r.l.State != guest.JobRunning {
		t.Fatalf("woken read: %q at %d, next %d, state %q", r.l.Data, r.l.Offset, r.l.NextOffset, r.l.State)
	}
	lat := r.at.Sub(wrote)
	t.Logf("write → long poll reply: %v (held %v before the write)", lat, wrote.Sub(started))
	// The bound is 20 s: an answer within 2 s is the write's, whatever the machine's load.
	if lat > 2*time.Second {
		t.Fatalf("the long poll answered %v after the write; want it woken by the write", lat)
	}

	// 2. Nothing written: the reply comes at the bound, empty, the job running.
	t0 := time.Now()
	r = <-poll(6, 400*time.Millisecond)
	held := r.at.Sub(t0)
	if r.err != nil || len(r.l.Data) != 0 || r.l.Offset != 6 || r.l.NextOffset != 6 || r.l.TotalBytes != 6 || r.l.State != guest.JobRunning {
		t.Fatalf("idle long poll: %+v %v", r.l, r.err)
	}
	if held < 400*time.Millisecond || held > 10*time.Second {
		t.Fatalf("idle long poll of 400 ms answered after %v", held)
	}

	// 3. Output already there past the offset: at once.
	if _, err := wf.WriteString("more\n"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		l, err := a.c.JobLogs(ctxT(t, 10*time.Second), ji.JobID, guest.JobLogsRequest{Offset: 6})
		if err != nil {
			t.Fatal(err)
		}
		if l.TotalBytes == 11 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the second line never reached the log: %+v", l)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t0 = time.Now()
	r = <-poll(6, 20*time.Second)
	if r.err != nil || string(r.l.Data) != "more\n" || r.at.Sub(t0) > 5*time.Second {
		t.Fatalf("read with output waiting: %q %v after %v", r.l.Data, r.err, r.at.Sub(t0))
	}

	// 4. The job ends: a long poll at the end of its log answers, ended, without waiting out
	// its bound.
	ch = poll(11, 20*time.Second)
	time.Sleep(200 * time.Millisecond)
	ended := time.Now()
	wf.Close() // cat reads EOF and exits 0
	r = <-ch
	if r.err != nil || len(r.l.Data) != 0 || r.l.State != guest.JobExited || r.l.NextOffset != 11 || r.l.TotalBytes != 11 {
		t.Fatalf("long poll at the job's end: %+v %v", r.l, r.err)
	}
	if d := r.at.Sub(ended); d > 5*time.Second {
		t.Fatalf("the long poll answered %v after the job's end", d)
	}
	// A finished job's read never waits.
	t0 = time.Now()
	r = <-poll(11, 20*time.Second)
	if r.err != nil || r.l.State != guest.JobExited || r.at.Sub(t0) > 5*time.Second {
		t.Fatalf("long poll of a finished job: %+v %v after %v", r.l, r.err, r.at.Sub(t0))
	}
}

// TestJobLogsLongPollCallerGoes: a long poll whose caller goes ends with the caller's error at
// once, and the agent is not held by it (a read after it is answered).
func TestJobLogsLongPollCallerGoes(t *testing.T) {
	a := startJobsAgent(t, "")
	ji := a.start(t, "sleep", "60")
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		_, err := a.c.JobLogs(ctx, ji.JobID, guest.JobLogsRequest{Wait: guest.MaxJobLogWait})
		done <- err
	}()
	time.Sleep(200 * time.Millisecond)
	cancel()
	select {
	case err := <-done:
		if err != context.Canceled {
			t.Fatalf("cancelled long poll: %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a cancelled long poll did not return")
	}
	if _, err := a.c.JobLogs(ctxT(t, 10*time.Second), ji.JobID, guest.JobLogsRequest{}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.c.CancelJob(ctxT(t, 30*time.Second), ji.JobID, 0); err != nil {
		t.Fatal(err)
	}
}

// TestJobLogsWaitBounds: wait_ms is validated, never clamped, by the agent and by the client.
func TestJobLogsWaitBounds(t *testing.T) {
	a := startJobsAgent(t, "")
	ji := a.start(t, "true")
	a.wait(t, ji.JobID)
	for _, q := range []string{"wait_ms=-1", "wait_ms=30001", "wait_ms=x", "wait_ms=5&tail_lines=3"} {
		code, eb := a.raw(t, http.MethodGet, "/jobs/"+ji.JobID+"/logs?"+q, "")
		if code != http.StatusBadRequest || eb.Code != string(errcode.InvalidArgument) || !strings.Contains(eb.Message, "wait_ms") {
			t.Errorf("%s: %d %+v; want 400 INVALID_ARGUMENT naming wait_ms", q, code, eb)
		}
	}
	for _, req := range []guest.JobLogsRequest{{Wait: -time.Millisecond}, {Wait: guest.MaxJobLogWait + time.Millisecond}, {Wait: time.Microsecond}, {Wait: time.Second, TailLines: 3}} {
		_, err := a.c.JobLogs(ctxT(t, 10*time.Second), ji.JobID, req)
		wantCode(t, err, errcode.InvalidArgument, "wait")
	}
	// The bound itself is accepted (a finished job answers at once).
	if _, err := a.c.JobLogs(ctxT(t, 10*time.Second), ji.JobID, guest.JobLogsRequest{Wait: guest.MaxJobLogWait}); err != nil {
		t.Fatal(err)
	}
}
