package wire

import "time"

// The requests and replies of jobs on joined machines (/v1/machines/{ref}/jobs).

// RemoteJobStart is the body of POST /v1/machines/{ref}/jobs.
type RemoteJobStart struct {
	Command string            `json:"command"`
	Shell   string            `json:"shell,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
	Cwd     string            `json:"cwd,omitempty"`
	// GPUIndex reserves one of the machine's GPUs for the job.
	GPUIndex *int `json:"gpu_index,omitempty"`
}

// RemoteJob is a job on a joined machine as replies carry it (the names of its environment
// variables, never their values).
type RemoteJob struct {
	JobID      string     `json:"job_id"`
	MachineID  string     `json:"machine_id"`
	State      string     `json:"state"`
	Success    bool       `json:"success"`
	Message    string     `json:"message"`
	Command    string     `json:"command"`
	Shell      string     `json:"shell"`
	Cwd        string     `json:"cwd,omitempty"`
	EnvNames   []string   `json:"env_names,omitempty"`
	GPUIndex   *int       `json:"gpu_index,omitempty"`
	ExitCode   *int       `json:"exit_code,omitempty"`
	Signal     string     `json:"signal,omitempty"`
	PID        int        `json:"pid,omitempty"`
	StartedAt  time.Time  `json:"started_at"`
	FinishedAt *time.Time `json:"finished_at,omitempty"`
	LogBytes   int64      `json:"log_bytes"`
	Owner      string     `json:"owner,omitempty"`
}

// RemoteJobList is the reply of GET /v1/machines/{ref}/jobs: the newest jobs, and how many
// older ones the limit left out.
type RemoteJobList struct {
	Jobs    []RemoteJob `json:"jobs"`
	Omitted int         `json:"omitted"`
}

// RemoteJobLogs is the reply of GET /v1/machines/{ref}/jobs/{job_id}/logs: a page of output.
type RemoteJobLogs struct {
	JobID      string `json:"job_id"`
	Data       []byte `json:"data"` // base64 on the wire
	Offset     int64  `json:"offset"`
	NextOffset int64  `json:"next_offset"`
	TotalBytes int64  `json:"total_bytes"`
	State      string `json:"state"`
}

// RemoteJobLogsRequest is the query of GET /v1/machines/{ref}/jobs/{job_id}/logs: the last
// TailLines lines, or MaxBytes from Offset (zero values: the server's defaults).
type RemoteJobLogsRequest struct {
	Offset    *int64
	MaxBytes  int
	TailLines int
}
