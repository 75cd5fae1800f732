package api

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/agentbox/agentbox/internal/authz"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/image"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/wire"
)

// IdempotencyKeyHeader carries a create's idempotency key (or the body's idempotency_key): a
// retried create with the same key, from the same caller, returns the sandbox the first made.
const IdempotencyKeyHeader = "Idempotency-Key"

func (s *Server) createSandbox(w http.ResponseWriter, r *http.Request) {
	var req sandbox.CreateRequest
	if err := decode(w, r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	if h := r.Header.Get(IdempotencyKeyHeader); h != "" {
		if req.IdempotencyKey != "" && req.IdempotencyKey != h {
			s.fail(w, r, errcode.New(errcode.InvalidArgument, "the %s header and the body's idempotency_key differ; give the key once", IdempotencyKeyHeader))
			return
		}
		req.IdempotencyKey = h
	}
	if wantsNDJSON(r) && req.Image != "" && req.Image != "host" {
		// Images: the pull's progress as NDJSON frames, then the sandbox. A
		// malformed reference is refused before the stream, as a plain error.
		if err := sandbox.CheckImageRef("image", req.Image); err != nil {
			s.fail(w, r, err)
			return
		}
		s.withProgress(w, r, http.StatusCreated, func(p image.ProgressFunc) (any, error) {
			sb, err := s.svc.Create(sandbox.WithPullProgress(r.Context(), p), req)
			if err != nil {
				return nil, err
			}
			s.withHardening(&sb)
			return wireSandbox(sb), nil
		})
		return
	}
	sb, err := s.svc.Create(r.Context(), req)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	s.withHardening(&sb)
	writeJSON(w, http.StatusCreated, wireSandbox(sb))
}

// withHardening fills each sandbox's Hardening with what its runtime enforces on every
// sandbox (the runtime's Capabilities.Hardening; not stored).
func (s *Server) withHardening(sbs ...*sandbox.Sandbox) {
	byRuntime := map[string][]string{}
	for _, c := range s.svc.Runtimes() {
		byRuntime[c.Name] = c.Hardening
	}
	for _, sb := range sbs {
		sb.Hardening = byRuntime[sb.Runtime]
	}
}

func (s *Server) listSandboxes(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	var f sandbox.ListFilter
	f.Principal, _ = authz.ListPrincipal(r.Context()) // an admin's lists show every sandbox
	for _, v := range q["state"] {
		for _, st := range strings.Split(v, ",") {
			f.States = append(f.States, sandbox.State(st))
		}
	}
	for _, v := range q["label"] {
		k, val, ok := strings.Cut(v, "=")
		if !ok || k == "" {
			s.fail(w, r, errcode.New(errcode.InvalidArgument, "label filter %q must be key=value", v))
			return
		}
		if f.Labels == nil {
			f.Labels = map[string]string{}
		}
		f.Labels[k] = val
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			s.fail(w, r, errcode.New(errcode.InvalidArgument, "limit must be a positive integer; got %q", v))
			return
		}
		f.Limit = n
	}
	list, err := s.svc.List(r.Context(), f)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if list == nil {
		list = []sandbox.Sandbox{}
	}
	for i := range list {
		s.withHardening(&list[i])
	}
	writeJSON(w, http.StatusOK, SandboxList{Sandboxes: wireSandboxes(list), Count: len(list)})
}

func (s *Server) getSandbox(w http.ResponseWriter, r *http.Request) {
	sb, err := s.svc.Get(r.Context(), r.PathValue("id"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	s.withHardening(&sb)
	writeJSON(w, http.StatusOK, wireSandbox(sb))
}

func (s *Server) destroySandbox(w http.ResponseWriter, r *http.Request) {
	sb, err := s.svc.Destroy(r.Context(), r.PathValue("id"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	s.withHardening(&sb)
	writeJSON(w, http.StatusOK, wireSandbox(sb))
}

// ExtendRequest is the body of POST /v1/sandboxes/{id}/extend.
type ExtendRequest = wire.ExtendRequest

func (s *Server) extendSandbox(w http.ResponseWriter, r *http.Request) {
	var req ExtendRequest
	if err := decode(w, r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	sb, err := s.svc.Extend(r.Context(), r.PathValue("id"), req.TTLSeconds)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	s.withHardening(&sb)
	writeJSON(w, http.StatusOK, wireSandbox(sb))
}

// EventList is the reply of the events endpoints.
type EventList = wire.EventList

func (s *Server) sandboxEvents(w http.ResponseWriter, r *http.Request) {
	s.listEvents(w, r, r.PathValue("id"))
}

func (s *Server) events(w http.ResponseWriter, r *http.Request) {
	s.listEvents(w, r, r.URL.Query().Get("sandbox_id"))
}

func (s *Server) listEvents(w http.ResponseWriter, r *http.Request, id string) {
	f := sandbox.EventFilter{SandboxID: id}
	q := r.URL.Query()
	var err error
	if f.AfterSeq, err = intParam(q.Get("after"), "after"); err == nil {
		var lim int64
		lim, err = intParam(q.Get("limit"), "limit")
		f.Limit = int(lim)
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	var wait time.Duration
	if v := q.Get("wait"); v != "" {
		if wait, err = time.ParseDuration(v); err != nil || wait < 0 || wait > MaxEventWait {
			s.fail(w, r, errcode.New(errcode.InvalidArgument, "wait must be a duration between 0s and %s, such as 25s; got %q", MaxEventWait, v))
			return
		}
	}
	if id != "" {
		if _, err := s.svc.Get(r.Context(), id); err != nil {
			s.fail(w, r, err)
			return
		}
	}
	// A key that is not admin sees the fleet's events of its own sandboxes only: pages of
	// others' are skipped (at most maxSkippedPages), then the wait is for what follows them.
	principal, filtered := authz.ListPrincipal(r.Context())
	filtered = filtered && id == ""
	page := func() ([]sandbox.Event, error) {
		for range maxSkippedPages {
			evs, err := s.svc.Events(r.Context(), f)
			if err != nil || !filtered || len(evs) == 0 {
				return evs, err
			}
			if mine := s.principalsEvents(r.Context(), principal, evs); len(mine) > 0 {
				return mine, nil
			}
			f.AfterSeq = evs[len(evs)-1].Seq
		}
		return nil, nil
	}
	evs, err := page()
	if err == nil && len(evs) == 0 && wait > 0 && s.awaitEvent(r.Context(), f, wait) {
		evs, err = page()
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if evs == nil {
		evs = []sandbox.Event{}
	}
	writeJSON(w, http.StatusOK, EventList{Events: wireEvents(evs)})
}

// principalsEvents keeps the events of principal's sandboxes: the fleet's event list shows a
// key that is not admin only its own (a pruned sandbox's events are nobody's to show).
func (s *Server) principalsEvents(ctx context.Context, principal string, evs []sandbox.Event) []sandbox.Event {
	mine := map[string]bool{}
	out := evs[:0:0]
	for _, ev := range evs {
		ok, seen := mine[ev.SandboxID]
		if !seen {
			sb, err := s.svc.Get(ctx, ev.SandboxID)
			ok = err == nil && sb.Principal == principal
			mine[ev.SandboxID] = ok
		}
		if ok {
			out = append(out, ev)
		}
	}
	return out
}

// maxSkippedPages bounds the pages of other principals' events one event list skips.
const maxSkippedPages = 20

// MaxEventWait bounds how long GET /v1/events?wait=… holds a request.
const MaxEventWait = 60 * time.Second

// awaitEvent waits up to wait for an event that f selects, through the service's event bus. It
// reports whether one arrived.
func (s *Server) awaitEvent(ctx context.Context, f sandbox.EventFilter, wait time.Duration) bool {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	ch, err := s.svc.Subscribe(ctx, f.AfterSeq)
	if err != nil {
		return false
	}
	for {
		select {
		case ev, ok := <-ch:
			if !ok {
				return false
			}
			if f.SandboxID == "" || ev.SandboxID == f.SandboxID {
				return true
			}
		case <-s.done:
			return false
		}
	}
}

func (s *Server) capacity(w http.ResponseWriter, r *http.Request) {
	c, err := s.svc.Capacity(r.Context())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, wireCapacity(c))
}

func (s *Server) runtimes(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, wire.RuntimeList{Default: s.svc.Config().DefaultRuntime, Runtimes: wireRuntimes(s.svc.Runtimes())})
}

// intParam parses an optional non-negative integer query parameter.
func intParam(v, name string) (int64, error) {
	if v == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return 0, errcode.New(errcode.InvalidArgument, "%s must be a non-negative integer; got %q", name, v)
	}
	return n, nil
}
