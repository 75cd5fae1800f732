package store

import (
	"context"
	"time"
)

// Lease is a named claim held by one holder (a server replica) until ExpiresAt: the way
// several replicas on one database agree which of them does a piece of lifecycle work (a
// sandbox's TTL, reconcile, a run's worker, a pool's refill). Times come from the database's
// clock (Postgres: clock_timestamp(); SQLite: the host's clock, read by SQLite), never a
// replica's, so replicas with skewed clocks still agree on who holds what.
type Lease struct {
	Name       string    `json:"name"`
	Holder     string    `json:"holder"`
	AcquiredAt time.Time `json:"acquired_at"` // when Holder took it (renewals keep it)
	ExpiresAt  time.Time `json:"expires_at"`
	// Live says the lease had not expired when it was read (by the database's clock).
	Live bool `json:"live"`
}

// Lease bounds.
const (
	MaxLeaseName = 256 // bytes of a lease's name, and of a holder's
	MinLeaseTTL  = 10 * time.Millisecond
	MaxLeaseTTL  = 24 * time.Hour
)

// Leases is the lease contract (storetest/leases.go is its suite).
type Leases interface {
	// AcquireLease takes the lease name for holder for ttl, or renews it, if it is free,
	// expired or already holder's: then held is true and expiresAt is now+ttl. If another
	// holder's lease is live, nothing changes: held is false and expiresAt is when that lease
	// expires. The check and the write are one write transaction (atomic across replicas).
	// An empty or over-long name or holder, or a ttl outside [MinLeaseTTL, MaxLeaseTTL], is
	// INVALID_ARGUMENT.
	AcquireLease(ctx context.Context, name, holder string, ttl time.Duration) (held bool, expiresAt time.Time, err error)
	// ReleaseLease ends holder's lease name; it reports whether holder held it (a lease
	// another holder took over, or none, is left as it is).
	ReleaseLease(ctx context.Context, name, holder string) (bool, error)
	// GetLease returns the lease name, live or expired; found is false if there is none.
	GetLease(ctx context.Context, name string) (l Lease, found bool, err error)
	// ListLeases returns the leases whose name starts with prefix, by name, at most limit
	// (1..1000).
	ListLeases(ctx context.Context, prefix string, limit int) ([]Lease, error)
}

// ChangeNotifier is implemented by stores that can tell a process that another process wrote
// events (Postgres: LISTEN/NOTIFY). A watcher polling the events can wait on it instead of a
// timer, so it wakes on another replica's writes as on its own.
type ChangeNotifier interface {
	// Changes returns a channel that receives (coalesced) after every committed write
	// transaction that appended sandbox or run events, by any process on the database, and
	// also after the notifier reconnected (it may have missed some). The channel is closed
	// when ctx ends. The error is the first connection's.
	Changes(ctx context.Context) (<-chan struct{}, error)
}
