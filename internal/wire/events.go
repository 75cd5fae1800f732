package wire

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// Event is a sandbox's recorded event as replies and watch streams carry it.
type Event struct {
	Seq       int64     `json:"seq"`
	SandboxID string    `json:"sandbox_id"`
	Type      string    `json:"type"` // "state"
	From      State     `json:"from,omitempty"`
	To        State     `json:"to"`
	Reason    string    `json:"reason,omitempty"`
	At        time.Time `json:"at"`
}

// EventList is the reply of the events endpoints (GET /v1/events, /v1/sandboxes/{id}/events).
type EventList struct {
	Events []Event `json:"events"`
}

// Connection is one connection a sandbox's egress proxy decided (a watch's connections stream).
type Connection struct {
	SandboxID   string    `json:"sandbox_id"`
	Seq         int64     `json:"seq"`
	Time        time.Time `json:"time"`
	Kind        string    `json:"kind"`
	Host        string    `json:"host"`
	Port        int       `json:"port"`
	Addr        string    `json:"addr,omitempty"` // the resolved address dialed
	Decision    string    `json:"decision"`
	Rule        string    `json:"rule,omitempty"`   // the policy entry that decided, or the built-in class
	Reason      string    `json:"reason,omitempty"` // why, in words, and how to change it when denied
	BytesOut    int64     `json:"bytes_out"`        // sandbox → upstream
	BytesIn     int64     `json:"bytes_in"`         // upstream → sandbox
	DurationMS  int64     `json:"duration_ms"`
	Intercepted bool      `json:"intercepted,omitempty"` // TLS terminated to swap secrets
}

// The kinds of a watch stream's messages (GET /v1/sandboxes/{id}/watch, server-sent events).
const (
	WatchState      = "state"      // lifecycle: the sandbox's state (the first is a snapshot)
	WatchEvent      = "event"      // events: one recorded event
	WatchLogs       = "logs"       // logs: a chunk of the job's output
	WatchMetrics    = "metrics"    // metrics: one sample
	WatchConnection = "connection" // connections: one connection record
	WatchMissed     = "missed"     // the watcher fell behind and lost (connections: skipped) Missed items
	WatchHeartbeat  = "heartbeat"  // nothing happened
	WatchEnd        = "end"        // the stream ended; Reason says why
)

// WatchMessage is one message of a watch stream (the data of one server-sent event).
type WatchMessage struct {
	SandboxID string `json:"sandbox_id"`
	Stream    string `json:"stream"`
	Kind      string `json:"kind"`
	// Seq is the event's sequence number (events and lifecycle; 0 for a snapshot).
	Seq int64     `json:"seq,omitempty"`
	At  time.Time `json:"at"`
	// State is the sandbox's state (lifecycle, events, end).
	State State `json:"state,omitempty"`
	// Event is the recorded event (events, and lifecycle transitions).
	Event *Event `json:"event,omitempty"`
	// JobID, Data and Offset carry a logs chunk: Data is the output (exact bytes, base64 in
	// JSON) starting at byte Offset of the job's log.
	JobID  string `json:"job_id,omitempty"`
	Data   []byte `json:"data,omitempty"`
	Offset int64  `json:"offset,omitempty"`
	// Metrics is one sample (metrics).
	Metrics json.RawMessage `json:"metrics,omitempty"`
	// Connection is one connection record (connections); Seq is its seq.
	Connection *Connection `json:"connection,omitempty"`
	// Missed is how many events the watcher lost (missed; connections: records skipped).
	Missed int64 `json:"missed,omitempty"`
	// Reason says why the stream ended (end), or why a sandbox changed state.
	Reason string `json:"reason,omitempty"`
}

// Text renders m as one line, as the server's watch.Message.Text does (without the sandbox id): "state running → stopping #12: reason",
// "event extend running #13: …", "logs job-… @0: <output>", "metrics {…}", "missed 5 events",
// "end (state destroyed): sandbox_ended". Logs output longer than maxLog bytes is cut, saying so.
func (m WatchMessage) Text(maxLog int) string {
	var b strings.Builder
	b.WriteString(m.Kind)
	switch m.Kind {
	case WatchState:
		if m.Event != nil && m.Event.From != "" {
			fmt.Fprintf(&b, " %s → %s", m.Event.From, m.State)
		} else {
			fmt.Fprintf(&b, " %s", m.State)
		}
	case WatchEvent:
		if e := m.Event; e != nil {
			fmt.Fprintf(&b, " %s", e.Type)
			if e.From != "" && e.From != e.To {
				fmt.Fprintf(&b, " %s → %s", e.From, e.To)
			} else {
				fmt.Fprintf(&b, " %s", e.To)
			}
		}
	case WatchLogs:
		data, cut := m.Data, ""
		if maxLog > 0 && len(data) > maxLog {
			data, cut = data[:maxLog], fmt.Sprintf(" [%d more bytes: page with job_logs]", len(m.Data)-maxLog)
		}
		fmt.Fprintf(&b, " %s @%d: %s%s", m.JobID, m.Offset, strings.ToValidUTF8(string(data), "\uFFFD"), cut)
	case WatchMetrics:
		fmt.Fprintf(&b, " %s", m.Metrics)
	case WatchConnection:
		if c := m.Connection; c != nil {
			fmt.Fprintf(&b, " %s %s:%d %s", c.Kind, c.Host, c.Port, c.Decision)
			if c.Rule != "" {
				fmt.Fprintf(&b, " (rule %s)", c.Rule)
			}
			if c.Addr != "" {
				fmt.Fprintf(&b, " via %s", c.Addr)
			}
			fmt.Fprintf(&b, " out %d in %d %dms", c.BytesOut, c.BytesIn, c.DurationMS)
			if c.Reason != "" {
				fmt.Fprintf(&b, ": %s", c.Reason)
			}
		}
	case WatchMissed:
		what := "events"
		if m.Stream == "connections" {
			what = "connection records skipped"
		}
		fmt.Fprintf(&b, " %d %s", m.Missed, what)
	case WatchEnd:
		fmt.Fprintf(&b, " (state %s)", m.State)
	}
	if m.Seq > 0 {
		fmt.Fprintf(&b, " #%d", m.Seq)
	}
	if m.Reason != "" && m.Kind != WatchLogs {
		fmt.Fprintf(&b, ": %s", m.Reason)
	}
	return strings.ToValidUTF8(b.String(), "\uFFFD")
}
