package createtrace_test

import (
	"context"
	"errors"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/agentbox/agentbox/internal/createtrace"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// TestRecorder: spans shaped as the core makes them become one Trace per create (steps in
// order, nested steps naming their parent, failure and pooling read from the create span),
// the first exec after it is its first request (a later one does not replace it), and the
// recorder keeps only the latest traces.
func TestRecorder(t *testing.T) {
	rec := createtrace.New(2)
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	tr := tp.Tracer("test")
	ctx := context.Background()
	create := func(id string, fail bool) {
		cctx, root := tr.Start(ctx, sandbox.SpanCreate)
		root.SetAttributes(attribute.String(sandbox.AttrSandbox, id), attribute.String(sandbox.AttrRuntime, "runc"))
		_, a := tr.Start(cctx, sandbox.SpanCreateAdmission)
		a.End()
		rctx, r := tr.Start(cctx, sandbox.SpanCreateRuntime)
		_, end := runtime.Step(rctx, runtime.StepDisk)
		end(nil)
		r.End()
		if fail {
			root.SetStatus(codes.Error, errors.New("boom").Error())
		}
		root.End()
	}
	exec := func(id string) {
		_, sp := tr.Start(ctx, sandbox.SpanExec)
		sp.SetAttributes(attribute.String(sandbox.AttrSandbox, id))
		sp.End()
	}
	create("sb-a", false)
	exec("sb-a")
	got := rec.Traces()
	if len(got) != 1 {
		t.Fatalf("%d traces; want 1", len(got))
	}
	a := got[0]
	if a.SandboxID != "sb-a" || a.Runtime != "runc" || a.Failed || a.Pooled || a.FirstRequest <= 0 {
		t.Fatalf("trace = %+v", a)
	}
	if len(a.Steps) != 3 || a.Steps[0].Name != sandbox.SpanCreateAdmission || a.Steps[1].Name != sandbox.SpanCreateRuntime ||
		a.Steps[2].Name != runtime.StepDisk || a.Steps[2].Parent != sandbox.SpanCreateRuntime || a.Steps[0].Parent != "" {
		t.Fatalf("steps = %+v", a.Steps)
	}
	if _, ok := a.Step(runtime.StepDisk); !ok {
		t.Fatal("Step(runtime.disk) not found")
	}
	if _, ok := a.Step(sandbox.SpanCreateImage); ok {
		t.Fatal("Step(create.image) found in a trace without one")
	}
	first := a.FirstRequest
	exec("sb-a")
	if got := rec.Traces()[0].FirstRequest; got != first {
		t.Fatalf("a second exec changed the first request: %v → %v", first, got)
	}
	create("sb-b", true)
	create("sb-c", false)
	got = rec.Traces()
	if len(got) != 2 || got[0].SandboxID != "sb-b" || !got[0].Failed || got[1].SandboxID != "sb-c" {
		t.Fatalf("traces = %+v; want sb-b (failed) then sb-c, sb-a dropped", got)
	}
	rec.Reset()
	if n := len(rec.Traces()); n != 0 {
		t.Fatalf("%d traces after Reset", n)
	}
}
