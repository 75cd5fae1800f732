package api

import (
	"net/http"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/sqlquery"
	"github.com/agentbox/agentbox/internal/wire"
)

// execute_sql: POST /v1/sql over Options.SQL.

// SQLRequest is the body of POST /v1/sql.
type SQLRequest = wire.SQLRequest

// sqlQuery answers POST /v1/sql with a sqlquery.Result.
func (s *Server) sqlQuery(w http.ResponseWriter, r *http.Request) {
	if s.opts.SQL == nil {
		s.fail(w, r, errcode.New(errcode.UnsupportedOp, "this server does not serve SQL (its store has no read-only query connection)"))
		return
	}
	var body SQLRequest
	if err := decode(w, r, &body); err != nil {
		s.fail(w, r, err)
		return
	}
	if _, err := sqlquery.Check(body.Query, body.MaxRows); err != nil {
		s.fail(w, r, err)
		return
	}
	res, err := s.opts.SQL.Query(r.Context(), body.Query, body.MaxRows)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}
