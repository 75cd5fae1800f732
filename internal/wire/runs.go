package wire

import (
	"time"
)

// Run is a durable run as the replies of the run operations carry it.
type Run struct {
	ID      string   `json:"run_id"`
	BatchID string   `json:"batch_id,omitempty"`
	State   RunState `json:"state"`
	// Reason says why the run is in its state, in words (always set once settled).
	Reason string  `json:"reason,omitempty"`
	Spec   RunSpec `json:"spec"`
	// Commit is the resolved commit of the checkout (and AgentCommit of the agent's).
	Commit       string        `json:"commit,omitempty"`
	AgentCommit  string        `json:"agent_commit,omitempty"`
	Phases       []RunPhase    `json:"phases"`
	ChangedFiles []ChangedFile `json:"changed_files"`
	// DiffStat is `git diff --stat` of the changes; Diff the diff itself, at most MaxDiffBytes
	// (DiffTruncated says so).
	DiffStat      string     `json:"diff_stat,omitempty"`
	Diff          string     `json:"diff"`
	DiffTruncated bool       `json:"diff_truncated,omitempty"`
	Artifacts     []Artifact `json:"artifacts"`
	// ArtifactErrors name what could not be collected (a glob matching nothing, a file over
	// the bound), never silently dropped.
	ArtifactErrors []string `json:"artifact_errors,omitempty"`
	SandboxID      string   `json:"sandbox_id,omitempty"`
	// SandboxKept: retention keep, the sandbox lives until KeptUntil.
	SandboxKept bool       `json:"sandbox_kept,omitempty"`
	KeptUntil   *time.Time `json:"kept_until,omitempty"`
	// CleanupFailed: the sandbox could not be destroyed (CleanupError says why); the control
	// plane's loop keeps trying, but the run never claims it was clean.
	CleanupFailed bool       `json:"cleanup_failed"`
	CleanupError  string     `json:"cleanup_error,omitempty"`
	CreatedAt     time.Time  `json:"created_at"`
	StartedAt     *time.Time `json:"started_at"`
	FinishedAt    *time.Time `json:"finished_at"`
	DurationMs    *int64     `json:"duration_ms"`
	// Success is true only for succeeded.
	Success   bool      `json:"success"`
	UpdatedAt time.Time `json:"updated_at"`
	// CancelRequested is set by run_cancel before the worker acts on it.
	CancelRequested bool `json:"cancel_requested,omitempty"`
}

// RunList is a page of runs, newest first.
type RunList struct {
	Runs []Run `json:"runs"`
	// Next is the cursor for the following page ("" at the end): pass it as before.
	Next string `json:"next,omitempty"`
}

// RunSpec is what a run does. Zero values take defaults. Every argv is a list of arguments, never
// a shell string.
type RunSpec struct {
	// RepoURL and Ref: the repository checked out (shallow, at Ref: a branch, tag or commit;
	// default the remote's HEAD) into Dir inside the sandbox, through the network policy. http,
	// https, or file:// under a directory the server's operator allowed. Optional: a run can
	// start from Files or an image only.
	RepoURL string `json:"repo_url,omitempty"`
	Ref     string `json:"ref,omitempty"`
	// RepoSecret names one of Secrets that authenticates the checkout (sent as HTTP basic auth
	// by the egress proxy; never in the URL, argv or logs). Its hosts default to the repo's host.
	RepoSecret string `json:"repo_secret,omitempty"`
	// Dir is the working directory of every phase and the checkout's target (default /workspace).
	Dir string `json:"dir,omitempty"`
	// Files are written into Dir (relative paths) before setup: path → UTF-8 content.
	Files map[string]string `json:"files,omitempty"`
	// Agent, set by agent_test/agent_compare, checks out and builds a coding agent beside the
	// target. Generic runs leave it nil.
	Agent              *AgentCheckout `json:"agent,omitempty"`
	Setup              []string       `json:"setup,omitempty"`
	Command            []string       `json:"command,omitempty"`
	ValidationCommands [][]string     `json:"validation_commands,omitempty"`
	// Stdin is given to Command.
	Stdin string `json:"stdin,omitempty"`
	// Artifacts are paths or globs (*, ?, [..], and ** across directories) relative to Dir,
	// collected after the validations.
	Artifacts []string          `json:"artifacts,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
	// Secrets are references, as a create's secrets are (SecretSpec).
	Secrets map[string]SecretSpec `json:"secrets,omitempty"`
	// The sandbox's shape.
	Image        string       `json:"image,omitempty"`
	Runtime      string       `json:"runtime,omitempty"`
	CPU          float64      `json:"cpu,omitempty"`
	MemoryMB     int64        `json:"memory_mb,omitempty"`
	DiskMB       int64        `json:"disk_mb,omitempty"`
	Network      *Network     `json:"network,omitempty"`
	Requirements Requirements `json:"requirements,omitzero"`
	// TimeoutSeconds bounds the whole run (default DefaultTimeout, at most MaxTimeout);
	// PhaseTimeouts bound single phases by name ("checkout", "setup", "command", "validation",
	// "agent_build"), each at most the run's.
	TimeoutSeconds int64             `json:"timeout_seconds,omitempty"`
	PhaseTimeouts  map[string]int64  `json:"phase_timeout_seconds,omitempty"`
	Retention      string            `json:"retention,omitempty"`
	KeepTTLSeconds int64             `json:"keep_ttl_seconds,omitempty"`
	Labels         map[string]string `json:"labels,omitempty"`
	// IdempotencyKey returns the existing run of this owner and key instead of a second one
	// (across restarts); a different spec under the same key is CONFLICT.
	IdempotencyKey string `json:"idempotency_key,omitempty"`
}

// AgentCheckout is the coding agent of agent_test/agent_compare: its repository at a ref,
// checked out into Dir, then built with BuildCommand (run in Dir; ["true"] skips it).
type AgentCheckout struct {
	RepoURL      string   `json:"repo_url"`
	Ref          string   `json:"ref,omitempty"`
	Dir          string   `json:"dir"`
	BuildCommand []string `json:"build_command,omitempty"`
	RepoSecret   string   `json:"repo_secret,omitempty"`
}

// RunPhase is one step of a run. Unknown times are null, never zero.
type RunPhase struct {
	Name  string     `json:"name"`
	State PhaseState `json:"state"`
	Argv  []string   `json:"argv,omitempty"`
	// JobID is the sandbox job that runs the phase's command (jobs survive a server restart,
	// so a restarted server waits for the same job).
	JobID    string `json:"job_id,omitempty"`
	ExitCode *int   `json:"exit_code"`
	Signal   string `json:"signal,omitempty"`
	// Stdout and Stderr are the last PhaseOutputBytes of each (UTF-8, invalid bytes replaced);
	// run_logs has the whole of each (up to MaxLogBytes).
	Stdout      string     `json:"stdout"`
	Stderr      string     `json:"stderr"`
	StdoutBytes int64      `json:"stdout_bytes"`
	StderrBytes int64      `json:"stderr_bytes"`
	Truncated   bool       `json:"truncated,omitempty"`
	StartedAt   *time.Time `json:"started_at"`
	FinishedAt  *time.Time `json:"finished_at"`
	DurationMs  *int64     `json:"duration_ms"`
	Error       string     `json:"error,omitempty"`
}

// ChangedFile is one path that differs from the checkout.
type ChangedFile struct {
	Path string `json:"path"`
	// Status is "added", "modified", "deleted" or "renamed" (From set).
	Status string `json:"status"`
	From   string `json:"from,omitempty"`
}

// Artifact is one collected file, downloadable at URL until ExpiresAt.
type Artifact struct {
	Path      string    `json:"path"`
	Size      int64     `json:"size"`
	SHA256    string    `json:"sha256"`
	URL       string    `json:"url"`
	ExpiresAt time.Time `json:"expires_at"`
}

// RunEvent is one transition of a run (or a note on it: a phase started or ended, a retry), in
// the order written.
type RunEvent struct {
	Seq   int64     `json:"seq"`
	RunID string    `json:"run_id"`
	Time  time.Time `json:"time"`
	From  RunState  `json:"from,omitempty"`
	To    RunState  `json:"to"`
	Phase string    `json:"phase,omitempty"`
	// Reason says what happened, in words.
	Reason string `json:"reason"`
}

// RunEventList is a page of a run's events, oldest first.
type RunEventList struct {
	RunID  string     `json:"run_id"`
	Events []RunEvent `json:"events"`
	// Next is the cursor of the following page (pass it as after).
	Next int64 `json:"next"`
}

// RunLogs is a slice of a phase's output.
type RunLogs struct {
	RunID  string `json:"run_id"`
	Phase  string `json:"phase"`
	Stream string `json:"stream"`
	// Data is the exact bytes (base64 in JSON).
	Data       []byte `json:"data"`
	Offset     int64  `json:"offset"`
	NextOffset int64  `json:"next_offset"`
	TotalBytes int64  `json:"total_bytes"`
	// Truncated: the phase wrote more than MaxLogBytes; the rest was not kept.
	Truncated bool `json:"truncated,omitempty"`
	// Complete: the phase ended and this is all there will be.
	Complete bool `json:"complete"`
}
