package api

import (
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/jobmodel"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/text"
	"github.com/agentbox/agentbox/internal/wire"
)

// Detached jobs: /v1/sandboxes/{id}/jobs…

// ToJob converts an exec body into a job start: a job takes the command, env, cwd and user;
// stdin, timeout_seconds and max_output_bytes belong to a blocking exec and are refused.
func (e ExecRequest) ToJob() (sandbox.JobStartRequest, error) {
	if e.Changes || e.Checkpoint {
		return sandbox.JobStartRequest{}, errcode.New(errcode.InvalidArgument,
			"changes and checkpoint apply to a blocking exec, not a job (background): after a job, take sandbox_snapshot and sandbox_diff yourself")
	}
	if e.Stdin != "" || e.StdinBase64 != "" || e.TimeoutSeconds != 0 || e.MaxOutputBytes != 0 {
		return sandbox.JobStartRequest{}, errcode.New(errcode.InvalidArgument,
			"a job (background) takes command, env, cwd and user only: stdin, timeout_seconds and max_output_bytes apply to a blocking exec (a job runs until it ends or job_cancel; its whole output is kept)")
	}
	return sandbox.JobStartRequest{Argv: e.Command, Env: e.Env, Cwd: e.Cwd, User: e.User}, nil
}

func (s *Server) startJob(w http.ResponseWriter, r *http.Request) {
	var body ExecRequest
	if err := decode(w, r, &body); err != nil {
		s.fail(w, r, err)
		return
	}
	s.startJobFrom(w, r, body)
}

func (s *Server) startJobFrom(w http.ResponseWriter, r *http.Request, body ExecRequest) {
	req, err := body.ToJob()
	if err != nil {
		s.fail(w, r, err)
		return
	}
	j, err := s.jobs.StartJob(r.Context(), r.PathValue("id"), req)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, wireJob(j))
}

func (s *Server) listJobs(w http.ResponseWriter, r *http.Request) {
	lim, err := boundedParam(r.URL.Query(), "limit", 1, sandbox.MaxList)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	l, err := s.jobs.ListJobs(r.Context(), r.PathValue("id"), int(ptrOr(lim, 0)))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, wireJobList(l))
}

func (s *Server) getJob(w http.ResponseWriter, r *http.Request) {
	j, err := s.jobs.JobStatus(r.Context(), r.PathValue("id"), r.PathValue("job_id"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, wireJob(j))
}

func (s *Server) jobLogs(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	req := sandbox.JobLogsRequest{Stream: q.Get("stream")}
	var err error
	if req.Offset, err = boundedParam(q, "offset", 0, 1<<62); err != nil {
		s.fail(w, r, err)
		return
	}
	if req.MaxBytes, err = boundedParam(q, "max_bytes", 1, jobmodel.MaxLogBytes); err != nil {
		s.fail(w, r, err)
		return
	}
	tail, err := boundedParam(q, "tail_lines", 1, jobmodel.MaxTailLines)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if tail != nil {
		n := int(*tail)
		req.TailLines = &n
	}
	l, err := s.jobs.JobLogs(r.Context(), r.PathValue("id"), r.PathValue("job_id"), req)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, l)
}

// DefaultJobWait is a job wait's timeout when the request gives none.
const DefaultJobWait = 30 * time.Second

func (s *Server) waitJob(w http.ResponseWriter, r *http.Request) {
	t, err := boundedParam(r.URL.Query(), "timeout_seconds", 0, int64(sandbox.MaxJobWait/time.Second))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	d := DefaultJobWait
	if t != nil {
		d = time.Duration(*t) * time.Second
	}
	j, err := s.jobs.WaitJob(r.Context(), r.PathValue("id"), r.PathValue("job_id"), d)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, wireJob(j))
}

// JobCancelRequest is the (optional) body of POST …/jobs/{job_id}/cancel.
type JobCancelRequest = wire.JobCancelRequest

func (s *Server) cancelJob(w http.ResponseWriter, r *http.Request) {
	var body JobCancelRequest
	if r.ContentLength != 0 {
		if err := decode(w, r, &body); err != nil {
			s.fail(w, r, err)
			return
		}
	}
	var grace *time.Duration
	if g := body.GraceSeconds; g != nil {
		d, err := jobmodel.GraceSeconds(*g)
		if err != nil {
			s.fail(w, r, err)
			return
		}
		grace = &d
	}
	j, err := s.jobs.CancelJob(r.Context(), r.PathValue("id"), r.PathValue("job_id"), grace)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, wireJob(j))
}

// boundedParam reads an integer query parameter in [lo, hi]; nil when absent.
func boundedParam(q url.Values, name string, lo, hi int64) (*int64, error) {
	v := q.Get(name)
	if v == "" {
		return nil, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < lo || n > hi {
		return nil, errcode.New(errcode.InvalidArgument, "%s must be an integer between %d and %d; got %q", name, lo, hi, text.Truncate(v, 32))
	}
	return &n, nil
}

func ptrOr(p *int64, def int64) int64 {
	if p == nil {
		return def
	}
	return *p
}
