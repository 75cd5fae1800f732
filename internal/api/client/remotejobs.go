package client

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/agentbox/agentbox/internal/wire"
)

// Remote jobs.

// StartRemoteJob starts a detached job on a joined machine.
func (c *Client) StartRemoteJob(ctx context.Context, machine string, req wire.RemoteJobStart) (wire.RemoteJob, error) {
	var j wire.RemoteJob
	err := c.doJSON(ctx, http.MethodPost, wire.RemoteJobPath(machine, "", ""), nil, req, &j)
	return j, err
}

// ListRemoteJobs lists a machine's newest limit jobs.
func (c *Client) ListRemoteJobs(ctx context.Context, machine string, limit int) (wire.RemoteJobList, error) {
	var l wire.RemoteJobList
	q := url.Values{}
	if limit != 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	err := c.doJSON(ctx, http.MethodGet, wire.RemoteJobPath(machine, "", ""), q, nil, &l)
	return l, err
}

// RemoteJobStatus returns one job.
func (c *Client) RemoteJobStatus(ctx context.Context, machine, id string) (wire.RemoteJob, error) {
	var j wire.RemoteJob
	err := c.doJSON(ctx, http.MethodGet, wire.RemoteJobPath(machine, id, ""), nil, nil, &j)
	return j, err
}

// RemoteJobLogs reads part of a job's output.
func (c *Client) RemoteJobLogs(ctx context.Context, machine, id string, req wire.RemoteJobLogsRequest) (wire.RemoteJobLogs, error) {
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
	var l wire.RemoteJobLogs
	err := c.doJSON(ctx, http.MethodGet, wire.RemoteJobPath(machine, id, "/logs"), q, nil, &l)
	return l, err
}

// CancelRemoteJob ends a job's whole tree.
func (c *Client) CancelRemoteJob(ctx context.Context, machine, id string, grace time.Duration) (wire.RemoteJob, error) {
	g := int(grace / time.Second)
	var j wire.RemoteJob
	err := c.doJSON(ctx, http.MethodPost, wire.RemoteJobPath(machine, id, "/cancel"), nil, wire.RemoteJobCancelRequest{GraceSeconds: &g}, &j)
	return j, err
}
