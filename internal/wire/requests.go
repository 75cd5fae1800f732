package wire

import "github.com/agentbox/agentbox/internal/errcode"

// Requests and small replies of the REST API that the server's handlers (internal/api) name
// through aliases.

// CommitRequest is the body of POST /v1/sandboxes/{id}/commit.
type CommitRequest struct {
	// Name is the new image's local name, NAME[:TAG] (tag latest by default).
	Name string `json:"name"`
}

// DecisionRequest is the body of POST /v1/approvals/{id}/approve|deny (optional on approve).
type DecisionRequest struct {
	Reason string `json:"reason,omitempty"`
}

// ErrorDetail is the body of an error: {"code", "message", "details"}.
type ErrorDetail struct {
	Code    errcode.Code   `json:"code"`
	Message string         `json:"message"`
	Details map[string]any `json:"details,omitempty"`
}

// ExecRequest is the body of POST /v1/sandboxes/{id}/exec.
type ExecRequest struct {
	// Command is the argv; it is never run through a shell.
	Command        []string          `json:"command"`
	Env            map[string]string `json:"env,omitempty"`
	Cwd            string            `json:"cwd,omitempty"`
	Stdin          string            `json:"stdin,omitempty"`
	StdinBase64    string            `json:"stdin_base64,omitempty"`
	TimeoutSeconds float64           `json:"timeout_seconds,omitempty"`
	MaxOutputBytes int64             `json:"max_output_bytes,omitempty"`
	User           string            `json:"user,omitempty"`
	// Background starts the command as a detached job (as POST …/jobs) and returns the job.
	Background bool `json:"background,omitempty"`
	// Changes returns the paths the command changed (result changes, changes_truncated);
	// Checkpoint snapshots the sandbox after it (result snapshot_id, or checkpoint_error).
	Changes    bool `json:"changes,omitempty"`
	Checkpoint bool `json:"checkpoint,omitempty"`
}

// ExposeRequest is the body of POST /v1/sandboxes/{id}/expose.
type ExposeRequest struct {
	Port   int  `json:"port"`
	Public bool `json:"public"`
}

// ExtendRequest is the body of POST /v1/sandboxes/{id}/extend.
type ExtendRequest struct {
	TTLSeconds int64 `json:"ttl_seconds"`
}

// JobCancelRequest is the (optional) body of POST …/jobs/{job_id}/cancel.
type JobCancelRequest struct {
	// GraceSeconds is the time between SIGTERM and SIGKILL: 0..600, default 10.
	GraceSeconds *float64 `json:"grace_seconds,omitempty"`
}

// PTYControl is a text message on the terminal WebSocket.
type PTYControl struct {
	// Type is "resize" (client → server), "exit" or "error" (server → client, the last message).
	Type     string       `json:"type"`
	Rows     int          `json:"rows,omitempty"`
	Cols     int          `json:"cols,omitempty"`
	ExitCode *int         `json:"exit_code,omitempty"`
	Signal   string       `json:"signal,omitempty"`
	Error    *ErrorDetail `json:"error,omitempty"`
}

// PoolSetRequest is the body of PUT /v1/pools/{name}: the shape of the pool's sandboxes (zero
// fields take the server's create defaults) and how many it keeps ready.
type PoolSetRequest struct {
	Image    string  `json:"image,omitempty"`
	Runtime  string  `json:"runtime,omitempty"`
	CPU      float64 `json:"cpu,omitempty"`
	MemoryMB int64   `json:"memory_mb,omitempty"`
	DiskMB   int64   `json:"disk_mb,omitempty"`
	// Network is "none" (the default) or "egress" (sandboxes with the egress plumbing ready; a
	// create with any network policy, and secrets, claims one and its policy applies at the claim).
	Network string `json:"network,omitempty"`
	// Size is required: 0 parks the pool (keeps none ready).
	Size *int `json:"size"`
}

// PruneRequest is the body of POST /v1/images/prune.
type PruneRequest struct {
	// All removes every image no live sandbox uses, tagged or not.
	All bool `json:"all,omitempty"`
}

// PullRequest is the body of POST /v1/images/pull.
type PullRequest struct {
	Ref string `json:"ref"`
}

// PushRequest is the body of POST /v1/images/push: push the cached image Name (a reference or
// digest) to Ref.
type PushRequest struct {
	Name string `json:"name"`
	Ref  string `json:"ref"`
}

// RemoteJobCancelRequest is the optional body of POST /v1/machines/{ref}/jobs/{job_id}/cancel.
type RemoteJobCancelRequest struct {
	// GraceSeconds between SIGTERM and SIGKILL: 0–600, default 10.
	GraceSeconds *int `json:"grace_seconds,omitempty"`
}

// RemoveResult is the reply of DELETE /v1/images.
type RemoveResult struct {
	Removed []string `json:"removed"`
}

// SQLRequest is the body of POST /v1/sql.
type SQLRequest struct {
	Query string `json:"query"`
	// MaxRows is the row limit: 1–sqlquery.MaxMaxRows, 0 for sqlquery.DefaultMaxRows.
	MaxRows int `json:"max_rows,omitempty"`
}

// WaitOptions are the wait fields of every POST that starts runs: with Wait (or a
// WaitSeconds), the reply is the record once settled, or as it is when WaitSeconds (default
// DefaultRunWait, at most runs.MaxWait) pass. A caller that hangs up loses nothing.
type WaitOptions struct {
	Wait        bool  `json:"wait,omitempty"`
	WaitSeconds int64 `json:"wait_seconds,omitempty"`
}
