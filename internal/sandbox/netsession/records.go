package netsession

// The records of what the egress proxy did (egress.Recorder, implemented by the Service):
// a bounded queue written to the store in batches by one goroutine. A connection that was not
// allowed is written before RecordConnection returns — before the proxy sends its refusal, so
// `agentbox connections` right after a refused request shows it (bounded by
// refusalCommitWait); other records are queued and RecordSecretCall and an allowed connection's
// record never block. When the queue is full a record is dropped and counted, and the count
// is logged at most once a minute.

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/agentbox/agentbox/internal/egress"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/text"
)

// Bounds of the records' queue.
const (
	// RecordQueue is how many records wait for the store at most.
	RecordQueue = 8192
	// recordBatch is how many records one store transaction writes at most.
	recordBatch = 256
	// recordFlushEvery is how long a record waits for its batch at most.
	recordFlushEvery = 100 * time.Millisecond
	// refusalCommitWait bounds how long a refusal waits for its record's commit (a store that
	// hangs delays the refusal by this much, never forever; the record is still written).
	refusalCommitWait = 5 * time.Second
	dropLogEvery      = time.Minute
)

// netRecord is one queued record: a connection, a secret call or an event.
type netRecord struct {
	conn *egress.Connection
	call *egress.SecretCall
	ev   *sandbox.Event
	// written, if set, is closed once the record is written (or dropped): its caller waits.
	written chan struct{}
}

type recordQueue struct {
	q            chan netRecord
	dropped      atomic.Int64 // since the last log line
	droppedTotal atomic.Int64
	lastLog      atomic.Int64 // unix nanoseconds of the last log line about drops
	flushes      chan chan struct{}
}

func newRecordQueue() *recordQueue {
	return &recordQueue{q: make(chan netRecord, RecordQueue), flushes: make(chan chan struct{})}
}

var _ egress.Recorder = (*Service)(nil)

// RecordConnection queues c for the store (egress.Recorder); it never blocks. A denied
// proxy or transparent connection also becomes an "egress_denied" event of the sandbox, at
// most deniedEventsPerSecond a second.
func (s *Service) RecordConnection(c egress.Connection) {
	if s.net.rec == nil {
		return
	}
	c.Seq = 0
	if c.Time.IsZero() {
		c.Time = s.core.Now()
	}
	if c.Decision == egress.Denied && c.Kind != egress.KindDNS {
		c.Reason = withAllowHint(c)
	}
	if c.Decision == egress.Allowed {
		s.enqueue(netRecord{conn: &c})
		return
	}
	written := make(chan struct{})
	if s.enqueue(netRecord{conn: &c, written: written}) {
		t := time.NewTimer(refusalCommitWait)
		select {
		case <-written:
		case <-t.C:
			s.core.Log().Warn("an egress refusal's record is not written yet; the refusal goes on", "sandbox_id", c.SandboxID, "waited", refusalCommitWait)
		}
		t.Stop()
	}
	if c.Decision != egress.Denied || c.Kind == egress.KindDNS {
		return
	}
	n := s.netOf(c.SandboxID)
	if n == nil || !n.allowEvent(s.core.Now()) {
		return
	}
	reason := fmt.Sprintf("%s:%d refused", c.Host, c.Port)
	if c.Rule != "" {
		reason += " (rule " + c.Rule + ")"
	}
	if c.Reason != "" {
		reason += ": " + c.Reason
	}
	at := s.core.Now()
	s.enqueue(netRecord{ev: &sandbox.Event{SandboxID: c.SandboxID, Type: "egress_denied", From: sandbox.StateRunning, To: sandbox.StateRunning,
		At: at, Reason: text.Truncate(reason, 1024)}})
}

// withAllowHint is a policy refusal's reason with how to lift it, as the proxy's 403 says it,
// so that a refused CONNECT or transparent connection (which gets no 403 body) tells the agent
// the same in its record and event. A never-reachable address gets no hint: no policy opens it.
func withAllowHint(c egress.Connection) string {
	if c.Host == "" || strings.Contains(c.Reason, "never reachable") || strings.Contains(c.Reason, "sandbox_network_update") {
		return c.Reason
	}
	hint := fmt.Sprintf("to allow it, add %q to the policy's allow list with sandbox_network_update (REST PATCH /v1/sandboxes/%s/network, CLI agentbox network set)", c.Host, c.SandboxID)
	if c.Rule != "" {
		hint = fmt.Sprintf("remove or narrow that deny rule with sandbox_network_update (REST PATCH /v1/sandboxes/%s/network, CLI agentbox network set)", c.SandboxID)
	}
	if c.Reason == "" {
		return hint
	}
	return c.Reason + "; " + hint
}

// RecordSecretCall queues c for the store (egress.Recorder); it never blocks.
func (s *Service) RecordSecretCall(c egress.SecretCall) {
	if s.net.rec == nil {
		return
	}
	c.Seq = 0
	if c.Time.IsZero() {
		c.Time = s.core.Now()
	}
	s.enqueue(netRecord{call: &c})
}

// enqueue queues r, or drops and counts it when the queue is full; it reports whether r was
// queued.
func (s *Service) enqueue(r netRecord) bool {
	rq := s.net.rec
	select {
	case rq.q <- r:
		return true
	default:
	}
	rq.dropped.Add(1)
	rq.droppedTotal.Add(1)
	now := time.Now().UnixNano()
	last := rq.lastLog.Load()
	if now-last >= int64(dropLogEvery) && rq.lastLog.CompareAndSwap(last, now) {
		s.core.Log().Warn("egress records dropped: the store falls behind the proxy", "dropped", rq.dropped.Swap(0), "queue", RecordQueue)
	}
	return false
}

// flushRecords writes the queue to the store until the service closes, then writes what is
// left.
func (s *Service) flushRecords(bg context.Context) {
	rq := s.net.rec
	tick := time.NewTicker(recordFlushEvery)
	defer tick.Stop()
	batch := make([]netRecord, 0, recordBatch)
	write := func(ctx context.Context) {
		if len(batch) > 0 {
			s.writeRecords(ctx, batch)
			batch = batch[:0]
		}
	}
	for {
		select {
		case r := <-rq.q:
			if batch = append(batch, r); len(batch) >= recordBatch {
				write(bg)
			} else if r.written != nil {
				// A refusal waits for its record: write it now, with whatever else waits.
				for n := len(rq.q); n > 0; n-- {
					if batch = append(batch, <-rq.q); len(batch) >= recordBatch {
						write(bg)
					}
				}
				write(bg)
			}
		case <-tick.C:
			write(bg)
		case done := <-rq.flushes:
			for len(rq.q) > 0 && len(batch) < RecordQueue {
				batch = append(batch, <-rq.q)
				if len(batch) >= recordBatch {
					write(bg)
				}
			}
			write(bg)
			close(done)
		case <-bg.Done():
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			for n := len(rq.q); n > 0; n-- {
				batch = append(batch, <-rq.q)
				if len(batch) >= recordBatch {
					write(ctx)
				}
			}
			write(ctx)
			cancel()
			return
		}
	}
}

// writeRecords writes one batch in one store transaction.
func (s *Service) writeRecords(ctx context.Context, batch []netRecord) {
	ns := s.store
	var conns []egress.Connection
	var calls []egress.SecretCall
	var evs []sandbox.Event
	for _, r := range batch {
		switch {
		case r.conn != nil:
			conns = append(conns, *r.conn)
		case r.call != nil:
			calls = append(calls, *r.call)
		case r.ev != nil:
			evs = append(evs, *r.ev)
		}
	}
	defer func() {
		for _, r := range batch {
			if r.written != nil {
				close(r.written)
			}
		}
	}()
	if err := ns.AppendNetRecords(ctx, conns, calls, evs, sandbox.MaxNetRecords); err != nil {
		s.net.rec.droppedTotal.Add(int64(len(batch)))
		s.core.Log().Warn("egress records not written", "records", len(batch), "err", err)
		return
	}
	if len(evs) > 0 {
		s.core.Published()
	}
	if len(conns) > 0 {
		ids := map[string]bool{}
		for _, c := range conns {
			ids[c.SandboxID] = true
		}
		s.recWake.wake(ids) // live watchers of these sandboxes' connections (netwake.go)
	}
}

// Flush writes every record queued so far to the store before it returns.
func (s *Service) Flush(ctx context.Context) error {
	if s.net.rec == nil {
		return nil
	}
	done := make(chan struct{})
	select {
	case s.net.rec.flushes <- done:
	case <-ctx.Done():
		return ctx.Err()
	case <-s.core.Context().Done():
		return s.core.Context().Err()
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// DroppedRecords returns how many egress records were dropped since the service started (the
// queue was full, or the store refused a batch).
func (s *Service) DroppedRecords() int64 {
	if s.net.rec == nil {
		return 0
	}
	return s.net.rec.droppedTotal.Load()
}
