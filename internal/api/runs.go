package api

import (
	"context"
	"io"
	"mime"
	"net/http"
	"path"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/agentbox/agentbox/internal/authz"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/runs"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/text"
)

// Durable runs: /v1/runs and /v1/batches over runs.Service.

// RunRequest is the body of POST /v1/runs: a runs.Spec plus how long to wait for it.
type RunRequest struct {
	runs.Spec
	WaitOptions
}

// WaitOptions are the wait fields of every POST that starts runs: with Wait (or a
// WaitSeconds), the reply is the record once settled, or as it is when WaitSeconds (default
// DefaultRunWait, at most runs.MaxWait) pass. A caller that hangs up loses nothing.
type WaitOptions struct {
	Wait        bool  `json:"wait,omitempty"`
	WaitSeconds int64 `json:"wait_seconds,omitempty"`
}

// BatchStartRequest is the body of POST /v1/batches.
type BatchStartRequest struct {
	runs.BatchRequest
	WaitOptions
}

// MatrixStartRequest is the body of POST /v1/batches/matrix.
type MatrixStartRequest struct {
	runs.MatrixRequest
	WaitOptions
}

// CompareStartRequest is the body of POST /v1/batches/agent-compare and /agent-test.
type CompareStartRequest struct {
	runs.CompareRequest
	WaitOptions
}

// DefaultRunWait is how long a start with wait true and no wait_seconds waits.
const DefaultRunWait = 10 * time.Minute

// Timeout returns how long to wait (0: do not wait), or INVALID_ARGUMENT naming wait_seconds.
func (o WaitOptions) Timeout() (time.Duration, error) {
	max := int64(runs.MaxWait / time.Second)
	if o.WaitSeconds < 0 || o.WaitSeconds > max {
		return 0, errcode.New(errcode.InvalidArgument, "wait_seconds must be between 0 and %d; got %d", max, o.WaitSeconds)
	}
	switch {
	case o.WaitSeconds > 0:
		return time.Duration(o.WaitSeconds) * time.Second, nil
	case o.Wait:
		return DefaultRunWait, nil
	}
	return 0, nil
}

// artifactPathRE is an artifact download: /v1/runs/{id}/artifacts/{path}.
var artifactPathRE = regexp.MustCompile(`^/v1/runs/[^/]+/artifacts/.+`)

// signedArtifactRequest reports whether r may go without the bearer token: a GET of an
// artifact with both expires and sig; the handler then must verify them.
func signedArtifactRequest(r *http.Request) bool {
	if r.Method != http.MethodGet || !artifactPathRE.MatchString(r.URL.Path) {
		return false
	}
	q := r.URL.Query()
	return q.Get("expires") != "" && q.Get("sig") != ""
}

type tokenAuthKey struct{}

// withTokenAuth records whether the request presented the bearer token (or none is needed).
func withTokenAuth(ctx context.Context, ok bool) context.Context {
	return context.WithValue(ctx, tokenAuthKey{}, ok)
}

func tokenAuthed(ctx context.Context) bool {
	ok, _ := ctx.Value(tokenAuthKey{}).(bool)
	return ok
}

func (s *Server) runRoutes() {
	m := patternMux{s.mux, s}
	m.HandleFunc("POST /v1/runs", s.startRun)
	m.HandleFunc("GET /v1/runs", s.listRuns)
	m.HandleFunc("GET /v1/runs/{id}", s.getRun)
	m.HandleFunc("POST /v1/runs/{id}/cancel", s.cancelRun)
	m.HandleFunc("GET /v1/runs/{id}/events", s.runEvents)
	m.HandleFunc("GET /v1/runs/{id}/logs", s.runLogs)
	// Any method: the catch-all /v1/ would otherwise answer 404 to a wrong one.
	m.HandleFunc("/v1/runs/{id}/artifacts/{path...}", s.runArtifact)
	m.HandleFunc("POST /v1/batches", s.startBatch)
	m.HandleFunc("POST /v1/batches/matrix", s.startMatrix)
	m.HandleFunc("POST /v1/batches/agent-compare", s.agentCompare)
	m.HandleFunc("POST /v1/batches/agent-test", s.agentTest)
	m.HandleFunc("GET /v1/batches", s.listBatches)
	m.HandleFunc("GET /v1/batches/{id}", s.getBatch)
	m.HandleFunc("POST /v1/batches/{id}/cancel", s.cancelBatch)
}

// runsSvc returns the run service, or answers UNSUPPORTED_OPERATION.
func (s *Server) runsSvc(w http.ResponseWriter, r *http.Request) *runs.Service {
	if s.opts.Runs == nil {
		s.fail(w, r, errcode.New(errcode.UnsupportedOp, "this server does not run durable runs (it was built without a run service)"))
		return nil
	}
	return s.opts.Runs
}

func (s *Server) startRun(w http.ResponseWriter, r *http.Request) {
	rs := s.runsSvc(w, r)
	if rs == nil {
		return
	}
	var body RunRequest
	if err := decode(w, r, &body); err != nil {
		s.fail(w, r, err)
		return
	}
	wait, err := body.Timeout()
	if err != nil {
		s.fail(w, r, err)
		return
	}
	run, err := rs.Start(r.Context(), body.Spec)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if wait > 0 && !run.State.Settled() {
		wctx, cancel := s.untilClose(r.Context())
		defer cancel()
		if run, err = rs.Wait(wctx, run.ID, wait); err != nil {
			s.fail(w, r, err)
			return
		}
	}
	writeJSON(w, http.StatusCreated, wireRun(run.Redacted()))
}

// untilClose is ctx, also ended by Close: a start's wait answers with the record as it is when
// the server shuts down, never holding the shutdown up.
func (s *Server) untilClose(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-s.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// splitStates reads repeated or comma-separated state parameters.
func splitStates(q []string) ([]runs.State, error) {
	var out []runs.State
	for _, v := range q {
		for _, st := range strings.Split(v, ",") {
			if st == "" {
				continue
			}
			if !runs.State(st).Valid() {
				return nil, errcode.New(errcode.InvalidArgument, "state %q is not a run state: use queued, preparing, running, validating, collecting, cleaning, succeeded, failed, errored, canceled or timed_out", text.Truncate(st, 32))
			}
			out = append(out, runs.State(st))
		}
	}
	return out, nil
}

func (s *Server) listRuns(w http.ResponseWriter, r *http.Request) {
	rs := s.runsSvc(w, r)
	if rs == nil {
		return
	}
	q := r.URL.Query()
	states, err := splitStates(q["state"])
	if err != nil {
		s.fail(w, r, err)
		return
	}
	// The caller's principal's runs (authz.ListPrincipal); an admin's lists show every run.
	f := runs.Filter{States: states, BatchID: q.Get("batch_id"), Before: q.Get("before"), Owner: authz.ListOwner(r.Context())}
	for _, v := range q["label"] {
		k, val, ok := strings.Cut(v, "=")
		if !ok || k == "" {
			s.fail(w, r, errcode.New(errcode.InvalidArgument, "label filter %q must be key=value", text.Truncate(v, 32)))
			return
		}
		if f.Labels == nil {
			f.Labels = map[string]string{}
		}
		f.Labels[k] = val
	}
	lim, err := boundedParam(q, "limit", 1, runs.MaxList)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	f.Limit = int(ptrOr(lim, 0))
	l, err := rs.List(r.Context(), f)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if l.Runs == nil {
		l.Runs = []runs.Run{}
	}
	writeJSON(w, http.StatusOK, wireRunList(l.Redacted()))
}

func (s *Server) getRun(w http.ResponseWriter, r *http.Request) {
	if rs := s.runsSvc(w, r); rs != nil {
		run, err := rs.Get(r.Context(), r.PathValue("id"))
		s.reply(w, r, wireRun(run.Redacted()), err)
	}
}

func (s *Server) cancelRun(w http.ResponseWriter, r *http.Request) {
	if rs := s.runsSvc(w, r); rs != nil {
		run, err := rs.Cancel(r.Context(), r.PathValue("id"))
		s.reply(w, r, wireRun(run.Redacted()), err)
	}
}

// reply writes v (200) or the error.
func (s *Server) reply(w http.ResponseWriter, r *http.Request, v any, err error) {
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, v)
}

func (s *Server) runEvents(w http.ResponseWriter, r *http.Request) {
	rs := s.runsSvc(w, r)
	if rs == nil {
		return
	}
	q := r.URL.Query()
	after, err := boundedParam(q, "after", 0, 1<<62)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	lim, err := boundedParam(q, "limit", 1, runs.MaxEventsPage)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	l, err := rs.Events(r.Context(), r.PathValue("id"), ptrOr(after, 0), int(ptrOr(lim, 0)))
	if l.Events == nil {
		l.Events = []runs.Event{}
	}
	s.reply(w, r, wireRunEventList(l), err)
}

func (s *Server) runLogs(w http.ResponseWriter, r *http.Request) {
	rs := s.runsSvc(w, r)
	if rs == nil {
		return
	}
	q := r.URL.Query()
	req := runs.LogsRequest{Phase: q.Get("phase"), Stream: q.Get("stream")}
	if req.Stream != "" && req.Stream != "stdout" && req.Stream != "stderr" {
		s.fail(w, r, errcode.New(errcode.InvalidArgument, "stream must be stdout or stderr; got %q", text.Truncate(req.Stream, 32)))
		return
	}
	off, err := boundedParam(q, "offset", 0, 1<<62)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	mb, err := boundedParam(q, "max_bytes", 1, runs.MaxLogPage)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	req.Offset, req.MaxBytes = ptrOr(off, 0), ptrOr(mb, 0)
	l, err := rs.Logs(r.Context(), r.PathValue("id"), req)
	s.reply(w, r, l, err)
}

// runArtifact streams an artifact: authorised by the bearer token, or by a valid signature
// (expires + sig, as the run's artifact URL carries them).
func (s *Server) runArtifact(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		w.Header().Set("Allow", http.MethodGet)
		writeError(w, errcode.New(errcode.InvalidArgument, "%s is not allowed on an artifact: use GET", r.Method), http.StatusMethodNotAllowed)
		return
	}
	rs := s.runsSvc(w, r)
	if rs == nil {
		return
	}
	id, p := r.PathValue("id"), r.PathValue("path")
	if !tokenAuthed(r.Context()) {
		q := r.URL.Query()
		exp, err := strconv.ParseInt(q.Get("expires"), 10, 64)
		if err != nil {
			s.fail(w, r, errcode.New(errcode.AuthFailed, "the artifact URL's expires must be a unix time; use the URL as the run record gives it"))
			return
		}
		if err := rs.VerifyArtifact(id, p, exp, q.Get("sig")); err != nil {
			s.fail(w, r, err)
			return
		}
	}
	rc, a, err := rs.OpenArtifact(r.Context(), id, p)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	defer rc.Close()
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Content-Length", strconv.FormatInt(a.Size, 10))
	h.Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": path.Base(p)}))
	h.Set("X-Content-Type-Options", "nosniff")
	if a.SHA256 != "" {
		h.Set("X-Agentbox-SHA256", a.SHA256)
	}
	w.WriteHeader(http.StatusOK)
	if _, err := io.CopyN(w, rc, a.Size); err != nil && r.Context().Err() == nil {
		s.log.Warn("artifact download cut short", "run_id", id, "path", p, "err", err)
	}
}

func (s *Server) startBatch(w http.ResponseWriter, r *http.Request) {
	var body BatchStartRequest
	s.startBatchWith(w, r, &body, &body.WaitOptions, func(rs *runs.Service) (runs.Batch, error) {
		return rs.StartBatch(r.Context(), body.BatchRequest)
	})
}

func (s *Server) startMatrix(w http.ResponseWriter, r *http.Request) {
	var body MatrixStartRequest
	s.startBatchWith(w, r, &body, &body.WaitOptions, func(rs *runs.Service) (runs.Batch, error) {
		return rs.StartMatrix(r.Context(), body.MatrixRequest)
	})
}

func (s *Server) agentCompare(w http.ResponseWriter, r *http.Request) {
	var body CompareStartRequest
	s.startBatchWith(w, r, &body, &body.WaitOptions, func(rs *runs.Service) (runs.Batch, error) {
		return rs.AgentCompare(r.Context(), body.CompareRequest)
	})
}

func (s *Server) agentTest(w http.ResponseWriter, r *http.Request) {
	var body CompareStartRequest
	s.startBatchWith(w, r, &body, &body.WaitOptions, func(rs *runs.Service) (runs.Batch, error) {
		return rs.AgentTest(r.Context(), body.CompareRequest)
	})
}

// startBatchWith decodes body, starts the batch and waits as its WaitOptions say.
func (s *Server) startBatchWith(w http.ResponseWriter, r *http.Request, body any, wo *WaitOptions, start func(*runs.Service) (runs.Batch, error)) {
	rs := s.runsSvc(w, r)
	if rs == nil {
		return
	}
	if err := decode(w, r, body); err != nil {
		s.fail(w, r, err)
		return
	}
	wait, err := wo.Timeout()
	if err != nil {
		s.fail(w, r, err)
		return
	}
	b, err := start(rs)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if wait > 0 && !b.Settled {
		wctx, cancel := s.untilClose(r.Context())
		defer cancel()
		if b, err = rs.WaitBatch(wctx, b.ID, wait); err != nil {
			s.fail(w, r, err)
			return
		}
	}
	writeJSON(w, http.StatusCreated, wireBatch(b))
}

func (s *Server) listBatches(w http.ResponseWriter, r *http.Request) {
	rs := s.runsSvc(w, r)
	if rs == nil {
		return
	}
	q := r.URL.Query()
	lim, err := boundedParam(q, "limit", 1, runs.MaxList)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	// The caller's principal's batches (authz.ListOwner); an admin's lists show every batch.
	ctx := sandbox.WithOwner(r.Context(), authz.ListOwner(r.Context()))
	l, err := rs.ListBatches(ctx, q.Get("before"), int(ptrOr(lim, 0)))
	if l.Batches == nil {
		l.Batches = []runs.Batch{}
	}
	s.reply(w, r, wireBatchList(l), err)
}

func (s *Server) getBatch(w http.ResponseWriter, r *http.Request) {
	if rs := s.runsSvc(w, r); rs != nil {
		b, err := rs.GetBatch(r.Context(), r.PathValue("id"))
		s.reply(w, r, wireBatch(b), err)
	}
}

func (s *Server) cancelBatch(w http.ResponseWriter, r *http.Request) {
	if rs := s.runsSvc(w, r); rs != nil {
		b, err := rs.CancelBatch(r.Context(), r.PathValue("id"))
		s.reply(w, r, wireBatch(b), err)
	}
}
