package api

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
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
	rec := &outcomeRecorder{statusRecorder: statusRecorder{ResponseWriter: w}}
	defer func() { exit(rec.outcome()) }()
	serve(rec, r)
}

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
