package api

import (
	"context"
	"net/http"
	"strconv"

	"github.com/agentbox/agentbox/internal/approval"
	"github.com/agentbox/agentbox/internal/authz"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/gate"
	"github.com/agentbox/agentbox/internal/wire"
)

// Approvals is the approval queue behind /v1/approvals (*approval.Service).
type Approvals interface {
	List(ctx context.Context, f approval.Filter) ([]approval.Approval, error)
	Get(ctx context.Context, id string) (approval.Approval, error)
	Decide(ctx context.Context, id string, approve bool, decider gate.Caller, reason string) (approval.Approval, error)
	Policy() approval.Policy
	MayDecide(c gate.Caller) error
}

// ApprovalList is GET /v1/approvals's reply.
type ApprovalList = wire.ApprovalList

// DecisionRequest is the body of POST /v1/approvals/{id}/approve|deny (optional on approve).
type DecisionRequest = wire.DecisionRequest

// approvalRoutes adds /v1/approvals. Deciding needs the caller's identity with a
// scope the queue's MayDecide accepts (admin); these routes are never themselves gated by
// approvals.
func (s *Server) approvalRoutes() {
	m := patternMux{s.mux, s}
	m.HandleFunc("GET /v1/approvals", s.listApprovals)
	m.HandleFunc("GET /v1/approvals/policy", s.approvalPolicy)
	m.HandleFunc("GET /v1/approvals/{id}", s.getApproval)
	m.HandleFunc("POST /v1/approvals/{id}/approve", func(w http.ResponseWriter, r *http.Request) { s.decideApproval(w, r, true) })
	m.HandleFunc("POST /v1/approvals/{id}/deny", func(w http.ResponseWriter, r *http.Request) { s.decideApproval(w, r, false) })
}

func (s *Server) approvals(w http.ResponseWriter, r *http.Request) Approvals {
	if s.opts.Approvals == nil {
		s.fail(w, r, errcode.New(errcode.UnsupportedOp, "this server keeps no approval queue"))
	}
	return s.opts.Approvals
}

func (s *Server) listApprovals(w http.ResponseWriter, r *http.Request) {
	ap := s.approvals(w, r)
	if ap == nil {
		return
	}
	// The caller's principal's approvals (authz.ListOwner); an admin's list shows every one.
	f := approval.Filter{State: approval.State(r.URL.Query().Get("state")), Principal: authz.ListOwner(r.Context())}
	if l := r.URL.Query().Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil {
			s.fail(w, r, errcode.New(errcode.InvalidArgument, "limit %q must be a number between 1 and %d", l, approval.MaxListLimit))
			return
		}
		f.Limit = n
	}
	l, err := ap.List(r.Context(), f)
	s.reply(w, r, ApprovalList{Approvals: convSlice(l, wireApproval)}, err)
}

// approvalPolicy says which calls wait for a decision and whether the caller may decide. A
// server without a queue holds nothing.
func (s *Server) approvalPolicy(w http.ResponseWriter, r *http.Request) {
	out := wire.ApprovalPolicy{Tools: []string{}, CannotDecide: "this server keeps no approval queue"}
	if ap := s.opts.Approvals; ap != nil {
		p := ap.Policy()
		out = wire.ApprovalPolicy{Required: p.Required, Tools: append([]string{}, p.Tools...), TimeoutSeconds: int(p.Timeout.Seconds()), Elicit: p.Elicit, CanDecide: true}
		caller, _ := gate.CallerFrom(r.Context())
		if err := ap.MayDecide(caller); err != nil {
			out.CanDecide, out.CannotDecide = false, err.Error()
		}
	}
	s.reply(w, r, out, nil)
}

func (s *Server) getApproval(w http.ResponseWriter, r *http.Request) {
	if ap := s.approvals(w, r); ap != nil {
		a, err := ap.Get(r.Context(), r.PathValue("id"))
		s.reply(w, r, wireApproval(a), err)
	}
}

func (s *Server) decideApproval(w http.ResponseWriter, r *http.Request, approve bool) {
	ap := s.approvals(w, r)
	if ap == nil {
		return
	}
	var req DecisionRequest
	if r.ContentLength != 0 && r.Body != nil && r.Body != http.NoBody {
		if err := decode(w, r, &req); err != nil {
			s.fail(w, r, err)
			return
		}
	}
	caller, _ := gate.CallerFrom(r.Context()) // none (--insecure-no-auth): MayDecide refuses
	a, err := ap.Decide(r.Context(), r.PathValue("id"), approve, caller, req.Reason)
	s.reply(w, r, wireApproval(a), err)
}
