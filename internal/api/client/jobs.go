package client

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/jobmodel"
	"github.com/agentbox/agentbox/internal/sandboxid"
	"github.com/agentbox/agentbox/internal/wire"
)

func jobPath(id, jobID, rest string) (string, error) {
	if err := sandboxid.Check(id); err != nil {
		return "", err
	}
	if jobID != "" && !jobmodel.SandboxJobID.Valid(jobID) {
		if len(jobID) > 64 {
			jobID = jobID[:64] + "…"
		}
		return "", errcode.New(errcode.InvalidArgument, "job_id %q is malformed: job ids look like job-0123456789ab (from job_start or job_list)", jobID)
	}
	p := "/v1/sandboxes/" + url.PathEscape(id) + "/jobs"
	if jobID != "" {
		p += "/" + url.PathEscape(jobID)
	}
	return p + rest, nil
}

// StartJob starts a detached job (POST /v1/sandboxes/{id}/jobs; the body as exec's).
func (c *Client) StartJob(ctx context.Context, id string, req wire.ExecRequest) (wire.Job, error) {
	p, err := jobPath(id, "", "")
	if err != nil {
		return wire.Job{}, err
	}
	var j wire.Job
	err = c.doJSON(ctx, http.MethodPost, p, nil, req, &j)
	return j, err
}

// ListJobs lists a sandbox's jobs, newest first; limit 0 takes the server's default (20).
func (c *Client) ListJobs(ctx context.Context, id string, limit int) (wire.JobList, error) {
	p, err := jobPath(id, "", "")
	if err != nil {
		return wire.JobList{}, err
	}
	q := url.Values{}
	if limit != 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	var l wire.JobList
	err = c.doJSON(ctx, http.MethodGet, p, q, nil, &l)
	return l, err
}

// JobStatus returns a job's status.
func (c *Client) JobStatus(ctx context.Context, id, jobID string) (wire.Job, error) {
	p, err := jobPath(id, jobID, "")
	if err != nil {
		return wire.Job{}, err
	}
	var j wire.Job
	err = c.doJSON(ctx, http.MethodGet, p, nil, nil, &j)
	return j, err
}

// JobLogs reads a slice of a job's output.
func (c *Client) JobLogs(ctx context.Context, id, jobID string, req wire.JobLogsRequest) (wire.JobLogs, error) {
	p, err := jobPath(id, jobID, "/logs")
	if err != nil {
		return wire.JobLogs{}, err
	}
	q := url.Values{}
	if req.Stream != "" {
		q.Set("stream", req.Stream)
	}
	if req.Offset != nil {
		q.Set("offset", strconv.FormatInt(*req.Offset, 10))
	}
	if req.MaxBytes != nil {
		q.Set("max_bytes", strconv.FormatInt(*req.MaxBytes, 10))
	}
	if req.TailLines != nil {
		q.Set("tail_lines", strconv.Itoa(*req.TailLines))
	}
	var l wire.JobLogs
	err = c.doJSON(ctx, http.MethodGet, p, q, nil, &l)
	return l, err
}

// WaitJob waits up to timeout (whole seconds, 0..3600) for a job to end.
func (c *Client) WaitJob(ctx context.Context, id, jobID string, timeout time.Duration) (wire.Job, error) {
	p, err := jobPath(id, jobID, "/wait")
	if err != nil {
		return wire.Job{}, err
	}
	q := url.Values{"timeout_seconds": {strconv.FormatInt(int64(timeout/time.Second), 10)}}
	var j wire.Job
	err = c.doJSON(ctx, http.MethodGet, p, q, nil, &j)
	return j, err
}

// CancelJob cancels a job; grace nil takes the default (10 s).
func (c *Client) CancelJob(ctx context.Context, id, jobID string, grace *time.Duration) (wire.Job, error) {
	p, err := jobPath(id, jobID, "/cancel")
	if err != nil {
		return wire.Job{}, err
	}
	var body wire.JobCancelRequest
	if grace != nil {
		g := grace.Seconds()
		body.GraceSeconds = &g
	}
	var j wire.Job
	err = c.doJSON(ctx, http.MethodPost, p, nil, body, &j)
	return j, err
}
