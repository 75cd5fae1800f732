package sandbox_test

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/sandbox"
)

type recordingObserver struct {
	mu      sync.Mutex
	creates []string
	execs   []string
}

func (o *recordingObserver) ObserveCreate(rt, outcome string, d time.Duration) {
	o.mu.Lock()
	o.creates = append(o.creates, rt+"/"+outcome)
	o.mu.Unlock()
}

func (o *recordingObserver) ObserveExec(rt, outcome string, d time.Duration) {
	o.mu.Lock()
	o.execs = append(o.execs, rt+"/"+outcome)
	o.mu.Unlock()
}

// TestObserverOnFake: the Observer sees creates and execs with their outcome (the samples
// themselves are the metrics package's: internal/sandbox/metrics).
func TestObserverOnFake(t *testing.T) {
	obs := &recordingObserver{}
	e := newFakeEnv(t, sandbox.Config{Observer: obs})
	ctx := t.Context()
	sb := e.create(t, sandbox.CreateRequest{})
	if _, err := e.svc.Exec(ctx, sb.ID, sandbox.ExecRequest{Argv: []string{"sh", "-c", "head -c 1048576 /dev/zero > blob"}}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := e.svc.Exec(ctx, "sb-000000000000", sandbox.ExecRequest{Argv: []string{"true"}}, nil); !errcode.Is(err, errcode.SandboxNotFound) {
		t.Fatalf("exec on an unknown sandbox: %v", err)
	}
	if _, err := e.svc.Create(ctx, sandbox.CreateRequest{CPU: -1}); !errcode.Is(err, errcode.InvalidArgument) {
		t.Fatalf("bad create: %v", err)
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if !slices.Equal(obs.creates, []string{"runc/ok", "runc/INVALID_ARGUMENT"}) {
		t.Errorf("creates observed: %v", obs.creates)
	}
	if !slices.Equal(obs.execs, []string{"runc/ok", "/SANDBOX_NOT_FOUND"}) {
		t.Errorf("execs observed: %v", obs.execs)
	}
}
