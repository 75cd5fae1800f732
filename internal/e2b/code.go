package e2b

import (
	"encoding/json"
	"net/http"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/interp"
)

// The code interpreter's routes (@e2b/code-interpreter, port 49999): /execute streams a cell's
// events as NDJSON, /contexts makes, lists, removes and restarts contexts. They run on
// agentbox's own kernel (internal/interp).

type interpreters struct{ m *interp.Manager }

func (i *interpreters) drop(id string) { i.m.Drop(id) }
func (i *interpreters) close()         { i.m.Close() }

// Interpreter returns the manager of the sandboxes' kernels (the MCP tools share it).
func (s *Server) Interpreter() *interp.Manager { return s.code.m }

func (s *Server) execute(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	var req interp.ExecuteRequest
	if err := decodeBody(r, &req); err != nil {
		WriteError(w, r, err)
		return
	}
	if _, err := s.live(r, id); err != nil {
		WriteError(w, r, err)
		return
	}
	rc := http.NewResponseController(w)
	started := false
	err := s.code.m.Execute(r.Context(), id, req, func(ev json.RawMessage) error {
		if !started {
			w.Header().Set("Content-Type", "application/x-ndjson")
			w.WriteHeader(http.StatusOK)
			started = true
		}
		if _, err := w.Write(append(ev, '\n')); err != nil {
			return err
		}
		return rc.Flush()
	})
	if err != nil && !started {
		WriteError(w, r, err)
		return
	}
	if err != nil {
		// Past the status line: an error event says what went wrong.
		b, _ := json.Marshal(map[string]string{"type": "error", "name": "AgentboxError", "value": errcode.Message(err), "traceback": ""})
		_, _ = w.Write(append(b, '\n'))
		setOutcome(w, err)
		return
	}
	if !started {
		w.Header().Set("Content-Type", "application/x-ndjson")
		w.WriteHeader(http.StatusOK)
	}
}

type contextBody struct {
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
}

func (s *Server) createContext(w http.ResponseWriter, r *http.Request) {
	var body contextBody
	if err := decodeBody(r, &body); err != nil {
		WriteError(w, r, err)
		return
	}
	c, err := s.code.m.CreateContext(r.Context(), r.PathValue("id"), body.Language, body.Cwd)
	if err != nil {
		WriteError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, c)
}

func (s *Server) listContexts(w http.ResponseWriter, r *http.Request) {
	l, err := s.code.m.ListContexts(r.Context(), r.PathValue("id"))
	if err != nil {
		WriteError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, l)
}

func (s *Server) removeContext(w http.ResponseWriter, r *http.Request) {
	if err := s.code.m.RemoveContext(r.Context(), r.PathValue("id"), r.PathValue("ctx")); err != nil {
		WriteError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) restartContext(w http.ResponseWriter, r *http.Request) {
	if err := s.code.m.RestartContext(r.Context(), r.PathValue("id"), r.PathValue("ctx")); err != nil {
		WriteError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) codeUnknown(w http.ResponseWriter, r *http.Request) {
	WriteError(w, r, errcode.New(errcode.UnsupportedOp, "code interpreter route %s /%s is not served by agentbox", r.Method, r.PathValue("rest")))
}
