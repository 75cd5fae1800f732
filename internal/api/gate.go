package api

import (
	"bytes"
	"encoding/json"
	"io"
	"mime"
	"net/http"
	"strings"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/gate"
)

// restActions names the MCP tool a REST route is the same operation as, so that a gate rule
// naming a tool (an approval for "exec") covers both surfaces.
var restActions = map[string]string{
	"POST /v1/machines/{ref}/pull":                 "remote_pull", // the file relay
	"POST /v1/machines/{ref}/push":                 "remote_push",
	"POST /v1/sandboxes":                           "sandbox_create",
	"GET /v1/sandboxes":                            "sandbox_list",
	"GET /v1/sandboxes/{id}":                       "sandbox_get",
	"DELETE /v1/sandboxes/{id}":                    "sandbox_destroy",
	"POST /v1/sandboxes/{id}/extend":               "sandbox_extend",
	"POST /v1/sandboxes/{id}/exec":                 "exec",
	"PUT /v1/sandboxes/{id}/files":                 "file_write",
	"GET /v1/sandboxes/{id}/files":                 "file_read",
	"GET /v1/sandboxes/{id}/files/list":            "file_list",
	"POST /v1/sandboxes/{id}/jobs":                 "job_start",
	"POST /v1/sandboxes/{id}/jobs/{job_id}/cancel": "job_cancel",
	"PATCH /v1/sandboxes/{id}/network":             "sandbox_network_update",
	"POST /v1/sandboxes/{id}/expose":               "sandbox_expose",
	"POST /v1/sandboxes/{id}/commit":               "sandbox_commit",
	"POST /v1/images/pull":                         "image_pull",
	"POST /v1/runs":                                "run",
	"POST /v1/sql":                                 "execute_sql",
	"POST /v1/runs/{id}/cancel":                    "run_cancel",
	"POST /v1/batches":                             "run_batch",
	"POST /v1/batches/matrix":                      "run_matrix",
	"POST /v1/batches/agent-compare":               "agent_compare",
	"POST /v1/batches/agent-test":                  "agent_test",
	// snapshots, forks, sleep, wake, diff (snapshots.go)
	"POST /v1/sandboxes/{id}/snapshots":  "sandbox_snapshot",
	"GET /v1/snapshots":                  "snapshot_list",
	"GET /v1/sandboxes/{id}/snapshots":   "snapshot_list",
	"DELETE /v1/snapshots/{snapshot_id}": "snapshot_delete",
	"POST /v1/sandboxes/{id}/fork":       "sandbox_fork",
	"POST /v1/sandboxes/{id}/sleep":      "sandbox_sleep",
	"POST /v1/sandboxes/{id}/wake":       "sandbox_wake",
	"GET /v1/sandboxes/{id}/diff":        "sandbox_diff",
	"POST /v1/sandboxes/{id}/diff":       "sandbox_diff",
	"POST /v1/run_python":                "run_python", // snippet.go
	"POST /v1/run_shell":                 "run_shell",
	// joined machines (remote.go)
	"POST /v1/machines/{ref}/exec":      "remote_exec",
	"GET /v1/machines/{ref}/screenshot": "remote_screenshot",
}

// secretBodies are routes whose JSON body holds a secret: the gate records its length only.
var secretBodies = map[string]bool{"POST /v1/machines/join": true}

// gated serves r through Options.Gate: the call is described (route, path, query, and a JSON
// body up to MaxJSONBody; any other body by its length only, never its content, which is
// left to stream), entered, served, and its outcome reported. Mounted handlers (MCP)
// are gated per tool by their own server, not here.
func (s *Server) gated(w http.ResponseWriter, r *http.Request, pattern string, serve func(http.ResponseWriter, *http.Request)) {
	c := &gate.Call{Surface: gate.SurfaceREST, Tool: pattern, Action: restActions[pattern], Started: time.Now()}
	if caller, ok := gate.CallerFrom(r.Context()); ok {
		c.Caller = caller
	}
	if rest, ok := strings.CutPrefix(r.URL.Path, "/v1/sandboxes/"); ok {
		c.SandboxID, _, _ = strings.Cut(rest, "/")
	}
	args := map[string]any{"method": r.Method, "path": r.URL.Path}
	if q := r.URL.Query(); len(q) > 0 {
		args["query"] = q
	}
	if r.Body != nil && r.Body != http.NoBody && r.ContentLength != 0 {
		if secretBodies[pattern] {
			args["body_bytes"] = r.ContentLength // a join token is never recorded
		} else if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt == "application/json" {
			b, err := readJSONBody(w, r)
			if err != nil {
				writeError(w, err, 0)
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(b))
			if json.Valid(b) {
				args["body"] = json.RawMessage(b)
				var sb struct {
					SandboxID string `json:"sandbox_id"`
				}
				if c.SandboxID == "" && json.Unmarshal(b, &sb) == nil {
					c.SandboxID = sb.SandboxID // e.g. run_python's sandbox
				}
			}
		} else if r.ContentLength > 0 {
			args["body_bytes"] = r.ContentLength
		}
	}
	c.Args, _ = json.Marshal(args)
	exit, err := s.opts.Gate.Enter(r.Context(), c)
	if err != nil {
		writeError(w, err, 0)
		return
	}
	rec := &outcomeRecorder{statusRecorder: statusRecorder{ResponseWriter: w}}
	defer func() { exit(rec.outcome()) }()
	serve(rec, r)
}

// outcomeRecorder keeps a response's status and, when writeError wrote it, its typed error.
type outcomeRecorder struct {
	statusRecorder
	err error
}

func (w *outcomeRecorder) setOutcome(err error) { w.err = err }

func (w *outcomeRecorder) outcome() error {
	if w.err != nil {
		return w.err
	}
	if st := w.status(); st >= 400 {
		return errcode.New(errcode.Internal, "HTTP %d", st)
	}
	return nil
}
