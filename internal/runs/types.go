// Package runs is agentbox's durable task service: a run is one self-contained task (check out
// a repository, set it up, run a command, validate, collect changed files and artifacts, clean
// up) kept as a record whose every transition is written before it acts, executed by workers in
// the server that resume after a crash; batches and matrices fan runs out under a real
// parallelism bound, and agent comparisons run two versions of a coding agent on one task.
//
// It sits on the sandbox control plane (Backend: sandboxes, jobs, files, network) and declares
// the Store it needs; it knows no adapter.
package runs

import (
	"context"
	"encoding/json"
	"time"

	"github.com/agentbox/agentbox/internal/sandbox"
)

// State is where a run is. Unsettled: queued, preparing, running, validating, collecting,
// cleaning. Settled: succeeded, failed, errored, canceled, timed_out.
type State string

const (
	Queued     State = "queued"     // recorded; waiting for a worker (and its batch's bound)
	Preparing  State = "preparing"  // sandbox, checkout, files, agent checkout and build, setup
	Running    State = "running"    // the command
	Validating State = "validating" // the validation commands
	Collecting State = "collecting" // changed files, diff, artifacts, logs
	Cleaning   State = "cleaning"   // the sandbox destroyed (or kept)
	Succeeded  State = "succeeded"  // every phase exited 0
	Failed     State = "failed"     // the task's outcome: a phase exited non-zero (never an API error)
	Errored    State = "errored"    // agentbox could not do its part (sandbox lost, create refused, a phase cut by a restart…): Reason says why
	Canceled   State = "canceled"   // run_cancel
	TimedOut   State = "timed_out"  // the run's or a phase's timeout
)

// Settled reports whether s is final.
func (s State) Settled() bool {
	switch s {
	case Succeeded, Failed, Errored, Canceled, TimedOut:
		return true
	}
	return false
}

// Valid reports whether s is a known state.
func (s State) Valid() bool {
	switch s {
	case Queued, Preparing, Running, Validating, Collecting, Cleaning:
		return true
	}
	return s.Settled()
}

// ActiveStates are the states that hold (or are about to hold) a sandbox: what a batch's
// max_parallel counts.
var ActiveStates = []State{Preparing, Running, Validating, Collecting, Cleaning}

// Retention says what happens to a run's sandbox once the run settles.
const (
	RetentionDestroy = "destroy" // the default
	RetentionKeep    = "keep"    // kept for KeepTTLSeconds, for debugging
)

// Spec is what a run does. Zero values take defaults. Every argv is a list of arguments, never
// a shell string.
type Spec struct {
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
	Agent *AgentCheckout `json:"agent,omitempty"`

	Setup              []string   `json:"setup,omitempty"`
	Command            []string   `json:"command,omitempty"`
	ValidationCommands [][]string `json:"validation_commands,omitempty"`
	// Stdin is given to Command.
	Stdin string `json:"stdin,omitempty"`
	// Artifacts are paths or globs (*, ?, [..], and ** across directories) relative to Dir,
	// collected after the validations.
	Artifacts []string          `json:"artifacts,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
	// Secrets are references, as the network issue defines them (sandbox.SecretSpec).
	Secrets map[string]sandbox.SecretSpec `json:"secrets,omitempty"`

	// The sandbox's shape.
	Image        string               `json:"image,omitempty"`
	Runtime      string               `json:"runtime,omitempty"`
	CPU          float64              `json:"cpu,omitempty"`
	MemoryMB     int64                `json:"memory_mb,omitempty"`
	DiskMB       int64                `json:"disk_mb,omitempty"`
	Network      *sandbox.Network     `json:"network,omitempty"`
	Requirements sandbox.Requirements `json:"requirements,omitzero"`

	// TimeoutSeconds bounds the whole run (default DefaultTimeout, at most MaxTimeout);
	// PhaseTimeouts bound single phases by name ("checkout", "setup", "command", "validation",
	// "agent_build"), each at most the run's.
	TimeoutSeconds int64            `json:"timeout_seconds,omitempty"`
	PhaseTimeouts  map[string]int64 `json:"phase_timeout_seconds,omitempty"`

	Retention      string `json:"retention,omitempty"`
	KeepTTLSeconds int64  `json:"keep_ttl_seconds,omitempty"`

	Labels map[string]string `json:"labels,omitempty"`
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

// Phase names.
const (
	PhaseSandbox       = "sandbox"        // create the sandbox
	PhaseCheckout      = "checkout"       // the repository
	PhaseFiles         = "files"          // Spec.Files
	PhaseAgentCheckout = "agent_checkout" // Spec.Agent's repository
	PhaseAgentBuild    = "agent_build"    // Spec.Agent.BuildCommand
	PhaseSetup         = "setup"
	PhaseCommand       = "command"
	PhaseValidation    = "validation" // one per validation command: "validation[0]", "validation[1]", …
	PhaseCollect       = "collect"    // changed files, diff, artifacts
	PhaseCleanup       = "cleanup"    // destroy (or keep) the sandbox
)

// PhaseState is where one phase is.
type PhaseState string

const (
	PhasePending   PhaseState = "pending"
	PhaseRunning   PhaseState = "running"
	PhaseSucceeded PhaseState = "succeeded"
	PhaseFailed    PhaseState = "failed"    // exited non-zero, or could not be done (Error)
	PhaseSkipped   PhaseState = "skipped"   // an earlier phase ended the run (Error says which)
	PhaseTimedOut  PhaseState = "timed_out" // its timeout or the run's
	PhaseCanceled  PhaseState = "canceled"
	// PhaseInterrupted: the server stopped while the phase ran and its outcome could not be
	// recovered after the restart (Error says what is known).
	PhaseInterrupted PhaseState = "interrupted"
)

// Phase is one step of a run. Unknown times are null, never zero.
type Phase struct {
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

// Run is the durable record of a run and the reply of every run operation.
type Run struct {
	ID      string `json:"run_id"`
	Owner   string `json:"-"`
	BatchID string `json:"batch_id,omitempty"`
	State   State  `json:"state"`
	// Reason says why the run is in its state, in words (always set once settled).
	Reason string `json:"reason,omitempty"`
	Spec   Spec   `json:"spec"`
	// Commit is the resolved commit of the checkout (and AgentCommit of the agent's).
	Commit       string        `json:"commit,omitempty"`
	AgentCommit  string        `json:"agent_commit,omitempty"`
	Phases       []Phase       `json:"phases"`
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
	// Version increases on every update (optimistic concurrency).
	Version int64 `json:"-"`
}

// Event is one transition of a run (or a note on it: a phase started or ended, a retry), in
// the order written.
type Event struct {
	Seq   int64     `json:"seq"`
	RunID string    `json:"run_id"`
	Time  time.Time `json:"time"`
	From  State     `json:"from,omitempty"`
	To    State     `json:"to"`
	Phase string    `json:"phase,omitempty"`
	// Reason says what happened, in words.
	Reason string `json:"reason"`
}

// EventList is a page of a run's events, oldest first.
type EventList struct {
	RunID  string  `json:"run_id"`
	Events []Event `json:"events"`
	// Next is the cursor of the following page (pass it as after).
	Next int64 `json:"next"`
}

// Filter selects runs for run_list: newest first.
type Filter struct {
	States  []State
	BatchID string
	Owner   string
	Labels  map[string]string
	// Before pages: runs created before this run id's creation (the previous page's Next).
	Before string
	Limit  int // 1..MaxList, default DefaultList
}

// RunList is a page of runs, newest first.
type RunList struct {
	Runs []Run `json:"runs"`
	// Next is the cursor for the following page ("" at the end): pass it as before.
	Next string `json:"next,omitempty"`
}

// LogsRequest selects a slice of a phase's output.
type LogsRequest struct {
	Phase    string // a phase name; default the command
	Stream   string // "stdout" (default) or "stderr"
	Offset   int64
	MaxBytes int64 // 1..MaxLogPage, default DefaultLogPage
}

// Logs is a slice of a phase's output.
type Logs struct {
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

// BatchRequest is run_batch: runs under one parallelism bound.
type BatchRequest struct {
	Runs        []json.RawMessage `json:"runs"` // each a Spec; a bad one is a submission failure, not an error of the batch
	MaxParallel int               `json:"max_parallel,omitempty"`
	// IdempotencyKey returns the existing batch of this owner and key.
	IdempotencyKey string            `json:"idempotency_key,omitempty"`
	Labels         map[string]string `json:"labels,omitempty"`
}

// MatrixRequest is run_matrix: Base with each combination of Axes' values (the cartesian
// product, at most MaxMatrixCells), as a batch. Axis keys are JSON field paths of a Spec
// ("image", "env.MODE", "command").
type MatrixRequest struct {
	Base           json.RawMessage              `json:"base"`
	Axes           map[string][]json.RawMessage `json:"axes"`
	MaxParallel    int                          `json:"max_parallel,omitempty"`
	IdempotencyKey string                       `json:"idempotency_key,omitempty"`
	Labels         map[string]string            `json:"labels,omitempty"`
}

// SubmissionFailure is a spec of a batch that was refused before it ran: its index and why.
type SubmissionFailure struct {
	Index int    `json:"index"`
	Error string `json:"error"`
	Code  string `json:"code"`
}

// Cell is one combination of a matrix: its axis values and its run.
type Cell struct {
	Values map[string]json.RawMessage `json:"values"`
	RunID  string                     `json:"run_id,omitempty"`
	State  State                      `json:"state,omitempty"`
	// ExitCodes by phase name (null where the phase did not end with one).
	ExitCodes map[string]*int `json:"exit_codes,omitempty"`
}

// BatchRun is a run's line in a batch's reply.
type BatchRun struct {
	RunID  string `json:"run_id"`
	Index  int    `json:"index"`
	State  State  `json:"state"`
	Reason string `json:"reason,omitempty"`
}

// Batch is the record of a batch (run_batch, run_matrix, agent_compare, agent_test).
type Batch struct {
	ID    string `json:"batch_id"`
	Owner string `json:"-"`
	// Kind is "batch", "matrix", "agent_compare" or "agent_test".
	Kind               string              `json:"kind"`
	MaxParallel        int                 `json:"max_parallel"`
	Runs               []BatchRun          `json:"runs"`
	SubmissionFailures []SubmissionFailure `json:"submission_failures"`
	// Counts are the runs by state.
	Counts         map[State]int     `json:"counts"`
	Settled        bool              `json:"settled"`
	Matrix         []Cell            `json:"matrix,omitempty"`
	Axes           []string          `json:"axes,omitempty"`
	Compare        *Comparison       `json:"comparison,omitempty"`
	Labels         map[string]string `json:"labels,omitempty"`
	IdempotencyKey string            `json:"-"`
	CreatedAt      time.Time         `json:"created_at"`
	SettledAt      *time.Time        `json:"settled_at"`
	Version        int64             `json:"-"`
}

// BatchList is a page of batches, newest first.
type BatchList struct {
	Batches []Batch `json:"batches"`
	Next    string  `json:"next,omitempty"`
}

// AgentSide is one version of a coding agent: its repository at a ref.
type AgentSide struct {
	RepoURL string `json:"repo_url"`
	Ref     string `json:"ref,omitempty"`
	// RepoSecret names one of the request's secrets for a private agent repository.
	RepoSecret string `json:"repo_secret,omitempty"`
}

// CompareRequest is agent_compare (and, with only Candidate, agent_test).
type CompareRequest struct {
	Baseline  *AgentSide `json:"baseline,omitempty"`
	Candidate AgentSide  `json:"candidate"`
	// Preset is "omp" (the oh-my-pi conventions: preset.go) or "" (AgentCommand required).
	Preset string `json:"preset,omitempty"`
	// TargetRepoURL/TargetRef: the repository the agent works on.
	TargetRepoURL    string `json:"target_repo_url"`
	TargetRef        string `json:"target_ref,omitempty"`
	TargetRepoSecret string `json:"target_repo_secret,omitempty"`
	Task             string `json:"task"`
	// BuildCommand builds the agent in its directory (["true"] skips it); SetupCommand prepares
	// the target; AgentCommand overrides the preset's invocation and gets the task on stdin and
	// in OMP_TASK and AGENT_TASK.
	BuildCommand       []string   `json:"build_command,omitempty"`
	SetupCommand       []string   `json:"setup_command,omitempty"`
	AgentCommand       []string   `json:"agent_command,omitempty"`
	ValidationCommands [][]string `json:"validation_commands,omitempty"`
	Repetitions        int        `json:"repetitions,omitempty"` // default 1, at most MaxRepetitions
	MaxParallel        int        `json:"max_parallel,omitempty"`
	// KeepSandbox (agent_test only) keeps the sandbox for KeepTTLSeconds.
	KeepSandbox    bool  `json:"keep_sandbox,omitempty"`
	KeepTTLSeconds int64 `json:"keep_ttl_seconds,omitempty"`
	// The sandbox's shape, the same for every repetition of both sides.
	Image          string                        `json:"image,omitempty"`
	Runtime        string                        `json:"runtime,omitempty"`
	CPU            float64                       `json:"cpu,omitempty"`
	MemoryMB       int64                         `json:"memory_mb,omitempty"`
	DiskMB         int64                         `json:"disk_mb,omitempty"`
	Network        *sandbox.Network              `json:"network,omitempty"`
	Env            map[string]string             `json:"env,omitempty"`
	Secrets        map[string]sandbox.SecretSpec `json:"secrets,omitempty"`
	TimeoutSeconds int64                         `json:"timeout_seconds,omitempty"`
	IdempotencyKey string                        `json:"idempotency_key,omitempty"`
}

// Comparison is the measured outcome of agent_compare/agent_test: per side, the real runs and
// what happened in each; never a winner.
type Comparison struct {
	Task       string        `json:"task"`
	Invocation []string      `json:"invocation"`
	Sides      []SideSummary `json:"sides"`
}

// SideSummary is one side's repetitions.
type SideSummary struct {
	Side        string              `json:"side"` // "baseline" or "candidate"
	RepoURL     string              `json:"repo_url"`
	Ref         string              `json:"ref,omitempty"`
	Repetitions []RepetitionSummary `json:"repetitions"`
	// Counts by run state; Passed counts repetitions whose every validation exited 0.
	Counts map[State]int `json:"counts"`
	Passed int           `json:"passed"`
	// MedianTaskMs is the median of the settled repetitions' agent phase durations (null if none).
	MedianTaskMs *int64 `json:"median_task_ms"`
}

// RepetitionSummary is one run of one side.
type RepetitionSummary struct {
	RunID        string `json:"run_id"`
	State        State  `json:"state"`
	AgentCommit  string `json:"agent_commit,omitempty"`
	TargetCommit string `json:"target_commit,omitempty"`
	// Outcomes by phase: exit code (null if none) and duration.
	Build         *PhaseOutcome  `json:"build,omitempty"`
	Setup         *PhaseOutcome  `json:"setup,omitempty"`
	Task          *PhaseOutcome  `json:"task,omitempty"`
	Validations   []PhaseOutcome `json:"validations"`
	DiffStat      string         `json:"diff_stat,omitempty"`
	ChangedFiles  int            `json:"changed_files"`
	CleanupFailed bool           `json:"cleanup_failed"`
	// Summary: the tail of the task's output when it succeeded, the failing phase's stderr
	// (or stdout) tail when it did not.
	Summary   string `json:"summary,omitempty"`
	SandboxID string `json:"sandbox_id,omitempty"`
}

// PhaseOutcome is a phase's end, as a comparison reports it.
type PhaseOutcome struct {
	State      PhaseState `json:"state"`
	ExitCode   *int       `json:"exit_code"`
	DurationMs *int64     `json:"duration_ms"`
}

// Bounds.
const (
	DefaultTimeout   = time.Hour
	MaxTimeout       = 24 * time.Hour
	DefaultKeepTTL   = 30 * time.Minute
	MaxKeepTTL       = 24 * time.Hour
	PhaseOutputBytes = 16 << 10 // per stream, kept in the record
	MaxLogBytes      = 16 << 20 // per phase and stream, kept in the blob store
	DefaultLogPage   = 64 << 10
	MaxLogPage       = 1 << 20
	MaxDiffBytes     = 256 << 10
	MaxChangedFiles  = 1000
	MaxArtifacts     = 100
	MaxArtifactBytes = 256 << 20 // one file
	MaxRunArtifacts  = 1 << 30   // one run's total
	MaxValidations   = 32
	MaxFiles         = 256
	MaxFilesBytes    = 8 << 20 // total content of Spec.Files
	MaxArgs          = 1024
	MaxBatchRuns     = 256
	MaxMatrixCells   = 256
	MaxRepetitions   = 16
	DefaultList      = 20
	MaxList          = 1000
	MaxEventsPage    = 1000
	MaxWait          = time.Hour
	// DefaultArtifactURLTTL is how long an artifact's URL is valid.
	DefaultArtifactURLTTL = 24 * time.Hour
)

// QueuedRun is a queued run as the dispatcher sees it before it claims one.
type QueuedRun struct {
	ID      string
	BatchID string
}

// Store is what the run service needs of durable state. internal/store.Store includes it.
//
// Errors: GetRun of an unknown run is RUN_NOT_FOUND, GetBatch of an unknown batch
// RUN_NOT_FOUND too (errcode has no BATCH_NOT_FOUND); an update whose expected version does not match is CONFLICT.
type Store interface {
	// CreateRun inserts r (Version 1, state queued) and ev in one transaction. When r.Owner
	// already has a run with r.Spec.IdempotencyKey (non-empty) it inserts nothing and returns
	// that run with created false.
	CreateRun(ctx context.Context, r Run, ev Event) (existing Run, created bool, err error)
	GetRun(ctx context.Context, id string) (Run, error)
	// UpdateRun writes r if the stored version is r.Version-1 (r.Version is the new one), and
	// appends evs, in one transaction.
	UpdateRun(ctx context.Context, r Run, evs ...Event) error
	ListRuns(ctx context.Context, f Filter) (RunList, error)
	// UnsettledRuns returns every run not settled, oldest first (the workers' resume list).
	UnsettledRuns(ctx context.Context) ([]Run, error)
	// QueuedRuns returns up to limit queued runs, oldest first, as ids and batch ids only: the
	// dispatcher's poll, which must not read the runs' specs.
	QueuedRuns(ctx context.Context, limit int) ([]QueuedRun, error)
	// ClaimRun moves queued run id to preparing (version bump, ev appended) in one
	// transaction, only if its batch (if any) has fewer than maxParallel runs in
	// ActiveStates. claimed false (no error) when it may not start yet or is no longer queued.
	ClaimRun(ctx context.Context, id string, maxParallel int, at time.Time, ev Event) (r Run, claimed bool, err error)
	// RunEvents pages a run's events after seq, oldest first, at most limit.
	RunEvents(ctx context.Context, runID string, after int64, limit int) ([]Event, error)

	// CreateBatch inserts b and its runs (each with its first event) in one transaction; an
	// existing batch of b.Owner with b.IdempotencyKey is returned instead (created false).
	CreateBatch(ctx context.Context, b Batch, runs []Run, evs []Event) (existing Batch, created bool, err error)
	GetBatch(ctx context.Context, id string) (Batch, error)
	UpdateBatch(ctx context.Context, b Batch) error
	ListBatches(ctx context.Context, owner string, before string, limit int) (BatchList, error)
	// BatchCounts returns the batch's runs by state.
	BatchCounts(ctx context.Context, batchID string) (map[State]int, error)

	// PruneRuns deletes settled runs (their events, and batches all of whose runs went)
	// finished before t, returning the ids of the runs deleted (so their blobs go too).
	PruneRuns(ctx context.Context, t time.Time) ([]string, error)
}

// RedactedValue stands for an environment variable's value in every reply: a run's spec.env
// keeps its names, never its values.
const RedactedValue = "[redacted]"

// Redacted is r as replies show it: its spec's environment values replaced by RedactedValue
// (the record keeps them; the worker reads the record, never a reply).
func (r Run) Redacted() Run {
	if len(r.Spec.Env) > 0 {
		env := make(map[string]string, len(r.Spec.Env))
		for k := range r.Spec.Env {
			env[k] = RedactedValue
		}
		r.Spec.Env = env
	}
	return r
}

// Redacted is l with every run Redacted.
func (l RunList) Redacted() RunList {
	runs := make([]Run, len(l.Runs))
	for i, r := range l.Runs {
		runs[i] = r.Redacted()
	}
	l.Runs = runs
	return l
}
