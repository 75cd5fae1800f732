package store

import (
	"context"
	"time"

	"github.com/agentbox/agentbox/internal/gpu"
)

// Machine is a joined machine: a computer its owner enrolled with a join token,
// which dials the server and is driven through it. Name and every alias are unique among live
// machines (a name never equals another machine's alias); a machine is addressed by id, name
// or alias.
type Machine struct {
	ID      string   `json:"machine_id"`
	Name    string   `json:"name"`
	Aliases []string `json:"aliases"`
	// PublicKey is the machine's ed25519 public key (32 bytes): it proves its identity with
	// the private key, which never leaves the machine.
	PublicKey []byte `json:"-"`
	// Platform (linux, darwin, windows), Arch (GOARCH), AgentVersion and GPUs are what the
	// machine last reported (at enrollment, then in heartbeats); GPUs are kept while offline.
	Platform     string    `json:"platform"`
	Arch         string    `json:"arch"`
	AgentVersion string    `json:"agent_version"`
	GPUs         []gpu.GPU `json:"gpus"`
	// LastSeen is when the server received the machine's last heartbeat; nil before the first.
	LastSeen  *time.Time `json:"last_seen"`
	CreatedAt time.Time  `json:"created_at"`
	// RemovedAt is set when the machine was removed (revoked): its key is refused from then on
	// and its name and aliases are free again.
	RemovedAt *time.Time `json:"removed_at,omitempty"`
}

// MachineFacts is what a machine reports about itself in a heartbeat.
type MachineFacts struct {
	Platform, Arch, AgentVersion string
	GPUs                         []gpu.GPU
}

// JoinToken is a credential that enrolls machines: usable until ExpiresAt, at most Uses times,
// until revoked. The secret is shown once at creation; only its SHA-256 is stored.
type JoinToken struct {
	ID        string     `json:"token_id"`
	Prefix    string     `json:"prefix"` // the secret's first characters, to recognise it
	CreatedAt time.Time  `json:"created_at"`
	ExpiresAt time.Time  `json:"expires_at"`
	Uses      int        `json:"uses"`      // how many enrollments it allowed
	UsesLeft  int        `json:"uses_left"` // how many it still allows
	RevokedAt *time.Time `json:"revoked_at,omitempty"`
}

// MachineStore is the durable state of joined machines and their join tokens.
type MachineStore interface {
	// CreateJoinToken stores t with hash, the SHA-256 of its secret. INVALID_ARGUMENT when
	// max live (unrevoked, unexpired at t.CreatedAt) tokens exist.
	CreateJoinToken(ctx context.Context, t JoinToken, hash []byte, max int) error
	// ListJoinTokens returns up to limit tokens, newest first.
	ListJoinTokens(ctx context.Context, limit int) ([]JoinToken, error)
	// RevokeJoinToken revokes the token of id or prefix ref (INVALID_ARGUMENT when none).
	// Revoking a revoked token returns it unchanged.
	RevokeJoinToken(ctx context.Context, ref string, at time.Time) (JoinToken, error)
	// EnrollMachine spends one use of the token whose secret hashes to tokenHash and creates
	// m, in one transaction: AUTH_FAILED when the token is unknown, revoked, expired at
	// m.CreatedAt or used up (nothing spent, nothing created); CONFLICT when m.Name is taken
	// (the use is not spent); INVALID_ARGUMENT when max live machines exist.
	EnrollMachine(ctx context.Context, tokenHash []byte, m Machine, max int) (Machine, error)
	// Machine returns the live machine whose id, name or alias is ref (in that order);
	// MACHINE_NOT_FOUND when none.
	Machine(ctx context.Context, ref string) (Machine, error)
	// MachineByID returns the machine of id, removed or not; MACHINE_NOT_FOUND when none.
	MachineByID(ctx context.Context, id string) (Machine, error)
	// ListMachines returns up to limit live machines by name.
	ListMachines(ctx context.Context, limit int) ([]Machine, error)
	// RecordHeartbeat stores a live machine's facts and LastSeen = at; MACHINE_NOT_FOUND when
	// it is unknown or removed.
	RecordHeartbeat(ctx context.Context, id string, f MachineFacts, at time.Time) error
	// AddMachineAlias gives the live machine ref the alias (CONFLICT when any live machine's
	// name or alias is already alias; INVALID_ARGUMENT beyond max aliases); adding an alias it
	// has is no change.
	AddMachineAlias(ctx context.Context, ref, alias string, max int) (Machine, error)
	// RemoveMachineAlias takes alias from the live machine ref (INVALID_ARGUMENT when it has
	// no such alias).
	RemoveMachineAlias(ctx context.Context, ref, alias string) (Machine, error)
	// RemoveMachine removes (revokes) the live machine ref: its key is refused from then on
	// and its name and aliases are freed. MACHINE_NOT_FOUND when none.
	RemoveMachine(ctx context.Context, ref string, at time.Time) (Machine, error)
}
