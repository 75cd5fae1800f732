package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/wire"
)

// WatchOptions are a watch's parameters (zero values take the server's defaults).
type WatchOptions struct {
	Stream          string // lifecycle (default), events, logs, metrics, connections
	JobID           string // logs
	DurationSeconds int64  // 1..3600 (0 = 60)
	IntervalSeconds int64  // metrics, 1..60 (0 = 2)
	// LastEventID resumes an events or lifecycle stream after this event seq, a connections
	// stream after this connection record seq (sent as Last-Event-ID).
	LastEventID int64
	// OnOpen, if set, is called once the server accepted the watch (its response headers
	// arrived): every event recorded after that is part of the stream.
	OnOpen func()
}

// maxSSELine bounds one line of the stream (a logs message carries at most 64 KiB, base64).
const maxSSELine = 1 << 20

// Watch streams GET /v1/sandboxes/{id}/watch: fn gets every message, in order, the final "end"
// message included, until the stream ends, ctx ends or fn returns an error. It returns the last
// event seq delivered (to resume an events stream with LastEventID after a dropped
// connection) and nil when the stream ended with its end message; a connection that drops
// before it is an error.
func (c *Client) Watch(ctx context.Context, id string, o WatchOptions, fn func(wire.WatchMessage) error) (int64, error) {
	q := url.Values{}
	if o.Stream != "" {
		q.Set("stream", o.Stream)
	}
	if o.JobID != "" {
		q.Set("job_id", o.JobID)
	}
	if o.DurationSeconds != 0 {
		q.Set("duration_seconds", strconv.FormatInt(o.DurationSeconds, 10))
	}
	if o.IntervalSeconds != 0 {
		q.Set("interval_seconds", strconv.FormatInt(o.IntervalSeconds, 10))
	}
	u := c.base + "/v1/sandboxes/" + url.PathEscape(id) + "/watch?" + q.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Accept", "text/event-stream")
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	if o.LastEventID > 0 {
		req.Header.Set("Last-Event-ID", strconv.FormatInt(o.LastEventID, 10))
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return o.LastEventID, fmt.Errorf("cannot reach the agentbox server at %s (is `agentbox serve` running? set AGENTBOX_URL to point elsewhere): %w", c.base, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		return o.LastEventID, decodeError(resp)
	}
	if o.OnOpen != nil {
		o.OnOpen()
	}
	return readSSE(resp.Body, o.LastEventID, fn)
}

// readSSE parses a Server-Sent Events stream of watch messages.
func readSSE(r io.Reader, last int64, fn func(wire.WatchMessage) error) (int64, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxSSELine)
	var event string
	var data bytes.Buffer
	for sc.Scan() {
		line := sc.Bytes()
		switch {
		case len(line) == 0: // dispatch
			if data.Len() == 0 {
				event = ""
				continue
			}
			if event == "error" {
				var b struct {
					Error struct {
						Code    string         `json:"code"`
						Message string         `json:"message"`
						Details map[string]any `json:"details"`
					} `json:"error"`
				}
				if err := json.Unmarshal(data.Bytes(), &b); err != nil || b.Error.Code == "" {
					return last, errcode.New(errcode.Internal, "watch stream error: %s", data.String())
				}
				return last, &errcode.Error{Code: errcode.Code(b.Error.Code), Message: b.Error.Message, Details: b.Error.Details}
			}
			var m wire.WatchMessage
			if err := json.Unmarshal(data.Bytes(), &m); err != nil {
				return last, fmt.Errorf("watch stream: bad message %q: %w", data.String(), err)
			}
			data.Reset()
			event = ""
			if m.Seq > 0 {
				last = m.Seq
			}
			if err := fn(m); err != nil {
				return last, err
			}
			if m.Kind == wire.WatchEnd {
				return last, nil
			}
		case line[0] == ':': // comment: heartbeat
		default:
			field, value, _ := bytes.Cut(line, []byte(":"))
			value = bytes.TrimPrefix(value, []byte(" "))
			switch string(field) {
			case "event":
				event = string(value)
			case "data":
				if data.Len() > 0 {
					data.WriteByte('\n')
				}
				data.Write(value)
			}
		}
	}
	if err := sc.Err(); err != nil {
		return last, fmt.Errorf("watch stream broke after event %d (resume with LastEventID): %w", last, err)
	}
	return last, fmt.Errorf("watch stream closed before its end message, after event %d (resume with LastEventID): %w", last, io.ErrUnexpectedEOF)
}
