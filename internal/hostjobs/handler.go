package hostjobs

import (
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/peerreply"
	"github.com/agentbox/agentbox/internal/text"
)

// listCommandBytes bounds each command in a list reply (status gives the whole of it).
const listCommandBytes = 1024

// NewHandler serves m's jobs under /jobs/ (full paths kept):
//
//	POST /jobs/                 start (StartRequest) → Job
//	GET  /jobs/?limit=N         list → List
//	GET  /jobs/{id}             status → Job
//	GET  /jobs/{id}/logs        ?tail_lines=N | ?offset_bytes=N&max_bytes=N → Logs
//	POST /jobs/{id}/cancel      ?grace_seconds=N → Job
func NewHandler(m *Manager) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /jobs/{$}", func(w http.ResponseWriter, r *http.Request) {
		var req StartRequest
		if err := json.NewDecoder(io.LimitReader(r.Body, MaxCommandBytes+MaxEnvBytes+64<<10)).Decode(&req); err != nil {
			writeError(w, errcode.New(errcode.InvalidArgument, "bad start request: %v", err))
			return
		}
		j, err := m.Start(r.Context(), req)
		reply(w, j, err)
	})
	mux.HandleFunc("GET /jobs/{$}", func(w http.ResponseWriter, r *http.Request) {
		limit, err := intParam(r, "limit", DefaultListLimit)
		if err != nil {
			writeError(w, err)
			return
		}
		l, err := m.List(r.Context(), limit)
		for i := range l.Jobs {
			l.Jobs[i].Command = text.Truncate(l.Jobs[i].Command, listCommandBytes)
		}
		reply(w, l, err)
	})
	mux.HandleFunc("GET /jobs/{id}", func(w http.ResponseWriter, r *http.Request) {
		j, err := m.Status(r.Context(), r.PathValue("id"))
		reply(w, j, err)
	})
	mux.HandleFunc("GET /jobs/{id}/logs", func(w http.ResponseWriter, r *http.Request) {
		var req LogsRequest
		var err error
		if req.TailLines, err = intParam(r, "tail_lines", 0); err != nil {
			writeError(w, err)
			return
		}
		if req.MaxBytes, err = intParam(r, "max_bytes", 0); err != nil {
			writeError(w, err)
			return
		}
		if r.URL.Query().Has("offset_bytes") {
			off, err := intParam(r, "offset_bytes", 0)
			if err != nil {
				writeError(w, err)
				return
			}
			o := int64(off)
			req.Offset = &o
		}
		l, err := m.Logs(r.Context(), r.PathValue("id"), req)
		reply(w, l, err)
	})
	mux.HandleFunc("POST /jobs/{id}/cancel", func(w http.ResponseWriter, r *http.Request) {
		grace, err := intParam(r, "grace_seconds", DefaultGraceSeconds)
		if err != nil {
			writeError(w, err)
			return
		}
		j, err := m.Cancel(r.Context(), r.PathValue("id"), time.Duration(grace)*time.Second)
		reply(w, j, err)
	})
	return mux
}

func intParam(r *http.Request, name string, def int) (int, error) {
	s := r.URL.Query().Get(name)
	if s == "" {
		return def, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		return 0, errcode.New(errcode.InvalidArgument, "%s must be an integer, not %q", name, text.Truncate(s, 64))
	}
	return n, nil
}

func reply(w http.ResponseWriter, v any, err error) {
	if err != nil {
		writeError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, err error) { peerreply.WriteError(w, err) }
