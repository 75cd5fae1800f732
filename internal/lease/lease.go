// Package lease runs a piece of work on one process at a time among several that share a store:
// an Owner takes a named lease in the store, renews it every TTL/3, runs the work while it
// holds it, stops the work at once when it cannot say it still holds it, and releases it on a
// clean shutdown; another process takes it over within the TTL when the holder dies.
//
// agentbox's replicas use it for a node's lifecycle work (Lifecycle): any replica of a server
// answers any request, but the control loop (TTLs, destroys, the orphan sweep, pruning),
// reconcile on takeover, the warm pools' refill, the run workers and the remote-job checks run
// only on the replica that holds the node's lifecycle lease. The package knows nothing of what
// the work is.
package lease

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// Store is what an Owner needs of the shared store's leases (store.Leases, which the SQL stores
// implement, on the database's clock). A server alone on its store (SQLite, under the state-dir
// lock) needs none: its Owner always holds.
type Store interface {
	// AcquireLease takes the lease name for holder for ttl, or renews it when holder already
	// holds it; held is false (and nothing changes) while another holder's lease has not
	// expired. expiresAt is when the lease (holder's, or the other's) ends, on the store's clock.
	AcquireLease(ctx context.Context, name, holder string, ttl time.Duration) (held bool, expiresAt time.Time, err error)
	// ReleaseLease ends holder's lease name at once, reporting whether holder held it (a lease
	// another holder took over is left as it is).
	ReleaseLease(ctx context.Context, name, holder string) (bool, error)
}

// DefaultTTL is how long a lease lasts unless renewed (serve's --lease-ttl).
const DefaultTTL = 15 * time.Second

// Lifecycle names the lease that owns node's lifecycle work.
func Lifecycle(node string) string { return "lifecycle:" + node }

// NewReplicaID returns a random id for this server process: its host name (at most 32 bytes)
// and 8 random hex digits, so logs and /health say which replica is which.
func NewReplicaID() string {
	host, _ := os.Hostname()
	if len(host) > 32 {
		host = host[:32]
	}
	if host == "" {
		host = "replica"
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	return host + "-" + hex.EncodeToString(b[:])
}

// Status is what /health and the metrics say of a replica's lease.
type Status struct {
	Replica string `json:"replica" jsonschema:"this server process's replica id (random per process)"`
	Lease   string `json:"lease" jsonschema:"the lifecycle lease's name: lifecycle:<node>"`
	Held    bool   `json:"held" jsonschema:"whether this replica holds the lease, and so runs the node's lifecycle work (TTLs, reconcile, pool refill, run workers)"`
}

// Config configures an Owner.
type Config struct {
	// Leases grants the lease; nil: the Owner always holds it (one process on its store).
	Leases Store
	Name   string        // the lease, e.g. Lifecycle(node)
	Holder string        // this replica's id
	TTL    time.Duration // DefaultTTL
	Log    *slog.Logger
	// OnChange, if set, is told each time the Owner gains or loses the lease.
	OnChange func(held bool)
	// Predecessor is the replica id of the last process on this replica's state dir (under the
	// state-dir lock, so surely dead now): TryAcquire takes over a lease it left live at once
	// rather than wait for it to expire, as a restarted single server always did.
	Predecessor string
}

// Owner runs work only while this replica holds a lease. It is safe for concurrent use.
type Owner struct {
	cfg  Config
	log  *slog.Logger
	held atomic.Bool
	// pre is set when TryAcquire took the lease before Run: Run's first term is then no
	// takeover (the caller did the start-up work itself).
	mu     sync.Mutex
	pre    bool
	lastOK time.Time // the start of the last AcquireLease that said held (monotonic)
}

// New returns an Owner of the lease cfg names; Run starts it.
func New(cfg Config) *Owner {
	if cfg.TTL <= 0 {
		cfg.TTL = DefaultTTL
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Owner{cfg: cfg, log: cfg.Log.With("lease", cfg.Name, "replica", cfg.Holder)}
}

// Held reports whether this replica holds the lease now; after a loss it turns false once the
// lifecycle work has stopped.
func (o *Owner) Held() bool { return o.held.Load() }

// Status reports the replica, the lease and whether it is held.
func (o *Owner) Status() Status {
	return Status{Replica: o.cfg.Holder, Lease: o.cfg.Name, Held: o.Held()}
}

// TryAcquire tries once to take the lease, before Run: a server alone on its store (or the
// first of its replicas) holds it at once and does its start-up reconcile before serving, as a
// single server always did.
func (o *Owner) TryAcquire(ctx context.Context) (bool, error) {
	if p := o.cfg.Predecessor; p != "" && p != o.cfg.Holder && o.cfg.Leases != nil {
		// Renewing as the predecessor succeeds only while its lease is live (or free); then
		// it is released for this process to take.
		if held, _, err := o.cfg.Leases.AcquireLease(ctx, o.cfg.Name, p, o.cfg.TTL); err == nil && held {
			if _, err := o.cfg.Leases.ReleaseLease(ctx, o.cfg.Name, p); err != nil {
				return false, fmt.Errorf("release the lease %s of this state dir's previous process: %w", o.cfg.Name, err)
			}
			o.log.Info("took over the lifecycle lease of this state dir's previous process", "predecessor", p)
		}
	}
	ok, _, err := o.acquire(ctx)
	if err != nil {
		return false, err
	}
	o.mu.Lock()
	o.pre = ok
	o.mu.Unlock()
	if ok {
		o.setHeld(true)
	}
	return ok, nil
}

// acquire asks the store once, remembering when a success started (the lease is surely
// held until then plus the TTL, whatever the store's clock says).
func (o *Owner) acquire(ctx context.Context) (bool, time.Time, error) {
	if o.cfg.Leases == nil {
		o.mu.Lock()
		o.lastOK = time.Now()
		o.mu.Unlock()
		return true, time.Time{}, nil
	}
	start := time.Now()
	actx, cancel := context.WithTimeout(ctx, o.cfg.TTL/3)
	defer cancel()
	ok, exp, err := o.cfg.Leases.AcquireLease(actx, o.cfg.Name, o.cfg.Holder, o.cfg.TTL)
	if err != nil {
		return false, time.Time{}, fmt.Errorf("acquire lease %s: %w", o.cfg.Name, err)
	}
	if ok {
		o.mu.Lock()
		o.lastOK = start
		o.mu.Unlock()
	}
	return ok, exp, nil
}

func (o *Owner) setHeld(v bool) {
	if o.held.Swap(v) != v {
		if v {
			o.log.Info("lifecycle lease gained: this replica runs the node's lifecycle work")
		} else {
			o.log.Warn("lifecycle lease lost: this replica stops the node's lifecycle work")
		}
		if o.cfg.OnChange != nil {
			o.cfg.OnChange(v)
		}
	}
}

// stopped reports the lease not held because Run is ending (the server stops): released, not
// lost, so it is said at INFO.
func (o *Owner) stopped() {
	if o.held.Swap(false) {
		o.log.Info("lifecycle lease released: this replica is stopping")
		if o.cfg.OnChange != nil {
			o.cfg.OnChange(false)
		}
	}
}

// Run holds the lease as long as it can until ctx ends, and runs work while it does: work's
// context ends as soon as the lease may be lost (a renewal refused, or none succeeded for
// 2/3 of the TTL), and Run waits for work to return before it tries again. takeover is false
// only for the first term when TryAcquire took the lease before Run; every later term follows a
// time another replica may have held it. When ctx ends Run stops work, waits for it and
// releases the lease, so another replica takes over at once.
func (o *Owner) Run(ctx context.Context, work func(ctx context.Context, takeover bool)) {
	ttl := o.cfg.TTL
	renewEvery := ttl / 3
	o.mu.Lock()
	first := o.pre
	o.mu.Unlock()
	defer func() {
		if o.cfg.Leases != nil && o.Held() {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ttl/3)
			if _, err := o.cfg.Leases.ReleaseLease(rctx, o.cfg.Name, o.cfg.Holder); err != nil {
				o.log.Warn("release lease; another replica takes it when it expires", "err", err)
			}
			cancel()
		}
		o.stopped()
	}()
	for ctx.Err() == nil {
		if !o.Held() {
			ok, exp, err := o.acquire(ctx)
			switch {
			case err != nil:
				if ctx.Err() == nil {
					o.log.Warn("lifecycle lease: store unreachable; retrying", "err", err)
				}
			case ok:
				o.setHeld(true)
			}
			if !o.Held() {
				// Look again when the other holder's lease ends, and at least every TTL/3.
				wait := renewEvery
				if d := time.Until(exp); err == nil && d > 0 && d+10*time.Millisecond < wait {
					wait = d + 10*time.Millisecond
				}
				if !sleep(ctx, wait) {
					return
				}
				continue
			}
		}
		takeover := !first
		first = false
		o.term(ctx, work, takeover)
	}
}

// term runs work while the lease is held, renewing it, and returns when it is lost or ctx ends.
func (o *Owner) term(ctx context.Context, work func(ctx context.Context, takeover bool), takeover bool) {
	ttl := o.cfg.TTL
	wctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); work(wctx, takeover) }()
	defer func() { stop(); <-done }()
	next := ttl / 3
	for {
		t := time.NewTimer(next)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-done:
			t.Stop()
			// work returned on its own: keep the lease (nothing else may do this work) until
			// ctx ends.
			o.keep(ctx)
			return
		case <-t.C:
		}
		ok, _, err := o.acquire(ctx)
		o.mu.Lock()
		since := time.Since(o.lastOK)
		o.mu.Unlock()
		switch {
		case err == nil && !ok:
			o.log.Warn("lifecycle lease renewal refused: another replica holds it")
			stop()
			<-done // not held is reported once the work has stopped
			o.setHeld(false)
			return
		case err != nil && since >= ttl-ttl/3:
			o.log.Warn("lifecycle lease: no renewal for 2/3 of its TTL; stopping lifecycle work", "err", err)
			stop()
			<-done
			o.setHeld(false)
			return
		case err != nil:
			if ctx.Err() != nil {
				return
			}
			o.log.Warn("lifecycle lease renewal failed; retrying", "err", err)
			next = max(ttl/10, 50*time.Millisecond)
		default:
			next = ttl / 3
		}
	}
}

// keep renews the lease until ctx ends or it is lost.
func (o *Owner) keep(ctx context.Context) {
	o.term(ctx, func(ctx context.Context, _ bool) { <-ctx.Done() }, false)
}

// sleep waits d or until ctx ends; false when ctx ended.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
