package mcpserver_test

import (
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/mcpserver"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/sandbox/metrics"
)

// TestSandboxMetricsTool: sandbox_metrics on a real runc sandbox reports its limits and use, a
// second call the CPU percentage of the busy loop between the two, and typed errors for a bad id
// and a destroyed sandbox.
func TestSandboxMetricsTool(t *testing.T) {
	svc := service(t, sandbox.Config{})
	srv := mcpserver.New(svc, mcpserver.Options{ControlPlane: "test", Samples: metrics.New(svc.Core(), svc.Core().Store())})
	defer srv.Close()
	c := connect(t, srv, protocolVersions[0])
	var sb mcpserver.SandboxInfo
	c.ok("sandbox_create", obj{"cpu": 0.5, "memory_mb": 256}, &sb)
	id := sb.SandboxID

	var m0 sandbox.SandboxMetrics
	txt := c.ok("sandbox_metrics", obj{"sandbox_id": id}, &m0)
	if m0.SandboxID != id || m0.State != sandbox.StateRunning || m0.Runtime != "runc" || m0.CPU == nil || m0.CPU.LimitCores != 0.5 ||
		m0.Memory == nil || m0.Memory.LimitBytes != 256<<20 || m0.Pids == nil || m0.Disk == nil || m0.Disk.TotalBytes <= 0 {
		t.Fatalf("first sample: %+v", m0)
	}
	if !strings.Contains(txt, id) || !strings.Contains(txt, "memory") {
		t.Errorf("text: %q", txt)
	}
	// Spin until the process has used 0.75 CPU-seconds (1.5 s at the full 0.5-core limit, more
	// on a busy host): what the sandbox used, not how long the wall clock ran, is what the
	// percentage must match.
	c.ok("exec", obj{"sandbox_id": id, "command": []string{"python3", "-c", "import time\nwhile time.process_time() < 0.75: pass"}}, nil)
	var m1 sandbox.SandboxMetrics
	c.ok("sandbox_metrics", obj{"sandbox_id": id}, &m1)
	if m1.CPUPercent == nil || m1.CPUPercentWindowSeconds < 1.4 {
		t.Fatalf("second sample without a percentage: %+v", m1)
	}
	// At least 0.75 CPU-seconds of the window's 0.5 × window (python's start and the agent add
	// a little), and never much above the limit.
	want := 100 * 0.75 / (0.5 * m1.CPUPercentWindowSeconds)
	if p := *m1.CPUPercent; p < want*0.95 || p > 105 {
		t.Errorf("cpu_percent %.1f over %.2fs, want about %.0f", p, m1.CPUPercentWindowSeconds, want)
	}
	if m1.SampledAt.Sub(m0.SampledAt) < 1400*time.Millisecond {
		t.Errorf("sampled_at %v then %v", m0.SampledAt, m1.SampledAt)
	}

	c.fails("sandbox_metrics", obj{"sandbox_id": "nope"}, "INVALID_ARGUMENT")
	c.fails("sandbox_metrics", obj{"sandbox_id": "sb-000000000000"}, "SANDBOX_NOT_FOUND")
	c.ok("sandbox_destroy", obj{"sandbox_id": id}, nil)
	c.fails("sandbox_metrics", obj{"sandbox_id": id}, "SANDBOX_NOT_RUNNING")
}
