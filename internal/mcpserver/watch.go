package mcpserver

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentbox/agentbox/internal/egress"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/watch"
)

// Bounds of the watch tools.
const (
	// MaxFleet is how many sandboxes one watch_fleet call watches; more is refused whole.
	MaxFleet = 20
	// maxBatchedMessages and maxBatchedBytes bound the messages a call without a progressToken
	// gets in its result; the rest are counted and the result says it was cut.
	maxBatchedMessages = 500
	maxBatchedBytes    = 256 << 10
	// maxLogText bounds the text of one logs message in a notification or the result.
	maxLogText = 16 << 10
)

// WatchIn are watch's arguments.
type WatchIn struct {
	SandboxID       string `json:"sandbox_id" jsonschema:"The sandbox's id, e.g. sb-0123456789ab."`
	Stream          string `json:"stream,omitempty" jsonschema:"What to watch: lifecycle (state transitions; the default), events (every recorded event: transitions, extends, errors), logs (one job's output as it is written; needs job_id) metrics (a sample every interval_seconds) or connections (each new network connection record: host, port, decision, rule, reason, bytes)."`
	JobID           string `json:"job_id,omitempty" jsonschema:"The job whose output to follow (stream logs only)."`
	DurationSeconds int64  `json:"duration_seconds,omitempty" jsonschema:"Stop watching after this many seconds; default 60, 1 to 3600."`
	IntervalSeconds int64  `json:"interval_seconds,omitempty" jsonschema:"Seconds between metrics samples; default 2, 1 to 60."`
}

// WatchFleetIn are watch_fleet's arguments.
type WatchFleetIn struct {
	SandboxIDs      []string `json:"sandbox_ids" jsonschema:"The sandboxes to watch: 1 to 20 ids, each once. 21 or more is refused as a whole."`
	Stream          string   `json:"stream,omitempty" jsonschema:"lifecycle (the default), events or metrics (logs needs one job: use watch)."`
	DurationSeconds int64    `json:"duration_seconds,omitempty" jsonschema:"Stop watching after this many seconds; default 60, 1 to 3600."`
	IntervalSeconds int64    `json:"interval_seconds,omitempty" jsonschema:"Seconds between metrics samples; default 2, 1 to 60."`
}

// WatchMessage is one message of a stream, as a tool result carries it.
type WatchMessage struct {
	SandboxID string `json:"sandbox_id" jsonschema:"The sandbox the message is about."`
	Kind      string `json:"kind" jsonschema:"state, event, logs, metrics, connection, missed (the watcher fell behind and lost events, or skipped connection records) or end."`
	Seq       int64  `json:"seq,omitempty" jsonschema:"The event's sequence number."`
	At        string `json:"at" jsonschema:"When it happened (RFC 3339)."`
	State     string `json:"state,omitempty" jsonschema:"The sandbox's state."`
	Text      string `json:"text" jsonschema:"The message as one line of text (logs: the output, as UTF-8 text)."`
	Metrics   any    `json:"metrics,omitempty" jsonschema:"The sample (metrics)."`
	// Connection is the record (connections; Seq is its seq).
	Connection *egress.Connection `json:"connection,omitempty" jsonschema:"The connection record (stream connections): seq, time, kind, host, port, addr, decision, rule, reason, bytes_out, bytes_in, duration_ms, intercepted."`
}

// WatchOut is watch's reply: what the watch saw.
type WatchOut struct {
	SandboxID string         `json:"sandbox_id" jsonschema:"The sandbox watched."`
	Stream    string         `json:"stream" jsonschema:"The stream watched."`
	Messages  int            `json:"messages" jsonschema:"How many messages the watch delivered."`
	Counts    map[string]int `json:"counts" jsonschema:"Messages by kind."`
	LastState string         `json:"last_state,omitempty" jsonschema:"The sandbox's last state seen."`
	LastSeq   int64          `json:"last_seq,omitempty" jsonschema:"The last event seen."`
	Missed    int64          `json:"missed" jsonschema:"Events lost because the watcher fell behind (0 normally)."`
	Ended     string         `json:"ended" jsonschema:"Why it ended: sandbox_ended, job_ended, duration or canceled."`
	// Batched messages, for a caller without a progressToken.
	Events          []WatchMessage `json:"events,omitempty" jsonschema:"The messages, when the call had no progressToken (with one, they came as progress notifications)."`
	EventsOmitted   int            `json:"events_omitted,omitempty" jsonschema:"Messages left out of events to keep the result bounded (500 messages, 256 KiB)."`
	EventsTruncated bool           `json:"events_truncated,omitempty" jsonschema:"True when events was cut (see events_omitted)."`
}

// WatchFleetOut is watch_fleet's reply.
type WatchFleetOut struct {
	Sandboxes       []WatchOut     `json:"sandboxes" jsonschema:"One summary per sandbox, in the order asked."`
	Messages        int            `json:"messages" jsonschema:"Messages delivered in all."`
	Missed          int64          `json:"missed" jsonschema:"Events lost in all because a watcher fell behind."`
	Events          []WatchMessage `json:"events,omitempty" jsonschema:"The messages of every sandbox in the order they happened, when the call had no progressToken."`
	EventsOmitted   int            `json:"events_omitted,omitempty" jsonschema:"Messages left out of events to keep the result bounded."`
	EventsTruncated bool           `json:"events_truncated,omitempty" jsonschema:"True when events was cut."`
}

const watchStreamsDoc = `stream: lifecycle (default: the sandbox's state, then every transition), events (every recorded event: transitions, extends, errors), logs (a job's output as written; needs job_id), metrics (a sample every interval_seconds, default 2, 1 to 60), connections (each network connection record written from now on, once, in order: kind, host:port, decision, rule, reason, bytes; more than 1000 at once skips to the newest 100 with a missed message saying how many were skipped — page them with sandbox_connections)`

func (s *Server) addWatchTools() {
	addTool(s, &mcp.Tool{
		Name:  "watch",
		Title: "Watch a sandbox live",
		Description: `Stream one sandbox's events while the call is open. Arguments: sandbox_id (required), ` + watchStreamsDoc + `, duration_seconds (default 60, 1 to 3600).
It ends when the sandbox ends (destroyed, failed or lost), when the job ends (logs), after duration_seconds, or when you cancel the call.
With a progressToken, every message arrives at once as a notifications/progress ("<sandbox_id> <kind> …"); the result is a summary: {messages, counts, last_state, last_seq, missed, ended}. Without one, the messages come batched in the result's events (at most 500 / 256 KiB; events_truncated says when cut).
missed > 0 means the watcher fell behind and lost that many events (a "missed" message says where).
` + errorsDoc(errNotFound, errInvalid, "UNSUPPORTED_OPERATION (this server cannot serve that stream)"),
		Annotations: &mcp.ToolAnnotations{Title: "Watch a sandbox live", ReadOnlyHint: true, OpenWorldHint: ptr(false)},
	}, func(in *jsonschema.Schema) {
		in.Properties["stream"].Enum = []any{watch.StreamLifecycle, watch.StreamEvents, watch.StreamLogs, watch.StreamMetrics, watch.StreamConnections}
	}, s.watchOne)

	addTool(s, &mcp.Tool{
		Name:  "watch_fleet",
		Title: "Watch many sandboxes live",
		Description: `Stream up to 20 sandboxes' events at once while the call is open. Arguments: sandbox_ids (required: 1 to 20 ids; 21 or more is refused as a whole, never cut), stream (lifecycle by default, events or metrics), duration_seconds (default 60, 1 to 3600), interval_seconds (metrics).
Each message is prefixed with its sandbox id and arrives whole: with a progressToken, one notifications/progress per message; without, batched in the result's events (bounded). It ends when every sandbox has ended, after duration_seconds, or when you cancel.
Reply: {sandboxes: [per-sandbox summary {sandbox_id, messages, counts, last_state, missed, ended}], messages, missed}.
` + errorsDoc(errNotFound, errInvalid, "UNSUPPORTED_OPERATION (this server cannot serve that stream)"),
		Annotations: &mcp.ToolAnnotations{Title: "Watch many sandboxes live", ReadOnlyHint: true, OpenWorldHint: ptr(false)},
	}, func(in *jsonschema.Schema) {
		in.Properties["stream"].Enum = []any{watch.StreamLifecycle, watch.StreamEvents, watch.StreamMetrics}
		in.Properties["sandbox_ids"].MinItems = ptr(1)
		in.Properties["sandbox_ids"].MaxItems = ptr(MaxFleet)
	}, s.watchFleet)
}

// sink delivers a call's messages: as progress notifications (whole messages, never
// interleaved: one at a time) or batched, bounded, for the result.
type sink struct {
	mu        sync.Mutex
	notify    func(msg string, n int) // nil: batch
	n         int
	batch     []WatchMessage
	bytes     int
	omitted   int
	truncated bool
}

func (s *Server) newSink(ctx context.Context, req *mcp.CallToolRequest) *sink {
	k := &sink{}
	if tok := req.Params.GetProgressToken(); tok != nil && req.Session != nil {
		k.notify = func(msg string, n int) {
			err := req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: tok, Progress: float64(n), Message: msg})
			if err != nil && ctx.Err() == nil {
				s.log.Debug("watch progress notification failed", "err", err)
			}
		}
	}
	return k
}

func (k *sink) emit(m watch.Message) error {
	if m.Kind == watch.KindHeartbeat {
		return nil
	}
	wm := toolMessage(m)
	k.mu.Lock()
	defer k.mu.Unlock()
	k.n++
	if k.notify != nil {
		k.notify(wm.SandboxID+" "+wm.Text, k.n) // under the lock: whole messages, in order
		return nil
	}
	size := len(wm.Text) + 128
	if len(k.batch) >= maxBatchedMessages || k.bytes+size > maxBatchedBytes {
		k.omitted++
		k.truncated = true
		return nil
	}
	k.bytes += size
	k.batch = append(k.batch, wm)
	return nil
}

// toolMessage renders a stream message for a tool: one line of text, and the fields.
func toolMessage(m watch.Message) WatchMessage {
	wm := WatchMessage{SandboxID: m.SandboxID, Kind: m.Kind, Seq: m.Seq, At: m.At.UTC().Format("2006-01-02T15:04:05.000Z07:00"),
		State: string(m.State), Text: m.Text(maxLogText)}
	wm.Connection = m.Connection
	if m.Kind == watch.KindMetrics {
		var v any
		if json.Unmarshal(m.Metrics, &v) == nil {
			wm.Metrics = v
		}
	}
	return wm
}

func summaryOut(sum watch.Summary) WatchOut {
	return WatchOut{SandboxID: sum.SandboxID, Stream: sum.Stream, Messages: sum.Messages, Counts: sum.Counts,
		LastState: string(sum.LastState), LastSeq: sum.LastSeq, Missed: sum.Missed, Ended: sum.Ended}
}

func (s *Server) watchOne(ctx context.Context, req *mcp.CallToolRequest, in WatchIn) (WatchOut, string, error) {
	k := s.newSink(ctx, req)
	sum, err := s.hub.Watch(ctx, watch.Request{SandboxID: in.SandboxID, Stream: in.Stream, JobID: in.JobID,
		DurationSeconds: in.DurationSeconds, IntervalSeconds: in.IntervalSeconds}, k.emit)
	if err != nil {
		return WatchOut{}, "", err
	}
	out := summaryOut(sum)
	if sum.Counts == nil {
		out.Counts = map[string]int{}
	}
	k.mu.Lock()
	out.Events, out.EventsOmitted, out.EventsTruncated = k.batch, k.omitted, k.truncated
	k.mu.Unlock()
	return out, renderWatch(out), nil
}

func (s *Server) watchFleet(ctx context.Context, req *mcp.CallToolRequest, in WatchFleetIn) (WatchFleetOut, string, error) {
	if len(in.SandboxIDs) == 0 || len(in.SandboxIDs) > MaxFleet {
		return WatchFleetOut{}, "", errcode.New(errcode.InvalidArgument, "sandbox_ids must hold 1 to %d ids; got %d (nothing was watched: split the fleet into calls of at most %d)", MaxFleet, len(in.SandboxIDs), MaxFleet)
	}
	if in.Stream == watch.StreamLogs {
		return WatchFleetOut{}, "", errcode.New(errcode.InvalidArgument, "stream logs follows one job: use watch with sandbox_id and job_id")
	}
	seen := map[string]bool{}
	reqs := make([]watch.Request, len(in.SandboxIDs))
	for i, id := range in.SandboxIDs {
		if seen[id] {
			return WatchFleetOut{}, "", errcode.New(errcode.InvalidArgument, "sandbox_ids[%d]: %s is listed twice; list each sandbox once", i, id)
		}
		seen[id] = true
		reqs[i] = watch.Request{SandboxID: id, Stream: in.Stream, DurationSeconds: in.DurationSeconds, IntervalSeconds: in.IntervalSeconds}
		if err := reqs[i].Validate(); err != nil {
			return WatchFleetOut{}, "", err
		}
	}
	// Every sandbox is checked before any is watched: the call is refused whole or not at all.
	for _, id := range in.SandboxIDs {
		if _, err := s.b.Get(ctx, id); err != nil {
			return WatchFleetOut{}, "", err
		}
	}
	k := s.newSink(ctx, req)
	out := WatchFleetOut{Sandboxes: make([]WatchOut, len(reqs))}
	errs := make([]error, len(reqs))
	var wg sync.WaitGroup
	for i, r := range reqs {
		wg.Go(func() {
			sum, err := s.hub.Watch(ctx, r, k.emit)
			out.Sandboxes[i], errs[i] = summaryOut(sum), err
			if out.Sandboxes[i].SandboxID == "" {
				out.Sandboxes[i].SandboxID, out.Sandboxes[i].Stream = r.SandboxID, r.Stream
			}
			if out.Sandboxes[i].Counts == nil {
				out.Sandboxes[i].Counts = map[string]int{}
			}
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil && ctx.Err() == nil {
			if out.Sandboxes[i].Ended == "" {
				out.Sandboxes[i].Ended = "error: " + errcode.Message(err)
			}
		}
	}
	for _, o := range out.Sandboxes {
		out.Messages += o.Messages
		out.Missed += o.Missed
	}
	k.mu.Lock()
	out.Events, out.EventsOmitted, out.EventsTruncated = k.batch, k.omitted, k.truncated
	k.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "watched %d sandboxes: %d messages, %d missed\n", len(out.Sandboxes), out.Messages, out.Missed)
	for _, o := range out.Sandboxes {
		fmt.Fprintf(&b, "%s: %d messages, last state %s, ended %s\n", o.SandboxID, o.Messages, o.LastState, o.Ended)
	}
	writeBatch(&b, out.Events, out.EventsOmitted)
	return out, b.String(), nil
}

func renderWatch(o WatchOut) string {
	var b strings.Builder
	fmt.Fprintf(&b, "watched %s (%s): %d messages, last state %s, missed %d, ended %s\n", o.SandboxID, o.Stream, o.Messages, o.LastState, o.Missed, o.Ended)
	writeBatch(&b, o.Events, o.EventsOmitted)
	return b.String()
}

func writeBatch(b *strings.Builder, evs []WatchMessage, omitted int) {
	for _, e := range evs {
		fmt.Fprintf(b, "%s %s %s\n", e.At, e.SandboxID, e.Text)
	}
	if omitted > 0 {
		fmt.Fprintf(b, "[%d more messages not included: the result is bounded; call with a progressToken to get every message]\n", omitted)
	}
}

// Watchers returns how many watch streams (watch, watch_fleet) are in progress.
func (s *Server) Watchers() int { return s.hub.Watchers() }
