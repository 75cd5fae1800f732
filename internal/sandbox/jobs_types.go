package sandbox

import (
	"context"
	"time"

	"github.com/agentbox/agentbox/internal/jobmodel"
)

// JobState is where a detached job is: the job model's states, which the jobs of joined
// machines share (internal/jobmodel).
type JobState = jobmodel.State

const (
	// JobStarting: the record is written and the agent has not yet said it runs the job.
	JobStarting = jobmodel.Starting
	JobRunning  = jobmodel.Running
	// JobExited: the job's process ended by itself; ExitCode says how.
	JobExited = jobmodel.Exited
	// JobKilled: a signal ended it (Signal; OOMKilled when the memory limit did).
	JobKilled = jobmodel.Killed
	// JobCanceled: job_cancel, or the sandbox's end (destroy, TTL), stopped it.
	JobCanceled = jobmodel.Canceled
	// JobFailed: it never started (Error says why).
	JobFailed = jobmodel.Failed
	// JobUnknown: the agent has no exit record (the sandbox was lost or restarted). Never success.
	JobUnknown = jobmodel.Unknown
)

// Job is the durable record of one detached job, and the reply of every job operation.
type Job struct {
	ID        string   `json:"job_id"`
	SandboxID string   `json:"sandbox_id"`
	Argv      []string `json:"argv"`
	// EnvNames are the names of the environment the job was given; values are never kept.
	EnvNames []string `json:"env_names,omitempty"`
	Cwd      string   `json:"cwd,omitempty"`
	User     string   `json:"user,omitempty"`
	State    JobState `json:"state"`
	// ExitCode is set once the job exited by itself.
	ExitCode *int `json:"exit_code,omitempty"`
	// Signal names the signal that ended a killed job (e.g. "SIGKILL").
	Signal     string     `json:"signal,omitempty"`
	OOMKilled  bool       `json:"oom_killed"`
	StartedAt  time.Time  `json:"started_at"`
	FinishedAt *time.Time `json:"finished_at,omitempty"`
	// LogBytes is the size of the job's interleaved output; LogTruncated says the log stopped
	// being written (the sandbox's disk filled), not the job.
	LogBytes     int64 `json:"log_bytes"`
	LogTruncated bool  `json:"log_truncated,omitempty"`
	// CPUSeconds is the job's CPU time (user + system) in seconds: while it runs, that of its
	// live processes (and the children they waited for) as the agent last sampled it; once it
	// ended, the rusage of its tree (its main process and the descendants waited for), or the
	// last sample if that was more.
	CPUSeconds float64 `json:"cpu_seconds"`
	// Error says why a job failed to start, was canceled by the sandbox's end, or is unknown.
	Error string `json:"error,omitempty"`
	// Success is true only for a job that exited with code 0 (never for unknown).
	Success bool `json:"success"`
	// Message says in words what State means for the caller (always set in replies).
	Message   string    `json:"message,omitempty"`
	UpdatedAt time.Time `json:"updated_at"`
	// Tail is the last TailBytes of the job's output, kept once it ended so that its end can
	// be read after the sandbox is gone; not part of a reply (job_logs serves it).
	Tail []byte `json:"-"`
	// Version increases on every update (optimistic concurrency).
	Version int64 `json:"-"`
}

// JobList is the reply of job_list: the newest jobs and how many older ones were left out.
type JobList struct {
	Jobs    []Job `json:"jobs"`
	Omitted int   `json:"omitted"`
}

// JobLogs is a slice of a job's output.
type JobLogs struct {
	JobID     string `json:"job_id"`
	SandboxID string `json:"sandbox_id"`
	Stream    string `json:"stream"`
	// Data is the exact bytes (base64 in JSON).
	Data       []byte `json:"data"`
	Offset     int64  `json:"offset"`
	NextOffset int64  `json:"next_offset"`
	TotalBytes int64  `json:"total_bytes"`
	// Truncated: the log stopped being written (the sandbox's disk filled); the job ran on.
	Truncated bool     `json:"truncated"`
	State     JobState `json:"state"`
	// Source is "agent" (the sandbox's disk: the whole log) or "record" (the sandbox is gone:
	// only the last TailBytes kept in the store).
	Source  string `json:"source"`
	Message string `json:"message,omitempty"`
}

// JobLogsRequest selects a slice of a job's output. With neither Offset nor TailLines, the last
// DefaultTailLines lines.
type JobLogsRequest struct {
	// Stream is "all" (default: stdout and stderr interleaved as written), "stdout" or "stderr".
	Stream string
	// Offset (≥ 0) with MaxBytes (1..MaxJobLogBytes, default DefaultJobLogBytes) pages by byte;
	// MaxBytes alone pages from 0.
	Offset   *int64
	MaxBytes *int64
	// TailLines (1..MaxTailLines) asks for the last lines.
	TailLines *int
	// Wait (0..MaxJobLogWait, whole milliseconds; with Offset) makes the read a long poll: while
	// the job runs and its log holds nothing past Offset, the sandbox's agent holds the read
	// until the job writes, ends, or Wait passes (an empty reply). An agent older than long
	// polls answers at once: a caller must not take an empty reply as a wait done. The watch
	// streams follow a log with it; it is not (yet) on REST or MCP.
	Wait time.Duration
}

// JobStartRequest starts a detached job: the command as exec's.
type JobStartRequest struct {
	Argv []string
	Env  map[string]string
	Cwd  string
	User string
}

// Bounds of jobs.
const (
	// DefaultMaxJobs bounds the running jobs of one sandbox (Config.MaxJobsPerSandbox).
	DefaultMaxJobs = 64
	// MaxJobRecords bounds the job records kept per sandbox: the oldest finished ones go.
	MaxJobRecords = 1000
	// TailBytes of output are kept in a finished job's record.
	TailBytes = 64 << 10
	// Job logs: a page is 1..MaxJobLogBytes (default DefaultJobLogBytes); tail 1..MaxTailLines
	// lines (default DefaultTailLines).
	MaxJobLogBytes     = jobmodel.MaxLogBytes
	DefaultJobLogBytes = jobmodel.DefaultLogBytes
	MaxTailLines       = jobmodel.MaxTailLines
	DefaultTailLines   = jobmodel.DefaultTailLines
	// job_list: limit 1..MaxList, default DefaultJobList.
	DefaultJobList = 20
	// job_wait: 0..MaxJobWait.
	MaxJobWait = time.Hour
	// A log read's long poll (JobLogsRequest.Wait): 0..MaxJobLogWait.
	MaxJobLogWait = 30 * time.Second
	// job_cancel: grace 0..MaxCancelGrace, default DefaultCancelGrace.
	MaxCancelGrace     = jobmodel.MaxGrace
	DefaultCancelGrace = jobmodel.DefaultGrace
)

// JobStore is what the job service needs of durable state. internal/store.Store includes it.
//
// Errors: GetJob of an unknown job returns errcode JOB_NOT_FOUND; UpdateJob whose expected
// version does not match returns errcode CONFLICT.
type JobStore interface {
	// CreateJob inserts j (Version 1) if its sandbox's record exists (else SANDBOX_NOT_FOUND)
	// and fewer than maxActive of its jobs are starting or running (else JOB_LIMIT_EXCEEDED),
	// in one transaction; it then deletes that sandbox's oldest finished jobs past MaxJobRecords.
	CreateJob(ctx context.Context, j Job, maxActive int) error
	GetJob(ctx context.Context, sandboxID, jobID string) (Job, error)
	// ListJobs returns sandboxID's jobs in any of states (all, if none), newest first, at most
	// limit (1..1000; 0 = 1000), and how many matching jobs that left out.
	ListJobs(ctx context.Context, sandboxID string, states []JobState, limit int) (jobs []Job, omitted int, err error)
	// UpdateJob writes j if the stored version equals j.Version-1. If ev.Type is set it appends
	// ev to the sandbox's events in the same transaction, its From and To being the sandbox's
	// state at that moment.
	UpdateJob(ctx context.Context, j Job, ev Event) error
	// PruneJobs deletes finished jobs updated before the given time and returns how many.
	PruneJobs(ctx context.Context, before time.Time) (int, error)
	// CountJobs returns how many job records are in each state (states with none are absent).
	CountJobs(ctx context.Context) (map[JobState]int, error)
	// ActiveJobsBySandbox returns how many starting or running job records each sandbox has
	// (sandboxes with none are absent), in one query.
	ActiveJobsBySandbox(ctx context.Context) (map[string]int, error)
}

// NewJobID returns a fresh job id: "job-" and 12 lowercase hex digits (jobmodel.SandboxJobID).
func NewJobID() string { return jobmodel.SandboxJobID.New() }

// ValidJobID reports whether id has the shape NewJobID produces.
func ValidJobID(id string) bool { return jobmodel.SandboxJobID.Valid(id) }
