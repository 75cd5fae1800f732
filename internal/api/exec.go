package api

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"sync"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/wire"
)

// ExecRequest is the body of POST /v1/sandboxes/{id}/exec.
type ExecRequest struct {
	// Command is the argv; it is never run through a shell.
	Command        []string          `json:"command"`
	Env            map[string]string `json:"env,omitempty"`
	Cwd            string            `json:"cwd,omitempty"`
	Stdin          string            `json:"stdin,omitempty"`
	StdinBase64    string            `json:"stdin_base64,omitempty"`
	TimeoutSeconds float64           `json:"timeout_seconds,omitempty"`
	MaxOutputBytes int64             `json:"max_output_bytes,omitempty"`
	User           string            `json:"user,omitempty"`
	// Background starts the command as a detached job (as POST …/jobs) and returns the job.
	Background bool `json:"background,omitempty"`
	// Changes returns the paths the command changed (result changes, changes_truncated);
	// Checkpoint snapshots the sandbox after it (result snapshot_id, or checkpoint_error).
	// The changed paths and a checkpoint after the command (sandbox/snapshots/execchanges.go).
	Changes    bool `json:"changes,omitempty"`
	Checkpoint bool `json:"checkpoint,omitempty"`
}

// ToService converts and checks the wire form.
func (e ExecRequest) ToService() (sandbox.ExecRequest, error) {
	req := sandbox.ExecRequest{Argv: e.Command, Env: e.Env, Cwd: e.Cwd, MaxOutputBytes: e.MaxOutputBytes, User: e.User,
		Changes: e.Changes, Checkpoint: e.Checkpoint}
	if e.Stdin != "" && e.StdinBase64 != "" {
		return req, errcode.New(errcode.InvalidArgument, "give stdin or stdin_base64, not both")
	}
	req.Stdin = []byte(e.Stdin)
	if e.StdinBase64 != "" {
		b, err := base64.StdEncoding.DecodeString(e.StdinBase64)
		if err != nil {
			return req, errcode.New(errcode.InvalidArgument, "stdin_base64 is not valid standard base64: %v", err)
		}
		req.Stdin = b
	}
	if e.TimeoutSeconds < 0 || e.TimeoutSeconds > 86400 {
		return req, errcode.New(errcode.InvalidArgument, "timeout_seconds must be between 0.001 and 86400; got %g", e.TimeoutSeconds)
	}
	req.Timeout = time.Duration(e.TimeoutSeconds * float64(time.Second))
	return req, nil
}

// ExecFrame is one line of a streamed exec (?stream=true, NDJSON): output chunks as they happen
// (Stream and Data, the exact bytes, base64 in JSON), then exactly one Result or Error.
type ExecFrame struct {
	Stream string              `json:"stream,omitempty"` // "stdout" or "stderr"
	Data   []byte              `json:"data,omitempty"`
	Result *sandbox.ExecResult `json:"result,omitempty"`
	Error  *ErrorDetail        `json:"error,omitempty"`
}

// ErrorDetail is the body of an error: {"code", "message", "details"}.
type ErrorDetail = wire.ErrorDetail

// exec runs a command. With ?stream=true the reply is NDJSON ExecFrame lines: output chunks as
// they happen, then one result (or error) frame.
func (s *Server) exec(w http.ResponseWriter, r *http.Request) {
	var body ExecRequest
	if err := decode(w, r, &body); err != nil {
		s.fail(w, r, err)
		return
	}
	if body.Background {
		s.startJobFrom(w, r, body)
		return
	}
	req, err := body.ToService()
	if err != nil {
		s.fail(w, r, err)
		return
	}
	id := r.PathValue("id")
	if r.URL.Query().Get("stream") != "true" {
		res, err := s.svc.Exec(r.Context(), id, req, nil)
		if err != nil {
			s.fail(w, r, err)
			return
		}
		writeJSON(w, http.StatusOK, res)
		return
	}
	// Check the sandbox before committing to a 200 stream, so a bad id is a plain error.
	if _, err := s.svc.Get(r.Context(), id); err != nil {
		s.fail(w, r, err)
		return
	}
	flusher, _ := w.(http.Flusher)
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	var mu sync.Mutex
	enc := json.NewEncoder(w)
	send := func(f ExecFrame) {
		mu.Lock()
		defer mu.Unlock()
		_ = enc.Encode(f)
		if flusher != nil {
			flusher.Flush()
		}
	}
	res, err := s.svc.Exec(r.Context(), id, req, func(stream string, data []byte) {
		send(ExecFrame{Stream: stream, Data: data})
	})
	if err != nil {
		if errcode.Of(err) == errcode.Internal {
			s.log.Error("request failed", "method", r.Method, "path", r.URL.Path, "err", err)
		}
		send(ExecFrame{Error: errorDetail(err)})
		return
	}
	send(ExecFrame{Result: &res})
}
