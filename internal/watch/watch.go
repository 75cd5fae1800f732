// Package watch turns the control plane's event bus into live streams of one sandbox: its state
// transitions (lifecycle), every recorded event (events), one job's output as it is written
// (logs), periodic resource samples (metrics) and its network connections as the egress proxy
// records them (connections). A Hub holds one subscription to the bus and fans
// each event out to its watchers through bounded buffers: a watcher that falls behind never slows
// the bus or another watcher; it catches up from the store by cursor, or, if that fails, is told
// in a "missed" message how many events it lost. It is shared by the REST (SSE) and MCP surfaces.
package watch

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/agentbox/agentbox/internal/egress"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// Streams.
const (
	StreamLifecycle = "lifecycle"
	StreamEvents    = "events"
	StreamLogs      = "logs"
	StreamMetrics   = "metrics"
	// StreamConnections delivers each new connection record of the sandbox (egress.Connection),
	// once, in order.
	StreamConnections = "connections"
)

// Streams lists every stream name.
var Streams = []string{StreamLifecycle, StreamEvents, StreamLogs, StreamMetrics, StreamConnections}

// Message kinds.
const (
	KindState   = "state"   // lifecycle: the sandbox's state (the first is a snapshot)
	KindEvent   = "event"   // events: one recorded event
	KindLogs    = "logs"    // logs: a chunk of the job's output
	KindMetrics = "metrics" // metrics: one sample
	// KindConnection is one connection record (connections).
	KindConnection = "connection"
	KindMissed     = "missed"    // the watcher fell behind and lost (connections: skipped) Missed items
	KindHeartbeat  = "heartbeat" // nothing happened (only when Request.Heartbeat is set)
	KindEnd        = "end"       // the stream ended; Reason says why
)

// End reasons.
const (
	EndSandbox  = "sandbox_ended"
	EndJob      = "job_ended"
	EndDuration = "duration"
	EndCanceled = "canceled"
)

// Bounds and defaults of a watch's arguments (validated, never clamped).
const (
	DefaultDurationSeconds = 60
	MaxDurationSeconds     = 3600
	DefaultIntervalSeconds = 2
	MaxIntervalSeconds     = 60
	// Buffer is how many events one watcher may have waiting before it starts to miss them.
	Buffer = 256
	// MaxLogChunk bounds the bytes of one logs message.
	MaxLogChunk = 64 << 10
	// LogPoll is how often a logs stream reads the job's log when its source answers at once
	// rather than waiting for output (an agent older than log long polls, or a Backend over
	// REST); Options.LogPoll overrides it.
	LogPoll = 200 * time.Millisecond
	// LogLongPoll is the wait of one long-polling read of a job's log (under the agent's
	// bound, guest.MaxJobLogWait): the read answers as soon as the job writes or ends.
	LogLongPoll = 25 * time.Second
	// ConnPage is how many connection records one read of a connections stream takes.
	ConnPage = 100
	// MaxConnBacklog is how many connection records a connections stream delivers per wake: a
	// watcher with more waiting has fallen behind; it skips to the newest ConnPage records and
	// is told how many it skipped in a missed message.
	MaxConnBacklog = 1000
	// connPoll is how often a connections stream looks for new records when nothing woke it
	// (records written by another process, or a Source without a wake).
	connPoll = time.Second
)

// Message is one item of a stream.
type Message struct {
	SandboxID string `json:"sandbox_id"`
	Stream    string `json:"stream"`
	Kind      string `json:"kind"`
	// Seq is the event's sequence number (events and lifecycle; 0 for a snapshot).
	Seq int64     `json:"seq,omitempty"`
	At  time.Time `json:"at"`
	// State is the sandbox's state (lifecycle, events, end).
	State sandbox.State `json:"state,omitempty"`
	// Event is the recorded event (events, and lifecycle transitions).
	Event *sandbox.Event `json:"event,omitempty"`
	// JobID, Data and Offset carry a logs chunk: Data is the output (exact bytes, base64 in
	// JSON) starting at byte Offset of the job's log.
	JobID  string `json:"job_id,omitempty"`
	Data   []byte `json:"data,omitempty"`
	Offset int64  `json:"offset,omitempty"`
	// Metrics is one sample (metrics).
	Metrics json.RawMessage `json:"metrics,omitempty"`
	// Connection is one connection record (connections); Seq is its seq.
	Connection *egress.Connection `json:"connection,omitempty"`
	// Missed is how many events the watcher lost (missed; connections: records skipped).
	Missed int64 `json:"missed,omitempty"`
	// Reason says why the stream ended (end), or why a sandbox changed state.
	Reason string `json:"reason,omitempty"`
}

// Request is one watch.
type Request struct {
	SandboxID string
	Stream    string
	JobID     string // logs only
	// DurationSeconds bounds the watch (0 = 60; 1..3600).
	DurationSeconds int64
	// IntervalSeconds is the metrics sample period (0 = 2; 1..60).
	IntervalSeconds int64
	// AfterSeq resumes an events or lifecycle stream after this event (SSE Last-Event-ID): every
	// event (transition) of the sandbox with a greater sequence number is delivered, none lost
	// across a reconnect, and a resumed lifecycle stream sends no new snapshot. For a connections
	// stream it is a connection record's seq: the records after it are delivered. Without it, a
	// connections stream starts with the records written after the watch began.
	AfterSeq int64
	// Heartbeat, if set, emits a heartbeat message after this long without another message.
	Heartbeat time.Duration
	// Ready, if set, is called once the watch is accepted (arguments valid, sandbox found),
	// before the first message: an SSE handler sends its headers then.
	Ready func()
}

// Validate checks the arguments and fills the defaults.
func (r *Request) Validate() error {
	if !sandbox.ValidID(r.SandboxID) {
		return errcode.New(errcode.InvalidArgument, "sandbox_id must look like sb-0123456789ab; got %q", r.SandboxID)
	}
	switch r.Stream {
	case "":
		r.Stream = StreamLifecycle
	case StreamLifecycle, StreamEvents, StreamMetrics, StreamConnections:
	case StreamLogs:
		if r.JobID == "" {
			return errcode.New(errcode.InvalidArgument, "stream logs needs job_id (from job_start or job_list)")
		}
	default:
		return errcode.New(errcode.InvalidArgument, "stream must be one of lifecycle, events, logs, metrics, connections; got %q", r.Stream)
	}
	if r.JobID != "" && r.Stream != StreamLogs {
		return errcode.New(errcode.InvalidArgument, "job_id is only for stream logs; got stream %q", r.Stream)
	}
	if r.DurationSeconds == 0 {
		r.DurationSeconds = DefaultDurationSeconds
	}
	if r.DurationSeconds < 1 || r.DurationSeconds > MaxDurationSeconds {
		return errcode.New(errcode.InvalidArgument, "duration_seconds must be between 1 and %d; got %d", MaxDurationSeconds, r.DurationSeconds)
	}
	if r.IntervalSeconds == 0 {
		r.IntervalSeconds = DefaultIntervalSeconds
	}
	if r.IntervalSeconds < 1 || r.IntervalSeconds > MaxIntervalSeconds {
		return errcode.New(errcode.InvalidArgument, "interval_seconds must be between 1 and %d; got %d", MaxIntervalSeconds, r.IntervalSeconds)
	}
	if r.AfterSeq < 0 {
		return errcode.New(errcode.InvalidArgument, "the resume cursor (Last-Event-ID) must be a non-negative event seq; got %d", r.AfterSeq)
	}
	if r.AfterSeq > 0 && r.Stream != StreamEvents && r.Stream != StreamLifecycle && r.Stream != StreamConnections {
		return errcode.New(errcode.InvalidArgument, "resuming (Last-Event-ID) is only for streams events, lifecycle and connections; got stream %q", r.Stream)
	}
	return nil
}

// Summary is what a finished watch saw.
type Summary struct {
	SandboxID string `json:"sandbox_id"`
	Stream    string `json:"stream"`
	// Messages counts the messages delivered (heartbeats and the end message excluded).
	Messages int `json:"messages"`
	// Counts is Messages by kind.
	Counts map[string]int `json:"counts"`
	// LastState is the last state of the sandbox the watch saw.
	LastState sandbox.State `json:"last_state,omitempty"`
	// LastSeq is the last event delivered (resume an events stream after it).
	LastSeq int64 `json:"last_seq,omitempty"`
	// Missed counts events lost when the watcher fell behind and could not catch up from the
	// store; Recovered counts those it did catch up.
	Missed    int64 `json:"missed"`
	Recovered int64 `json:"recovered,omitempty"`
	// Ended says why the watch ended: sandbox_ended, job_ended, duration or canceled.
	Ended string `json:"ended"`
}

// JobLogChunk is one page of a job's output.
type JobLogChunk struct {
	Data []byte
	// Offset is where Data starts (past the asked offset when the older output is gone).
	Offset     int64
	NextOffset int64
	TotalBytes int64
	// Running is false once the job has ended (its log is then complete).
	Running bool
}

// JobLogPager reads a job's output from offset, at most max bytes, and says whether the job is
// still running. With wait > 0 it may long-poll: when there is nothing past offset and the job
// runs, hold the read until the job writes or ends, or wait passes (then an empty chunk). A
// pager that cannot wait answers at once; the logs stream then reads every Options.LogPoll.
type JobLogPager func(ctx context.Context, sandboxID, jobID string, offset, max int64, wait time.Duration) (JobLogChunk, error)

// ConnectionPager pages a sandbox's connection records after a cursor (sandbox.Service.Connections).
type ConnectionPager func(ctx context.Context, sandboxID string, after int64, limit int) (sandbox.ConnectionList, error)

// ConnectionWake returns a channel closed when connection records of a sandbox are next
// written, and a release to call when the caller stops waiting
// (netsession.Service.ConnectionsChanged).
type ConnectionWake func(sandboxID string) (<-chan struct{}, func())

// MetricsSource takes one sample of a sandbox's metrics (any JSON-encodable value).
type MetricsSource func(ctx context.Context, sandboxID string) (any, error)

// Text renders m as one line (without the sandbox id): "state running → stopping #12: reason",
// "event extend running #13: …", "logs job-… @0: <output>", "metrics {…}", "missed 5 events",
// "end (state destroyed): sandbox_ended". Logs output longer than maxLog bytes is cut, saying so.
func (m Message) Text(maxLog int) string {
	var b strings.Builder
	b.WriteString(m.Kind)
	switch m.Kind {
	case KindState:
		if m.Event != nil && m.Event.From != "" {
			fmt.Fprintf(&b, " %s → %s", m.Event.From, m.State)
		} else {
			fmt.Fprintf(&b, " %s", m.State)
		}
	case KindEvent:
		if e := m.Event; e != nil {
			fmt.Fprintf(&b, " %s", e.Type)
			if e.From != "" && e.From != e.To {
				fmt.Fprintf(&b, " %s → %s", e.From, e.To)
			} else {
				fmt.Fprintf(&b, " %s", e.To)
			}
		}
	case KindLogs:
		data, cut := m.Data, ""
		if maxLog > 0 && len(data) > maxLog {
			data, cut = data[:maxLog], fmt.Sprintf(" [%d more bytes: page with job_logs]", len(m.Data)-maxLog)
		}
		fmt.Fprintf(&b, " %s @%d: %s%s", m.JobID, m.Offset, strings.ToValidUTF8(string(data), "\uFFFD"), cut)
	case KindMetrics:
		fmt.Fprintf(&b, " %s", m.Metrics)
	case KindConnection:
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
	case KindMissed:
		what := "events"
		if m.Stream == StreamConnections {
			what = "connection records skipped"
		}
		fmt.Fprintf(&b, " %d %s", m.Missed, what)
	case KindEnd:
		fmt.Fprintf(&b, " (state %s)", m.State)
	}
	if m.Seq > 0 {
		fmt.Fprintf(&b, " #%d", m.Seq)
	}
	if m.Reason != "" && m.Kind != KindLogs {
		fmt.Fprintf(&b, ": %s", m.Reason)
	}
	return strings.ToValidUTF8(b.String(), "\uFFFD")
}
