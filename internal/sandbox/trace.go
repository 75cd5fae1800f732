package sandbox

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// The create trace: every create is one span (SpanCreate) whose children, one per step and in
// order, cover it; the runtime adds its own steps under SpanCreateRuntime (runtime.Step*). An
// exec is a span (SpanExec) too, so that a create's first request is seen beside it. docs/TRACE.md
// lists them.
const (
	// TracerName names the tracer the core's spans come from.
	TracerName = "github.com/agentbox/agentbox/internal/sandbox"

	SpanCreate = "sandbox.create"
	// SpanCreateAdmission: the Request hooks, validation, the draft record and the Prepare
	// hooks (a warm pool's claim answers here).
	SpanCreateAdmission = "create.admission"
	// SpanCreateImage: an OCI image resolved and pinned (absent for the host image).
	SpanCreateImage = "create.image"
	// SpanCreateRecord: the host's headroom, the store's admission and the record written, the
	// sandbox's host id range allocated.
	SpanCreateRecord = "create.record"
	// SpanCreateRuntime: the runtime makes and starts the sandbox (its children name the steps).
	SpanCreateRuntime = "create.runtime"
	// SpanCreateAgent: from the runtime's start until the agent answers.
	SpanCreateAgent = "create.agent_ready"
	// SpanCreateUp: the Up hooks (a feature readies the running sandbox).
	SpanCreateUp = "create.up"
	// SpanCreateRunning: the record says running.
	SpanCreateRunning = "create.running"
	// SpanExec is one exec, the first request after a create included.
	SpanExec = "sandbox.exec"

	// AttrSandbox, AttrRuntime and AttrPooled are the spans' attributes: the sandbox's id, its
	// runtime, and whether a warm pool answered the create.
	AttrSandbox = "sandbox.id"
	AttrRuntime = "sandbox.runtime"
	AttrPooled  = "sandbox.pooled"
)

// tracer returns the tracer of the configured provider (Config.Tracing), a no-op one without.
func (c *Config) tracer() trace.Tracer {
	if c.Tracing == nil {
		return noop.NewTracerProvider().Tracer(TracerName)
	}
	return c.Tracing.Tracer(TracerName)
}

// traceStep starts the child span of one step of the current operation; its end records err.
func (s *Service) traceStep(ctx context.Context, name string) (context.Context, func(err error)) {
	ctx, sp := s.tracer.Start(ctx, name)
	return ctx, func(err error) { endSpan(sp, err) }
}

func endSpan(sp trace.Span, err error) {
	if err != nil {
		sp.RecordError(err)
		sp.SetStatus(codes.Error, err.Error())
	}
	sp.End()
}

func sandboxAttrs(sb *Sandbox) []attribute.KeyValue {
	return []attribute.KeyValue{attribute.String(AttrSandbox, sb.ID), attribute.String(AttrRuntime, sb.Runtime)}
}
