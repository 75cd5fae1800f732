// Package createtrace summarises the create trace in process: a span processor that turns the
// spans of each sandbox create (internal/sandbox's SpanCreate and its children, the runtime's
// steps under them) into one Trace of step durations, with the sandbox's first exec after it,
// and keeps the latest ones. The bench reads it; a server exports the same spans over OTLP
// (docs/TRACE.md).
package createtrace

import (
	"context"
	"slices"
	"sync"
	"time"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/agentbox/agentbox/internal/sandbox"
)

// Step is one step of a create: a span under the create's, by name, with its parent step's
// name ("" for a direct child of the create).
type Step struct {
	Name     string
	Parent   string
	Start    time.Time
	Duration time.Duration
}

// Trace is one create's steps.
type Trace struct {
	SandboxID string
	Runtime   string
	// Pooled says a warm pool answered the create (its steps are the claim's).
	Pooled bool
	// Failed says the create returned an error.
	Failed bool
	Start  time.Time
	// Total is the create span's duration.
	Total time.Duration
	// Steps are the create's steps in the order they started.
	Steps []Step
	// FirstRequest is the sandbox's first exec after the create (0 until there is one).
	FirstRequest time.Duration
}

// Step returns the summed duration of the steps named name, and whether there was one.
func (t Trace) Step(name string) (time.Duration, bool) {
	var d time.Duration
	found := false
	for _, s := range t.Steps {
		if s.Name == name {
			d, found = d+s.Duration, true
		}
	}
	return d, found
}

// Recorder is an sdktrace.SpanProcessor keeping the latest Max create traces. Register it with
// sdktrace.WithSpanProcessor on the provider the service traces with (sandbox.Config.Tracing).
type Recorder struct {
	max int

	mu      sync.Mutex
	pending map[trace.TraceID][]sdktrace.ReadOnlySpan // the ended children of creates in flight
	done    []Trace                                   // oldest first
}

// DefaultMax is how many traces a Recorder keeps when New is given 0.
const DefaultMax = 4096

// New returns a Recorder keeping the latest max traces (0: DefaultMax).
func New(max int) *Recorder {
	if max <= 0 {
		max = DefaultMax
	}
	return &Recorder{max: max, pending: map[trace.TraceID][]sdktrace.ReadOnlySpan{}}
}

// Traces returns the kept traces, oldest first.
func (r *Recorder) Traces() []Trace {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Trace, len(r.done))
	for i, t := range r.done {
		out[i] = t
		out[i].Steps = slices.Clone(t.Steps)
	}
	return out
}

// Reset forgets every kept trace.
func (r *Recorder) Reset() {
	r.mu.Lock()
	r.done = nil
	r.mu.Unlock()
}

// OnStart does nothing: a span is read when it ends.
func (r *Recorder) OnStart(context.Context, sdktrace.ReadWriteSpan) {}

// OnEnd files an ended span: a create's child under its trace, a create as a Trace, an exec as
// its sandbox's first request if it has none yet.
func (r *Recorder) OnEnd(s sdktrace.ReadOnlySpan) {
	r.mu.Lock()
	defer r.mu.Unlock()
	tid := s.SpanContext().TraceID()
	switch {
	case s.Name() == sandbox.SpanCreate:
		r.finish(s, r.pending[tid])
		delete(r.pending, tid)
	case s.Name() == sandbox.SpanExec:
		if s.Parent().IsValid() { // an exec inside another operation, not a caller's request
			return
		}
		id := attr(s, sandbox.AttrSandbox)
		for i := len(r.done) - 1; i >= 0; i-- {
			if r.done[i].SandboxID == id {
				if r.done[i].FirstRequest == 0 {
					r.done[i].FirstRequest = s.EndTime().Sub(s.StartTime())
				}
				return
			}
		}
	case s.Parent().IsValid():
		if len(r.pending) < 4*r.max { // bounded: traces whose create never ends are not kept forever
			r.pending[tid] = append(r.pending[tid], s)
		}
	}
}

func (r *Recorder) finish(root sdktrace.ReadOnlySpan, kids []sdktrace.ReadOnlySpan) {
	t := Trace{SandboxID: attr(root, sandbox.AttrSandbox), Runtime: attr(root, sandbox.AttrRuntime),
		Pooled: attr(root, sandbox.AttrPooled) == "true", Failed: root.Status().Code == codes.Error,
		Start: root.StartTime(), Total: root.EndTime().Sub(root.StartTime())}
	names := map[trace.SpanID]string{}
	for _, k := range kids {
		names[k.SpanContext().SpanID()] = k.Name()
	}
	rootID := root.SpanContext().SpanID()
	for _, k := range kids {
		st := Step{Name: k.Name(), Start: k.StartTime(), Duration: k.EndTime().Sub(k.StartTime())}
		if p := k.Parent().SpanID(); p != rootID {
			st.Parent = names[p]
		}
		t.Steps = append(t.Steps, st)
	}
	slices.SortStableFunc(t.Steps, func(a, b Step) int { return a.Start.Compare(b.Start) })
	r.done = append(r.done, t)
	if len(r.done) > r.max {
		r.done = slices.Delete(r.done, 0, len(r.done)-r.max)
	}
}

func attr(s sdktrace.ReadOnlySpan, key string) string {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return kv.Value.Emit()
		}
	}
	return ""
}

// Shutdown does nothing.
func (r *Recorder) Shutdown(context.Context) error { return nil }

// ForceFlush does nothing: every trace is summarised when its create ends.
func (r *Recorder) ForceFlush(context.Context) error { return nil }

var _ sdktrace.SpanProcessor = (*Recorder)(nil)
