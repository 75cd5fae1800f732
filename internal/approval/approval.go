// Package approval gates calls on an operator's decision: a gated call is recorded
// as a pending approval bound to its digest — the SHA-256 of the canonical JSON of its tool and
// every argument, so an approval covers one invocation — and waits, reporting progress, until an
// operator approves or denies it (REST /v1/approvals…, `agentbox approvals`, or the MCP
// client's elicitation when allowed) or its time runs out. An approved call runs exactly once:
// the approval is claimed (state used) before the call acts, and a retry with the same digest is
// refused, naming the approval. The Service is a gate.Gate, the last of the server's chain.
package approval

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strings"
	"time"

	"github.com/agentbox/agentbox/internal/gate"
)

// State is an approval's state: pending → approved → used, or pending → denied | expired.
type State string

const (
	Pending  State = "pending"
	Approved State = "approved" // decided, not yet claimed by the call
	Denied   State = "denied"
	Expired  State = "expired" // nobody decided in time
	Used     State = "used"    // the approved call was let through (it runs or ran)
)

// States lists every state.
var States = []State{Pending, Approved, Denied, Expired, Used}

// Approval is one call's request for a decision. Summary describes the call for the operator
// (never a file's content or a secret: those are given by length and SHA-256).
type Approval struct {
	ID         string          `json:"id"`
	State      State           `json:"state"`
	Tool       string          `json:"tool"`             // the MCP tool, or the REST route pattern
	Action     string          `json:"action,omitempty"` // the MCP tool a REST route is
	Surface    string          `json:"surface"`
	SandboxID  string          `json:"sandbox_id,omitempty"`
	Digest     string          `json:"digest"`
	Summary    json.RawMessage `json:"summary"`
	CallerID   string          `json:"caller_id,omitempty"`
	CallerName string          `json:"caller_name,omitempty"`
	// Principal is the requesting key's principal (gate.Caller.Principal; "admin" for the
	// server's token and the stdio session): a key that is not admin sees its own principal's
	// approvals only, and never decides one.
	Principal string     `json:"principal,omitempty"`
	CreatedAt time.Time  `json:"created_at"`
	ExpiresAt time.Time  `json:"expires_at"`
	DecidedAt *time.Time `json:"decided_at,omitempty"`
	Decider   string     `json:"decider,omitempty"`
	Reason    string     `json:"reason,omitempty"`
	UsedAt    *time.Time `json:"used_at,omitempty"`
	// Outcome is "ok" or the error code the approved call returned, once it returned.
	Outcome string `json:"outcome,omitempty"`
	// Bound: the call's digest does not cover all it sends (a streamed REST body, represented by
	// its length only), so only the request that asked may use the approval; a retry asks anew.
	Bound bool `json:"bound,omitempty"`
}

// Filter selects approvals to list, newest first.
type Filter struct {
	State     State  // "" = every state
	Principal string // "" = every principal's
	Limit     int    // 0 = DefaultListLimit; at most MaxListLimit
}

// Bounds.
const (
	DefaultListLimit = 100
	MaxListLimit     = 1000
	MaxReasonBytes   = 1024
)

// Store keeps approvals (sqlite: migration 0010_approvals.sql). Times are stored to the
// millisecond in UTC.
type Store interface {
	// CreateApproval inserts a (CONFLICT if the id exists).
	CreateApproval(ctx context.Context, a Approval) error
	// GetApproval returns one approval (APPROVAL_NOT_FOUND).
	GetApproval(ctx context.Context, id string) (Approval, error)
	// ListApprovals returns approvals newest first (bounded by f.Limit).
	ListApprovals(ctx context.Context, f Filter) ([]Approval, error)
	// FindApproval returns the newest approval of callerID for digest created at or after since
	// that is pending, approved or used and not Bound.
	FindApproval(ctx context.Context, callerID, digest string, since time.Time) (Approval, bool, error)
	// DecideApproval moves a pending approval not yet expired at `at` to to (Approved or
	// Denied), recording the decider and reason; CONFLICT naming the state if it is not pending.
	DecideApproval(ctx context.Context, id string, to State, decider, reason string, at time.Time) (Approval, error)
	// ClaimApproval moves an approved approval to used; false if it was not approved (another
	// call claimed it).
	ClaimApproval(ctx context.Context, id string, at time.Time) (bool, error)
	// SetApprovalOutcome records the outcome of the call that used it.
	SetApprovalOutcome(ctx context.Context, id, outcome string) error
	// ExpireApprovals moves pending approvals whose expires_at is at or before now to expired.
	ExpireApprovals(ctx context.Context, now time.Time) (int64, error)
	// CountPendingApprovals counts pending approvals.
	CountPendingApprovals(ctx context.Context) (int, error)
	// PruneApprovals deletes approvals other than pending and approved created before before.
	PruneApprovals(ctx context.Context, before time.Time) (int64, error)
}

// ReadOnly are the MCP tools that only read; with approvals required for every call, they (and
// every REST route its table declares read-only, and the approval routes themselves) are never
// gated. Every other tool — a new one too, until it is listed here — waits for a decision.
var ReadOnly = map[string]bool{
	"health": true, "sandbox_list": true, "sandbox_get": true, "sandbox_metrics": true,
	"sandbox_connections": true, "sandbox_secret_calls": true,
	"file_read": true, "file_list": true,
	"job_list": true, "job_status": true, "job_logs": true, "job_wait": true,
	"image_list":    true,
	"snapshot_list": true, "sandbox_diff": true, "pool_list": true, // snapshots, pools
	"machine_list": true, "machine_status": true, "remote_job_list": true, "remote_job_status": true, // joined machines
	"remote_job_logs": true, "remote_screenshot": true,
	"run_get": true, "run_list": true, "run_events": true, "run_logs": true, "run_artifact": true, "batch_get": true,
	"watch": true, "watch_fleet": true,
	"execute_sql": true, "fetch_metrics": true,
}

// redactKeys are argument names whose values the summary gives by length and SHA-256 only.
var redactKeys = map[string]bool{"content": true, "content_base64": true, "stdin": true, "data": true,
	"secret": true, "secrets": true, "password": true, "token": true, "env": true}

const (
	maxSummaryString = 4096     // longer strings are shown by a prefix, length and SHA-256
	maxSummaryBytes  = 16 << 10 // a larger summary keeps only its digest of the arguments
)

// Summarize describes c for the operator: its tool, action, sandbox, and its arguments with
// file contents, stdin, environment values and secrets replaced by {bytes, sha256}, long
// strings cut; file_write also gets path, content_bytes and content_sha256 at the top.
func Summarize(c *gate.Call) json.RawMessage {
	var args any
	if len(c.Args) > 0 {
		_ = json.Unmarshal(c.Args, &args)
	}
	s := map[string]any{"tool": c.Tool, "surface": c.Surface}
	if c.Action != "" && c.Action != c.Tool {
		s["action"] = c.Action
	}
	if c.SandboxID != "" {
		s["sandbox_id"] = c.SandboxID
	}
	if m, ok := args.(map[string]any); ok && c.Action == "file_write" {
		if p, ok := m["path"].(string); ok {
			s["path"] = p
		}
		for _, k := range []string{"content", "content_base64"} {
			if v, ok := m[k].(string); ok {
				s["content_bytes"], s["content_sha256"] = len(v), sha(v)
				if k == "content_base64" {
					s["content_encoding"] = "base64"
				}
			}
		}
		if q, ok := m["query"].(map[string]any); ok { // REST: PUT …/files?path=
			if p, ok := q["path"].([]any); ok && len(p) == 1 {
				s["path"] = p[0]
			}
		}
		if n, ok := m["body_bytes"]; ok {
			s["content_bytes"] = n
		}
	}
	s["arguments"] = redact("", args)
	b, _ := json.Marshal(s)
	if len(b) > maxSummaryBytes {
		s["arguments"] = map[string]any{"truncated": true, "bytes": len(c.Args), "sha256": sha(string(c.Args))}
		b, _ = json.Marshal(s)
	}
	return b
}

func redact(key string, v any) any {
	if redactKeys[strings.ToLower(key)] {
		if v == nil {
			return nil
		}
		raw, _ := json.Marshal(v)
		if s, ok := v.(string); ok {
			raw = []byte(s)
		}
		return map[string]any{"redacted": true, "bytes": len(raw), "sha256": sha(string(raw))}
	}
	switch x := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = redact(k, e)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = redact(key, e)
		}
		return out
	case string:
		if len(x) > maxSummaryString {
			return map[string]any{"prefix": strings.ToValidUTF8(x[:1024], ""), "bytes": len(x), "sha256": sha(x)}
		}
	}
	return v
}

func sha(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}
