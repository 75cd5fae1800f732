package audit

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/gate"
)

// Bounds and defaults of the recorder.
const (
	// QueueSize is how many records wait for the store at most; a call whose record finds
	// the queue full waits for room (within Config.CommitWait).
	QueueSize = 8192
	// BatchSize is how many records one store transaction writes at most.
	BatchSize = 256
	// DefaultCommitWait is how long a call waits at most for its record to be written
	// (Config.CommitWait), the store's refusals retried meanwhile; past it the call is not
	// acknowledged (UNAVAILABLE), its record still queued.
	DefaultCommitWait = 5 * time.Second
	// retryFirst and retryMax bound the backoff between tries of a batch the store refused.
	retryFirst = 20 * time.Millisecond
	retryMax   = 500 * time.Millisecond
	// DefaultRetention is how long records are kept by default (--audit-retention).
	DefaultRetention = 30 * 24 * time.Hour
	// DefaultMaxRows is how many records are kept at most by default (--audit-max-rows).
	DefaultMaxRows = 1_000_000
	// PruneEvery is how often old records are pruned (and once at start).
	PruneEvery   = time.Hour
	dropLogEvery = time.Minute
	closeTimeout = 5 * time.Second
)

// Config configures a Recorder.
type Config struct {
	// Retention is how long records are kept (0: DefaultRetention).
	Retention time.Duration
	// MaxRows is how many records are kept at most (0: DefaultMaxRows).
	MaxRows int
	// CommitWait bounds how long a call waits for its record's commit (0:
	// DefaultCommitWait): a store that hangs delays replies by this much, never forever.
	CommitWait time.Duration
	// Now is the clock (nil: time.Now).
	Now func() time.Time
}

// Recorder is the audit log's gate.Gate: Enter lets every call in, and its exit writes the
// call's record to the store before it returns — so a reply that left the server has its
// record committed, and a SIGKILL loses none. A record that cannot be made durable within
// Config.CommitWait (the store refuses its batch, each try retried, or hangs) is the call's
// failure: its exit sets gate.Call.NotRecorded and the surface does not acknowledge the call. Records are group-committed: one goroutine
// writes whatever waits in one transaction (up to BatchSize), so concurrent calls share a
// commit instead of queueing one each.
type Recorder struct {
	st      Store
	cfg     Config
	log     *slog.Logger
	q       chan pending
	mu      sync.RWMutex // held to read closed and send, or to set closed
	closed  bool
	dropped atomic.Int64 // since the last log line
	total   atomic.Int64 // dropped since start (the store refused a batch, closed)
	late    atomic.Int64 // calls not acknowledged: their record was not committed within CommitWait
	waiting atomic.Int64 // calls in Append now
	lastLog atomic.Int64
	flushes chan chan struct{}
	stop    chan struct{}
	done    chan struct{}
	once    sync.Once
}

// pending is a queued record and the channel closed once it is written (or dropped: err).
type pending struct {
	rec     Record
	written chan struct{}
	err     *error
}

var _ gate.Gate = (*Recorder)(nil)

// New starts a Recorder writing to st; Close flushes and stops it.
func New(st Store, cfg Config, log *slog.Logger) *Recorder {
	if cfg.Retention <= 0 {
		cfg.Retention = DefaultRetention
	}
	if cfg.MaxRows <= 0 {
		cfg.MaxRows = DefaultMaxRows
	}
	if cfg.CommitWait <= 0 {
		cfg.CommitWait = DefaultCommitWait
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &Recorder{st: st, cfg: cfg, log: log, q: make(chan pending, QueueSize), flushes: make(chan chan struct{}),
		stop: make(chan struct{}), done: make(chan struct{})}
	go r.run()
	return r
}

// Enter lets c in; its exit records it (gate.Gate). It never refuses.
func (r *Recorder) Enter(ctx context.Context, c *gate.Call) (func(error), error) {
	return func(outcome error) { r.record(c, outcome) }, nil
}

// Observe records a call a surface refused before the chain (gate.Observer).
func (r *Recorder) Observe(c *gate.Call, outcome error) { r.record(c, outcome) }

func (r *Recorder) record(c *gate.Call, outcome error) {
	now := r.cfg.Now()
	started := c.Started
	if started.IsZero() {
		started = now
	}
	digest, summary := digestAndSummary(c.Surface, c.Args)
	c.NotRecorded = r.Append(Record{Time: started.UTC(), Surface: c.Surface, CallerID: c.Caller.ID, CallerName: c.Caller.Name,
		Tool: c.Tool, Action: c.Action, SandboxID: c.SandboxID, ArgsSHA256: digest, Summary: summary,
		Outcome: Outcome(outcome), DurationMS: float64(now.Sub(started).Microseconds()) / 1000, ApprovalID: c.ApprovalID})
}

// Outcome is "ok" for nil, else err's code.
func Outcome(err error) string {
	if err == nil {
		return "ok"
	}
	return string(errcode.Of(err))
}

// Append writes rec to the store and returns nil once it is committed (with the records of
// the calls beside it). It returns UNAVAILABLE (errcode) when rec is not durable: the store
// refused its batch at every try for Config.CommitWait (rec dropped), or took longer than
// that (rec still queued, counted by Late), or the recorder is closed (rec dropped). The
// call whose record it is must then not be acknowledged.
func (r *Recorder) Append(rec Record) error {
	r.waiting.Add(1)
	defer r.waiting.Add(-1)
	var werr error
	p := pending{rec: rec, written: make(chan struct{}), err: &werr}
	timer := time.NewTimer(r.cfg.CommitWait)
	defer timer.Stop()
	r.mu.RLock()
	if r.closed {
		r.mu.RUnlock()
		r.drop(1, "the recorder is closed")
		return notDurable(rec, "the server is shutting down", nil)
	}
	select {
	case r.q <- p:
	case <-timer.C: // the queue stayed full: the store falls far behind
		r.mu.RUnlock()
		r.drop(1, "the store falls behind the calls")
		return notDurable(rec, "the store falls behind the calls", nil)
	}
	r.mu.RUnlock()
	select {
	case <-p.written:
		if werr != nil {
			return notDurable(rec, "the store refuses it", werr)
		}
		return nil
	case <-timer.C:
		r.late.Add(1)
		r.log.Warn("an audit record is not written yet; the call is not acknowledged", "tool", rec.Tool, "waited", r.cfg.CommitWait)
		return notDurable(rec, "the store did not commit it within "+r.cfg.CommitWait.String(), nil)
	}
}

// notDurable is the error of a call whose audit record could not be made durable.
func notDurable(rec Record, why string, cause error) error {
	if e, ok := errcode.As(cause); ok && e.Code == errcode.Unavailable {
		return errcode.Wrap(errcode.Unavailable, cause, "the call's audit record could not be made durable (%s), so the call is not acknowledged: %s", why, e.Message).
			With("retry_after_seconds", errcode.RetryAfterSeconds).With("tool", rec.Tool)
	}
	return errcode.Wrap(errcode.Unavailable, cause, "the call's audit record could not be made durable (%s), so the call is not acknowledged; it may have acted — retry shortly (with an idempotency key where the call takes one)", why).
		With("retry_after_seconds", errcode.RetryAfterSeconds).With("tool", rec.Tool)
}

func (r *Recorder) drop(n int64, why string) {
	r.dropped.Add(n)
	r.total.Add(n)
	now := time.Now().UnixNano()
	last := r.lastLog.Load()
	if now-last >= int64(dropLogEvery) && r.lastLog.CompareAndSwap(last, now) {
		r.log.Warn("audit records dropped: "+why, "dropped", r.dropped.Swap(0), "queue", QueueSize)
	}
}

// Dropped returns how many records were dropped since the recorder started (the store
// refused their batch, or the recorder was closed).
func (r *Recorder) Dropped() int64 { return r.total.Load() }

// Waiting returns how many calls wait for their record's commit now.
func (r *Recorder) Waiting() int64 { return r.waiting.Load() }

// Late returns how many calls replied before their record was committed (the store took
// longer than Config.CommitWait).
func (r *Recorder) Late() int64 { return r.late.Load() }

// Flush writes every record queued so far before it returns.
func (r *Recorder) Flush(ctx context.Context) error {
	done := make(chan struct{})
	select {
	case r.flushes <- done:
	case <-r.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close stops recording, writes what is queued (for at most 5 s) and returns when it is
// written. Calls that exit afterwards are dropped and counted.
func (r *Recorder) Close() error {
	r.once.Do(func() {
		r.mu.Lock() // no Append sends after this: the writer's drain sees every queued record
		r.closed = true
		r.mu.Unlock()
		close(r.stop)
	})
	<-r.done
	return nil
}

// Prune deletes the records older than the retention, then the oldest beyond the row bound.
func (r *Recorder) Prune(ctx context.Context) (int64, error) {
	n, err := r.st.PruneAudit(ctx, r.cfg.Now().Add(-r.cfg.Retention), r.cfg.MaxRows)
	if err != nil {
		r.log.Warn("audit log not pruned", "err", err)
	} else if n > 0 {
		r.log.Info("audit log pruned", "deleted", n, "retention", r.cfg.Retention, "max_rows", r.cfg.MaxRows)
	}
	return n, err
}

func (r *Recorder) run() {
	defer close(r.done)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r.Prune(ctx)
	prune := time.NewTicker(PruneEvery)
	defer prune.Stop()
	batch := make([]pending, 0, BatchSize)
	recs := make([]Record, 0, BatchSize)
	write := func(ctx context.Context) {
		if len(batch) == 0 {
			return
		}
		recs = recs[:0]
		for _, p := range batch {
			recs = append(recs, p.rec)
		}
		err := r.st.AppendAudit(ctx, recs)
		// A refused batch is tried again, with backoff, until its oldest caller's CommitWait
		// has passed: a store that comes back within it loses nothing and fails no call.
		deadline := time.Now().Add(r.cfg.CommitWait)
		for wait := retryFirst; err != nil && time.Now().Add(wait).Before(deadline); wait = min(2*wait, retryMax) {
			select {
			case <-time.After(wait):
			case <-ctx.Done():
			}
			if ctx.Err() != nil {
				break
			}
			err = r.st.AppendAudit(ctx, recs)
		}
		if err != nil {
			r.drop(int64(len(batch)), "the store refused a batch: "+err.Error())
		}
		for _, p := range batch {
			if p.err != nil {
				*p.err = err
			}
			close(p.written)
		}
		batch = batch[:0]
	}
	// drain writes first and whatever else waits now, BatchSize records a transaction.
	drain := func(ctx context.Context, first *pending) {
		if first != nil {
			batch = append(batch, *first)
		}
		for n := len(r.q); n > 0; n-- {
			if batch = append(batch, <-r.q); len(batch) >= BatchSize {
				write(ctx)
			}
		}
		write(ctx)
	}
	for {
		select {
		case p := <-r.q:
			drain(ctx, &p)
		case <-prune.C:
			drain(ctx, nil)
			r.Prune(ctx)
		case done := <-r.flushes:
			drain(ctx, nil)
			close(done)
		case <-r.stop:
			cctx, ccancel := context.WithTimeout(context.Background(), closeTimeout)
			drain(cctx, nil)
			ccancel()
			return
		}
	}
}
