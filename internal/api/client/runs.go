package client

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/wire"
)

// Durable runs: /v1/runs and /v1/batches.

// runPath is /v1/runs/{id}{rest}, refusing an empty id or one with a slash.
func runPath(kind, id, rest string) (string, error) {
	if id == "" || strings.ContainsAny(id, "/?#") || len(id) > 128 {
		if len(id) > 64 {
			id = id[:64] + "…"
		}
		what := "run_id"
		if kind == "batches" {
			what = "batch_id"
		}
		return "", errcode.New(errcode.InvalidArgument, "%s %q is malformed: give the id a start or list returned", what, id)
	}
	return "/v1/" + kind + "/" + url.PathEscape(id) + rest, nil
}

func waitOpts(wait time.Duration) wire.WaitOptions {
	if wait <= 0 {
		return wire.WaitOptions{}
	}
	return wire.WaitOptions{Wait: true, WaitSeconds: max(1, int64(wait.Round(time.Second)/time.Second))}
}

// StartRun records a run and returns it at once (POST /v1/runs).
func (c *Client) StartRun(ctx context.Context, spec wire.RunSpec) (wire.Run, error) {
	return c.WaitRun(ctx, spec, 0)
}

// WaitRun records a run and waits up to wait (at most the server's bound, runs.MaxWait) for it to settle; the reply
// is the run as it is then. wait 0 returns at once.
func (c *Client) WaitRun(ctx context.Context, spec wire.RunSpec, wait time.Duration) (wire.Run, error) {
	var r wire.Run
	err := c.doJSON(ctx, http.MethodPost, "/v1/runs", nil, wire.RunRequest{RunSpec: spec, WaitOptions: waitOpts(wait)}, &r)
	return r, err
}

// GetRun returns a run's record.
func (c *Client) GetRun(ctx context.Context, id string) (wire.Run, error) {
	p, err := runPath("runs", id, "")
	if err != nil {
		return wire.Run{}, err
	}
	var r wire.Run
	err = c.doJSON(ctx, http.MethodGet, p, nil, nil, &r)
	return r, err
}

// ListRuns pages runs, newest first.
func (c *Client) ListRuns(ctx context.Context, f wire.RunFilter) (wire.RunList, error) {
	q := url.Values{}
	var states []string
	for _, s := range f.States {
		states = append(states, string(s))
	}
	if len(states) > 0 {
		q.Set("state", strings.Join(states, ","))
	}
	if f.BatchID != "" {
		q.Set("batch_id", f.BatchID)
	}
	for k, v := range f.Labels {
		q.Add("label", k+"="+v)
	}
	if f.Before != "" {
		q.Set("before", f.Before)
	}
	if f.Limit != 0 {
		q.Set("limit", strconv.Itoa(f.Limit))
	}
	var l wire.RunList
	err := c.doJSON(ctx, http.MethodGet, "/v1/runs", q, nil, &l)
	return l, err
}

// CancelRun asks for a run's end.
func (c *Client) CancelRun(ctx context.Context, id string) (wire.Run, error) {
	p, err := runPath("runs", id, "/cancel")
	if err != nil {
		return wire.Run{}, err
	}
	var r wire.Run
	err = c.doJSON(ctx, http.MethodPost, p, nil, nil, &r)
	return r, err
}

// RunEvents pages a run's events after seq (limit 0: the server's default).
func (c *Client) RunEvents(ctx context.Context, id string, after int64, limit int) (wire.RunEventList, error) {
	p, err := runPath("runs", id, "/events")
	if err != nil {
		return wire.RunEventList{}, err
	}
	q := url.Values{}
	if after > 0 {
		q.Set("after", strconv.FormatInt(after, 10))
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	var l wire.RunEventList
	err = c.doJSON(ctx, http.MethodGet, p, q, nil, &l)
	return l, err
}

// RunLogs reads a slice of one phase's output.
func (c *Client) RunLogs(ctx context.Context, id string, req wire.RunLogsRequest) (wire.RunLogs, error) {
	p, err := runPath("runs", id, "/logs")
	if err != nil {
		return wire.RunLogs{}, err
	}
	q := url.Values{}
	if req.Phase != "" {
		q.Set("phase", req.Phase)
	}
	if req.Stream != "" {
		q.Set("stream", req.Stream)
	}
	if req.Offset > 0 {
		q.Set("offset", strconv.FormatInt(req.Offset, 10))
	}
	if req.MaxBytes > 0 {
		q.Set("max_bytes", strconv.FormatInt(req.MaxBytes, 10))
	}
	var l wire.RunLogs
	err = c.doJSON(ctx, http.MethodGet, p, q, nil, &l)
	return l, err
}

// DownloadArtifact opens a run's artifact (with the bearer token) and returns its body and size.
func (c *Client) DownloadArtifact(ctx context.Context, id, path string) (io.ReadCloser, int64, error) {
	if path == "" {
		return nil, 0, errcode.New(errcode.InvalidArgument, "path is required: an artifact's path as the run record lists it")
	}
	p, err := runPath("runs", id, "/artifacts/")
	if err != nil {
		return nil, 0, err
	}
	segs := strings.Split(strings.TrimLeft(path, "/"), "/")
	for i, s := range segs {
		segs[i] = url.PathEscape(s)
	}
	resp, err := c.do(ctx, http.MethodGet, p+strings.Join(segs, "/"), nil, nil, "")
	if err != nil {
		return nil, 0, err
	}
	return resp.Body, resp.ContentLength, nil
}

// StartBatch records a batch (POST /v1/batches); wait > 0 waits for it to settle.
func (c *Client) StartBatch(ctx context.Context, req wire.BatchRequest, wait time.Duration) (wire.Batch, error) {
	var b wire.Batch
	err := c.doJSON(ctx, http.MethodPost, "/v1/batches", nil, wire.BatchStartRequest{BatchRequest: req, WaitOptions: waitOpts(wait)}, &b)
	return b, err
}

// StartMatrix expands and records a matrix (POST /v1/batches/matrix).
func (c *Client) StartMatrix(ctx context.Context, req wire.MatrixRequest, wait time.Duration) (wire.Batch, error) {
	var b wire.Batch
	err := c.doJSON(ctx, http.MethodPost, "/v1/batches/matrix", nil, wire.MatrixStartRequest{MatrixRequest: req, WaitOptions: waitOpts(wait)}, &b)
	return b, err
}

// AgentCompare records an agent comparison (POST /v1/batches/agent-compare).
func (c *Client) AgentCompare(ctx context.Context, req wire.CompareRequest, wait time.Duration) (wire.Batch, error) {
	var b wire.Batch
	err := c.doJSON(ctx, http.MethodPost, "/v1/batches/agent-compare", nil, wire.CompareStartRequest{CompareRequest: req, WaitOptions: waitOpts(wait)}, &b)
	return b, err
}

// AgentTest records a single-side agent test (POST /v1/batches/agent-test).
func (c *Client) AgentTest(ctx context.Context, req wire.CompareRequest, wait time.Duration) (wire.Batch, error) {
	var b wire.Batch
	err := c.doJSON(ctx, http.MethodPost, "/v1/batches/agent-test", nil, wire.CompareStartRequest{CompareRequest: req, WaitOptions: waitOpts(wait)}, &b)
	return b, err
}

// GetBatch returns a batch's record.
func (c *Client) GetBatch(ctx context.Context, id string) (wire.Batch, error) {
	p, err := runPath("batches", id, "")
	if err != nil {
		return wire.Batch{}, err
	}
	var b wire.Batch
	err = c.doJSON(ctx, http.MethodGet, p, nil, nil, &b)
	return b, err
}

// ListBatches pages batches, newest first.
func (c *Client) ListBatches(ctx context.Context, before string, limit int) (wire.BatchList, error) {
	q := url.Values{}
	if before != "" {
		q.Set("before", before)
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	var l wire.BatchList
	err := c.doJSON(ctx, http.MethodGet, "/v1/batches", q, nil, &l)
	return l, err
}

// CancelBatch cancels every unsettled run of a batch.
func (c *Client) CancelBatch(ctx context.Context, id string) (wire.Batch, error) {
	p, err := runPath("batches", id, "/cancel")
	if err != nil {
		return wire.Batch{}, err
	}
	var b wire.Batch
	err = c.doJSON(ctx, http.MethodPost, p, nil, nil, &b)
	return b, err
}
