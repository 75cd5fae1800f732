// Package audit is the audit log of a gate.Gate (Recorder) that records every call
// on every surface — when, where from, who (an API key's id and name or the stdio session,
// never a key), which tool or route, which sandbox, the SHA-256 of the call's canonical
// arguments, a redacted summary of them (never a file's content, stdin, an environment
// variable's value, a secret or a body's bytes), the outcome and the duration — committed
// to the store before the call's reply leaves (group commit: concurrent calls share one
// transaction), kept for a retention period and to a row bound.
package audit

import (
	"context"
	"encoding/json"
	"time"
)

// Record is one recorded call.
type Record struct {
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

// Filter selects a page of records.
type Filter struct {
	// After is a cursor: records with Seq > After, oldest first. 0: the newest Limit records
	// (oldest first).
	After int64
	// Limit is how many at most: 1–MaxPage.
	Limit int
	// Tool, if set: a REST route's pattern ("POST /v1/sandboxes/{id}/exec") matches records
	// of that route; an MCP tool's name matches records whose Action it is, on both surfaces
	// ("exec" finds the MCP tool's calls and the REST route's).
	Tool      string
	SandboxID string
}

// MaxPage bounds one page of records.
const MaxPage = 1000

// Store is what the audit log needs of durable state (embedded in store.Store).
type Store interface {
	// AppendAudit inserts records in one transaction, assigning their Seq.
	AppendAudit(ctx context.Context, records []Record) error
	// ListAudit returns a page of records (Filter) and the number of older matching records
	// a page without After left out.
	ListAudit(ctx context.Context, f Filter) (records []Record, omitted int64, err error)
	// PruneAudit deletes the records older than before, then the oldest beyond the newest
	// maxRows, and returns how many it deleted.
	PruneAudit(ctx context.Context, before time.Time, maxRows int) (int64, error)
}

// List is the reply of GET /v1/audit.
type List struct {
	Records []Record `json:"records"`
	// Next is the cursor of the next page (the last record's seq; After when none).
	Next int64 `json:"next"`
	// Omitted is how many older matching records a page without after left out.
	Omitted int64 `json:"omitted,omitempty"`
}
