package wire

import (
	"time"
)

// Job is a detached job in a sandbox as the replies of the job operations carry it.
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
