package api

import (
	"context"
	"net/http"

	"github.com/agentbox/agentbox/internal/authz"
	"github.com/agentbox/agentbox/internal/metricsnap"
	"github.com/agentbox/agentbox/internal/sandbox"
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

// GET /v1/fleet/metrics: one sample of every running sandbox of the caller's (agentbox top).
func (s *Server) fleetMetrics(w http.ResponseWriter, r *http.Request) {
	m, err := s.ownFleetMetrics(r.Context())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, m)
}

// ownFleetMetrics samples the caller's running sandboxes (an admin's: every one).
func (s *Server) ownFleetMetrics(ctx context.Context) (sandbox.FleetMetrics, error) {
	principal, filtered := authz.ListPrincipal(ctx)
	if !filtered {
		return s.opts.Metrics.FleetMetrics(ctx)
	}
	sbs, err := s.svc.List(ctx, sandbox.ListFilter{States: []sandbox.State{sandbox.StateRunning}, Principal: principal, Limit: sandbox.MaxList})
	if err != nil {
		return sandbox.FleetMetrics{}, err
	}
	return s.opts.Metrics.SampleSandboxes(ctx, sbs)
}

// metricsVisible is which sandboxes' Prometheus series ctx's caller sees (GET /metrics):
// authz.SandboxPredicate over the caller's principal's live sandboxes (an admin: every one).
func (s *Server) metricsVisible(ctx context.Context) (metricsnap.Visible, error) {
	return authz.SandboxPredicate(ctx, authz.PrincipalSandboxes(s.svc))
}
