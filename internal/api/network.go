package api

import (
	"net/http"
	"strconv"

	"github.com/agentbox/agentbox/internal/egress"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/text"
	"github.com/agentbox/agentbox/internal/wire"
)

// Network: a sandbox's egress policy, its connection and secret-swap records, and
// its preview URLs. The preview URLs themselves are served by preview.go.

// MaxRecordPage bounds one page of connections or secret calls.
const MaxRecordPage = 1000

// NetworkUpdate is the body of PATCH /v1/sandboxes/{id}/network: the whole new policy.
type NetworkUpdate = egress.Policy

// ExposeRequest is the body of POST /v1/sandboxes/{id}/expose.
type ExposeRequest = wire.ExposeRequest

// ExposureList is the reply of GET /v1/sandboxes/{id}/expose.
type ExposureList = wire.ExposureList

// Unexposed is the reply of DELETE /v1/sandboxes/{id}/expose/{port}.
type Unexposed struct {
	SandboxID string `json:"sandbox_id"`
	Port      int    `json:"port"`
}

func (s *Server) updateNetwork(w http.ResponseWriter, r *http.Request) {
	var p NetworkUpdate
	if err := decode(w, r, &p); err != nil {
		s.fail(w, r, err)
		return
	}
	sb, err := s.opts.Network.UpdateNetwork(r.Context(), r.PathValue("id"), p)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	s.withHardening(&sb)
	writeJSON(w, http.StatusOK, wireSandbox(sb))
}

// pageParams reads after (≥ 0) and limit (1–MaxRecordPage; 0 or absent: the service's default).
func pageParams(r *http.Request) (int64, int, error) {
	q := r.URL.Query()
	after, err := intParam(q.Get("after"), "after")
	if err != nil {
		return 0, 0, err
	}
	lim, err := boundedParam(q, "limit", 1, MaxRecordPage)
	if err != nil {
		return 0, 0, err
	}
	return after, int(ptrOr(lim, 0)), nil
}

func (s *Server) listConnections(w http.ResponseWriter, r *http.Request) {
	after, limit, err := pageParams(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	l, err := s.opts.Network.Connections(r.Context(), r.PathValue("id"), after, limit)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if l.Connections == nil {
		l.Connections = []egress.Connection{}
	}
	writeJSON(w, http.StatusOK, wireConnectionList(l))
}

func (s *Server) listSecretCalls(w http.ResponseWriter, r *http.Request) {
	after, limit, err := pageParams(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	l, err := s.opts.Network.SecretCalls(r.Context(), r.PathValue("id"), after, limit)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if l.Calls == nil {
		l.Calls = []egress.SecretCall{}
	}
	writeJSON(w, http.StatusOK, wireSecretCallList(l))
}

// checkPort refuses a port outside 1–65535, naming the argument.
func checkPort(port int) error {
	if port < 1 || port > 65535 {
		return errcode.New(errcode.InvalidArgument, "port must be between 1 and 65535 (the port the sandbox's server listens on, on 127.0.0.1); got %d", port)
	}
	return nil
}

func (s *Server) expose(w http.ResponseWriter, r *http.Request) {
	var req ExposeRequest
	if err := decode(w, r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	if err := checkPort(req.Port); err != nil {
		s.fail(w, r, err)
		return
	}
	e, err := s.opts.Network.Expose(r.Context(), r.PathValue("id"), req.Port, req.Public)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, wireExposure(e))
}

func (s *Server) unexpose(w http.ResponseWriter, r *http.Request) {
	v := r.PathValue("port")
	port, err := strconv.Atoi(v)
	if err != nil {
		s.fail(w, r, errcode.New(errcode.InvalidArgument, "port must be an integer between 1 and 65535; got %q", text.Truncate(v, 32)))
		return
	}
	if err := checkPort(port); err != nil {
		s.fail(w, r, err)
		return
	}
	id := r.PathValue("id")
	if err := s.opts.Network.Unexpose(r.Context(), id, port); err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, Unexposed{SandboxID: id, Port: port})
}

func (s *Server) listExposures(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	l, err := s.opts.Network.Exposures(r.Context(), id)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if l == nil {
		l = []sandbox.Exposure{}
	}
	writeJSON(w, http.StatusOK, ExposureList{SandboxID: id, Exposures: convSlice(l, wireExposure)})
}
