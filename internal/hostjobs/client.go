package hostjobs

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/agentbox/agentbox/internal/errcode"
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
	maxErrReply  = 64 << 10
)

// Start starts a job (idempotent on req.JobID).
func (c *Client) Start(ctx context.Context, req StartRequest) (Job, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return Job{}, err
	}
	var j Job
	if err := c.do(ctx, http.MethodPost, "/jobs/", body, maxJobReply, &j); err != nil {
		return Job{}, err
	}
	return j, checkJob(j, req.JobID)
}

// Status returns one job.
func (c *Client) Status(ctx context.Context, id string) (Job, error) {
	if !ValidID(id) {
		return Job{}, notFound(id)
	}
	var j Job
	if err := c.do(ctx, http.MethodGet, "/jobs/"+id, nil, maxJobReply, &j); err != nil {
		return Job{}, err
	}
	return j, checkJob(j, id)
}

// List returns the machine's newest limit jobs.
func (c *Client) List(ctx context.Context, limit int) (List, error) {
	var l List
	if err := c.do(ctx, http.MethodGet, "/jobs/?limit="+strconv.Itoa(limit), nil, maxListReply, &l); err != nil {
		return List{}, err
	}
	if len(l.Jobs) > limit || l.Omitted < 0 || l.Omitted > 1<<30 {
		return List{}, badReply("a list of %d jobs (limit %d, omitted %d)", len(l.Jobs), limit, l.Omitted)
	}
	for _, j := range l.Jobs {
		if err := checkJob(j, ""); err != nil {
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
	if err := checkLogs(&req); err != nil {
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
	if err := c.do(ctx, http.MethodGet, "/jobs/"+id+"/logs?"+q.Encode(), nil, maxLogsReply, &l); err != nil {
		return Logs{}, err
	}
	switch {
	case l.JobID != id || !validState(l.State):
		return Logs{}, badReply("logs of job %q in state %q", bound(l.JobID, 64), bound(l.State, 64))
	case len(l.Data) > req.MaxBytes, l.Offset < 0, l.TotalBytes < 0, l.Offset > l.TotalBytes,
		l.NextOffset != l.Offset+int64(len(l.Data)), l.NextOffset > l.TotalBytes:
		return Logs{}, badReply("a log slice of %d bytes at %d–%d of %d", len(l.Data), l.Offset, l.NextOffset, l.TotalBytes)
	case req.Offset != nil && l.Offset != min(*req.Offset, l.TotalBytes):
		return Logs{}, badReply("a log slice at %d for offset %d", l.Offset, *req.Offset)
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
	if err := c.do(ctx, http.MethodPost, path, nil, maxJobReply, &j); err != nil {
		return Job{}, err
	}
	return j, checkJob(j, id)
}

func (c *Client) do(ctx context.Context, method, path string, body []byte, limit int64, out any) error {
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
		var we wireError
		b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrReply))
		if json.Unmarshal(b, &we) != nil || !slices.Contains(errcode.Codes, we.Error.Code) {
			return badReply("HTTP %d", resp.StatusCode)
		}
		e := errcode.New(we.Error.Code, "%s", cleanText(we.Error.Message, 2048))
		for k, v := range we.Error.Details {
			if len(e.Details) < 8 && len(k) <= 64 && utf8.ValidString(k) {
				if s, ok := v.(string); ok {
					v = cleanText(s, 256)
				} else if _, ok := v.(float64); !ok {
					if _, ok := v.(bool); !ok {
						continue
					}
				}
				e.With(k, v)
			}
		}
		return e
	}
	dec := json.NewDecoder(io.LimitReader(resp.Body, limit))
	if err := dec.Decode(out); err != nil {
		return badReply("%v", err)
	}
	return nil
}

func badReply(f string, a ...any) error {
	return errcode.New(errcode.Internal, "the machine's agent sent a bad jobs reply: %s", fmt.Sprintf(f, a...))
}

func cleanText(s string, n int) string {
	return bound(string(bytes.ToValidUTF8([]byte(s), []byte("\uFFFD"))), n)
}

func validState(s string) bool {
	return s == StateRunning || s == StateExited || s == StateCanceled || s == StateUnknown
}

// checkJob checks one job of a reply (want: the id asked for, if one was).
func checkJob(j Job, want string) error {
	switch {
	case !ValidID(j.JobID) || (want != "" && j.JobID != want):
		return badReply("job id %q", bound(j.JobID, 64))
	case !validState(j.State):
		return badReply("state %q", bound(j.State, 64))
	case j.Success && (j.State != StateExited || j.ExitCode == nil || *j.ExitCode != 0):
		return badReply("success for a job %s", j.State)
	case len(j.Command) > MaxCommandBytes+4, len(j.Message) > 4096, len(j.Shell) > 16,
		len(j.Cwd) > MaxCwdBytes, len(j.Signal) > 32, len(j.EnvNames) > MaxEnv:
		return badReply("job %s has fields beyond their bounds", j.JobID)
	case j.GPUIndex != nil && (*j.GPUIndex < 0 || *j.GPUIndex > MaxGPUIndex):
		return badReply("gpu_index %d", *j.GPUIndex)
	case j.LogBytes < 0 || j.PID < 0:
		return badReply("negative log_bytes or pid")
	}
	for _, n := range j.EnvNames {
		if !validEnvName(n) {
			return badReply("env name %q", bound(n, 64))
		}
	}
	return nil
}
