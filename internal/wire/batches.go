package wire

import (
	"encoding/json"
	"time"
)

// Batch is the record of a batch (run_batch, run_matrix, agent_compare, agent_test).
type Batch struct {
	ID string `json:"batch_id"`
	// Kind is "batch", "matrix", "agent_compare" or "agent_test".
	Kind               string              `json:"kind"`
	MaxParallel        int                 `json:"max_parallel"`
	Runs               []BatchRun          `json:"runs"`
	SubmissionFailures []SubmissionFailure `json:"submission_failures"`
	// Counts are the runs by state.
	Counts    map[RunState]int  `json:"counts"`
	Settled   bool              `json:"settled"`
	Matrix    []Cell            `json:"matrix,omitempty"`
	Axes      []string          `json:"axes,omitempty"`
	Compare   *Comparison       `json:"comparison,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
	CreatedAt time.Time         `json:"created_at"`
	SettledAt *time.Time        `json:"settled_at"`
}

// BatchList is a page of batches, newest first.
type BatchList struct {
	Batches []Batch `json:"batches"`
	Next    string  `json:"next,omitempty"`
}

// BatchRun is a run's line in a batch's reply.
type BatchRun struct {
	RunID  string   `json:"run_id"`
	Index  int      `json:"index"`
	State  RunState `json:"state"`
	Reason string   `json:"reason,omitempty"`
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
	State  RunState                   `json:"state,omitempty"`
	// ExitCodes by phase name (null where the phase did not end with one).
	ExitCodes map[string]*int `json:"exit_codes,omitempty"`
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
	Counts map[RunState]int `json:"counts"`
	Passed int              `json:"passed"`
	// MedianTaskMs is the median of the settled repetitions' agent phase durations (null if none).
	MedianTaskMs *int64 `json:"median_task_ms"`
}

// RepetitionSummary is one run of one side.
type RepetitionSummary struct {
	RunID        string   `json:"run_id"`
	State        RunState `json:"state"`
	AgentCommit  string   `json:"agent_commit,omitempty"`
	TargetCommit string   `json:"target_commit,omitempty"`
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

// CompareRequest is agent_compare (and, with only Candidate, agent_test).
type CompareRequest struct {
	Baseline  *AgentSide `json:"baseline,omitempty"`
	Candidate AgentSide  `json:"candidate"`
	// Preset is "omp" (the oh-my-pi conventions) or "" (AgentCommand required).
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
	Image          string                `json:"image,omitempty"`
	Runtime        string                `json:"runtime,omitempty"`
	CPU            float64               `json:"cpu,omitempty"`
	MemoryMB       int64                 `json:"memory_mb,omitempty"`
	DiskMB         int64                 `json:"disk_mb,omitempty"`
	Network        *Network              `json:"network,omitempty"`
	Env            map[string]string     `json:"env,omitempty"`
	Secrets        map[string]SecretSpec `json:"secrets,omitempty"`
	TimeoutSeconds int64                 `json:"timeout_seconds,omitempty"`
	IdempotencyKey string                `json:"idempotency_key,omitempty"`
}

// AgentSide is one version of a coding agent: its repository at a ref.
type AgentSide struct {
	RepoURL string `json:"repo_url"`
	Ref     string `json:"ref,omitempty"`
	// RepoSecret names one of the request's secrets for a private agent repository.
	RepoSecret string `json:"repo_secret,omitempty"`
}
