package api

import (
	"net/http"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/remoteexec"
	"github.com/agentbox/agentbox/internal/screenshot"
	"github.com/agentbox/agentbox/internal/wire"
)

// Joined machines: POST /v1/machines/{ref}/exec (remote_exec) and
// GET /v1/machines/{ref}/screenshot?display=N (remote_screenshot), over Options.RemoteExec and
// Options.Screenshots.

// ScreenshotReply is the body of GET /v1/machines/{ref}/screenshot: the shot (its PNG in
// base64) and its caption.
type ScreenshotReply = wire.Screenshot

func (s *Server) remoteRoutes() {
	m := patternMux{s.mux, s}
	m.HandleFunc("POST /v1/machines/{ref}/exec", s.remoteExec)
	m.HandleFunc("GET /v1/machines/{ref}/screenshot", s.remoteScreenshot)
}

// remoteExec answers with a remoteexec.Result: 200 whenever the command started, partial or
// not (partial: true is an unknown outcome, not an error).
func (s *Server) remoteExec(w http.ResponseWriter, r *http.Request) {
	if s.opts.RemoteExec == nil {
		s.fail(w, r, errcode.New(errcode.UnsupportedOp, "this server has no joined machines"))
		return
	}
	var req remoteexec.Request
	if err := decode(w, r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	res, err := s.opts.RemoteExec.Exec(r.Context(), r.PathValue("ref"), req)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, wire.RemoteExecResult(*res))
}

func (s *Server) remoteScreenshot(w http.ResponseWriter, r *http.Request) {
	if s.opts.Screenshots == nil {
		s.fail(w, r, errcode.New(errcode.UnsupportedOp, "this server has no joined machines"))
		return
	}
	display, err := screenshot.ParseDisplay(r.URL.Query().Get("display"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	shot, err := s.opts.Screenshots.Capture(r.Context(), r.PathValue("ref"), display)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, wireScreenshot(shot))
}
