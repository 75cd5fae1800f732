package mcpserver_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/mcpserver"
	"github.com/agentbox/agentbox/internal/sandbox"
)

func (c *client) progressMessages() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, p := range c.progress {
		out = append(out, p.Message)
	}
	return out
}

// TestWatchToolProgress: with a progressToken, watch sends one progress notification per
// message while the call is in flight (the snapshot before anything changes; each transition as
// it happens), with increasing progress, then returns the summary.
func TestWatchToolProgress(t *testing.T) {
	svc := fakeService(t)
	srv := mcpserver.New(svc, mcpserver.Options{})
	defer srv.Close()
	for _, v := range protocolVersions {
		t.Run(v, func(t *testing.T) {
			c := connect(t, srv, v)
			sb, err := svc.Create(t.Context(), sandbox.CreateRequest{})
			if err != nil {
				t.Fatal(err)
			}
			var out mcpserver.WatchOut
			done := make(chan struct{})
			go func() {
				defer close(done)
				res := c.callCtx(context.Background(), "watch", obj{"sandbox_id": sb.ID, "duration_seconds": 30}, "tok-"+v)
				decode(t, res, &out)
			}()
			// The snapshot arrives while the call is in flight, before anything changes.
			eventually(t, 5*time.Second, "the snapshot as progress", func() bool { return len(c.progressMessages()) >= 1 })
			if _, err := svc.Destroy(t.Context(), sb.ID); err != nil {
				t.Fatal(err)
			}
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("watch did not return when the sandbox was destroyed")
			}
			// The client may handle notifications after the reply that followed them on the wire.
			eventually(t, 2*time.Second, "every notification", func() bool { return len(c.progressMessages()) >= 4 })
			got := c.progressMessages()
			want := []string{sb.ID + " state running", sb.ID + " state running → stopping", sb.ID + " state stopping → destroyed", sb.ID + " end (state destroyed)"}
			if len(got) != len(want) {
				t.Fatalf("progress %q, want %d messages like %q", got, len(want), want)
			}
			for i := range want {
				if !strings.HasPrefix(got[i], want[i]) {
					t.Fatalf("progress[%d] = %q, want it to start %q (all: %q)", i, got[i], want[i], got)
				}
			}
			c.mu.Lock()
			for i, p := range c.progress {
				if p.ProgressToken != "tok-"+v || p.Progress != float64(i+1) {
					t.Errorf("notification %d: token %v progress %v", i, p.ProgressToken, p.Progress)
				}
			}
			c.progress = nil
			c.mu.Unlock()
			if out.Messages != 3 || out.Counts["state"] != 3 || out.LastState != "destroyed" || out.Ended != "sandbox_ended" || out.Missed != 0 || len(out.Events) != 0 {
				t.Fatalf("summary %+v", out)
			}
		})
	}
}

// TestWatchToolBatched: without a progressToken the messages come in the result; the watch
// ends after duration_seconds.
func TestWatchToolBatched(t *testing.T) {
	svc := fakeService(t)
	srv := mcpserver.New(svc, mcpserver.Options{})
	defer srv.Close()
	c := connect(t, srv, protocolVersions[0])
	sb, err := svc.Create(t.Context(), sandbox.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(200 * time.Millisecond)
		svc.Extend(context.Background(), sb.ID, 900)
	}()
	var out mcpserver.WatchOut
	start := time.Now()
	txt := c.ok("watch", obj{"sandbox_id": sb.ID, "stream": "events", "duration_seconds": 1}, &out)
	if time.Since(start) > 3*time.Second || out.Ended != "duration" || len(out.Events) != 2 || out.Events[0].Kind != "event" || out.Events[1].Kind != "end" ||
		!strings.Contains(out.Events[0].Text, "extend") || len(c.progressMessages()) != 0 {
		t.Fatalf("batched watch after %s: %+v\n%s", time.Since(start), out, txt)
	}
}

// TestWatchFleetBounds: 21 ids are refused whole (INVALID_ARGUMENT naming sandbox_ids), as is a
// fleet with one unknown sandbox; numbers out of range are refused naming the argument.
func TestWatchFleetBounds(t *testing.T) {
	svc := fakeService(t)
	srv := mcpserver.New(svc, mcpserver.Options{})
	defer srv.Close()
	c := connect(t, srv, protocolVersions[0])
	sb, err := svc.Create(t.Context(), sandbox.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	ids := []string{sb.ID}
	for i := range 20 {
		ids = append(ids, fmt.Sprintf("sb-%012x", i+1))
	}
	msg := c.fails("watch_fleet", obj{"sandbox_ids": ids, "duration_seconds": 1}, "INVALID_ARGUMENT")
	if !strings.Contains(msg, "sandbox_ids") || !strings.Contains(msg, "20") {
		t.Fatalf("21 ids: %q; want it to name sandbox_ids and the bound 20", msg)
	}
	// 2 ids, one unknown: refused whole, nothing streamed.
	c.fails("watch_fleet", obj{"sandbox_ids": []string{sb.ID, "sb-0000000000ff"}, "duration_seconds": 1}, "SANDBOX_NOT_FOUND")
	c.fails("watch_fleet", obj{"sandbox_ids": []string{sb.ID, sb.ID}}, "INVALID_ARGUMENT")
	c.fails("watch_fleet", obj{"sandbox_ids": []string{}}, "INVALID_ARGUMENT")
	for _, tc := range []struct {
		args obj
		says string
	}{
		{obj{"sandbox_id": sb.ID, "duration_seconds": 3601}, "duration_seconds must be between 1 and 3600; got 3601"},
		{obj{"sandbox_id": sb.ID, "duration_seconds": -1}, "duration_seconds must be between 1 and 3600; got -1"},
		{obj{"sandbox_id": sb.ID, "interval_seconds": 61}, "interval_seconds must be between 1 and 60; got 61"},
		{obj{"sandbox_id": sb.ID, "stream": "logs"}, "stream logs needs job_id"},
	} {
		if m := c.fails("watch", tc.args, "INVALID_ARGUMENT"); !strings.Contains(m, tc.says) {
			t.Errorf("%v: %q, want %q", tc.args, m, tc.says)
		}
	}
	if m := c.fails("watch", obj{"sandbox_id": sb.ID, "stream": "bogus"}, "INVALID_ARGUMENT"); !strings.Contains(m, "stream") {
		t.Errorf("bad stream: %q", m)
	}
	if len(c.progressMessages()) != 0 {
		t.Fatalf("refused calls streamed: %q", c.progressMessages())
	}
}

// TestWatchFleetProgress: watch_fleet streams every sandbox's messages as whole progress
// notifications, each prefixed with its sandbox id, and ends when every sandbox has ended.
func TestWatchFleetProgress(t *testing.T) {
	svc := fakeService(t)
	srv := mcpserver.New(svc, mcpserver.Options{})
	defer srv.Close()
	c := connect(t, srv, protocolVersions[1])
	var ids []string
	for range 5 {
		sb, err := svc.Create(t.Context(), sandbox.CreateRequest{})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sb.ID)
	}
	var out mcpserver.WatchFleetOut
	done := make(chan struct{})
	go func() {
		defer close(done)
		decode(t, c.callCtx(context.Background(), "watch_fleet", obj{"sandbox_ids": ids, "duration_seconds": 30}, 7), &out)
	}()
	eventually(t, 5*time.Second, "five snapshots", func() bool { return len(c.progressMessages()) >= 5 })
	var wg sync.WaitGroup
	for _, id := range ids {
		wg.Go(func() { svc.Destroy(context.Background(), id) })
	}
	wg.Wait()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("watch_fleet did not end when every sandbox had ended")
	}
	eventually(t, 2*time.Second, "every notification", func() bool { return len(c.progressMessages()) >= 20 })
	per := map[string][]string{}
	for _, m := range c.progressMessages() {
		id, rest, ok := strings.Cut(m, " ")
		if !ok || !slices.Contains(ids, id) {
			t.Fatalf("message not prefixed with a watched sandbox id: %q", m)
		}
		per[id] = append(per[id], strings.Fields(rest)[0]+" "+lastState(rest))
	}
	for _, id := range ids {
		want := []string{"state running", "state stopping", "state destroyed", "end sandbox_ended"}
		if !slices.Equal(per[id], want) {
			t.Errorf("%s: %q, want %q", id, per[id], want)
		}
	}
	if out.Messages != 15 || out.Missed != 0 || len(out.Sandboxes) != 5 {
		t.Fatalf("summary %+v", out)
	}
	for i, s := range out.Sandboxes {
		if s.SandboxID != ids[i] || s.Ended != "sandbox_ended" || s.LastState != "destroyed" {
			t.Errorf("sandbox %d: %+v", i, s)
		}
	}
}

// lastState is the last word of a state message ("running → stopping #5: …" → stopping), or
// an end message's reason.
func lastState(rest string) string {
	rest, _, _ = strings.Cut(rest, " #")
	f := strings.Fields(rest)
	return f[len(f)-1]
}
