package e2e

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/testenv"
	"github.com/agentbox/agentbox/internal/watch"
	"github.com/agentbox/agentbox/internal/wire"
)

// TestWatchAgainstServe: against a real `agentbox serve` and a runc sandbox, `agentbox watch`
// prints one line per transition as it happens and exits when the sandbox is destroyed; an SSE
// logs stream follows a real job's output byte for byte; an events stream dropped and resumed
// with Last-Event-ID loses nothing.
func TestWatchAgainstServe(t *testing.T) {
	testenv.RequireRoot(t)
	dir := testenv.ShortTempDir(t, "abe2e")
	s := startServer(t, dir)
	ctx := context.Background()
	c := s.client()
	sb, err := c.Create(ctx, wire.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}

	// The CLI, lifecycle, in the background.
	cmd := exec.Command(s.Bin, "watch", "--duration", "2m", sb.ID)
	cmd.Env = append(os.Environ(), "AGENTBOX_URL="+s.URL, "AGENTBOX_TOKEN="+token)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 100)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	next := func() string {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("agentbox watch ended early; stderr: %s", stderr.String())
			}
			return l
		case <-time.After(30 * time.Second):
			t.Fatalf("no line from agentbox watch in 30 s; stderr: %s", stderr.String())
		}
		return ""
	}
	if l := next(); !strings.Contains(l, sb.ID+" state running") {
		t.Fatalf("first line %q, want the sandbox's state", l)
	}

	// A real job's output over SSE, exactly.
	j, err := c.StartJob(ctx, sb.ID, apiExec("sh", "-c", "for i in $(seq 1 20); do echo out $i; sleep 0.05; done; printf 'no newline'"))
	if err != nil {
		t.Fatal(err)
	}
	var logs []byte
	var end wire.WatchMessage
	if _, err := c.Watch(ctx, sb.ID, client.WatchOptions{Stream: "logs", JobID: j.ID, DurationSeconds: 60}, func(m wire.WatchMessage) error {
		if m.Kind == wire.WatchLogs {
			logs = append(logs, m.Data...)
		}
		end = m
		return nil
	}); err != nil {
		t.Fatalf("watch logs: %v", err)
	}
	var want strings.Builder
	for i := 1; i <= 20; i++ {
		want.WriteString("out " + itoa(i) + "\n")
	}
	want.WriteString("no newline")
	if string(logs) != want.String() || end.Kind != wire.WatchEnd || end.Reason != watch.EndJob {
		t.Fatalf("logs %q end %+v; want %q then job_ended", logs, end, want.String())
	}

	// Events: drop the connection after the first, record more, resume: every event once.
	ectx, drop := context.WithCancel(ctx)
	opened := make(chan struct{})
	var seqs []int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.Watch(ectx, sb.ID, client.WatchOptions{Stream: "events", DurationSeconds: 60, OnOpen: func() { close(opened) }}, func(m wire.WatchMessage) error {
			if m.Kind == wire.WatchEvent {
				seqs = append(seqs, m.Seq)
				drop() // the connection drops right after the first event
				return context.Canceled
			}
			return nil
		})
	}()
	<-opened
	before, _ := c.Events(ctx, sb.ID)
	cursor := before[len(before)-1].Seq
	for i := range 4 {
		if _, err := c.Extend(ctx, sb.ID, int64(900+i)); err != nil {
			t.Fatal(err)
		}
	}
	<-done
	if len(seqs) != 1 {
		t.Fatalf("first connection got %v, want exactly one event before the drop", seqs)
	}
	last, err := c.Watch(ctx, sb.ID, client.WatchOptions{Stream: "events", DurationSeconds: 2, LastEventID: seqs[0]}, func(m wire.WatchMessage) error {
		if m.Kind == wire.WatchEvent {
			seqs = append(seqs, m.Seq)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("resume: %v", err)
	}
	after, _ := c.Events(ctx, sb.ID)
	var wantSeqs []int64
	for _, ev := range after {
		if ev.Seq > cursor && ev.Seq <= last {
			wantSeqs = append(wantSeqs, ev.Seq)
		}
	}
	if len(wantSeqs) < 4 || !equalSeqs(seqs, wantSeqs) {
		t.Fatalf("events across the reconnect %v, want %v", seqs, wantSeqs)
	}

	if _, err := c.Destroy(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	var rest []string
	for l := range lines {
		rest = append(rest, l)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("agentbox watch: %v; stderr %s", err, stderr.String())
	}
	text := strings.Join(rest, "\n")
	for _, w := range []string{"state running → stopping", "state stopping → destroyed", "end (state destroyed): sandbox_ended"} {
		if !strings.Contains(text, w) {
			t.Errorf("agentbox watch printed %q; want a line with %q", text, w)
		}
	}
	if len(rest) != 3 {
		t.Errorf("agentbox watch printed %d more lines, want 3 (one per transition, then the end):\n%s", len(rest), text)
	}
	s.stop()
	assertHostClean(t, dir, []string{sb.ID})
}

func itoa(i int) string { return strconv.Itoa(i) }

func equalSeqs(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
