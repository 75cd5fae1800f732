package watch_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/egress"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/watch"
)

// memConns is an in-memory connections table with the store's paging (global seq, interleaved
// sandboxes; after 0 = the newest limit) and a wake like netsession.Service.ConnectionsChanged.
type memConns struct {
	mu    sync.Mutex
	recs  []egress.Connection
	seq   int64
	wake  chan struct{}
	reads int
}

func newMemConns() *memConns { return &memConns{wake: make(chan struct{})} }

// add appends n records of id (each followed by one of another sandbox) and wakes the waiters.
func (m *memConns) add(id string, n int) {
	m.mu.Lock()
	for range n {
		m.seq++
		m.recs = append(m.recs, egress.Connection{SandboxID: id, Seq: m.seq, Host: "h.test", Port: 443, Decision: egress.Denied, Kind: egress.KindProxy})
		m.seq++
		m.recs = append(m.recs, egress.Connection{SandboxID: idB, Seq: m.seq, Host: "b.test", Port: 80, Decision: egress.Allowed})
	}
	close(m.wake)
	m.wake = make(chan struct{})
	m.mu.Unlock()
}

func (m *memConns) page(ctx context.Context, id string, after int64, limit int) (sandbox.ConnectionList, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.reads++
	var mine []egress.Connection
	for _, c := range m.recs {
		if c.SandboxID == id && c.Seq > after {
			mine = append(mine, c)
		}
	}
	out := sandbox.ConnectionList{SandboxID: id, Next: after, Connections: []egress.Connection{}}
	if after == 0 && len(mine) > limit {
		out.Omitted = int64(len(mine) - limit)
		mine = mine[len(mine)-limit:]
	} else if len(mine) > limit {
		mine = mine[:limit]
	}
	out.Connections = append(out.Connections, mine...)
	if len(mine) > 0 {
		out.Next = mine[len(mine)-1].Seq
	}
	return out, nil
}

func (m *memConns) changed(string) (<-chan struct{}, func()) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.wake, func() {}
}

// TestConnectionsStream: only records written after the watch began, each once, in order,
// woken without waiting for the poll; more than MaxConnBacklog at once skips to the newest page
// with a missed message counting exactly the skipped records.
func TestConnectionsStream(t *testing.T) {
	src := newMemSource()
	conns := newMemConns()
	conns.add(idA, 5) // before the watch: not delivered
	h := watch.NewHub(src, watch.Options{Connections: conns.page, ConnectionsWake: conns.changed})
	defer h.Close()

	type got struct {
		msgs []watch.Message
		at   []time.Time
	}
	var mu sync.Mutex
	var g got
	ready := make(chan struct{})
	sumc := make(chan watch.Summary, 1)
	go func() {
		s, err := h.Watch(t.Context(), watch.Request{SandboxID: idA, Stream: watch.StreamConnections, DurationSeconds: 30,
			Ready: func() { close(ready) }}, func(m watch.Message) error {
			mu.Lock()
			g.msgs = append(g.msgs, m)
			g.at = append(g.at, time.Now())
			mu.Unlock()
			return nil
		})
		if err != nil {
			t.Errorf("watch: %v", err)
		}
		sumc <- s
	}()
	<-ready
	waitFor := func(n int) []watch.Message {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			mu.Lock()
			c := len(g.msgs)
			out := append([]watch.Message(nil), g.msgs...)
			mu.Unlock()
			if c >= n {
				return out
			}
			if time.Now().After(deadline) {
				t.Fatalf("got %d messages, want %d: %+v", c, n, out)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	start := time.Now()
	conns.add(idA, 3)
	msgs := waitFor(3)
	if d := time.Since(start); d > 500*time.Millisecond {
		t.Errorf("the wake took %v: the stream waited for its poll", d)
	}
	for i, m := range msgs {
		if m.Kind != watch.KindConnection || m.Connection == nil || m.Connection.SandboxID != idA || m.Seq != m.Connection.Seq || m.Seq != int64(2*(5+i)+1) {
			t.Fatalf("message %d = %+v, want connection record seq %d of %s", i, m, 2*(5+i)+1, idA)
		}
	}

	// 2,500 at once: 1,000 delivered, then 1,400 skipped (said), then the newest 100.
	conns.add(idA, 2500)
	msgs = waitFor(3 + 1000 + 1 + 100)
	time.Sleep(50 * time.Millisecond)
	mu.Lock()
	if len(g.msgs) != 3+1000+1+100 {
		t.Fatalf("got %d messages, want %d", len(g.msgs), 3+1000+1+100)
	}
	mu.Unlock()
	last := int64(0)
	for i, m := range msgs[:1003] {
		if m.Kind != watch.KindConnection || m.Seq <= last {
			t.Fatalf("message %d = %s seq %d after %d", i, m.Kind, m.Seq, last)
		}
		last = m.Seq
	}
	miss := msgs[1003]
	if miss.Kind != watch.KindMissed || miss.Missed != 1400 {
		t.Fatalf("message 1003 = %+v, want missed 1400", miss)
	}
	for i, m := range msgs[1004:] {
		want := int64(2*(5+3+2400+i) + 1)
		if m.Kind != watch.KindConnection || m.Seq != want {
			t.Fatalf("newest page message %d = %s seq %d, want %d", i, m.Kind, m.Seq, want)
		}
	}
	if txt := miss.Text(0); txt == "" || !strings.Contains(txt, "1400 connection records skipped") {
		t.Errorf("missed text = %q", txt)
	}

	src.add(idA, "state", sandbox.StateDestroyed)
	s := <-sumc
	if s.Ended != watch.EndSandbox || s.Missed != 1400 || s.Counts[watch.KindConnection] != 1103 || s.LastSeq != msgs[len(msgs)-1].Seq {
		t.Fatalf("summary = %+v", s)
	}
}

// TestConnectionsStreamResumeAndRefusals: a resume cursor delivers the records after it; one
// past the newest record, and a hub without a pager, are refused before anything is emitted.
func TestConnectionsStreamResumeAndRefusals(t *testing.T) {
	src := newMemSource()
	conns := newMemConns()
	conns.add(idA, 4)                                              // idA's seqs: 1, 3, 5, 7 (the next is 9)
	h := watch.NewHub(src, watch.Options{Connections: conns.page}) // no wake: the 1 s poll
	defer h.Close()

	_, err := h.Watch(t.Context(), watch.Request{SandboxID: idA, Stream: watch.StreamConnections, AfterSeq: 8}, func(watch.Message) error { return nil })
	if errcode.Of(err) != errcode.InvalidArgument {
		t.Fatalf("resume past the newest record: %v, want INVALID_ARGUMENT", err)
	}
	var seqs []int64
	stop := errors.New("stop")
	go func() {
		time.Sleep(100 * time.Millisecond)
		conns.add(idA, 1) // seq 9, found by the poll
	}()
	_, err = h.Watch(t.Context(), watch.Request{SandboxID: idA, Stream: watch.StreamConnections, AfterSeq: 3}, func(m watch.Message) error {
		seqs = append(seqs, m.Seq)
		if len(seqs) == 3 {
			return stop
		}
		return nil
	})
	if !errors.Is(err, stop) || len(seqs) != 3 || seqs[0] != 5 || seqs[1] != 7 || seqs[2] != 9 {
		t.Fatalf("resumed after 3: %v %v, want 5, 7, then the next", seqs, err)
	}

	bare := watch.NewHub(src, watch.Options{})
	defer bare.Close()
	if _, err := bare.Watch(t.Context(), watch.Request{SandboxID: idA, Stream: watch.StreamConnections}, func(watch.Message) error { return nil }); errcode.Of(err) != errcode.UnsupportedOp {
		t.Fatalf("without a pager: %v, want UNSUPPORTED_OPERATION", err)
	}
	if _, err := bare.Watch(t.Context(), watch.Request{SandboxID: idA, Stream: "connection"}, func(watch.Message) error { return nil }); errcode.Of(err) != errcode.InvalidArgument {
		t.Fatalf("stream connection: %v, want INVALID_ARGUMENT", err)
	}
}
