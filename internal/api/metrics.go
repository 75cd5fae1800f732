package api

import (
	"net/http"
)

// GET /v1/sandboxes/{id}/metrics: one sample of a running sandbox's resource use.
func (s *Server) sandboxMetrics(w http.ResponseWriter, r *http.Request) {
	m, err := s.opts.Metrics.Metrics(r.Context(), r.PathValue("id"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, m)
}

// GET /v1/fleet/metrics: one sample of every running sandbox (agentbox top).
func (s *Server) fleetMetrics(w http.ResponseWriter, r *http.Request) {
	m, err := s.opts.Metrics.FleetMetrics(r.Context())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, m)
}
