package wire

import (
	"encoding/json"
	"time"
)

// Approval is one call's request for a decision. Summary describes the call for the operator
// (never a file's content or a secret: those are given by length and SHA-256).
type Approval struct {
	ID         string          `json:"id"`
	State      ApprovalState   `json:"state"`
	Tool       string          `json:"tool"`             // the MCP tool, or the REST route pattern
	Action     string          `json:"action,omitempty"` // the MCP tool a REST route is
	Surface    string          `json:"surface"`
	SandboxID  string          `json:"sandbox_id,omitempty"`
	Digest     string          `json:"digest"`
	Summary    json.RawMessage `json:"summary"`
	CallerID   string          `json:"caller_id,omitempty"`
	CallerName string          `json:"caller_name,omitempty"`
	// Principal is the requesting key's principal ("key:<id>", or "admin").
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

// ApprovalPolicy is the reply of GET /v1/approvals/policy: which calls this server holds for an
// operator's decision, and whether the caller's key may decide them (what `agentbox chat
// --yes` needs to know before it starts).
type ApprovalPolicy struct {
	// Required: every call that acts (not reads) waits for a decision.
	Required bool `json:"required"`
	// Tools: only these tools (and their REST routes) wait; empty with Required false: none.
	Tools          []string `json:"tools"`
	TimeoutSeconds int      `json:"timeout_seconds"`
	// Elicit: the MCP client itself may decide its calls (elicitation).
	Elicit bool `json:"elicit"`
	// CanDecide: the caller's key may approve or deny; else CannotDecide says why.
	CanDecide    bool   `json:"can_decide"`
	CannotDecide string `json:"cannot_decide,omitempty"`
}

// AuditRecord is one recorded call.
type AuditRecord struct {
	// Seq is the record's cursor, assigned by the store (increasing, never reused).
	Seq        int64     `json:"seq"`
	Time       time.Time `json:"time"`
	Surface    string    `json:"surface"` // rest, mcp or mcp-stdio (gate.Surface*)
	CallerID   string    `json:"caller_id"`
	CallerName string    `json:"caller_name"`
	// Tool is the MCP tool or the REST route's pattern ("POST /v1/sandboxes/{id}/exec");
	// Action is the MCP tool either is ("exec"), empty for REST routes that are none.
	Tool      string `json:"tool"`
	Action    string `json:"action"`
	SandboxID string `json:"sandbox_id,omitempty"`
	// ArgsSHA256 is the hex SHA-256 of the arguments' canonical JSON (Digest).
	ArgsSHA256 string `json:"args_sha256"`
	// Summary is the arguments redacted (Summarize): a JSON object.
	Summary json.RawMessage `json:"summary"`
	// Outcome is "ok" or the call's error code.
	Outcome    string  `json:"outcome"`
	DurationMS float64 `json:"duration_ms"`
	// ApprovalID is the approval the call waited for, if any.
	ApprovalID string `json:"approval_id,omitempty"`
}

// AuditList is the reply of GET /v1/audit.
type AuditList struct {
	Records []AuditRecord `json:"records"`
	// Next is the cursor of the next page (the last record's seq; After when none).
	Next int64 `json:"next"`
	// Omitted is how many older matching records a page without after left out.
	Omitted int64 `json:"omitted,omitempty"`
}

// APIKey is an API key's record: never the key itself, which is shown once at creation.
type APIKey struct {
	ID    string `json:"id"`
	Name  string `json:"name"`
	Scope string `json:"scope"`
	// Prefix is the key's first characters ("abk_" and 6 more), to tell keys apart.
	Prefix     string     `json:"prefix"`
	CreatedAt  time.Time  `json:"created_at"`
	ExpiresAt  *time.Time `json:"expires_at,omitempty"`
	RevokedAt  *time.Time `json:"revoked_at,omitempty"`
	LastUsedAt *time.Time `json:"last_used_at,omitempty"`
}

// KeyCreateRequest is a new key's name, scope and lifetime.
type KeyCreateRequest struct {
	Name  string `json:"name"`
	Scope string `json:"scope"`
	// TTL is how long the key lasts (0: until revoked), as a Go duration ("720h").
	TTL string `json:"ttl,omitempty"`
}

// CreatedKey is a new key and, once, its secret.
type CreatedKey struct {
	Key APIKey `json:"key"`
	// Secret is the API key: shown now and never again.
	Secret string `json:"secret"`
}

// SQLResult is one query's answer. Rows hold JSON values: integers and reals as numbers, text as
// strings, NULL as null, blobs as base64 strings.
type SQLResult struct {
	Columns []string `json:"columns"`
	Rows    [][]any  `json:"rows"`
	// RowCount is len(Rows).
	RowCount int `json:"row_count"`
	// Truncated says more rows were there than returned; TruncatedBy says which bound cut
	// them: "max_rows" or "max_bytes".
	Truncated   bool   `json:"truncated"`
	TruncatedBy string `json:"truncated_by,omitempty"`
	// ElapsedMS is how long the query ran, in milliseconds.
	ElapsedMS float64 `json:"elapsed_ms"`
}
