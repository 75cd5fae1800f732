package guest

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/agentbox/agentbox/internal/jobmodel"
	"github.com/agentbox/agentbox/internal/text"
)

// Detached jobs: commands the agent runs apart from any request. The agent owns each job: it
// keeps running when the caller hangs up, until its own end, a cancel, or the sandbox's end.
// Its output goes, as it is written, to files on the sandbox's own disk (so it counts against
// the sandbox's disk), under JobsDir/<job_id>/: "output" (stdout and stderr interleaved as
// written), "stdout", "stderr", and "exit.json" (the final JobInfo, written atomically) once it
// ended. A write error (a full disk) stops the logging, never the job: its pipes are still
// drained, and its info says log_truncated.

// Bounds and defaults of the jobs protocol.
const (
	// DefaultJobsDir is where the agent keeps its jobs' output (root only, on the sandbox's disk).
	DefaultJobsDir = "/.agentbox/run/jobs"
	// MaxRunningJobs is how many jobs may run at once in one sandbox (JOB_LIMIT_EXCEEDED past it).
	MaxRunningJobs = 64
	// MaxJobList is how many jobs GET /v1/jobs returns at most, newest first.
	MaxJobList = 1000
	// MaxJobArgvBytes bounds a job's argv: the sum of its arguments' lengths, plus one per
	// argument (a longer script goes in a file).
	MaxJobArgvBytes = 64 << 10
	// MaxJobLogBytes is the largest slice of a log one read returns (and its default).
	MaxJobLogBytes = jobmodel.MaxLogBytes
	// MaxJobTailLines is the most lines tail_lines may ask for.
	MaxJobTailLines = jobmodel.MaxTailLines
	// MaxJobWait is the longest a wait may hold the request.
	MaxJobWait = time.Hour
	// MaxJobLogWait is the longest a log read may wait for output (wait_ms): the long poll a
	// follower of the log (the host's watch streams) re-arms.
	MaxJobLogWait = 30 * time.Second
	// DefaultJobCancelGrace is the time between SIGTERM and SIGKILL when a cancel gives none;
	// MaxJobCancelGrace is the most it may give.
	DefaultJobCancelGrace = jobmodel.DefaultGrace
	MaxJobCancelGrace     = jobmodel.MaxGrace
)

// Job states: those of jobmodel an agent reports (the host adds starting, failed and unknown).
const (
	JobRunning  = string(jobmodel.Running)
	JobExited   = string(jobmodel.Exited)
	JobKilled   = string(jobmodel.Killed)
	JobCanceled = string(jobmodel.Canceled)
)

// Job log streams.
const (
	JobStreamAll    = "all"
	JobStreamStdout = "stdout"
	JobStreamStderr = "stderr"
)

// JobStartRequest starts a detached job. Argv, Env, Cwd and User are as ExecRequest's.
type JobStartRequest struct {
	// JobID is assigned by the host: "job-" and 12 lowercase hex digits.
	JobID string            `json:"job_id"`
	Argv  []string          `json:"argv"`
	Env   map[string]string `json:"env,omitempty"`
	Cwd   string            `json:"cwd,omitempty"`
	User  string            `json:"user,omitempty"`
}

// JobInfo is a job's status.
type JobInfo struct {
	JobID string   `json:"job_id"`
	Argv  []string `json:"argv"`
	// State is running, exited (ExitCode), killed (Signal, and OOMKilled when the sandbox's
	// memory limit did it) or canceled (a cancel ended it; ExitCode or Signal say how it died).
	State      string     `json:"state"`
	ExitCode   *int       `json:"exit_code,omitempty"`
	Signal     string     `json:"signal,omitempty"`
	OOMKilled  bool       `json:"oom_killed,omitempty"`
	StartedAt  time.Time  `json:"started_at"`
	FinishedAt *time.Time `json:"finished_at,omitempty"`
	// LogBytes is the size of the interleaved output so far.
	LogBytes int64 `json:"log_bytes"`
	// LogTruncated: writing the output failed (the disk is full); the job ran on, unlogged.
	LogTruncated bool `json:"log_truncated,omitempty"`
	// CPUSeconds is the job's CPU time, user + system, in seconds: while it runs, the sum over
	// its live processes (its process group and exec tag, as a cancel finds them) of their own
	// and their waited-for children's times from /proc/<pid>/stat; once it ended, the rusage
	// of its main process and the descendants it waited for (wait4), or the last sample if
	// that was more.
	CPUSeconds float64 `json:"cpu_seconds,omitempty"`
}

// JobList is the reply of GET /v1/jobs: at most MaxJobList jobs, newest first.
type JobList struct {
	Jobs []JobInfo `json:"jobs"`
}

// JobLogs is a slice of a job's log: Data is the bytes from Offset to NextOffset (base64 on the
// wire) of a log of TotalBytes so far.
type JobLogs struct {
	Data       []byte `json:"data"`
	Offset     int64  `json:"offset"`
	NextOffset int64  `json:"next_offset"`
	TotalBytes int64  `json:"total_bytes"`
	// Truncated: the log stopped being written (the disk is full); the job ran on.
	Truncated bool `json:"truncated"`
	// State is the job's state (JobRunning, JobExited, …) read before the data: an ended state
	// means the log is complete (it ends at TotalBytes). An agent older than log long polls
	// leaves it empty (and never waits: it ignores wait_ms).
	State string `json:"state,omitempty"`
}

// JobLogsRequest selects a slice of a job's log: Stream is "all" (the default: stdout and
// stderr interleaved), "stdout" or "stderr"; then either TailLines (1..MaxJobTailLines: the
// last lines, at most Max bytes of them, the end kept) or Offset (≥ 0) and Max (1..MaxJobLogBytes;
// 0: MaxJobLogBytes).
//
// Wait (0..MaxJobLogWait, whole milliseconds; with Offset, not TailLines) makes the read a long
// poll: when the log holds nothing past Offset and the job runs, the agent holds the request
// until the job writes more, the job ends, Wait passes (then the reply is empty), or the caller
// goes.
type JobLogsRequest struct {
	Stream    string
	Offset    int64
	Max       int64
	TailLines int
	Wait      time.Duration
}

// JobCancelRequest is the body of POST /v1/jobs/{id}/cancel; GraceMs nil is the default.
type JobCancelRequest struct {
	GraceMs *int64 `json:"grace_ms,omitempty"`
}

// ValidJobID reports whether id has the form the host assigns (jobmodel.SandboxJobID): "job-"
// and 12 lowercase hex digits.
func ValidJobID(id string) error { return jobmodel.SandboxJobID.Check(id) }

// argvBytes is the size of argv as MaxJobArgvBytes counts it.
func argvBytes(argv []string) int {
	n := 0
	for _, a := range argv {
		n += len(a) + 1
	}
	return n
}

// validJobInfo checks an agent's JobInfo.
func validJobInfo(j *JobInfo) error {
	if err := ValidJobID(j.JobID); err != nil {
		return err
	}
	if len(j.Argv) == 0 || len(j.Argv) > MaxJobArgs || argvBytes(j.Argv) > MaxJobArgvBytes {
		return errors.New("argv empty or over its bound")
	}
	switch j.State {
	case JobRunning:
		if j.FinishedAt != nil || j.ExitCode != nil || j.Signal != "" {
			return errors.New("a running job with an end")
		}
	case JobExited, JobKilled, JobCanceled:
		if j.FinishedAt == nil {
			return fmt.Errorf("a %s job without finished_at", j.State)
		}
	default:
		return fmt.Errorf("unknown job state %q", text.Clean(j.State, 32))
	}
	if j.LogBytes < 0 {
		return errors.New("negative log_bytes")
	}
	if !(j.CPUSeconds >= 0 && j.CPUSeconds < 1e12) { // NaN fails too
		return fmt.Errorf("cpu_seconds %g out of range", j.CPUSeconds)
	}
	if len(j.Signal) > 16 || strings.IndexFunc(j.Signal, func(c rune) bool { return (c < 'A' || c > 'Z') && (c < '0' || c > '9') && c != '+' }) >= 0 {
		return fmt.Errorf("bad signal name %q", text.Clean(j.Signal, 32))
	}
	return nil
}
