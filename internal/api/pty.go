package api

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/coder/websocket"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/sameorigin"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/wire"
)

// PTY over WebSocket: GET /v1/sandboxes/{id}/pty?arg=…&arg=…&user=root&term=…&rows=…&cols=…&cwd=…
//
// Binary messages carry terminal bytes both ways (at most sandbox.MaxPTYData per message from
// the server; the server refuses messages over MaxPTYMessage). Text messages are PTYControl
// JSON: the client sends {"type":"resize","rows":R,"cols":C}; the server ends with
// {"type":"exit","exit_code":N,"signal":"…"} or {"type":"error","error":{…}} and closes. A
// request the server refuses (bad argument, sandbox not running, wrong token, foreign Origin)
// gets an ordinary JSON error reply instead of the upgrade.

// MaxPTYMessage bounds one message a terminal client sends.
const MaxPTYMessage = wire.MaxPTYMessage

// PTYControl is a text message on the terminal WebSocket.
type PTYControl = wire.PTYControl

// ptyRequest decodes the endpoint's query.
func ptyRequest(q url.Values) (sandbox.PTYRequest, error) {
	req := sandbox.PTYRequest{Argv: q["arg"], User: q.Get("user"), Term: q.Get("term"), Cwd: q.Get("cwd")}
	for _, kv := range q["env"] {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return req, errcode.New(errcode.InvalidArgument, "env %q must be NAME=VALUE", kv)
		}
		if req.Env == nil {
			req.Env = map[string]string{}
		}
		req.Env[k] = v
	}
	for _, f := range []struct {
		name string
		dst  *int
		max  int
	}{{"rows", &req.Rows, sandbox.MaxPTYRows}, {"cols", &req.Cols, sandbox.MaxPTYCols}} {
		v := q.Get(f.name)
		if v == "" {
			continue
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > f.max {
			return req, errcode.New(errcode.InvalidArgument, "%s must be an integer between 1 and %d; got %q", f.name, f.max, v)
		}
		*f.dst = n
	}
	return req, nil
}

// sameOriginOnly refuses a request a browser sends from another origin: a WebSocket handshake
// is a GET that a web page may open to any host, so the Origin must be the server's own
// (scheme, host and port: internal/sameorigin).
func sameOriginOnly(r *http.Request) error {
	o := r.Header.Get("Origin")
	if o == "" {
		return nil // not a browser
	}
	if !sameorigin.Same(r, o) { // scheme, host and port
		return errcode.New(errcode.AuthFailed, "cross-origin request refused (Origin %q): the terminal endpoint does not serve web pages of other origins", o)
	}
	return nil
}

// pty opens a terminal in a sandbox and relays it over a WebSocket.
func (s *Server) pty(w http.ResponseWriter, r *http.Request) {
	if err := sameOriginOnly(r); err != nil {
		writeError(w, err, http.StatusForbidden)
		return
	}
	if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		s.fail(w, r, errcode.New(errcode.InvalidArgument, "GET /v1/sandboxes/{id}/pty is a WebSocket: send a WebSocket handshake (Upgrade: websocket), e.g. with `agentbox shell`"))
		return
	}
	req, err := ptyRequest(r.URL.Query())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	sess, err := s.svc.PTY(ctx, r.PathValue("id"), req)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	defer sess.Close()
	// The Origin was checked above (and coder/websocket checks it again against Host).
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{})
	if err != nil {
		return // Accept has answered the client
	}
	defer c.CloseNow()
	c.SetReadLimit(MaxPTYMessage)
	go func() {
		select {
		case <-s.done: // the server is shutting down: hang the terminal up
			cancel()
		case <-ctx.Done():
		}
	}()

	// Client → sandbox: keystrokes and resizes. Its end (the client left) cancels ctx, which
	// closes the agent's connection and so hangs the command up.
	go func() {
		defer cancel()
		for {
			typ, data, err := c.Read(ctx)
			if err != nil {
				return
			}
			if typ == websocket.MessageBinary {
				if _, err := sess.Write(data); err != nil {
					return
				}
				continue
			}
			var m PTYControl
			if err := json.Unmarshal(data, &m); err != nil || m.Type != "resize" {
				_ = c.Close(websocket.StatusPolicyViolation, `text messages must be {"type":"resize","rows":R,"cols":C}`)
				return
			}
			if err := sess.Resize(m.Rows, m.Cols); err != nil {
				_ = c.Close(websocket.StatusPolicyViolation, cutReason(errcode.Message(err)))
				return
			}
		}
	}()

	// Sandbox → client: output, one message at a time (a slow client slows the command).
	for {
		b, x, err := sess.Next()
		switch {
		case err != nil:
			if ctx.Err() != nil {
				return
			}
			if errcode.Of(err) == errcode.Internal {
				s.log.Error("terminal failed", "path", r.URL.Path, "err", err)
			}
			s.sendControl(ctx, c, PTYControl{Type: "error", Error: errorDetail(err)})
			_ = c.Close(websocket.StatusInternalError, "terminal failed")
			return
		case x != nil:
			code := x.ExitCode
			s.sendControl(ctx, c, PTYControl{Type: "exit", ExitCode: &code, Signal: x.Signal})
			_ = c.Close(websocket.StatusNormalClosure, "")
			return
		}
		if err := c.Write(ctx, websocket.MessageBinary, b); err != nil {
			return
		}
	}
}

func (s *Server) sendControl(ctx context.Context, c *websocket.Conn, m PTYControl) {
	b, _ := json.Marshal(m)
	_ = c.Write(ctx, websocket.MessageText, b)
}

// cutReason fits a close reason in a control frame (at most 123 bytes).
func cutReason(s string) string {
	if len(s) <= 120 {
		return s
	}
	return strings.ToValidUTF8(s[:120], "")
}
