package oci

import (
	"context"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/guest"
	"github.com/agentbox/agentbox/internal/runtime/runtimetest"
)

// TestRuncJobLogsLongPoll: in a real runc sandbox, a log read with a wait is held while the job
// is quiet, answers with the line as soon as the job writes it (long before its 20 s bound),
// answers empty at its bound when nothing is written, and answers at once when the job ends.
// The job echoes each line an exec writes to a FIFO, so every write is the test's.
func TestRuncJobLogsLongPoll(t *testing.T) {
	rt := newRunc(t)
	id := runtimetest.NewID()
	c := runtimetest.Start(t, rt, runtimetest.DefaultSpec(id))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	if r := runtimetest.Exec(t, c, "mkfifo", "/tmp/in"); r.ExitCode != 0 {
		t.Fatalf("mkfifo: %+v", r)
	}
	jobID := "job-00000000100a"
	if _, err := c.StartJob(ctx, guest.JobStartRequest{JobID: jobID, Argv: []string{"sh", "-c", `while :; do if read l < /tmp/in; then echo "got $l"; fi; done`}}); err != nil {
		t.Fatal(err)
	}
	type reply struct {
		l   guest.JobLogs
		err error
		at  time.Time
	}
	poll := func(off int64, wait time.Duration) <-chan reply {
		ch := make(chan reply, 1)
		go func() {
			l, err := c.JobLogs(ctx, jobID, guest.JobLogsRequest{Offset: off, Wait: wait})
			ch <- reply{l, err, time.Now()}
		}()
		return ch
	}

	// Quiet: held to the bound, then empty.
	t0 := time.Now()
	r := <-poll(0, 500*time.Millisecond)
	if r.err != nil || len(r.l.Data) != 0 || r.l.State != guest.JobRunning || r.at.Sub(t0) < 500*time.Millisecond {
		t.Fatalf("quiet long poll: %+v %v after %v", r.l, r.err, r.at.Sub(t0))
	}

	// A write wakes a 20 s long poll.
	ch := poll(0, 20*time.Second)
	time.Sleep(300 * time.Millisecond)
	wrote := time.Now()
	if res := runtimetest.Exec(t, c, "sh", "-c", "echo hello > /tmp/in"); res.ExitCode != 0 {
		t.Fatalf("write: %+v", res)
	}
	r = <-ch
	if r.err != nil || string(r.l.Data) != "got hello\n" || r.l.State != guest.JobRunning {
		t.Fatalf("woken long poll: %q %q %v", r.l.Data, r.l.State, r.err)
	}
	t.Logf("exec writing the line started → long poll reply: %v", r.at.Sub(wrote))
	if d := r.at.Sub(wrote); d > 5*time.Second {
		t.Fatalf("the long poll answered %v after the write; want it woken by the write, not its 20 s bound", d)
	}

	// The job ends (canceled): a long poll at the end of its log answers at once, ended.
	off := r.l.NextOffset
	ch = poll(off, 20*time.Second)
	time.Sleep(200 * time.Millisecond)
	ended := time.Now()
	if _, err := c.CancelJob(ctx, jobID, 0); err != nil {
		t.Fatal(err)
	}
	r = <-ch
	if r.err != nil || r.l.State != guest.JobCanceled || r.l.NextOffset != off || r.at.Sub(ended) > 5*time.Second {
		t.Fatalf("long poll at the job's end: %+v %v after %v", r.l, r.err, r.at.Sub(ended))
	}
}
