//go:build linux

package watch_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/sandbox/jobs"
	"github.com/agentbox/agentbox/internal/testenv/fakecp"
	"github.com/agentbox/agentbox/internal/watch"
)

// newJobService is a control plane over real SQLite and the fake runtime, whose sandboxes'
// agents are real (guest.Run in this process): jobs are real processes, their logs real files.
func newJobService(t *testing.T) jobs.Sandboxes {
	t.Helper()
	return jobs.With(fakecp.Service(t))
}

// logsWatch runs one logs stream in the background, handing its messages on.
type logsWatch struct {
	msgs  chan watch.Message
	ready chan struct{}
	done  chan struct{}
	sum   watch.Summary
	err   error
}

func startLogsWatch(ctx context.Context, h *watch.Hub, sandboxID, jobID string) *logsWatch {
	w := &logsWatch{msgs: make(chan watch.Message, 64), ready: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		w.sum, w.err = h.Watch(ctx, watch.Request{SandboxID: sandboxID, Stream: watch.StreamLogs, JobID: jobID, DurationSeconds: 120,
			Ready: func() { close(w.ready) }}, func(m watch.Message) error {
			w.msgs <- m
			return nil
		})
	}()
	return w
}

// next returns the next logs chunk within d, or fails.
func (w *logsWatch) next(t *testing.T, d time.Duration, what string) watch.Message {
	t.Helper()
	timeout := time.After(d)
	for {
		select {
		case m := <-w.msgs:
			if m.Kind == watch.KindLogs {
				return m
			}
		case <-w.done:
			t.Fatalf("%s: the stream ended (%v, %+v) before a logs chunk", what, w.err, w.sum)
		case <-timeout:
			t.Fatalf("%s: no logs chunk within %v", what, d)
		}
	}
}

// TestLogsStreamPushedByLongPoll: a line a job writes reaches its logs watchers through the
// agent's long poll, not a poll: the stream's poll interval is an hour and a write makes no
// event on the bus, so only the long poll can carry it. Two watchers of the job share one
// follower (one outstanding read). A control run over a pager that cannot wait shows the test
// would fail without the long poll: there, nothing arrives before the hour's poll.
func TestLogsStreamPushedByLongPoll(t *testing.T) {
	svc := newJobService(t)
	ctx := t.Context()
	sb, err := svc.Create(ctx, sandbox.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(t.TempDir(), "in")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	j, err := svc.StartJob(ctx, sb.ID, sandbox.JobStartRequest{Argv: []string{"cat", fifo}})
	if err != nil {
		t.Fatal(err)
	}
	wf, err := os.OpenFile(fifo, os.O_WRONLY, 0) // returns once cat runs
	if err != nil {
		t.Fatal(err)
	}
	defer wf.Close()
	if _, err := wf.WriteString("before\n"); err != nil {
		t.Fatal(err)
	}

	// The wait is validated, never clamped.
	zero := int64(0)
	for _, req := range []sandbox.JobLogsRequest{{Offset: &zero, Wait: sandbox.MaxJobLogWait + time.Millisecond}, {Offset: &zero, Wait: -time.Second}, {Wait: time.Second}} {
		if _, err := svc.JobLogs(ctx, sb.ID, j.ID, req); errcode.Of(err) != errcode.InvalidArgument || !strings.Contains(errcode.Message(err), "wait") {
			t.Errorf("JobLogs wait %v (offset %v): %v; want INVALID_ARGUMENT about the wait", req.Wait, req.Offset != nil, err)
		}
	}

	h := watch.NewHub(svc, watch.Options{JobLogs: watch.JobLogsOf(svc), LogPoll: time.Hour})
	defer h.Close()
	a := startLogsWatch(ctx, h, sb.ID, j.ID)
	<-a.ready
	if m := a.next(t, 10*time.Second, "the output so far"); string(m.Data) != "before\n" || m.Offset != 0 {
		t.Fatalf("first chunk: %q at %d", m.Data, m.Offset)
	}
	b := startLogsWatch(ctx, h, sb.ID, j.ID)
	<-b.ready
	if m := b.next(t, 10*time.Second, "the second watcher's output so far"); string(m.Data) != "before\n" {
		t.Fatalf("second watcher's first chunk: %q", m.Data)
	}

	var lat []time.Duration
	off := int64(len("before\n"))
	for i, line := range []string{"one\n", "two\n", "three\n"} {
		wrote := time.Now()
		if _, err := wf.WriteString(line); err != nil {
			t.Fatal(err)
		}
		for _, w := range []*logsWatch{a, b} {
			// 20 s: far under the hour's poll, and past any load a CI machine puts on a write.
			m := w.next(t, 20*time.Second, "line "+strings.TrimSpace(line))
			if string(m.Data) != line || m.Offset != off {
				t.Fatalf("line %d: %q at %d, want %q at %d", i, m.Data, m.Offset, line, off)
			}
		}
		lat = append(lat, time.Since(wrote))
		off += int64(len(line))
	}
	t.Logf("write → both watchers: %v", lat)
	if n := h.LogFeeds(); n != 1 {
		t.Fatalf("%d log feeds for one job watched twice; want 1", n)
	}

	// The job ends: both streams end job_ended, and the feed with them.
	wf.Close()
	for _, w := range []*logsWatch{a, b} {
		select {
		case <-w.done:
		case <-time.After(20 * time.Second):
			t.Fatal("the stream did not end with its job")
		}
		if w.err != nil || w.sum.Ended != watch.EndJob {
			t.Fatalf("stream end: %v %+v", w.err, w.sum)
		}
	}
	if n := h.LogFeeds(); n != 0 {
		t.Fatalf("%d log feeds after the streams ended", n)
	}

	// Control: the same stream over a pager that cannot wait (it drops the wait, as an agent
	// older than long polls does) gets the next line only at the hour's poll.
	j2, err := svc.StartJob(ctx, sb.ID, sandbox.JobStartRequest{Argv: []string{"cat", fifo}})
	if err != nil {
		t.Fatal(err)
	}
	wf2, err := os.OpenFile(fifo, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer wf2.Close()
	inner := watch.JobLogsOf(svc)
	var calls sync.WaitGroup
	noWait := func(ctx context.Context, sandboxID, jobID string, offset, max int64, _ time.Duration) (watch.JobLogChunk, error) {
		calls.Add(1)
		defer calls.Done()
		return inner(ctx, sandboxID, jobID, offset, max, 0)
	}
	h2 := watch.NewHub(svc, watch.Options{JobLogs: noWait, LogPoll: time.Hour})
	defer h2.Close()
	wctx, cancel := context.WithCancel(ctx)
	c := startLogsWatch(wctx, h2, sb.ID, j2.ID)
	<-c.ready
	time.Sleep(300 * time.Millisecond) // the stream is past its first read
	if _, err := wf2.WriteString("late\n"); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-c.msgs:
		if m.Kind == watch.KindLogs {
			t.Fatalf("without a long poll the line still arrived (%q): the test cannot tell the mechanisms apart", m.Data)
		}
	case <-time.After(2 * time.Second):
	}
	cancel()
	<-c.done
	calls.Wait()
}
