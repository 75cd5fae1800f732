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
	// QueueSize is how many records wait for the store at most; beyond it a record is
	// dropped and counted, never waited for.
	QueueSize = 8192
	// BatchSize is how many records one store transaction writes at most.
	BatchSize = 256
	// FlushEvery is how long a record waits for its batch at most.
	FlushEvery = 100 * time.Millisecond
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
	// Now is the clock (nil: time.Now).
	Now func() time.Time
}

// Recorder is the audit log's gate.Gate: Enter lets every call in, and its exit queues the
// call's record. One goroutine writes the queue to the store in batches — every FlushEvery, or
// as soon as BatchSize records wait — and prunes it.
type Recorder struct {
	st      Store
	cfg     Config
	log     *slog.Logger
	q       chan Record
	mu      sync.RWMutex // held to read closed and send, or to set closed
	closed  bool
	dropped atomic.Int64 // since the last log line
	total   atomic.Int64 // dropped since start (queue full, store refused a batch, closed)
	lastLog atomic.Int64
	flushes chan chan struct{}
	kick    chan struct{} // a batch is waiting: write before the tick
	stop    chan struct{}
	done    chan struct{}
	once    sync.Once
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
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &Recorder{st: st, cfg: cfg, log: log, q: make(chan Record, QueueSize), flushes: make(chan chan struct{}), kick: make(chan struct{}, 1),
		stop: make(chan struct{}), done: make(chan struct{})}
	go r.run()
	return r
}

// Enter lets c in; its exit records it (gate.Gate). It never blocks and never refuses.
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
	r.Append(Record{Time: started.UTC(), Surface: c.Surface, CallerID: c.Caller.ID, CallerName: c.Caller.Name,
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

// Append queues rec for the store; it never blocks. A full queue (or a closed recorder)
// drops it and counts it.
func (r *Recorder) Append(rec Record) {
	r.mu.RLock()
	sent := false
	if !r.closed {
		select {
		case r.q <- rec:
			sent = true
		default:
		}
	}
	closed := r.closed
	r.mu.RUnlock()
	switch {
	case sent:
		// The writer is not woken per record (a call would pay for the switch): it writes
		// every FlushEvery, or when a batch is waiting.
		if len(r.q) >= BatchSize {
			select {
			case r.kick <- struct{}{}:
			default:
			}
		}
	case closed:
		r.drop(1, "the recorder is closed")
	default:
		r.drop(1, "the store falls behind the calls")
	}
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

// Dropped returns how many records were dropped since the recorder started (the queue was
// full, the store refused a batch, or the recorder was closed).
func (r *Recorder) Dropped() int64 { return r.total.Load() }

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
	tick := time.NewTicker(FlushEvery)
	defer tick.Stop()
	prune := time.NewTicker(PruneEvery)
	defer prune.Stop()
	batch := make([]Record, 0, BatchSize)
	write := func(ctx context.Context) {
		if len(batch) == 0 {
			return
		}
		if err := r.st.AppendAudit(ctx, batch); err != nil {
			r.drop(int64(len(batch)), "the store refused a batch: "+err.Error())
		}
		batch = batch[:0]
	}
	drain := func(ctx context.Context) {
		for n := len(r.q); n > 0; n-- {
			if batch = append(batch, <-r.q); len(batch) >= BatchSize {
				write(ctx)
			}
		}
		write(ctx)
	}
	for {
		select {
		case <-tick.C:
			drain(ctx)
		case <-r.kick:
			drain(ctx)
		case <-prune.C:
			drain(ctx)
			r.Prune(ctx)
		case done := <-r.flushes:
			drain(ctx)
			close(done)
		case <-r.stop:
			cctx, ccancel := context.WithTimeout(context.Background(), closeTimeout)
			drain(cctx)
			ccancel()
			return
		}
	}
}
