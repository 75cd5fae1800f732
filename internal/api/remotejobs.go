package api

import (
	"net/http"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/hostjobs"
	"github.com/agentbox/agentbox/internal/jobmodel"
	"github.com/agentbox/agentbox/internal/remotejobs"
	"github.com/agentbox/agentbox/internal/wire"
)

// Remote jobs: /v1/machines/{ref}/jobs….

// RemoteJobCancelRequest is the optional body of POST /v1/machines/{ref}/jobs/{job_id}/cancel.
type RemoteJobCancelRequest = wire.RemoteJobCancelRequest

// RemoteJobPath is the REST path of a machine's jobs, or of one job (id) and below (rest).
func RemoteJobPath(machine, id, rest string) string { return wire.RemoteJobPath(machine, id, rest) }

// remoteJobRoutes registers the remote job routes (one line in routes()).
func (s *Server) remoteJobRoutes() {
	m := patternMux{s.mux, s}
	m.HandleFunc("POST /v1/machines/{ref}/jobs", s.startRemoteJob)
	m.HandleFunc("GET /v1/machines/{ref}/jobs", s.listRemoteJobs)
	m.HandleFunc("GET /v1/machines/{ref}/jobs/{job_id}", s.getRemoteJob)
	m.HandleFunc("GET /v1/machines/{ref}/jobs/{job_id}/logs", s.remoteJobLogs)
	m.HandleFunc("POST /v1/machines/{ref}/jobs/{job_id}/cancel", s.cancelRemoteJob)
}

func (s *Server) remoteJobs(w http.ResponseWriter, r *http.Request) *remotejobs.Service {
	if s.opts.RemoteJobs == nil {
		s.fail(w, r, errcode.New(errcode.UnsupportedOp, "this server runs no remote jobs"))
	}
	return s.opts.RemoteJobs
}

func (s *Server) startRemoteJob(w http.ResponseWriter, r *http.Request) {
	svc := s.remoteJobs(w, r)
	if svc == nil {
		return
	}
	var req remotejobs.StartRequest
	if err := decode(w, r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	j, err := svc.Start(r.Context(), r.PathValue("ref"), req)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, wire.RemoteJob(j))
}

func (s *Server) listRemoteJobs(w http.ResponseWriter, r *http.Request) {
	svc := s.remoteJobs(w, r)
	if svc == nil {
		return
	}
	lim, err := boundedParam(r.URL.Query(), "limit", 1, hostjobs.MaxListLimit)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	limit := hostjobs.DefaultListLimit
	if lim != nil {
		limit = int(*lim)
	}
	l, err := svc.List(r.Context(), r.PathValue("ref"), limit)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, wireRemoteJobList(l))
}

func (s *Server) getRemoteJob(w http.ResponseWriter, r *http.Request) {
	svc := s.remoteJobs(w, r)
	if svc == nil {
		return
	}
	j, err := svc.Status(r.Context(), r.PathValue("ref"), r.PathValue("job_id"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, wire.RemoteJob(j))
}

func (s *Server) remoteJobLogs(w http.ResponseWriter, r *http.Request) {
	svc := s.remoteJobs(w, r)
	if svc == nil {
		return
	}
	q := r.URL.Query()
	var req remotejobs.LogsRequest
	tail, err := boundedParam(q, "tail_lines", 1, jobmodel.MaxTailLines)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	off, err := boundedParam(q, "offset_bytes", 0, 1<<62)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	maxb, err := boundedParam(q, "max_bytes", 1, jobmodel.MaxLogBytes)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if tail != nil {
		req.TailLines = int(*tail)
	}
	req.Offset = off
	if maxb != nil {
		req.MaxBytes = int(*maxb)
	}
	l, err := svc.Logs(r.Context(), r.PathValue("ref"), r.PathValue("job_id"), req)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, wire.RemoteJobLogs(l))
}

func (s *Server) cancelRemoteJob(w http.ResponseWriter, r *http.Request) {
	svc := s.remoteJobs(w, r)
	if svc == nil {
		return
	}
	var req RemoteJobCancelRequest
	if r.ContentLength != 0 {
		if err := decode(w, r, &req); err != nil {
			s.fail(w, r, err)
			return
		}
	}
	grace := jobmodel.DefaultGraceSeconds
	if req.GraceSeconds != nil {
		grace = *req.GraceSeconds
	}
	if g, err := boundedParam(r.URL.Query(), "grace_seconds", 0, jobmodel.MaxGraceSeconds); err != nil {
		s.fail(w, r, err)
		return
	} else if g != nil {
		grace = int(*g)
	}
	d, err := jobmodel.GraceSeconds(float64(grace))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	j, err := svc.Cancel(r.Context(), r.PathValue("ref"), r.PathValue("job_id"), d)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, wire.RemoteJob(j))
}
