package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/watch"
)

// SSE timing: a heartbeat comment after this long without a message (proxies and clients keep
// the stream open), and how long one write may take before a client that stopped reading is
// dropped (the watch then ends; nothing waits on it).
const (
	SSEHeartbeat    = 15 * time.Second
	sseWriteTimeout = 30 * time.Second
)

// watchQuery parses GET /v1/sandboxes/{id}/watch's parameters into a watch.Request. Numbers are
// validated, not clamped: a value that is not an integer is INVALID_ARGUMENT naming it.
func watchQuery(r *http.Request) (watch.Request, error) {
	q := r.URL.Query()
	req := watch.Request{SandboxID: r.PathValue("id"), Stream: q.Get("stream"), JobID: q.Get("job_id"), Heartbeat: SSEHeartbeat}
	num := func(name string, lo, hi int64, dst *int64) error {
		v, ok := q[name]
		if !ok {
			return nil
		}
		n, err := strconv.ParseInt(v[0], 10, 64)
		if err != nil || n < lo || n > hi {
			return errcode.New(errcode.InvalidArgument, "%s must be an integer between %d and %d; got %q", name, lo, hi, v[0])
		}
		*dst = n
		return nil
	}
	if err := num("duration_seconds", 1, watch.MaxDurationSeconds, &req.DurationSeconds); err != nil {
		return req, err
	}
	if err := num("interval_seconds", 1, watch.MaxIntervalSeconds, &req.IntervalSeconds); err != nil {
		return req, err
	}
	last := r.Header.Get("Last-Event-ID")
	if last == "" {
		last = q.Get("last_event_id") // for clients that cannot set the header
	}
	if last != "" {
		n, err := strconv.ParseInt(last, 10, 64)
		if err != nil || n < 0 {
			return req, errcode.New(errcode.InvalidArgument, "Last-Event-ID must be an event seq (a non-negative integer); got %q", last)
		}
		req.AfterSeq = n
	}
	return req, req.Validate()
}

// watchSandbox streams a sandbox's events as Server-Sent Events: "id:" is the event's seq (so
// a reconnect with Last-Event-ID resumes the events stream with nothing lost), "event:" the
// message kind, "data:" the watch.Message as JSON; comments are heartbeats. The stream ends
// with an "end" message when the sandbox (or job) ends or duration_seconds passes.
func (s *Server) watchSandbox(w http.ResponseWriter, r *http.Request) {
	req, err := watchQuery(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	rc := http.NewResponseController(w)
	started := false
	write := func(b []byte) error {
		_ = rc.SetWriteDeadline(time.Now().Add(sseWriteTimeout))
		if _, err := w.Write(b); err != nil {
			return err
		}
		return rc.Flush()
	}
	req.Ready = func() {
		h := w.Header()
		h.Set("Content-Type", "text/event-stream")
		h.Set("Cache-Control", "no-cache")
		h.Set("X-Accel-Buffering", "no")
		w.WriteHeader(http.StatusOK)
		started = true
		_ = write([]byte(": watching " + req.SandboxID + " stream " + req.Stream + "\n\n"))
	}
	emit := func(m watch.Message) error {
		if m.Kind == watch.KindHeartbeat {
			return write([]byte(": heartbeat\n\n"))
		}
		data, err := json.Marshal(wireWatchMessage(m))
		if err != nil {
			return err
		}
		var buf []byte
		if m.Seq > 0 {
			buf = fmt.Appendf(buf, "id: %d\n", m.Seq)
		}
		buf = fmt.Appendf(buf, "event: %s\ndata: %s\n\n", m.Kind, data)
		return write(buf)
	}
	ctx := r.Context()
	_, err = s.hub.Watch(ctx, req, emit)
	if err == nil || ctx.Err() != nil {
		return
	}
	if !started {
		s.fail(w, r, err)
		return
	}
	var ne interface{ Timeout() bool }
	if !errors.As(err, &ne) {
		// Tell the caller why the stream stops (best effort: it may be the write that failed).
		d := errorDetail(err)
		b, _ := json.Marshal(errorBody{Error: d})
		_ = write(fmt.Appendf(nil, "event: error\ndata: %s\n\n", b))
	}
	if errcode.Of(err) == errcode.Internal {
		s.log.Warn("watch ended with an error", "sandbox", req.SandboxID, "stream", req.Stream, "err", err)
	}
}
