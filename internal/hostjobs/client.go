package hostjobs

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/jobmodel"
	"github.com/agentbox/agentbox/internal/peerreply"
	"github.com/agentbox/agentbox/internal/text"
)

// Client calls a machine's job handler. Nothing a machine replies is trusted: every reply is
// bounded and checked before it is returned.
type Client struct {
	hc   *http.Client
	base string
}

// NewClient returns a Client over hc; base is the machine's base URL ("http://machine" over a
// machine's connection, whose host part the transport ignores).
func NewClient(hc *http.Client, base string) *Client { return &Client{hc: hc, base: base} }

// Reply bounds.
const (
	maxJobReply  = MaxCommandBytes + 64<<10
	maxListReply = 8 << 20
	maxLogsReply = MaxLogBytes*4/3 + 64<<10
	// maxMessage bounds a job's message.
	maxMessage = 4096
)

// The error codes the job handler returns, by endpoint (any other is INTERNAL, marked as the
// machine's).
var (
	startCodes = []errcode.Code{errcode.InvalidArgument, errcode.JobLimitExceeded, errcode.Internal}
	listCodes  = []errcode.Code{errcode.InvalidArgument, errcode.Internal}
	jobCodes   = []errcode.Code{errcode.InvalidArgument, errcode.JobNotFound, errcode.Internal}
)

// Start starts a job (idempotent on req.JobID).
func (c *Client) Start(ctx context.Context, req StartRequest) (Job, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return Job{}, err
	}
	var j Job
	if err := c.do(ctx, http.MethodPost, "/jobs/", body, maxJobReply, &j, startCodes); err != nil {
		return Job{}, err
	}
	return j, checkJob(&j, req.JobID)
}

// Status returns one job.
func (c *Client) Status(ctx context.Context, id string) (Job, error) {
	if !ValidID(id) {
		return Job{}, notFound(id)
	}
	var j Job
	if err := c.do(ctx, http.MethodGet, "/jobs/"+id, nil, maxJobReply, &j, jobCodes); err != nil {
		return Job{}, err
	}
	return j, checkJob(&j, id)
}

// List returns the machine's newest limit jobs.
func (c *Client) List(ctx context.Context, limit int) (List, error) {
	var l List
	if err := c.do(ctx, http.MethodGet, "/jobs/?limit="+strconv.Itoa(limit), nil, maxListReply, &l, listCodes); err != nil {
		return List{}, err
	}
	if len(l.Jobs) > limit || l.Omitted < 0 || l.Omitted > 1<<30 {
		return List{}, badReply("a list of %d jobs (limit %d, omitted %d)", len(l.Jobs), limit, l.Omitted)
	}
	for i := range l.Jobs {
		if err := checkJob(&l.Jobs[i], ""); err != nil {
			return List{}, err
		}
	}
	return l, nil
}

// Logs reads part of a job's output.
func (c *Client) Logs(ctx context.Context, id string, req LogsRequest) (Logs, error) {
	if !ValidID(id) {
		return Logs{}, notFound(id)
	}
	if err := req.Check(); err != nil {
		return Logs{}, err
	}
	q := url.Values{}
	if req.Offset != nil {
		q.Set("offset_bytes", strconv.FormatInt(*req.Offset, 10))
		q.Set("max_bytes", strconv.Itoa(req.MaxBytes))
	} else {
		q.Set("tail_lines", strconv.Itoa(req.TailLines))
	}
	var l Logs
	if err := c.do(ctx, http.MethodGet, "/jobs/"+id+"/logs?"+q.Encode(), nil, maxLogsReply, &l, jobCodes); err != nil {
		return Logs{}, err
	}
	if l.JobID != id || !validState(l.State) {
		return Logs{}, badReply("logs of job %q in state %q", text.Truncate(l.JobID, 64), text.Truncate(l.State, 64))
	}
	if err := jobmodel.CheckSlice(jobmodel.Slice{Offset: l.Offset, NextOffset: l.NextOffset, TotalBytes: l.TotalBytes}, len(l.Data), req.MaxBytes, req.Offset); err != nil {
		return Logs{}, badReply("%v", err)
	}
	return l, nil
}

// Cancel ends a job's whole tree (SIGTERM, SIGKILL after grace).
func (c *Client) Cancel(ctx context.Context, id string, grace time.Duration) (Job, error) {
	if !ValidID(id) {
		return Job{}, notFound(id)
	}
	var j Job
	path := "/jobs/" + id + "/cancel?grace_seconds=" + strconv.Itoa(int(grace/time.Second))
	if err := c.do(ctx, http.MethodPost, path, nil, maxJobReply, &j, jobCodes); err != nil {
		return Job{}, err
	}
	return j, checkJob(&j, id)
}

func (c *Client) do(ctx context.Context, method, path string, body []byte, limit int64, out any, codes []errcode.Code) error {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return peerreply.Machine.ReadError(resp, "remote jobs", codes...)
	}
	dec := json.NewDecoder(io.LimitReader(resp.Body, limit))
	if err := dec.Decode(out); err != nil {
		return badReply("%v", err)
	}
	return nil
}

func badReply(f string, a ...any) error {
	return peerreply.Machine.Malformedf("remote jobs", f, a...)
}

func validState(s string) bool {
	return s == StateRunning || s == StateExited || s == StateCanceled || s == StateUnknown
}

// checkJob checks one job of a reply (want: the id asked for, if one was) and cleans the
// machine's own words in it (its message), which reach MCP clients as they are.
func checkJob(j *Job, want string) error {
	switch {
	case !ValidID(j.JobID) || (want != "" && j.JobID != want):
		return badReply("job id %q", text.Truncate(j.JobID, 64))
	case !validState(j.State):
		return badReply("state %q", text.Truncate(j.State, 64))
	case j.Success && (j.State != StateExited || j.ExitCode == nil || *j.ExitCode != 0):
		return badReply("success for a job %s", j.State)
	case len(j.Command) > MaxCommandBytes+4, len(j.Message) > maxMessage, len(j.Shell) > 16,
		len(j.Cwd) > MaxCwdBytes, len(j.Signal) > 32, len(j.EnvNames) > MaxEnv:
		return badReply("job %s has fields beyond their bounds", j.JobID)
	case j.GPUIndex != nil && (*j.GPUIndex < 0 || *j.GPUIndex > MaxGPUIndex):
		return badReply("gpu_index %d", *j.GPUIndex)
	case j.LogBytes < 0 || j.PID < 0:
		return badReply("negative log_bytes or pid")
	}
	for _, n := range j.EnvNames {
		if !validEnvName(n) {
			return badReply("env name %q", text.Truncate(n, 64))
		}
	}
	j.Message = text.Clean(j.Message, maxMessage)
	return nil
}
