package api

import (
	"net/http"

	"github.com/agentbox/agentbox/internal/snippet"
)

// runSnippet serves POST /v1/run_python and /v1/run_shell: the code runs in a fresh
// sandbox (destroyed afterwards unless keep) or in body.sandbox_id; a program that raised or
// exited non-zero is a 200 result.
func (s *Server) runSnippet(lang snippet.Language) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var body snippet.Request
		if err := decode(w, r, &body); err != nil {
			s.fail(w, r, err)
			return
		}
		res, err := snippet.New(s.svc).Run(r.Context(), lang, body)
		if err != nil {
			s.fail(w, r, err)
			return
		}
		writeJSON(w, http.StatusOK, res)
	}
}
