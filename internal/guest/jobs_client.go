package guest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/jobmodel"
	"github.com/agentbox/agentbox/internal/text"
)

// Bounds of the jobs replies (see reply.go for the reasoning).
const (
	// MaxJobArgs bounds how many arguments a job's argv has.
	MaxJobArgs = 4096
	// maxJobInfoReply bounds one JobInfo: its argv escaped (each byte at most jsonGrowth, each
	// argument's quotes and comma within the one byte MaxJobArgvBytes counts per argument).
	maxJobInfoReply = jsonGrowth*MaxJobArgvBytes + replySlack
	// maxJobLogsReply bounds a slice of a log: MaxJobLogBytes in base64.
	maxJobLogsReply = (MaxJobLogBytes+2)/3*4 + replySlack
)

func jobPath(id string, rest string) (string, error) {
	if err := ValidJobID(id); err != nil {
		return "", errcode.New(errcode.InvalidArgument, "%v", err)
	}
	return "/jobs/" + id + rest, nil
}

// StartJob starts a detached job; the reply comes at once, the job running.
func (c *Client) StartJob(ctx context.Context, req JobStartRequest) (JobInfo, error) {
	if err := ValidJobID(req.JobID); err != nil {
		return JobInfo{}, errcode.New(errcode.InvalidArgument, "%v", err)
	}
	var ji JobInfo
	err := doJSON(ctx, c, call{method: http.MethodPost, path: "/jobs", codes: jobStartCodes}, req, &ji, maxJobInfoReply, jobInfoOf(req.JobID))
	return ji, err
}

// Jobs lists the sandbox's jobs, running and finished, newest first (at most MaxJobList).
func (c *Client) Jobs(ctx context.Context) ([]JobInfo, error) {
	resp, err := c.do(ctx, call{method: http.MethodGet, path: "/jobs", codes: jobCodes})
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	jobs, err := decodeJobList(resp.Body)
	return jobs, ctxErr(ctx, err)
}

// Job returns one job's status.
func (c *Client) Job(ctx context.Context, id string) (JobInfo, error) {
	p, err := jobPath(id, "")
	if err != nil {
		return JobInfo{}, err
	}
	var ji JobInfo
	err = doJSON(ctx, c, call{method: http.MethodGet, path: p, codes: jobCodes}, nil, &ji, maxJobInfoReply, jobInfoOf(id))
	return ji, err
}

// JobLogs reads a slice of a job's log (see JobLogsRequest). The agent validates the numbers;
// the wait is checked here too (its bound keeps the request's life bounded). A reply's State is
// "" from an agent older than long polls, which answers at once: the caller must not take an
// empty reply as proof that the agent waited.
func (c *Client) JobLogs(ctx context.Context, id string, req JobLogsRequest) (JobLogs, error) {
	p, err := jobPath(id, "/logs")
	if err != nil {
		return JobLogs{}, err
	}
	if req.Wait < 0 || req.Wait > MaxJobLogWait || req.Wait%time.Millisecond != 0 {
		return JobLogs{}, errcode.New(errcode.InvalidArgument, "a log read's wait must be whole milliseconds from 0 to %d ms; got %s", MaxJobLogWait.Milliseconds(), req.Wait).With("argument", "wait_ms")
	}
	if req.Wait > 0 && req.TailLines != 0 {
		return JobLogs{}, errcode.New(errcode.InvalidArgument, "a log read waits for output past an offset: wait_ms and tail_lines exclude each other").With("argument", "wait_ms")
	}
	q := url.Values{}
	if req.Wait > 0 {
		q.Set("wait_ms", strconv.FormatInt(req.Wait.Milliseconds(), 10))
	}
	if req.Stream != "" {
		q.Set("stream", req.Stream)
	}
	if req.TailLines != 0 {
		q.Set("tail_lines", strconv.Itoa(req.TailLines))
	}
	if req.Offset != 0 {
		q.Set("offset", strconv.FormatInt(req.Offset, 10))
	}
	if req.Max != 0 {
		q.Set("max", strconv.FormatInt(req.Max, 10))
	}
	limit := int64(MaxJobLogBytes)
	if req.Max > 0 && req.Max < limit {
		limit = req.Max
	}
	var jl JobLogs
	err = doJSON(ctx, c, call{method: http.MethodGet, path: p, query: q, codes: jobCodes}, nil, &jl, maxJobLogsReply, func(l *JobLogs) error {
		var offset *int64
		if req.TailLines == 0 {
			offset = &req.Offset
		}
		if err := jobmodel.CheckSlice(jobmodel.Slice{Offset: l.Offset, NextOffset: l.NextOffset, TotalBytes: l.TotalBytes}, len(l.Data), int(limit), offset); err != nil {
			return err
		}
		if l.State != "" && l.State != JobRunning && l.State != JobExited && l.State != JobKilled && l.State != JobCanceled {
			return fmt.Errorf("unknown job state %q", text.Clean(l.State, 32))
		}
		return nil
	})
	return jl, err
}

// WaitJob waits up to timeout (at most MaxJobWait) for the job to end and returns its status:
// still running when the timeout passed first, which is not an error.
func (c *Client) WaitJob(ctx context.Context, id string, timeout time.Duration) (JobInfo, error) {
	p, err := jobPath(id, "/wait")
	if err != nil {
		return JobInfo{}, err
	}
	q := url.Values{"timeout_ms": {strconv.FormatInt(timeout.Milliseconds(), 10)}}
	var ji JobInfo
	err = doJSON(ctx, c, call{method: http.MethodGet, path: p, query: q, codes: jobCodes}, nil, &ji, maxJobInfoReply, jobInfoOf(id))
	return ji, err
}

// CancelJob ends a job: SIGTERM to its whole tree, SIGKILL after grace (at most
// MaxJobCancelGrace), and returns its final status. A finished job's status is returned as is.
func (c *Client) CancelJob(ctx context.Context, id string, grace time.Duration) (JobInfo, error) {
	p, err := jobPath(id, "/cancel")
	if err != nil {
		return JobInfo{}, err
	}
	ms := grace.Milliseconds()
	var ji JobInfo
	err = doJSON(ctx, c, call{method: http.MethodPost, path: p, codes: jobCodes}, JobCancelRequest{GraceMs: &ms}, &ji, maxJobInfoReply, jobInfoOf(id))
	return ji, err
}

// jobInfoOf checks a JobInfo that must be job id's.
func jobInfoOf(id string) func(*JobInfo) error {
	return func(j *JobInfo) error {
		if err := validJobInfo(j); err != nil {
			return err
		}
		if j.JobID != id {
			return fmt.Errorf("the status of job %q for job %q", j.JobID, id)
		}
		return nil
	}
}

// decodeJobList decodes a job list entry by entry, each within maxJobInfoReply, at most
// MaxJobList of them, so that the reply is never buffered whole.
func decodeJobList(body io.Reader) ([]JobInfo, error) {
	const what = "jobs"
	br := &budgetReader{r: body}
	dec := json.NewDecoder(br)
	br.dec = dec
	var jobs []JobInfo
	err := decodeObject(dec, br, func(key string) error {
		if key != "jobs" {
			var skip json.RawMessage
			return dec.Decode(&skip)
		}
		tok, err := dec.Token()
		if err != nil || tok == nil {
			return err
		}
		if d, ok := tok.(json.Delim); !ok || d != '[' {
			return fmt.Errorf("jobs is %v, not an array", tok)
		}
		for dec.More() {
			if len(jobs) == MaxJobList {
				return fmt.Errorf("more than %d jobs", MaxJobList)
			}
			br.allow(maxJobInfoReply)
			var ji JobInfo
			if err := dec.Decode(&ji); err != nil {
				return err
			}
			if err := validJobInfo(&ji); err != nil {
				return err
			}
			jobs = append(jobs, ji)
		}
		br.allow(maxFileInfoReply)
		return wantDelim(dec, ']')
	})
	if err == nil {
		_, err = dec.Token()
		if errors.Is(err, io.EOF) {
			err = nil
		} else if err == nil {
			err = errors.New("data after the list")
		}
	}
	switch {
	case err == nil:
		return jobs, nil
	case errors.Is(err, errOverBudget):
		return nil, agent.Oversized(what, br.budget)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return nil, errcode.Wrap(errcode.SandboxNotRunning, err, "the sandbox's agent broke off its reply to %s (the sandbox may have stopped)", what)
	}
	if e, ok := errcode.As(err); ok {
		return nil, e
	}
	return nil, agent.Malformed(what, err)
}
