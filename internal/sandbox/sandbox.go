// Package sandbox is the control plane for disposable sandboxes: the domain types, the one state
// table every sandbox follows, and the Service that creates, tracks, bounds, reaps, reconciles and
// destroys them through a runtime.Runtime, recording intent in a Store before acting.
package sandbox

import (
	"time"

	"github.com/agentbox/agentbox/internal/egress"
	"github.com/agentbox/agentbox/internal/sandboxid"
)

// State is a sandbox's lifecycle state.
type State string

const (
	StateCreating  State = "creating"
	StateRunning   State = "running"
	StateStopping  State = "stopping"
	StateDestroyed State = "destroyed"
	StateFailed    State = "failed"
	StateLost      State = "lost"
)

// transitions is the one state table: from → allowed targets.
//
// Sleep and wake (sleep.go): running → sleeping once the sleep snapshot is complete; a wake
// takes sleeping → creating (the runtime creating it again from the snapshot, SleepSnapshot
// still set) → running, or back → sleeping when the wake fails or the server stopped during it.
var transitions = map[State][]State{
	StateCreating: {StateRunning, StateStopping, StateFailed, StateLost, StateSleeping},
	StateRunning:  {StateStopping, StateLost, StateFailed, StateSleeping},
	StateSleeping: {StateCreating, StateStopping, StateLost},
	StateStopping: {StateDestroyed, StateFailed, StateLost},
	StateFailed:   {StateStopping, StateDestroyed},
	StateLost:     {StateStopping, StateDestroyed},
}

// CanTransition reports whether from → to is allowed by the state table.
func CanTransition(from, to State) bool {
	for _, s := range transitions[from] {
		if s == to {
			return true
		}
	}
	return false
}

// Live reports whether a sandbox in state s holds (or may hold) host resources and counts
// against capacity. A sleeping sandbox is live: it holds its snapshot (disk) and its id range,
// and counts against the live bound and the disk budget, though not the CPU and memory budgets
// (HoldsCompute).
func (s State) Live() bool {
	return s == StateCreating || s == StateRunning || s == StateStopping || s == StateSleeping
}

// HoldsCompute reports whether a live sandbox in state s counts against the CPU and memory
// budgets: every live state but sleeping.
func (s State) HoldsCompute() bool { return s.Live() && s != StateSleeping }

// Terminal reports whether s is an end state.
func (s State) Terminal() bool { return s == StateDestroyed }

// Valid reports whether s is a known state.
func (s State) Valid() bool {
	switch s {
	case StateCreating, StateRunning, StateStopping, StateDestroyed, StateFailed, StateLost, StateSleeping:
		return true
	}
	return false
}

// Sandbox is the durable record of one sandbox.
type Sandbox struct {
	ID    string `json:"sandbox_id"`
	State State  `json:"state"`
	Image string `json:"image"`
	// ImageDigest is the manifest digest of the OCI image the sandbox was created from, pinned
	// at create (a tag that moves later does not change it); "" for the host image.
	ImageDigest string  `json:"image_digest,omitempty"`
	Runtime     string  `json:"runtime"`
	Isolation   string  `json:"isolation"`
	CPU         float64 `json:"cpu"`
	MemoryMB    int64   `json:"memory_mb"`
	DiskMB      int64   `json:"disk_mb"`
	PidsLimit   int64   `json:"pids_limit"`
	// Env is never part of a reply (values may be credentials): replies carry EnvNames.
	Env map[string]string `json:"-"`
	// EnvNames are Env's names, sorted; MarshalJSON fills them.
	EnvNames  []string          `json:"env_names,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
	CreatedAt time.Time         `json:"created_at"`
	UpdatedAt time.Time         `json:"updated_at"`
	ExpiresAt time.Time         `json:"expires_at"`
	// Error says why a sandbox failed or was lost.
	Error string `json:"error,omitempty"`
	// Hardening is what the sandbox's runtime enforces on every sandbox (its
	// Capabilities.Hardening), filled in by the API's replies; it is not stored.
	Hardening []string `json:"hardening,omitempty"`
	// Owner is who created the sandbox (an API key's name, an MCP session; WithOwner).
	Owner string `json:"owner,omitempty"`
	// Principal is the API key the sandbox belongs to ("key:<id>"), or gate.AdminPrincipal
	// (WithPrincipal): the authorization gate lets only it, and admins, see and act on the
	// sandbox. Never in replies.
	Principal string `json:"-"`
	// IdempotencyKey is the key the create carried, if any (unique per owner).
	IdempotencyKey string `json:"idempotency_key,omitempty"`
	// Node is the host (or cluster node, or joined machine) the sandbox runs on.
	Node string `json:"node,omitempty"`
	// Handle is the runtime's opaque reference to the sandbox (runtime.Handle), persisted so
	// that a restarted server can adopt it. It is not part of any reply.
	Handle string `json:"-"`
	// Network is "none" or the sandbox's egress policy (network.go); UpdateNetwork changes it.
	Network Network `json:"network"`
	// Secrets are the sandbox's secrets: names, placeholders and references ("env:VAR"),
	// never values. Not part of any reply: replies carry SecretNames.
	Secrets []egress.Secret `json:"-"`
	// SecretNames are Secrets' names, sorted; MarshalJSON fills them.
	SecretNames []string `json:"secret_names,omitempty"`
	// FromSnapshot is the snapshot the sandbox was made from (create --snapshot, fork); "" if none.
	FromSnapshot string `json:"from_snapshot,omitempty"`
	// AutoWake: an exec or file call on the sandbox while it sleeps wakes it first (else it is
	// SANDBOX_NOT_RUNNING saying to wake it).
	AutoWake bool `json:"auto_wake,omitempty"`
	// TTLWhileSleeping: the TTL runs on while the sandbox sleeps (default: sleeping time does
	// not count; ExpiresAt moves on by the time slept at wake).
	TTLWhileSleeping bool `json:"ttl_while_sleeping,omitempty"`
	// OnExpiry is what happens at ExpiresAt: OnExpiryDestroy ("", the default) or
	// OnExpirySleep (the sandbox sleeps, and a wake gives it TTLSeconds again).
	OnExpiry string `json:"on_expiry,omitempty"`
	// TTLSeconds is the TTL the sandbox was created with (after defaults): what a wake gives a
	// sandbox that slept at its expiry.
	TTLSeconds int64 `json:"ttl_seconds,omitempty"`
	// SleepSnapshot is the snapshot holding a sleeping sandbox's state; "" when awake.
	SleepSnapshot string `json:"sleep_snapshot,omitempty"`
	// SleptAt is when the sandbox last went to sleep (zero when awake).
	SleptAt time.Time `json:"slept_at,omitzero"`
	// FromPool says the sandbox was claimed from a warm pool rather than started for its create.
	FromPool bool `json:"from_pool,omitempty"`
	// Pool is the warm pool holding the sandbox until a create claims it ("" once claimed, or
	// for a sandbox not made for a pool). A pooled sandbox is never listed as the caller's.
	Pool string `json:"pool,omitempty"`
	// Version increases on every update (optimistic concurrency).
	Version int64 `json:"version"`
}

// Event records one state transition of a sandbox.
type Event struct {
	Seq       int64     `json:"seq"`
	SandboxID string    `json:"sandbox_id"`
	Type      string    `json:"type"` // "state"
	From      State     `json:"from,omitempty"`
	To        State     `json:"to"`
	Reason    string    `json:"reason,omitempty"`
	At        time.Time `json:"at"`
}

// ListFilter selects sandboxes. Zero values select everything.
type ListFilter struct {
	States []State
	Labels map[string]string
	// Pool selects only the sandboxes that warm pool holds (Sandbox.Pool); NoPooled leaves out
	// every sandbox a pool holds (Service.List sets it unless Pool is given: pooled sandboxes
	// are nobody's until claimed).
	Pool     string
	NoPooled bool
	// Principal selects one principal's sandboxes ("" all).
	Principal string
	// Limit bounds the result; 0 means the store's default bound.
	Limit int
}

// EventFilter selects events. SandboxID "" selects all sandboxes; AfterSeq pages.
type EventFilter struct {
	SandboxID string
	AfterSeq  int64
	Limit     int
}

// Defaults of Config that the server's configuration (internal/config) shows as its own: this is
// their one source.
const (
	DefaultRuntime      = "runc"
	DefaultTTL          = 30 * time.Minute
	DefaultMaxTTL       = 24 * time.Hour
	DefaultMaxSandboxes = 200
	// A sandbox created without limits gets these (Config.DefaultCPU, DefaultMemMB,
	// DefaultDiskMB, PidsLimit).
	DefaultCPU       = 1.0  // cores
	DefaultMemoryMB  = 512  // MiB
	DefaultDiskMB    = 1024 // MiB
	DefaultPidsLimit = 1024 // processes
)

// NewID returns a fresh sandbox id: "sb-" and 12 lowercase hex digits (sandboxid.New).
func NewID() string { return sandboxid.New() }

// ValidID reports whether id has the shape NewID produces (sandboxid.Valid).
func ValidID(id string) bool { return sandboxid.Valid(id) }
