package watch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agentbox/agentbox/internal/egress"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// Source is what a Hub needs of the control plane: *sandbox.Service satisfies it.
type Source interface {
	Get(ctx context.Context, id string) (sandbox.Sandbox, error)
	Events(ctx context.Context, f sandbox.EventFilter) ([]sandbox.Event, error)
	Subscribe(ctx context.Context, after int64) (<-chan sandbox.Event, error)
}

// Options configures a Hub.
type Options struct {
	Logger *slog.Logger
	// JobLogs serves the logs stream; nil makes it UNSUPPORTED_OPERATION.
	JobLogs JobLogPager
	// Metrics serves the metrics stream; nil makes it UNSUPPORTED_OPERATION.
	Metrics MetricsSource
	// Connections serves the connections stream; nil makes it UNSUPPORTED_OPERATION.
	Connections ConnectionPager
	// ConnectionsWake, if set, wakes a connections stream as soon as its sandbox's records are
	// written; without it (or besides it) the stream looks every second.
	ConnectionsWake ConnectionWake
	// Buffer is each watcher's buffer (0 = Buffer).
	Buffer int
	// LogPoll spaces the reads of a job's log whose source answered at once instead of
	// waiting for output (0 = LogPoll).
	LogPoll time.Duration
}

// Hub fans the event bus out to watchers. It subscribes to the bus when the first watch starts
// and keeps that one subscription until Close.
type Hub struct {
	src  Source
	opts Options
	log  *slog.Logger

	ctx    context.Context
	cancel context.CancelFunc

	startMu sync.Mutex
	started bool
	done    chan struct{} // closed when the hub's loop has returned (once started)

	mu   sync.Mutex
	subs map[string]map[*sub]struct{} // by sandbox id

	// feeds follow the logs of the jobs watched (logfeed.go), one per job.
	feedMu sync.Mutex
	feeds  map[feedKey]*logFeed
	feedWG sync.WaitGroup
}

// sub is one watcher's registration.
type sub struct {
	ch     chan sandbox.Event
	missed atomic.Int64
	wake   chan struct{} // signalled (non-blocking) when an event was dropped
	// started is set once the watch has fixed where it starts: from then on every event and
	// connection record written reaches it.
	started atomic.Bool
}

// NewHub returns a Hub over src. Close it to end its subscription and every watch.
func NewHub(src Source, opts Options) *Hub {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Buffer <= 0 {
		opts.Buffer = Buffer
	}
	if opts.LogPoll <= 0 {
		opts.LogPoll = LogPoll
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Hub{src: src, opts: opts, log: opts.Logger, ctx: ctx, cancel: cancel,
		done: make(chan struct{}), subs: map[string]map[*sub]struct{}{}, feeds: map[feedKey]*logFeed{}}
}

// Close ends the hub's subscription and every watch in progress (they end "canceled").
func (h *Hub) Close() {
	h.cancel()
	h.startMu.Lock()
	started := h.started
	h.startMu.Unlock()
	if started {
		<-h.done
	}
	h.feedWG.Wait()
}

// head returns the sequence number of the last recorded event.
func (h *Hub) head(ctx context.Context) (int64, error) {
	var cursor int64
	for {
		evs, err := h.src.Events(ctx, sandbox.EventFilter{AfterSeq: cursor, Limit: sandbox.MaxList})
		if err != nil {
			return 0, err
		}
		if len(evs) > 0 {
			cursor = evs[len(evs)-1].Seq
		}
		if len(evs) < sandbox.MaxList {
			return cursor, nil
		}
	}
}

// start subscribes the hub to the bus (once) and fixes its cursor: every event recorded after
// start returns reaches the watchers registered by then.
func (h *Hub) start(ctx context.Context) error {
	h.startMu.Lock()
	defer h.startMu.Unlock()
	if h.ctx.Err() != nil {
		return errcode.New(errcode.CapacityUnavailable, "the server is shutting down; watch again when it is back")
	}
	if h.started {
		return nil
	}
	cursor, err := h.head(ctx)
	if err != nil {
		return err
	}
	ch, err := h.src.Subscribe(h.ctx, cursor)
	if err != nil {
		return err
	}
	h.started = true
	go h.run(ch, cursor)
	return nil
}

// run delivers the bus's events to the watchers, resubscribing from its cursor if the
// subscription ends before the hub does.
func (h *Hub) run(ch <-chan sandbox.Event, cursor int64) {
	defer close(h.done)
	backoff := 100 * time.Millisecond
	for {
		for ev := range ch {
			cursor = ev.Seq
			h.deliver(ev)
			backoff = 100 * time.Millisecond
		}
		if h.ctx.Err() != nil {
			return
		}
		var err error
		for {
			select {
			case <-h.ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 5*time.Second)
			if ch, err = h.src.Subscribe(h.ctx, cursor); err == nil {
				break
			}
			h.log.Warn("watch: resubscribe to events", "err", err)
		}
	}
}

// deliver hands ev to every watcher of its sandbox without ever blocking: a full buffer counts a
// missed event and wakes the watcher to catch up.
func (h *Hub) deliver(ev sandbox.Event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for s := range h.subs[ev.SandboxID] {
		select {
		case s.ch <- ev:
		default:
			s.missed.Add(1)
			select {
			case s.wake <- struct{}{}:
			default:
			}
		}
	}
}

func (h *Hub) register(id string) *sub {
	s := &sub{ch: make(chan sandbox.Event, h.opts.Buffer), wake: make(chan struct{}, 1)}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.subs[id] == nil {
		h.subs[id] = map[*sub]struct{}{}
	}
	h.subs[id][s] = struct{}{}
	return s
}

func (h *Hub) unregister(id string, s *sub) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.subs[id], s)
	if len(h.subs[id]) == 0 {
		delete(h.subs, id)
	}
}

// Watchers returns how many watches are in progress and past their start (every event or
// connection record written from now on reaches them).
func (h *Hub) Watchers() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, m := range h.subs {
		for s := range m {
			if s.started.Load() {
				n++
			}
		}
	}
	return n
}

// Watch streams req to emit until the sandbox (or job) ends, req's duration passes, or ctx
// ends. emit is called from one goroutine, one whole message at a time; an emit error ends the
// watch with that error. Bad arguments and an unknown sandbox are refused before anything is
// emitted.
func (h *Hub) Watch(ctx context.Context, req Request, emit func(Message) error) (Summary, error) {
	if err := req.Validate(); err != nil {
		return Summary{}, err
	}
	switch {
	case req.Stream == StreamLogs && h.opts.JobLogs == nil:
		return Summary{}, errcode.New(errcode.UnsupportedOp, "stream logs is not available on this server yet (it needs detached jobs); use stream lifecycle or events")
	case req.Stream == StreamMetrics && h.opts.Metrics == nil:
		return Summary{}, errcode.New(errcode.UnsupportedOp, "stream metrics is not available on this server yet (it needs per-sandbox metrics); use stream lifecycle or events")
	case req.Stream == StreamConnections && h.opts.Connections == nil:
		return Summary{}, errcode.New(errcode.UnsupportedOp, "stream connections is not available on this server; page sandbox_connections (GET /v1/sandboxes/{id}/connections) with after instead")
	}
	if err := h.start(ctx); err != nil {
		return Summary{}, err
	}
	if req.Stream == StreamLogs {
		// An unknown job (or sandbox) is refused before the stream starts.
		if _, err := h.opts.JobLogs(ctx, req.SandboxID, req.JobID, 0, 1, 0); err != nil && errcode.Of(err) != errcode.SandboxNotRunning {
			return Summary{}, err
		}
	}
	s := h.register(req.SandboxID)
	defer h.unregister(req.SandboxID, s)
	// Registered before reading the sandbox: every event recorded from here on reaches s.
	sb, err := h.src.Get(ctx, req.SandboxID)
	if err != nil {
		return Summary{}, err
	}
	w := &watcher{h: h, req: req, s: s, emit: emit, state: sb.State,
		sum: Summary{SandboxID: req.SandboxID, Stream: req.Stream, Counts: map[string]int{}, LastState: sb.State}}
	if w.cursor, err = h.lastSeq(ctx, req.SandboxID); err != nil {
		return Summary{}, err
	}
	if req.Stream == StreamConnections {
		if err := w.startConns(ctx); err != nil {
			return Summary{}, err
		}
		defer w.releaseWake()
	} else if req.AfterSeq > w.cursor {
		return Summary{}, errcode.New(errcode.InvalidArgument, "the resume cursor (Last-Event-ID) %d is past sandbox %s's last event %d; resume from an id this stream sent", req.AfterSeq, req.SandboxID, w.cursor)
	}
	if req.AfterSeq > 0 && req.Stream != StreamConnections {
		w.cursor = req.AfterSeq
	}
	s.started.Store(true)
	if req.Ready != nil {
		req.Ready()
	}
	err = w.run(ctx)
	return w.sum, err
}

// lastSeq returns the sequence number of id's last recorded event.
func (h *Hub) lastSeq(ctx context.Context, id string) (int64, error) {
	var cursor int64
	for {
		evs, err := h.src.Events(ctx, sandbox.EventFilter{SandboxID: id, AfterSeq: cursor, Limit: sandbox.MaxList})
		if err != nil {
			return 0, err
		}
		if len(evs) > 0 {
			cursor = evs[len(evs)-1].Seq
		}
		if len(evs) < sandbox.MaxList {
			return cursor, nil
		}
	}
}

// watcher is one watch in progress.
type watcher struct {
	h      *Hub
	req    Request
	s      *sub
	emit   func(Message) error
	cursor int64 // last event handled
	state  sandbox.State
	sum    Summary
	ended  string
	last   time.Time // last message emitted

	logOffset int64
	logDone   bool
	feed      *logFeed        // the job's log follower (logs), from the end of the first read
	feedWake  <-chan struct{} // closed at the feed's next publish

	connCursor  int64           // last connection record delivered (connections)
	connWake    <-chan struct{} // closed when the sandbox's records are next written
	connRelease func()
}

var (
	errEnded    = errors.New("watch ended")
	errDuration = errors.New("duration_seconds passed")
)

func (w *watcher) send(m Message) error {
	m.SandboxID, m.Stream = w.req.SandboxID, w.req.Stream
	if m.At.IsZero() {
		m.At = time.Now().UTC()
	}
	if m.Kind != KindHeartbeat && m.Kind != KindEnd {
		w.sum.Messages++
		w.sum.Counts[m.Kind]++
	}
	w.last = time.Now()
	return w.emit(m)
}

func (w *watcher) run(ctx context.Context) error {
	dur := time.Duration(w.req.DurationSeconds) * time.Second
	ctx, cancel := context.WithTimeoutCause(ctx, dur, errDuration)
	defer cancel()
	w.last = time.Now()

	var tick <-chan time.Time
	switch w.req.Stream {
	case StreamMetrics:
		t := time.NewTicker(time.Duration(w.req.IntervalSeconds) * time.Second)
		defer t.Stop()
		tick = t.C
	case StreamConnections:
		t := time.NewTicker(connPoll)
		defer t.Stop()
		tick = t.C
	}
	var hb <-chan time.Time
	if w.req.Heartbeat > 0 {
		t := time.NewTicker(w.req.Heartbeat / 2)
		defer t.Stop()
		hb = t.C
	}

	err := w.begin(ctx)
	if err == nil && w.req.Stream == StreamLogs {
		// Past the output so far: the job's feed wakes the stream when it writes more. What
		// the feed published before the stream armed its wake is looked at once.
		w.feed = w.h.acquireFeed(w.req.SandboxID, w.req.JobID, w.logOffset)
		defer w.h.releaseFeed(w.feed)
		err = w.fromFeed(ctx)
	}
	for err == nil {
		if n := w.s.missed.Swap(0); n > 0 {
			err = w.catchUp(ctx, n)
			continue
		}
		select {
		case ev := <-w.s.ch:
			err = w.handle(ctx, ev)
		case <-w.s.wake:
		case <-w.feedWake:
			err = w.fromFeed(ctx)
		case <-w.connWake:
			w.releaseWake()
			w.armWake() // before reading: a write in between wakes the next round
			err = w.poll(ctx)
		case <-tick:
			err = w.poll(ctx)
		case <-hb:
			if time.Since(w.last) >= w.req.Heartbeat {
				err = w.send(Message{Kind: KindHeartbeat, State: w.state})
			}
		case <-ctx.Done():
			err = ctx.Err()
		case <-w.h.ctx.Done():
			err = context.Canceled
		}
	}
	if errors.Is(err, errEnded) {
		err = nil
	} else if ctx.Err() != nil && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)) {
		w.ended = EndCanceled
		if errors.Is(context.Cause(ctx), errDuration) {
			w.ended = EndDuration
		}
		err = nil
	} else if w.h.ctx.Err() != nil {
		w.ended, err = EndCanceled, nil
	}
	w.sum.Ended = w.ended
	if err != nil {
		return err
	}
	if w.ended == EndCanceled {
		return nil // nobody is listening, or the server is shutting down
	}
	// The end message is best effort: a caller that hung up does not get it.
	_ = w.send(Message{Kind: KindEnd, State: w.state, Reason: w.ended})
	return nil
}

// begin emits what a stream starts with: the sandbox's current state (lifecycle), the events
// after a resume cursor (events), the job's output so far (logs) or a first sample (metrics).
func (w *watcher) begin(ctx context.Context) error {
	switch w.req.Stream {
	case StreamLifecycle, StreamEvents:
		if w.req.AfterSeq > 0 {
			if err := w.replay(ctx); err != nil {
				return err
			}
		} else if w.req.Stream == StreamLifecycle {
			if err := w.send(Message{Kind: KindState, State: w.state}); err != nil {
				return err
			}
		}
	case StreamLogs, StreamMetrics, StreamConnections:
		if err := w.poll(ctx); err != nil {
			return err
		}
	}
	if !w.state.Live() {
		return w.end(EndSandbox)
	}
	return nil
}

func (w *watcher) end(reason string) error {
	w.ended = reason
	return errEnded
}

// replay delivers the sandbox's recorded events after the cursor, a page at a time.
func (w *watcher) replay(ctx context.Context) error {
	for {
		evs, err := w.h.src.Events(ctx, sandbox.EventFilter{SandboxID: w.req.SandboxID, AfterSeq: w.cursor, Limit: sandbox.MaxList})
		if err != nil {
			return storeError{err}
		}
		for _, ev := range evs {
			if err := w.handle(ctx, ev); err != nil {
				return err
			}
		}
		if len(evs) < sandbox.MaxList {
			return nil
		}
	}
}

// catchUp recovers the n events the hub could not buffer from the store, or says they were
// missed when the store cannot be read.
func (w *watcher) catchUp(ctx context.Context, n int64) error {
	before := w.cursor
	err := w.replay(ctx)
	var se storeError
	if !errors.As(err, &se) {
		w.sum.Recovered += n // read back from the store (and delivered, unless the emit failed)
		return err
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	w.h.log.Warn("watch: catch up from the store failed; telling the watcher", "sandbox", w.req.SandboxID, "missed", n, "after_seq", before, "err", err)
	w.sum.Missed += n
	return w.send(Message{Kind: KindMissed, Missed: n, State: w.state,
		Reason: fmt.Sprintf("the watcher fell behind and %d events after seq %d were lost", n, before)})
}

// storeError is a failed read of the store (as opposed to a failed emit).
type storeError struct{ error }

func (e storeError) Unwrap() error { return e.error }

// handle processes one event of the sandbox (once, in order: events at or before the cursor
// were handled already).
func (w *watcher) handle(ctx context.Context, ev sandbox.Event) error {
	if ev.Seq <= w.cursor {
		return nil
	}
	w.cursor = ev.Seq
	if w.req.Stream != StreamConnections {
		w.sum.LastSeq = ev.Seq // a connections stream's is its last record's (sendConn)
	}
	isState := ev.Type == "state" && ev.To != ""
	if isState {
		w.state = ev.To
		w.sum.LastState = ev.To
	}
	var err error
	switch w.req.Stream {
	case StreamEvents:
		e := ev
		err = w.send(Message{Kind: KindEvent, Seq: ev.Seq, At: ev.At, State: w.state, Event: &e, Reason: ev.Reason})
	case StreamLifecycle:
		if isState {
			e := ev
			err = w.send(Message{Kind: KindState, Seq: ev.Seq, At: ev.At, State: ev.To, Event: &e, Reason: ev.Reason})
		}
	case StreamLogs:
		if ev.Type == "job" || isState {
			err = w.poll(ctx)
		}
	case StreamConnections:
		// A refused connection's event is written with its record: the record is there now.
		if ev.Type == "egress_denied" || isState {
			err = w.poll(ctx)
		}
	}
	if err != nil {
		return err
	}
	if isState && !w.state.Live() {
		if w.req.Stream == StreamLogs && !w.logDone {
			_ = w.poll(ctx) // the last of the output, if the agent still answers
		}
		if w.req.Stream == StreamConnections {
			_ = w.poll(ctx) // the last records written
		}
		return w.end(EndSandbox)
	}
	return nil
}

// poll reads what a logs or metrics stream shows next.
func (w *watcher) poll(ctx context.Context) error {
	switch w.req.Stream {
	case StreamMetrics:
		if !w.state.Live() {
			return nil
		}
		v, err := w.h.opts.Metrics(ctx, w.req.SandboxID)
		if err != nil {
			if ctx.Err() != nil || errcode.Of(err) == errcode.SandboxNotRunning || errcode.Of(err) == errcode.SandboxNotFound {
				return ctx.Err() // the sandbox is ending: its event ends the stream
			}
			return err
		}
		b, err := json.Marshal(v)
		if err != nil {
			return err
		}
		return w.send(Message{Kind: KindMetrics, State: w.state, Metrics: b})
	case StreamConnections:
		return w.pollConns(ctx)
	case StreamLogs:
		for !w.logDone {
			c, err := w.h.opts.JobLogs(ctx, w.req.SandboxID, w.req.JobID, w.logOffset, MaxLogChunk, 0)
			if err != nil {
				if ctx.Err() == nil && (errcode.Of(err) == errcode.SandboxNotRunning) {
					return nil // the sandbox is ending: its event ends the stream
				}
				return err
			}
			if len(c.Data) > 0 {
				if err := w.send(Message{Kind: KindLogs, JobID: w.req.JobID, Data: c.Data, Offset: c.Offset, State: w.state}); err != nil {
					return err
				}
			}
			w.logOffset = c.NextOffset
			if w.logOffset >= c.TotalBytes {
				if !c.Running {
					w.logDone = true
					return w.end(EndJob)
				}
				return nil
			}
		}
	}
	return nil
}

// startConns fixes where a connections stream starts: after the resume cursor, or after the
// sandbox's newest record (only new records are delivered), and arms the wake.
func (w *watcher) startConns(ctx context.Context) error {
	w.armWake() // before reading the head: a record written in between wakes the stream
	head, err := w.h.opts.Connections(ctx, w.req.SandboxID, 0, 1)
	if err != nil {
		w.releaseWake()
		return err
	}
	if w.req.AfterSeq > head.Next {
		w.releaseWake()
		return errcode.New(errcode.InvalidArgument, "the resume cursor (Last-Event-ID) %d is past sandbox %s's newest connection record %d; resume from an id this stream sent", w.req.AfterSeq, w.req.SandboxID, head.Next)
	}
	w.connCursor = head.Next
	if w.req.AfterSeq > 0 {
		w.connCursor = w.req.AfterSeq
	}
	return nil
}

func (w *watcher) armWake() {
	if w.h.opts.ConnectionsWake != nil && w.connWake == nil {
		w.connWake, w.connRelease = w.h.opts.ConnectionsWake(w.req.SandboxID)
	}
}

func (w *watcher) releaseWake() {
	if w.connRelease != nil {
		w.connRelease()
	}
	w.connWake, w.connRelease = nil, nil
}

// pollConns delivers the records written after the cursor, ConnPage at a time, at most
// MaxConnBacklog of them; a watcher with more waiting has fallen behind and skips to the newest
// page (skipConns).
func (w *watcher) pollConns(ctx context.Context) error {
	for delivered := 0; ; {
		if delivered >= MaxConnBacklog {
			return w.skipConns(ctx)
		}
		l, err := w.h.opts.Connections(ctx, w.req.SandboxID, w.connCursor, ConnPage)
		if err != nil {
			return w.connErr(ctx, err)
		}
		for i := range l.Connections {
			if err := w.sendConn(l.Connections[i]); err != nil {
				return err
			}
		}
		delivered += len(l.Connections)
		if len(l.Connections) < ConnPage {
			return nil
		}
	}
}

// connErr: a sandbox record gone (pruned) or a watch ending is not the stream's error.
func (w *watcher) connErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if errcode.Of(err) == errcode.SandboxNotFound {
		return w.end(EndSandbox)
	}
	return err
}

func (w *watcher) sendConn(c egress.Connection) error {
	if c.Seq <= w.connCursor {
		return nil
	}
	w.connCursor, w.sum.LastSeq = c.Seq, c.Seq
	return w.send(Message{Kind: KindConnection, Seq: c.Seq, At: c.Time, State: w.state, Connection: &c})
}

// skipConns moves a watcher that fell behind to the sandbox's newest ConnPage records: it counts
// the records it skips (reading them by cursor, at most the sandbox's kept records), says so in
// a missed message, then delivers the newest page.
func (w *watcher) skipConns(ctx context.Context) error {
	newest, err := w.h.opts.Connections(ctx, w.req.SandboxID, 0, ConnPage)
	if err != nil {
		return w.connErr(ctx, err)
	}
	if len(newest.Connections) == 0 || newest.Connections[0].Seq <= w.connCursor {
		return w.pollConns(ctx) // caught up meanwhile (cannot recurse again: under a page waits)
	}
	first, before := newest.Connections[0].Seq, w.connCursor
	var skipped int64
	cursor := w.connCursor
	for range sandbox.MaxNetRecords/sandbox.MaxNetList + 1 {
		l, err := w.h.opts.Connections(ctx, w.req.SandboxID, cursor, sandbox.MaxNetList)
		if err != nil {
			return w.connErr(ctx, err)
		}
		done := len(l.Connections) < sandbox.MaxNetList
		for _, c := range l.Connections {
			if c.Seq >= first {
				done = true
				break
			}
			skipped++
			cursor = c.Seq
		}
		if done {
			break
		}
	}
	w.connCursor = first - 1
	if skipped > 0 {
		w.sum.Missed += skipped
		if err := w.send(Message{Kind: KindMissed, Missed: skipped, State: w.state,
			Reason: fmt.Sprintf("the watcher fell behind (more than %d records at once): %d connection records after seq %d were skipped; page them with sandbox_connections after=%d", MaxConnBacklog, skipped, before, before)}); err != nil {
			return err
		}
	}
	for i := range newest.Connections {
		if err := w.sendConn(newest.Connections[i]); err != nil {
			return err
		}
	}
	return nil
}
