package sandbox

import (
	"context"
	"time"

	"github.com/agentbox/agentbox/internal/egress"
)

// Warm pools: a pool keeps Size ready sandboxes of one shape so that a create of that
// shape claims one instead of starting one. The feature is internal/sandbox/pools; the types
// are the store's, the capacity reply's and that package's.

// Bounds of pools.
const (
	// MaxPools bounds how many pools a server keeps.
	MaxPools = 32
	// PoolOwnerPrefix prefixes the owner of a sandbox a pool holds ("pool:<name>").
	PoolOwnerPrefix = "pool:"
	// PoolNetworkNone and PoolNetworkEgress are a pool's networks.
	PoolNetworkNone   = "none"
	PoolNetworkEgress = "egress"
)

// Pool is a warm pool's configuration: its name, the shape of the sandboxes it holds and how
// many it keeps ready.
type Pool struct {
	Name     string  `json:"name"`
	Image    string  `json:"image"`
	Runtime  string  `json:"runtime"`
	CPU      float64 `json:"cpu"`
	MemoryMB int64   `json:"memory_mb"`
	DiskMB   int64   `json:"disk_mb"`
	// Network is "none" (the default) or "egress": a pool of egress sandboxes holds them with
	// the egress plumbing up and a policy that allows nothing; a create with any network
	// policy (and secrets) claims one, and its policy and secrets apply at the claim.
	Network string `json:"network"`
	// Size is how many ready sandboxes the pool keeps (0 keeps none: the pool is parked).
	Size      int       `json:"size"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// PoolStatus is a pool with what it holds now and how creates of its shape fared since the
// server started.
type PoolStatus struct {
	Pool
	// Ready is how many running sandboxes the pool holds; Starting how many are being created.
	Ready    int `json:"ready"`
	Starting int `json:"starting"`
	// Hits counts creates of the pool's shape that claimed a ready sandbox; Misses those that
	// found none ready and started one (both since this server started).
	Hits   int64 `json:"hits"`
	Misses int64 `json:"misses"`
	// LastError is why the last refill failed, while refills keep failing ("" otherwise).
	LastError string `json:"last_error,omitempty"`
}

// PoolCount is how many live sandboxes a pool holds, by state.
type PoolCount struct {
	Ready    int // running
	Starting int // creating
}

// PoolClaim is what a create gives the pooled sandbox it claims: the caller's identity, env,
// labels, TTL and idempotency key.
type PoolClaim struct {
	Pool           string
	Node           string
	Owner          string
	Principal      string // the claimant's (WithPrincipal): the claimed sandbox becomes its
	IdempotencyKey string
	Env            map[string]string
	Labels         map[string]string
	ExpiresAt      time.Time
	At             time.Time
	// Network and Secrets replace the sandbox's when Network.Policy is set and the sandbox has
	// a policy too (an egress sandbox: the claimant's policy and secrets; a sandbox started
	// without egress keeps network none, which the service then sees is not what was asked).
	Network Network
	Secrets []egress.Secret
}

// PoolStore is what warm pools need of durable state. internal/store.Store includes it.
type PoolStore interface {
	// PutPool inserts p, or replaces the pool of that name (keeping its CreatedAt).
	PutPool(ctx context.Context, p Pool) error
	// ListPools returns every pool, by name (at most MaxPools are ever stored).
	ListPools(ctx context.Context) ([]Pool, error)
	// DeletePool removes the pool's configuration (not its sandboxes); an unknown name is
	// errcode POOL_NOT_FOUND.
	DeletePool(ctx context.Context, name string) error
	// ClaimPooled, in one transaction:
	//   - when c.IdempotencyKey is set and a sandbox of c.Owner already has that key, changes
	//     nothing and returns that sandbox as prior;
	//   - else takes the oldest running sandbox of node c.Node that pool c.Pool holds, sets its
	//     pool to "", from_pool, owner, idempotency key, env, labels, expires_at (and, when
	//     c.Network.Policy is set, network and secrets) from c, bumps
	//     its version, appends a "claim" event, and returns it as claimed;
	//   - else (none ready) changes nothing and returns two zero records.
	// Two claimants never get the same sandbox, whatever races between them (or between server
	// processes on one database).
	ClaimPooled(ctx context.Context, c PoolClaim) (claimed, prior Sandbox, err error)
	// CountPooled returns, per pool name, how many creating and running sandboxes of node the
	// pool holds (pools holding none are absent).
	CountPooled(ctx context.Context, node string) (map[string]PoolCount, error)
}
