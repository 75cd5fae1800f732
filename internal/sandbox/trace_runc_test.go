package sandbox_test

import (
	"context"
	"slices"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/agentbox/agentbox/internal/createtrace"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// TestCreateTraceRunc: a create on real runc is one span whose children are every step, in
// order, each with a non-negative duration, together covering the create (their sum within a
// few percent of its total), with the runtime's own steps under the runtime step likewise; the
// first exec after it is its first request. The in-process summary (createtrace) says the same.
func TestCreateTraceRunc(t *testing.T) {
	spans := tracetest.NewSpanRecorder()
	rec := createtrace.New(0)
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans), sdktrace.WithSpanProcessor(rec))
	e := newEnv(t, sandbox.Config{Tracing: tp})
	const n = 3
	for range n {
		sb := e.create(t, sandbox.CreateRequest{})
		e.exec(t, sb.ID, sandbox.ExecRequest{Argv: []string{"true"}})
	}

	// The raw spans: one create span per create, the steps its children.
	byID := map[string]sdktrace.ReadOnlySpan{}
	var creates []sdktrace.ReadOnlySpan
	for _, s := range spans.Ended() {
		byID[s.SpanContext().SpanID().String()] = s
		if s.Name() == sandbox.SpanCreate {
			creates = append(creates, s)
		}
	}
	if len(creates) != n {
		t.Fatalf("%d create spans; want %d", len(creates), n)
	}
	for _, s := range spans.Ended() {
		if s.Name() == sandbox.SpanCreate || s.Name() == sandbox.SpanExec {
			continue
		}
		if _, ok := byID[s.Parent().SpanID().String()]; !ok {
			t.Errorf("span %s has no parent among the recorded spans", s.Name())
		}
	}

	wantTop := []string{sandbox.SpanCreateAdmission, sandbox.SpanCreateRecord, sandbox.SpanCreateRuntime,
		sandbox.SpanCreateAgent, sandbox.SpanCreateUp, sandbox.SpanCreateRunning}
	wantRuntime := []string{runtime.StepLayout, runtime.StepDir, runtime.StepDisk, runtime.StepNetwork, runtime.StepBundle,
		runtime.StepMounts, runtime.StepCreate, runtime.StepAfter}
	wantDisk := []string{runtime.StepDiskCopy, runtime.StepDiskMount}
	traces := rec.Traces()
	if len(traces) != n {
		t.Fatalf("the recorder kept %d traces; want %d", len(traces), n)
	}
	var gaps [][3]bool // per create: whether the create, its runtime and its disk left time uncovered
	for _, tr := range traces {
		if tr.SandboxID == "" || tr.Runtime != "runc" || tr.Pooled || tr.Failed {
			t.Errorf("trace = %+v; want a runc sandbox's successful, unpooled create", tr)
		}
		var top, inRuntime, inDisk []string
		var topSum, rtSum, rtTotal, diskSum, diskTotal time.Duration
		for _, s := range tr.Steps {
			if s.Duration < 0 {
				t.Errorf("%s: step %s took %v", tr.SandboxID, s.Name, s.Duration)
			}
			switch s.Parent {
			case "":
				top = append(top, s.Name)
				topSum += s.Duration
				if s.Name == sandbox.SpanCreateRuntime {
					rtTotal = s.Duration
				}
			case sandbox.SpanCreateRuntime:
				inRuntime = append(inRuntime, s.Name)
				rtSum += s.Duration
				if s.Name == runtime.StepDisk {
					diskTotal = s.Duration
				}
			case runtime.StepDisk:
				inDisk = append(inDisk, s.Name)
				diskSum += s.Duration
			default:
				t.Errorf("%s: step %s under %s", tr.SandboxID, s.Name, s.Parent)
			}
		}
		if !slices.Equal(top, wantTop) {
			t.Errorf("%s: steps %v; want %v in this order", tr.SandboxID, top, wantTop)
		}
		if !slices.Equal(inRuntime, wantRuntime) {
			t.Errorf("%s: runtime steps %v; want %v in this order", tr.SandboxID, inRuntime, wantRuntime)
		}
		if !slices.Equal(inDisk, wantDisk) {
			t.Errorf("%s: disk steps %v; want %v in this order", tr.SandboxID, inDisk, wantDisk)
		}
		// Spans are sequential, so the sum can never pass the total.
		if topSum > tr.Total || rtSum > rtTotal || diskSum > diskTotal {
			t.Errorf("%s: steps sum past their parent: %v of %v, %v of %v, %v of %v", tr.SandboxID, topSum, tr.Total, rtSum, rtTotal, diskSum, diskTotal)
		}
		// The steps cover the create: what is left between them (a lock taken, a log line) is
		// small. Judged on the median create below: work outside every step shows in each
		// create, while a loaded host's preemption between two steps lands in one.
		uncovered := func(sum, total time.Duration) bool { return total-sum > total/20+time.Millisecond }
		gaps = append(gaps, [3]bool{uncovered(topSum, tr.Total), uncovered(rtSum, rtTotal), uncovered(diskSum, diskTotal)})
		if uncovered(topSum, tr.Total) || uncovered(rtSum, rtTotal) || uncovered(diskSum, diskTotal) {
			t.Logf("%s: steps leave time uncovered: %v of a %v create, runtime %v of %v, disk %v of %v", tr.SandboxID, topSum, tr.Total, rtSum, rtTotal, diskSum, diskTotal)
		}
		if tr.FirstRequest <= 0 {
			t.Errorf("%s: no first request after the create", tr.SandboxID)
		}
		t.Logf("%s: total %v, first request %v, steps %+v", tr.SandboxID, tr.Total, tr.FirstRequest, tr.Steps)
	}
	for i, what := range []string{"the create's steps", "the runtime's steps", "the disk's steps"} {
		if n := len(slices.DeleteFunc(slices.Clone(gaps), func(g [3]bool) bool { return !g[i] })); n > len(gaps)/2 {
			t.Errorf("%s leave more than 5%% of their parent uncovered in %d of %d creates: work outside every step", what, n, len(gaps))
		}
	}
	for _, s := range creates {
		if s.EndTime().Before(s.StartTime()) {
			t.Errorf("create span ends before it starts")
		}
	}
	if err := tp.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
}
