package wire

import (
	"bytes"
	"encoding/json"
	"time"
	"unicode/utf8"

	"github.com/agentbox/agentbox/internal/errcode"
)

// State is a sandbox's lifecycle state.
type State string

// The states a sandbox reply names.
const (
	StateCreating  State = "creating"
	StateRunning   State = "running"
	StateStopping  State = "stopping"
	StateSleeping  State = "sleeping"
	StateDestroyed State = "destroyed"
	StateFailed    State = "failed"
	StateLost      State = "lost"
)

// Live reports whether a sandbox in state s holds (or may hold) resources on the server: what
// sandbox.State.Live says, for the CLI's displays.
func (s State) Live() bool {
	return s == StateCreating || s == StateRunning || s == StateStopping || s == StateSleeping
}

// Sandbox is a sandbox as every reply carries it (GET /v1/sandboxes/{id}, a create, a destroy,
// ...): the names of its environment variables and secrets, never their values.
type Sandbox struct {
	ID    string `json:"sandbox_id"`
	State State  `json:"state"`
	Image string `json:"image"`
	// ImageDigest is the manifest digest of the OCI image the sandbox was created from; "" for
	// the host image.
	ImageDigest string  `json:"image_digest,omitempty"`
	Runtime     string  `json:"runtime"`
	Isolation   string  `json:"isolation"`
	CPU         float64 `json:"cpu"`
	MemoryMB    int64   `json:"memory_mb"`
	DiskMB      int64   `json:"disk_mb"`
	PidsLimit   int64   `json:"pids_limit"`
	// EnvNames are the names of the environment variables given at create, sorted.
	EnvNames  []string          `json:"env_names,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
	CreatedAt time.Time         `json:"created_at"`
	UpdatedAt time.Time         `json:"updated_at"`
	ExpiresAt time.Time         `json:"expires_at"`
	// Error says why a sandbox failed or was lost.
	Error string `json:"error,omitempty"`
	// Hardening is what the sandbox's runtime enforces on every sandbox.
	Hardening []string `json:"hardening,omitempty"`
	// Owner is who created the sandbox (an API key's name, an MCP session).
	Owner string `json:"owner,omitempty"`
	// IdempotencyKey is the key the create carried, if any (unique per owner).
	IdempotencyKey string `json:"idempotency_key,omitempty"`
	// Node is the host (or cluster node, or joined machine) the sandbox runs on.
	Node string `json:"node,omitempty"`
	// Network is "none" or the sandbox's egress policy.
	Network Network `json:"network"`
	// SecretNames are the names of the sandbox's secrets, sorted.
	SecretNames []string `json:"secret_names,omitempty"`
	// FromSnapshot is the snapshot the sandbox was made from; "" if none.
	FromSnapshot string `json:"from_snapshot,omitempty"`
	// AutoWake: an exec or file call on the sandbox while it sleeps wakes it first.
	AutoWake bool `json:"auto_wake,omitempty"`
	// TTLWhileSleeping: the TTL runs on while the sandbox sleeps.
	TTLWhileSleeping bool `json:"ttl_while_sleeping,omitempty"`
	// OnExpiry is what happens when the TTL runs out: "" (destroyed) or "sleep" (it sleeps, and
	// a wake gives it TTLSeconds again).
	OnExpiry string `json:"on_expiry,omitempty"`
	// TTLSeconds is the TTL the sandbox was created with (0 for sandboxes made before it was kept).
	TTLSeconds int64 `json:"ttl_seconds,omitempty"`
	// SleepSnapshot is the snapshot holding a sleeping sandbox's state; "" when awake.
	SleepSnapshot string `json:"sleep_snapshot,omitempty"`
	// SleptAt is when the sandbox last went to sleep (zero when awake).
	SleptAt time.Time `json:"slept_at,omitzero"`
	// FromPool says the sandbox was claimed from a warm pool rather than started for its create.
	FromPool bool `json:"from_pool,omitempty"`
	// Pool is the warm pool holding the sandbox until a create claims it.
	Pool string `json:"pool,omitempty"`
	// Version increases on every update.
	Version int64 `json:"version"`
}

// SandboxList is the reply of GET /v1/sandboxes.
type SandboxList struct {
	Sandboxes []Sandbox `json:"sandboxes"`
	Count     int       `json:"count"`
}

// ForkResult is the reply of POST /v1/sandboxes/{id}/fork: the snapshot forked from and the new
// sandboxes.
type ForkResult struct {
	SnapshotID string    `json:"snapshot_id"`
	Kind       string    `json:"kind"`
	Sandboxes  []Sandbox `json:"sandboxes"`
}

// Policy is a sandbox's egress policy: the hosts it may reach, and those it may not.
type Policy struct {
	Allow []string `json:"allow"`
	Deny  []string `json:"deny"`
}

// Network is "none" (Policy nil: no network at all) or an egress policy.
type Network struct {
	Policy *Policy
}

// MarshalJSON writes "none" or {"allow": [...], "deny": [...]} (arrays never null).
func (n Network) MarshalJSON() ([]byte, error) {
	if n.Policy == nil {
		return []byte(`"none"`), nil
	}
	return json.Marshal(normalPolicy(*n.Policy))
}

// UnmarshalJSON reads "none" (or null) or an object with only "allow" and "deny".
func (n *Network) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	const want = `network must be "none" or {"allow": ["host", ...], "deny": [...]}`
	switch {
	case bytes.Equal(b, []byte("null")):
		n.Policy = nil
		return nil
	case len(b) > 0 && b[0] == '"':
		var s string
		if err := json.Unmarshal(b, &s); err != nil || s != "none" {
			return errcode.New(errcode.InvalidArgument, "%s; got %s", want, clip(string(b), 64))
		}
		n.Policy = nil
		return nil
	case len(b) > 0 && b[0] == '{':
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		var p Policy
		if err := dec.Decode(&p); err != nil {
			return errcode.Wrap(errcode.InvalidArgument, err, "%s: %s", want, clip(err.Error(), 200))
		}
		p = normalPolicy(p)
		n.Policy = &p
		return nil
	}
	return errcode.New(errcode.InvalidArgument, "%s; got %s", want, clip(string(b), 64))
}

// normalPolicy returns p with non-nil arrays.
func normalPolicy(p Policy) Policy {
	if p.Allow == nil {
		p.Allow = []string{}
	}
	if p.Deny == nil {
		p.Deny = []string{}
	}
	return p
}

// clip cuts s to at most n bytes on a character boundary, marking the cut.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
