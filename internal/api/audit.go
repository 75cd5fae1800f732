package api

import (
	"context"
	"net/http"

	"github.com/agentbox/agentbox/internal/audit"
	"github.com/agentbox/agentbox/internal/errcode"
)

// The audit log: GET /v1/audit pages its records.

// AuditLister is what GET /v1/audit needs: the store's audit log.
type AuditLister interface {
	ListAudit(ctx context.Context, f audit.Filter) ([]audit.Record, int64, error)
}

// DefaultAuditPage is how many records a page without limit holds.
const DefaultAuditPage = 100

// listAudit serves GET /v1/audit?after&limit&tool&sandbox_id: after 0, the newest limit
// records; else those after the cursor, oldest first.
func (s *Server) listAudit(w http.ResponseWriter, r *http.Request) {
	if s.opts.Audit == nil {
		s.fail(w, r, errcode.New(errcode.UnsupportedOp, "this server keeps no audit log"))
		return
	}
	after, limit, err := pageParams(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if limit == 0 {
		limit = DefaultAuditPage
	}
	q := r.URL.Query()
	f := audit.Filter{After: after, Limit: limit, Tool: q.Get("tool"), SandboxID: q.Get("sandbox_id")}
	if len(f.Tool) > 256 || len(f.SandboxID) > 256 {
		s.fail(w, r, errcode.New(errcode.InvalidArgument, "tool and sandbox_id must be at most 256 bytes"))
		return
	}
	recs, omitted, err := s.opts.Audit.ListAudit(r.Context(), f)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	l := audit.List{Records: recs, Next: after, Omitted: omitted}
	if l.Records == nil {
		l.Records = []audit.Record{}
	}
	if n := len(recs); n > 0 {
		l.Next = recs[n-1].Seq
	}
	writeJSON(w, http.StatusOK, wireAuditList(l))
}
