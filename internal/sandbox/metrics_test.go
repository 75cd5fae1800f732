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

// TestMetricsOnFake: the fake runtime measures its directory's disk use and says it measures
// nothing else (no CPU percentage is made up); the Observer sees creates and execs with their
// outcome; a sandbox that is not running has no metrics.
func TestMetricsOnFake(t *testing.T) {
	obs := &recordingObserver{}
	e := newFakeEnv(t, sandbox.Config{Observer: obs})
	ctx := t.Context()
	sb := e.create(t, sandbox.CreateRequest{})
	m0, err := e.svc.Metrics(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if m0.SandboxID != sb.ID || m0.Runtime != "runc" || m0.State != sandbox.StateRunning || m0.Disk == nil ||
		m0.CPU != nil || m0.Memory != nil || m0.Pids != nil || m0.CPUPercent != nil ||
		!slices.Equal(m0.Unsupported, []string{"cpu", "memory", "pids"}) {
		t.Fatalf("fake sample: %+v", m0)
	}
	if _, err := e.svc.Exec(ctx, sb.ID, sandbox.ExecRequest{Argv: []string{"sh", "-c", "head -c 1048576 /dev/zero > blob"}}, nil); err != nil {
		t.Fatal(err)
	}
	m1, err := e.svc.Metrics(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if d := m1.Disk.UsedBytes - m0.Disk.UsedBytes; d < 1<<20 {
		t.Errorf("disk used rose by %d after writing 1 MiB", d)
	}
	if m1.CPUPercent != nil {
		t.Errorf("a cpu percentage without cpu samples: %v", *m1.CPUPercent)
	}
	fleet, err := e.svc.FleetMetrics(ctx)
	if err != nil || len(fleet.Sandboxes) != 1 || fleet.Failed != 0 || fleet.Sandboxes[0].SandboxID != sb.ID {
		t.Fatalf("fleet: %+v %v", fleet, err)
	}
	if _, err := e.svc.Exec(ctx, "sb-000000000000", sandbox.ExecRequest{Argv: []string{"true"}}, nil); !errcode.Is(err, errcode.SandboxNotFound) {
		t.Fatalf("exec on an unknown sandbox: %v", err)
	}
	if _, err := e.svc.Create(ctx, sandbox.CreateRequest{CPU: -1}); !errcode.Is(err, errcode.InvalidArgument) {
		t.Fatalf("bad create: %v", err)
	}
	if _, err := e.svc.Destroy(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := e.svc.Metrics(ctx, sb.ID); !errcode.Is(err, errcode.SandboxNotRunning) {
		t.Errorf("metrics of a destroyed sandbox: %v", err)
	}
	if _, err := e.svc.Metrics(ctx, "sb-000000000000"); !errcode.Is(err, errcode.SandboxNotFound) {
		t.Errorf("metrics of an unknown sandbox: %v", err)
	}
	if _, err := e.svc.Metrics(ctx, "../x"); !errcode.Is(err, errcode.InvalidArgument) {
		t.Errorf("metrics of a malformed id: %v", err)
	}
	fleet, err = e.svc.FleetMetrics(ctx)
	if err != nil || len(fleet.Sandboxes) != 0 {
		t.Fatalf("fleet after destroy: %+v %v", fleet, err)
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
