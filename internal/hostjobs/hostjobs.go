// Package hostjobs is the machine side of remote jobs: a joined machine's agent starts
// detached commands that outlive the call, the agent and (on Linux, under systemd) the agent's
// service restart. Each job lives in a directory of the agent's state dir: its spec, its output
// (stdout and stderr interleaved, written by the job itself), a pid file and an exit marker
// written atomically by a small supervisor (the agentbox binary re-executed as a hidden
// subcommand, in its own session, never a child the agent's death kills). The job's state is
// read from those files on every call, so an agent that restarts re-adopts its jobs without
// remembering anything: a job with an exit marker ended as it says; one without whose process
// is alive runs; one without whose process is gone is `unknown`, never a success.
//
// NewHandler serves the jobs under /jobs/ (the agent mounts it over the machine's connection);
// Client calls it from the server.
package hostjobs

import (
	"time"

	"github.com/agentbox/agentbox/internal/jobmodel"
)

// States of a job: those of jobmodel a machine reports (the server adds starting and failed).
const (
	StateRunning  = string(jobmodel.Running)
	StateExited   = string(jobmodel.Exited)
	StateCanceled = string(jobmodel.Canceled)
	StateUnknown  = string(jobmodel.Unknown)
)

// Bounds, all enforced on both sides of the wire.
const (
	// MaxRunning is how many jobs may run at once on one machine.
	MaxRunning = 64
	// MaxKept is how many job directories the agent keeps; the oldest ended ones go first.
	MaxKept = 1000
	// MaxCommandBytes bounds the command string.
	MaxCommandBytes = 128 << 10
	// MaxEnv bounds the number of env entries; MaxEnvBytes their total size.
	MaxEnv      = 256
	MaxEnvBytes = 128 << 10
	// MaxCwdBytes bounds cwd.
	MaxCwdBytes = 4096
	// MaxGPUIndex bounds gpu_index (nvidia-smi numbers GPUs from 0).
	MaxGPUIndex = 63
	// DefaultListLimit and MaxListLimit bound list.
	DefaultListLimit = 20
	MaxListLimit     = 1000
	// DefaultTailLines and MaxTailLines bound a logs tail; DefaultLogBytes and MaxLogBytes
	// a logs page (a tail is of the last MaxLogBytes at most): jobmodel's.
	DefaultTailLines = jobmodel.DefaultTailLines
	MaxTailLines     = jobmodel.MaxTailLines
	DefaultLogBytes  = jobmodel.DefaultLogBytes
	MaxLogBytes      = jobmodel.MaxLogBytes
	// MaxGraceSeconds bounds cancel's grace between SIGTERM and SIGKILL (jobmodel.MaxGrace).
	MaxGraceSeconds     = jobmodel.MaxGraceSeconds
	DefaultGraceSeconds = jobmodel.DefaultGraceSeconds
)

// ValidID reports whether id is a well-formed remote job id (jobmodel.MachineJobID: rjob- and
// 16 hex digits): the server chooses it (so its record exists before the machine is asked), the
// machine checks it (it names a directory).
func ValidID(id string) bool { return jobmodel.MachineJobID.Valid(id) }

// StartRequest is what starts a job.
type StartRequest struct {
	// JobID is chosen by the server (rjob-<16 hex>); starting an id that exists returns that
	// job unchanged (a retried start after a lost reply starts nothing twice).
	JobID   string `json:"job_id"`
	Command string `json:"command"`
	// Shell is the dialect: sh | bash on POSIX, cmd | powershell on Windows; "" is the
	// platform's default.
	Shell string            `json:"shell,omitempty"`
	Env   map[string]string `json:"env,omitempty"`
	Cwd   string            `json:"cwd,omitempty"`
	// GPUIndex, if set, is exported to the job as CUDA_VISIBLE_DEVICES.
	GPUIndex *int `json:"gpu_index,omitempty"`
}

// Job is one job as the machine knows it.
type Job struct {
	JobID    string   `json:"job_id"`
	State    string   `json:"state"`
	Success  bool     `json:"success"`
	Message  string   `json:"message"`
	Command  string   `json:"command"`
	Shell    string   `json:"shell"`
	Cwd      string   `json:"cwd,omitempty"`
	EnvNames []string `json:"env_names,omitempty"`
	GPUIndex *int     `json:"gpu_index,omitempty"`
	// ExitCode is set for `exited` (a job killed by a signal other than SIGKILL has 128+signal).
	ExitCode *int `json:"exit_code,omitempty"`
	// Signal names the signal that ended it, if one did.
	Signal     string     `json:"signal,omitempty"`
	PID        int        `json:"pid,omitempty"`
	StartedAt  time.Time  `json:"started_at"`
	FinishedAt *time.Time `json:"finished_at,omitempty"`
	LogBytes   int64      `json:"log_bytes"`
}

// Ended reports whether the job's state is final.
func (j Job) Ended() bool { return j.State != StateRunning }

// List is a page of jobs, newest first.
type List struct {
	Jobs []Job `json:"jobs"`
	// Omitted counts the older jobs left out by the limit.
	Omitted int `json:"omitted"`
}

// LogsRequest selects part of a job's output: the last TailLines lines (default 200), or, with
// Offset set, MaxBytes bytes from it.
type LogsRequest = jobmodel.LogPage

// Logs is a slice of a job's output.
type Logs struct {
	JobID      string `json:"job_id"`
	Data       []byte `json:"data"` // base64 on the wire
	Offset     int64  `json:"offset"`
	NextOffset int64  `json:"next_offset"`
	TotalBytes int64  `json:"total_bytes"`
	State      string `json:"state"`
}
