package watch_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/watch"
)

// memSource is an in-memory event log with the bus's semantics (Subscribe reads by cursor and
// is woken on every append), and a switch that makes per-sandbox reads fail.
type memSource struct {
	mu      sync.Mutex
	evs     []sandbox.Event
	changed chan struct{}
	failing atomic.Bool
	refused atomic.Int64 // reads refused while failing
}

func newMemSource() *memSource { return &memSource{changed: make(chan struct{})} }

func (m *memSource) add(id string, typ string, to sandbox.State) {
	m.mu.Lock()
	m.evs = append(m.evs, sandbox.Event{Seq: int64(len(m.evs) + 1), SandboxID: id, Type: typ, To: to, At: time.Now()})
	close(m.changed)
	m.changed = make(chan struct{})
	m.mu.Unlock()
}

func (m *memSource) Get(ctx context.Context, id string) (sandbox.Sandbox, error) {
	return sandbox.Sandbox{ID: id, State: sandbox.StateRunning}, nil
}

func (m *memSource) Events(ctx context.Context, f sandbox.EventFilter) ([]sandbox.Event, error) {
	if f.SandboxID != "" && m.failing.Load() {
		m.refused.Add(1)
		return nil, errors.New("store unavailable")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []sandbox.Event
	for _, ev := range m.evs {
		if ev.Seq > f.AfterSeq && (f.SandboxID == "" || ev.SandboxID == f.SandboxID) && len(out) < f.Limit {
			out = append(out, ev)
		}
	}
	return out, nil
}

func (m *memSource) Subscribe(ctx context.Context, after int64) (<-chan sandbox.Event, error) {
	out := make(chan sandbox.Event, 64)
	go func() {
		defer close(out)
		cursor := after
		for {
			m.mu.Lock()
			changed := m.changed
			evs := append([]sandbox.Event(nil), m.evs[min(int(cursor), len(m.evs)):]...)
			m.mu.Unlock()
			for _, ev := range evs {
				select {
				case out <- ev:
					cursor = ev.Seq
				case <-ctx.Done():
					return
				}
			}
			select {
			case <-changed:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, nil
}

const (
	idA = "sb-00000000000a"
	idB = "sb-00000000000b"
)

// stalled starts an events watch of id whose emit blocks until release is closed.
func stalled(t *testing.T, h *watch.Hub, id string, release chan struct{}) (msgs *[]watch.Message, sum chan watch.Summary) {
	msgs, sum, _ = stalledEntered(t, h, id, release)
	return msgs, sum
}

// stalledEntered is stalled that also returns a channel closed when the watcher is first held
// in its emit.
func stalledEntered(t *testing.T, h *watch.Hub, id string, release chan struct{}) (msgs *[]watch.Message, sum chan watch.Summary, entered chan struct{}) {
	var got []watch.Message
	sum = make(chan watch.Summary, 1)
	ready := make(chan struct{})
	entered = make(chan struct{})
	var once sync.Once
	go func() {
		s, err := h.Watch(t.Context(), watch.Request{SandboxID: id, Stream: watch.StreamEvents, DurationSeconds: 30,
			Ready: func() { close(ready) }}, func(m watch.Message) error {
			once.Do(func() { close(entered) })
			<-release
			got = append(got, m)
			if len(got) == 100 {
				return errors.New("enough")
			}
			return nil
		})
		if err != nil && err.Error() != "enough" {
			t.Errorf("stalled watch: %v", err)
		}
		sum <- s
	}()
	<-ready
	return &got, sum, entered
}

// TestStalledWatcherNeverBlocks: a watcher that stops reading does not hold up the hub or
// another watcher; when it reads again it catches up from the store with nothing lost, in order.
func TestStalledWatcherNeverBlocks(t *testing.T) {
	src := newMemSource()
	h := watch.NewHub(src, watch.Options{Buffer: 4})
	defer h.Close()
	release := make(chan struct{})
	slow, slowSum := stalled(t, h, idA, release)

	var fast atomic.Int64
	ready := make(chan struct{})
	go h.Watch(t.Context(), watch.Request{SandboxID: idA, Stream: watch.StreamEvents, DurationSeconds: 30, Ready: func() { close(ready) }},
		func(m watch.Message) error { fast.Add(1); return nil })
	<-ready
	for range 100 {
		src.add(idA, "extend", sandbox.StateRunning)
	}
	deadline := time.Now().Add(5 * time.Second)
	for fast.Load() < 100 {
		if time.Now().After(deadline) {
			t.Fatalf("the reading watcher got %d of 100 events while another was stalled", fast.Load())
		}
		time.Sleep(time.Millisecond)
	}
	close(release)
	s := <-slowSum
	if len(*slow) != 100 {
		t.Fatalf("the stalled watcher got %d messages, want 100", len(*slow))
	}
	for i, m := range *slow {
		if m.Kind != watch.KindEvent || m.Seq != int64(i+1) {
			t.Fatalf("message %d: %s seq %d, want event seq %d", i, m.Kind, m.Seq, i+1)
		}
	}
	if s.Missed != 0 || s.Recovered == 0 {
		t.Fatalf("summary %+v: want recovered > 0 (it overflowed a buffer of 4) and missed 0", s)
	}
}

// TestStalledWatcherToldWhatItMissed: when the store cannot be read to catch up, the watcher
// gets a missed message with the count, never a silent gap.
func TestStalledWatcherToldWhatItMissed(t *testing.T) {
	src := newMemSource()
	h := watch.NewHub(src, watch.Options{Buffer: 4})
	defer h.Close()
	release := make(chan struct{})
	slow, slowSum, entered := stalledEntered(t, h, idA, release)
	// A reading watcher of the same sandbox: once it has all 50, the hub has handed them to
	// the stalled one too (deliver gives each event to every watcher in turn).
	var fast atomic.Int64
	ready := make(chan struct{})
	go h.Watch(t.Context(), watch.Request{SandboxID: idA, Stream: watch.StreamEvents, DurationSeconds: 30, Ready: func() { close(ready) }},
		func(m watch.Message) error { fast.Add(1); return nil })
	<-ready
	// The first event holds the stalled watcher in its emit; the other 49 reach it only through
	// the hub (a buffer of 4), not through its start's own read of the store.
	src.add(idA, "extend", sandbox.StateRunning)
	<-entered
	for range 49 {
		src.add(idA, "extend", sandbox.StateRunning)
	}
	src.add(idB, "extend", sandbox.StateRunning) // another sandbox's: not this watcher's
	for deadline := time.Now().Add(20 * time.Second); fast.Load() < 50; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the reading watcher got %d of 50 events", fast.Load())
		}
	}
	src.failing.Store(true)
	close(release)
	// The store fails until the released watcher's catch-up read has been refused (a fixed
	// window was once too short on a loaded CI host: the read came after it ended).
	deadline := time.Now().Add(20 * time.Second)
	for src.refused.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the released watcher never tried to catch up from the store")
		}
		time.Sleep(5 * time.Millisecond)
	}
	src.failing.Store(false)
	src.add(idA, "state", sandbox.StateDestroyed)
	s := <-slowSum
	var events, missed int64
	for _, m := range *slow {
		switch m.Kind {
		case watch.KindEvent:
			events++
		case watch.KindMissed:
			missed += m.Missed
		}
	}
	if missed == 0 || events+missed != 51 || s.Missed != missed || s.Ended != watch.EndSandbox {
		t.Fatalf("events %d + missed %d, want 51 in all with missed > 0; summary %+v; messages %+v", events, missed, s, *slow)
	}
}

// TestWatchArguments: numbers are validated, not clamped, and logs/metrics without a source
// are UNSUPPORTED_OPERATION.
func TestWatchArguments(t *testing.T) {
	h := watch.NewHub(newMemSource(), watch.Options{})
	defer h.Close()
	for _, tc := range []struct {
		r    watch.Request
		code errcode.Code
		says string
	}{
		{watch.Request{SandboxID: idA, DurationSeconds: 3601}, errcode.InvalidArgument, "duration_seconds must be between 1 and 3600; got 3601"},
		{watch.Request{SandboxID: idA, DurationSeconds: -5}, errcode.InvalidArgument, "duration_seconds must be between 1 and 3600; got -5"},
		{watch.Request{SandboxID: idA, IntervalSeconds: 61}, errcode.InvalidArgument, "interval_seconds must be between 1 and 60; got 61"},
		{watch.Request{SandboxID: idA, IntervalSeconds: -1}, errcode.InvalidArgument, "interval_seconds must be between 1 and 60; got -1"},
		{watch.Request{SandboxID: "nope"}, errcode.InvalidArgument, "sandbox_id must look like"},
		{watch.Request{SandboxID: idA, Stream: "logs"}, errcode.InvalidArgument, "stream logs needs job_id"},
		{watch.Request{SandboxID: idA, Stream: "lifecycle", JobID: "job-1"}, errcode.InvalidArgument, "job_id is only for stream logs"},
		{watch.Request{SandboxID: idA, Stream: "logs", JobID: "job-000000000001"}, errcode.UnsupportedOp, "stream logs is not available"},
		{watch.Request{SandboxID: idA, Stream: "metrics"}, errcode.UnsupportedOp, "stream metrics is not available"},
	} {
		_, err := h.Watch(t.Context(), tc.r, func(watch.Message) error { t.Error("emitted"); return nil })
		if e, ok := errcode.As(err); !ok || e.Code != tc.code || !contains(e.Message, tc.says) {
			t.Errorf("%+v: %v; want %s saying %q", tc.r, err, tc.code, tc.says)
		}
	}
	if h.Watchers() != 0 {
		t.Fatalf("%d watchers left after refused watches", h.Watchers())
	}
}

func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}

// TestHeartbeatAndDuration: a quiet stream sends heartbeats at the asked period and ends after
// duration_seconds with an end message saying so.
func TestHeartbeatAndDuration(t *testing.T) {
	h := watch.NewHub(newMemSource(), watch.Options{})
	defer h.Close()
	var kinds []string
	start := time.Now()
	sum, err := h.Watch(t.Context(), watch.Request{SandboxID: idA, Stream: watch.StreamEvents, DurationSeconds: 1, Heartbeat: 200 * time.Millisecond},
		func(m watch.Message) error { kinds = append(kinds, m.Kind); return nil })
	if err != nil {
		t.Fatal(err)
	}
	hb := 0
	for _, k := range kinds {
		if k == watch.KindHeartbeat {
			hb++
		}
	}
	if el := time.Since(start); el < time.Second || el > 2*time.Second || hb < 3 || kinds[len(kinds)-1] != watch.KindEnd || sum.Ended != watch.EndDuration || sum.Messages != 0 {
		t.Fatalf("after %s: kinds %v, summary %+v; want ~4 heartbeats then end, ended duration", el, kinds, sum)
	}
}
