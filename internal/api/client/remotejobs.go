package client

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/agentbox/agentbox/internal/remotejobs"
	"github.com/agentbox/agentbox/internal/wire"
)

// Remote jobs (issue 17).

// StartRemoteJob starts a detached job on a joined machine.
func (c *Client) StartRemoteJob(ctx context.Context, machine string, req remotejobs.StartRequest) (remotejobs.Job, error) {
	var j remotejobs.Job
	err := c.doJSON(ctx, http.MethodPost, wire.RemoteJobPath(machine, "", ""), nil, req, &j)
	return j, err
}

// ListRemoteJobs lists a machine's newest limit jobs.
func (c *Client) ListRemoteJobs(ctx context.Context, machine string, limit int) (remotejobs.List, error) {
	var l remotejobs.List
	q := url.Values{}
	if limit != 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	err := c.doJSON(ctx, http.MethodGet, wire.RemoteJobPath(machine, "", ""), q, nil, &l)
	return l, err
}

// RemoteJobStatus returns one job.
func (c *Client) RemoteJobStatus(ctx context.Context, machine, id string) (remotejobs.Job, error) {
	var j remotejobs.Job
	err := c.doJSON(ctx, http.MethodGet, wire.RemoteJobPath(machine, id, ""), nil, nil, &j)
	return j, err
}

// RemoteJobLogs reads part of a job's output.
func (c *Client) RemoteJobLogs(ctx context.Context, machine, id string, req remotejobs.LogsRequest) (remotejobs.Logs, error) {
	q := url.Values{}
	if req.TailLines != 0 {
		q.Set("tail_lines", strconv.Itoa(req.TailLines))
	}
	if req.Offset != nil {
		q.Set("offset_bytes", strconv.FormatInt(*req.Offset, 10))
	}
	if req.MaxBytes != 0 {
		q.Set("max_bytes", strconv.Itoa(req.MaxBytes))
	}
	var l remotejobs.Logs
	err := c.doJSON(ctx, http.MethodGet, wire.RemoteJobPath(machine, id, "/logs"), q, nil, &l)
	return l, err
}

// CancelRemoteJob ends a job's whole tree.
func (c *Client) CancelRemoteJob(ctx context.Context, machine, id string, grace time.Duration) (remotejobs.Job, error) {
	g := int(grace / time.Second)
	var j remotejobs.Job
	err := c.doJSON(ctx, http.MethodPost, wire.RemoteJobPath(machine, id, "/cancel"), nil, wire.RemoteJobCancelRequest{GraceSeconds: &g}, &j)
	return j, err
}
