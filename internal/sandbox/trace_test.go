package sandbox_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/agentbox/agentbox/internal/createtrace"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/fake"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/store/sqlite"
)

// TestCreateTraceFailedStep (a logic test on the fake runtime; the real tier is
// TestCreateTraceRunc): a create whose runtime fails is traced as failed, the failing step
// carries the error and the steps after it are absent; without a provider nothing is traced
// and creates work as before.
func TestCreateTraceFailedStep(t *testing.T) {
	dir := t.TempDir()
	st, err := sqlite.Open(t.Context(), filepath.Join(dir, "agentbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	rt, err := fake.New(fake.Config{Name: "runc"})
	if err != nil {
		t.Fatal(err)
	}
	spans := tracetest.NewSpanRecorder()
	rec := createtrace.New(0)
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans), sdktrace.WithSpanProcessor(rec))
	svc, err := sandbox.NewService(st, []runtime.Runtime{rt}, sandbox.Config{Tracing: tp}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Close(); rt.Shutdown(context.Background()); st.Close() })
	boom := errcode.New(errcode.RuntimeUnavailable, "injected")
	rt.SetFault(func(_ context.Context, op fake.Op, _ string) error {
		if op == fake.OpRun || op == fake.OpCreate {
			return boom
		}
		return nil
	})
	if _, err := svc.Create(t.Context(), sandbox.CreateRequest{}); !errors.Is(err, boom) && errcode.Of(err) != errcode.RuntimeUnavailable {
		t.Fatalf("create with a failing runtime: %v", err)
	}
	traces := rec.Traces()
	if len(traces) != 1 || !traces[0].Failed || traces[0].SandboxID == "" {
		t.Fatalf("traces = %+v; want one failed create naming its sandbox", traces)
	}
	if _, ok := traces[0].Step(sandbox.SpanCreateAgent); ok {
		t.Fatal("a create whose runtime failed has an agent-ready step")
	}
	var runtimeStep sdktrace.ReadOnlySpan
	for _, s := range spans.Ended() {
		if s.Name() == sandbox.SpanCreateRuntime {
			runtimeStep = s
		}
	}
	if runtimeStep == nil || runtimeStep.Status().Code != codes.Error || len(runtimeStep.Events()) == 0 {
		t.Fatalf("the runtime step does not carry the error: %+v", runtimeStep)
	}

	rt.SetFault(nil)
	sb, err := svc.Create(t.Context(), sandbox.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(rec.Traces()); n != 2 || rec.Traces()[1].SandboxID != sb.ID || rec.Traces()[1].Failed {
		t.Fatalf("after a good create the traces are %+v", rec.Traces())
	}

	quiet, err := sandbox.NewService(st, []runtime.Runtime{rt}, sandbox.Config{}, nil) // no provider
	if err != nil {
		t.Fatal(err)
	}
	defer quiet.Close()
	before := len(spans.Ended())
	if _, err := quiet.Create(t.Context(), sandbox.CreateRequest{}); err != nil {
		t.Fatal(err)
	}
	if after := len(spans.Ended()); after != before {
		t.Fatalf("a service without a provider recorded %d spans", after-before)
	}
}
