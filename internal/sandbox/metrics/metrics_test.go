package metrics_test

import (
	"context"
	"path/filepath"
	"slices"
	"testing"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/fake"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/sandbox/metrics"
	"github.com/agentbox/agentbox/internal/store/sqlite"
)

// newService returns a sandbox service over real SQLite and the fake runtime (named "runc"),
// and the metrics feature over it.
func newService(t *testing.T) (*sandbox.Service, *metrics.Service) {
	t.Helper()
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "agentbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	rt, err := fake.New(fake.Config{Name: "runc"})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := sandbox.NewService(st, []runtime.Runtime{rt}, sandbox.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		svc.Close()
		rt.Shutdown(context.Background())
		st.Close()
	})
	return svc, metrics.New(svc.Core(), st)
}

// TestMetricsOnFake: the fake runtime measures its directory's disk use and says it measures
// nothing else (no CPU percentage is made up); a sandbox that is not running has no metrics;
// the fleet's sample holds the running sandboxes only.
func TestMetricsOnFake(t *testing.T) {
	svc, m := newService(t)
	ctx := t.Context()
	sb, err := svc.Create(ctx, sandbox.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	m0, err := m.Metrics(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if m0.SandboxID != sb.ID || m0.Runtime != "runc" || m0.State != sandbox.StateRunning || m0.Disk == nil ||
		m0.CPU != nil || m0.Memory != nil || m0.Pids != nil || m0.CPUPercent != nil ||
		!slices.Equal(m0.Unsupported, []string{"cpu", "memory", "pids"}) {
		t.Fatalf("fake sample: %+v", m0)
	}
	if _, err := svc.Exec(ctx, sb.ID, sandbox.ExecRequest{Argv: []string{"sh", "-c", "head -c 1048576 /dev/zero > blob"}}, nil); err != nil {
		t.Fatal(err)
	}
	m1, err := m.Metrics(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if d := m1.Disk.UsedBytes - m0.Disk.UsedBytes; d < 1<<20 {
		t.Errorf("disk used rose by %d after writing 1 MiB", d)
	}
	if m1.CPUPercent != nil {
		t.Errorf("a cpu percentage without cpu samples: %v", *m1.CPUPercent)
	}
	fleet, err := m.FleetMetrics(ctx)
	if err != nil || len(fleet.Sandboxes) != 1 || fleet.Failed != 0 || fleet.Sandboxes[0].SandboxID != sb.ID {
		t.Fatalf("fleet: %+v %v", fleet, err)
	}
	if fleet.Sandboxes[0].RunningJobs == nil || *fleet.Sandboxes[0].RunningJobs != 0 {
		t.Errorf("fleet's running jobs of a sandbox without jobs: %v", fleet.Sandboxes[0].RunningJobs)
	}
	if _, err := svc.Destroy(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Metrics(ctx, sb.ID); !errcode.Is(err, errcode.SandboxNotRunning) {
		t.Errorf("metrics of a destroyed sandbox: %v", err)
	}
	if _, err := m.Metrics(ctx, "sb-000000000000"); !errcode.Is(err, errcode.SandboxNotFound) {
		t.Errorf("metrics of an unknown sandbox: %v", err)
	}
	if _, err := m.Metrics(ctx, "../x"); !errcode.Is(err, errcode.InvalidArgument) {
		t.Errorf("metrics of a malformed id: %v", err)
	}
	fleet, err = m.FleetMetrics(ctx)
	if err != nil || len(fleet.Sandboxes) != 0 {
		t.Fatalf("fleet after destroy: %+v %v", fleet, err)
	}
}
