package runtime

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// The runtime's steps of a create, each a child span of the create's runtime step when the
// caller traces (the control plane's create trace; docs/TRACE.md). A runtime names its steps
// with these so that every runtime's trace reads the same.
const (
	// StepLayout: the checks before anything is made, and the runtime's shared root file
	// system (made by the first create only).
	StepLayout = "runtime.layout"
	// StepDir: the sandbox's directory made, closed to other host users, its id range
	// recorded.
	StepDir = "runtime.dir"
	// StepDisk: the sandbox's disk made (an image copied, mounted).
	StepDisk = "runtime.disk"
	// StepDiskCopy and StepDiskMount are StepDisk's parts: the image copied from the runtime's
	// formatted template; attached to a loop device and mounted.
	StepDiskCopy  = "runtime.disk.copy"
	StepDiskMount = "runtime.disk.mount"
	// StepNetwork: the sandbox's network namespace and its egress plumbing.
	StepNetwork = "runtime.network"
	// StepMounts: the root file system's mounts (overlays, id-mapped views).
	StepMounts = "runtime.mounts"
	// StepBundle: the bundle's spec built and written.
	StepBundle = "runtime.bundle"
	// StepCreate and StepStart: the OCI runtime's create and start (one `run` is StepCreate
	// alone).
	StepCreate = "runtime.create"
	StepStart  = "runtime.start"
	// StepAfter: what the runtime does once its container runs (OOM guard, the init recorded).
	StepAfter = "runtime.after"
)

// tracerName names the tracer runtime steps come from.
const tracerName = "github.com/agentbox/agentbox/internal/runtime"

// Step starts a child span of ctx's span named name, from ctx's span's own provider (no span:
// nothing is recorded); end it with the step's error.
func Step(ctx context.Context, name string) (context.Context, func(error)) {
	ctx, sp := trace.SpanFromContext(ctx).TracerProvider().Tracer(tracerName).Start(ctx, name)
	return ctx, func(err error) {
		if err != nil {
			sp.RecordError(err)
			sp.SetStatus(codes.Error, err.Error())
		}
		sp.End()
	}
}

// Steps traces a sequence of steps: Next ends the current step and starts the next one, Done
// ends the current one with the operation's error. The zero Steps is not usable; NewSteps.
type Steps struct {
	ctx, cur context.Context
	end      func(error)
}

// NewSteps returns a sequence of steps under ctx's span.
func NewSteps(ctx context.Context) *Steps { return &Steps{ctx: ctx} }

// Next ends the current step (successfully) and starts the step named name.
func (s *Steps) Next(name string) {
	if s.end != nil {
		s.end(nil)
	}
	s.cur, s.end = Step(s.ctx, name)
}

// Context is the current step's context (its sub-steps' parent); before the first step, the
// sequence's.
func (s *Steps) Context() context.Context {
	if s.cur == nil {
		return s.ctx
	}
	return s.cur
}

// Done ends the current step with err; it is safe to call more than once.
func (s *Steps) Done(err error) {
	if s.end != nil {
		s.end(err)
		s.end = nil
	}
}

// Observed records a step that was watched rather than run — its start and end were seen from
// outside (a pod's status, say) — as a finished child span of ctx's span; a zero start or an
// end before it records nothing.
func Observed(ctx context.Context, name string, start, end time.Time) {
	if start.IsZero() || end.Before(start) {
		return
	}
	_, sp := trace.SpanFromContext(ctx).TracerProvider().Tracer(tracerName).Start(ctx, name, trace.WithTimestamp(start))
	sp.End(trace.WithTimestamp(end))
}
