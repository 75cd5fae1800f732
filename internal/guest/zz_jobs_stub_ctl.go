package guest

// TEMPORARY stub of the jobs contract (jobs-contract.txt) so that the control plane builds
// before the agent side is merged; deleted by the merge of branch jobsagent.

import (
	"context"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
)

type JobStartRequest struct {
	JobID string            `json:"job_id"`
	Argv  []string          `json:"argv"`
	Env   map[string]string `json:"env,omitempty"`
	Cwd   string            `json:"cwd,omitempty"`
	User  string            `json:"user,omitempty"`
}

type JobInfo struct {
	JobID        string     `json:"job_id"`
	Argv         []string   `json:"argv"`
	State        string     `json:"state"`
	ExitCode     *int       `json:"exit_code,omitempty"`
	Signal       string     `json:"signal,omitempty"`
	OOMKilled    bool       `json:"oom_killed,omitempty"`
	StartedAt    time.Time  `json:"started_at"`
	FinishedAt   *time.Time `json:"finished_at,omitempty"`
	LogBytes     int64      `json:"log_bytes"`
	LogTruncated bool       `json:"log_truncated,omitempty"`
}

type JobLogs struct {
	Data       []byte `json:"data"`
	Offset     int64  `json:"offset"`
	NextOffset int64  `json:"next_offset"`
	TotalBytes int64  `json:"total_bytes"`
	Truncated  bool   `json:"truncated"`
}

type JobLogsRequest struct {
	Stream      string
	Offset, Max int64
	TailLines   int
}

var errStub = errcode.New(errcode.UnsupportedOp, "jobs are not implemented by this agent (stub)")

func (c *Client) StartJob(ctx context.Context, req JobStartRequest) (JobInfo, error) {
	return JobInfo{}, errStub
}
func (c *Client) Jobs(ctx context.Context) ([]JobInfo, error)            { return nil, errStub }
func (c *Client) Job(ctx context.Context, id string) (JobInfo, error) { return JobInfo{}, errStub }
func (c *Client) JobLogs(ctx context.Context, id string, req JobLogsRequest) (JobLogs, error) {
	return JobLogs{}, errStub
}
func (c *Client) WaitJob(ctx context.Context, id string, timeout time.Duration) (JobInfo, error) {
	return JobInfo{}, errStub
}
func (c *Client) CancelJob(ctx context.Context, id string, grace time.Duration) (JobInfo, error) {
	return JobInfo{}, errStub
}
