package api

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/agentbox/agentbox/internal/e2b"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/gate"
)

// decided is h behind Options.Gate: every route is registered through it (patternMux), with
// its declaration, so no route reaches its handler without passing the chain.
func (s *Server) decided(pattern string, rt Route, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if len(s.opts.Gate) == 0 {
			h(w, r)
			return
		}
		s.gated(w, r, pattern, rt, h)
	}
}

// holder is a gate that can tell beforehand whether it holds a call until someone decides
// (approval.Service): a streamed body is then spooled so that the approver sees its digest.
type holder interface {
	Gated(c *gate.Call) bool
}

// gated serves r through Options.Gate: the call is described by its route's declaration (the
// action, scope, object and read-only mark of routeTable) and its arguments — method, path,
// query and body — entered, served, and its outcome reported. The handler reads exactly the
// body the chain was shown: a JSON body whatever its Content-Type (one that is not JSON is
// refused before the chain), a stream by its length and SHA-256 (spooled first when a gate
// would hold the call), a secret by its length. Mounted handlers (MCP) are gated per tool by
// their own server, not here.
func (s *Server) gated(w http.ResponseWriter, r *http.Request, pattern string, rt Route, serve http.HandlerFunc) {
	c := &gate.Call{Surface: gate.SurfaceREST, Tool: pattern, Action: rt.Action, Scope: rt.Scope, ReadOnly: rt.ReadOnly,
		Object: objectOf(rt.Object, r.PathValue), Started: time.Now()}
	if caller, ok := gate.CallerFrom(r.Context()); ok {
		c.Caller = caller
	}
	switch rt.Object {
	case gate.ObjectSandbox, gate.ObjectJob, gate.ObjectExpose:
		c.SandboxID = c.Object.ID
	}
	args := map[string]any{"method": r.Method, "path": r.URL.Path}
	if q := r.URL.Query(); len(q) > 0 {
		args["query"] = q
	}
	fail := func(err error) {
		if rt.E2B {
			e2b.WriteError(w, r, err)
			return
		}
		writeError(w, err, 0)
	}
	refuse := func(err error) {
		c.Args, _ = json.Marshal(args)
		s.opts.Gate.Observe(c, err)
		fail(err)
	}
	if r.Body != nil && r.Body != http.NoBody && r.ContentLength != 0 {
		switch rt.Body {
		case BodySecret:
			args["body_bytes"] = r.ContentLength // a join token is never recorded
		case BodyStream:
			c.Args, _ = json.Marshal(args)
			if !s.holds(c) {
				args["body_bytes"] = r.ContentLength // streamed as it comes; -1: chunked
				break
			}
			f, n, sum, err := spool(r.Body, s.maxStream())
			if err != nil {
				refuse(err)
				return
			}
			defer func() { _ = f.Close() }()
			r.Body, r.ContentLength = f, n
			args["body_bytes"], args["body_sha256"] = n, sum
		default:
			b, err := readJSONBody(w, r) // over the bound: FILE_TOO_LARGE (413)
			if err != nil {
				refuse(err)
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(b))
			if len(bytes.TrimSpace(b)) == 0 {
				break
			}
			if !json.Valid(b) {
				refuse(errcode.New(errcode.InvalidArgument, "request body is not one JSON value: %s takes a JSON body (whatever its Content-Type), which is shown as sent to the audit log and any approver", pattern).With("argument", "body"))
				return
			}
			args["body"] = json.RawMessage(b)
			var sb struct {
				SandboxID string `json:"sandbox_id"`
			}
			if c.SandboxID == "" && json.Unmarshal(b, &sb) == nil {
				c.SandboxID = sb.SandboxID // e.g. run_python's sandbox
			}
		}
	}
	c.Args, _ = json.Marshal(args)
	exit, err := s.opts.Gate.Enter(r.Context(), c)
	if err != nil {
		fail(err)
		return
	}
	// The reply is held until the chain's exit says the call is recorded (the audit log):
	// a call whose record is not durable is answered UNAVAILABLE instead, never acknowledged.
	header := w.Header().Clone()
	held := &heldReply{w: w}
	rec := &outcomeRecorder{statusRecorder: statusRecorder{ResponseWriter: held}}
	exited := false
	defer func() {
		if !exited { // the handler panicked: the recovery answers (what it held is dropped)
			exit(errcode.New(errcode.Internal, "the handler panicked"))
		}
	}()
	serve(rec, r)
	exited = true
	exit(rec.outcome())
	if c.NotRecorded == nil {
		held.release()
		return
	}
	s.log.Warn("a call is not acknowledged: its audit record is not durable", "route", pattern, "err", c.NotRecorded)
	if held.passed {
		panic(http.ErrAbortHandler) // part of the reply left already: cut it, so it is no answer
	}
	for k := range w.Header() {
		delete(w.Header(), k)
	}
	for k, v := range header {
		w.Header()[k] = v
	}
	writeError(w, c.NotRecorded, 0)
}

// maxHeldReply bounds the reply heldReply keeps in memory; a larger one (a download, a stream)
// goes out as it is written, before the call's record is known to be durable.
const maxHeldReply = 64 << 10

// heldReply holds a gated call's reply — status and body, up to maxHeldReply — until release,
// so that a call whose audit record could not be made durable can be answered with that error
// instead. A handler that flushes, hijacks or writes more sends what it holds at once.
type heldReply struct {
	w      http.ResponseWriter
	code   int
	buf    []byte
	passed bool
}

func (h *heldReply) Header() http.Header { return h.w.Header() }

func (h *heldReply) WriteHeader(code int) {
	switch {
	case h.passed, code >= 100 && code < 200:
		h.w.WriteHeader(code)
	case h.code == 0:
		h.code = code
	}
}

func (h *heldReply) Write(b []byte) (int, error) {
	if h.passed {
		return h.w.Write(b)
	}
	if h.code == 0 {
		h.code = http.StatusOK
	}
	if len(h.buf)+len(b) > maxHeldReply {
		if err := h.pass(); err != nil {
			return 0, err
		}
		return h.w.Write(b)
	}
	h.buf = append(h.buf, b...)
	return len(b), nil
}

// pass sends what is held and lets the rest through.
func (h *heldReply) pass() error {
	if h.passed {
		return nil
	}
	h.passed = true
	if h.code != 0 {
		h.w.WriteHeader(h.code)
	}
	if len(h.buf) > 0 {
		b := h.buf
		h.buf = nil
		if _, err := h.w.Write(b); err != nil {
			return err
		}
	}
	return nil
}

// release sends the held reply.
func (h *heldReply) release() { _ = h.pass() }

func (h *heldReply) Flush() {
	_ = h.pass()
	_ = http.NewResponseController(h.w).Flush()
}

func (h *heldReply) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	h.passed = true
	return http.NewResponseController(h.w).Hijack()
}

func (h *heldReply) Unwrap() http.ResponseWriter { return h.w }

// holds reports whether a gate of the chain would hold c for a decision.
func (s *Server) holds(c *gate.Call) bool {
	for _, g := range s.opts.Gate {
		if h, ok := g.(holder); ok && h.Gated(c) {
			return true
		}
	}
	return false
}

// maxStream bounds a spooled stream: the largest body a streaming route takes.
func (s *Server) maxStream() int64 {
	return max(s.opts.MaxFileBytes, s.opts.MaxImportBytes, DefaultMaxImportBytes)
}

// spooledBody is a spooled request body: a temporary file, removed when closed.
type spooledBody struct{ *os.File }

func (b spooledBody) Close() error {
	err := b.File.Close()
	_ = os.Remove(b.Name())
	return err
}

// spool copies at most limit bytes of body to a temporary file and returns it rewound, with
// its length and SHA-256: what the approver is shown is what the handler then reads.
func spool(body io.Reader, limit int64) (io.ReadCloser, int64, string, error) {
	f, err := os.CreateTemp("", "agentbox-body-*")
	if err != nil {
		return nil, 0, "", errcode.New(errcode.Internal, "spool request body: %v", err)
	}
	sb := spooledBody{f}
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(f, h), io.LimitReader(body, limit+1))
	if err == nil && n > limit {
		err = errcode.New(errcode.InvalidArgument, "request body exceeds %d bytes", limit)
	}
	if err == nil {
		_, err = f.Seek(0, io.SeekStart)
	}
	if err != nil {
		_ = sb.Close()
		if !isTyped(err) {
			var mbe *http.MaxBytesError
			if errors.As(err, &mbe) {
				err = errcode.New(errcode.InvalidArgument, "request body exceeds %d bytes", mbe.Limit)
			} else {
				err = errcode.New(errcode.InvalidArgument, "request body: %v", err)
			}
		}
		return nil, 0, "", err
	}
	return sb, n, hex.EncodeToString(h.Sum(nil)), nil
}

// outcomeRecorder keeps a response's status and, when writeError wrote it, its typed error.
type outcomeRecorder struct {
	statusRecorder
	err error
}

func (w *outcomeRecorder) setOutcome(err error) { w.err = err }

// SetOutcome is setOutcome for handlers outside this package (the E2B surface's).
func (w *outcomeRecorder) SetOutcome(err error) { w.err = err }

func (w *outcomeRecorder) outcome() error {
	if w.err != nil {
		return w.err
	}
	if st := w.status(); st >= 400 {
		return errcode.New(errcode.Internal, "HTTP %d", st)
	}
	return nil
}
