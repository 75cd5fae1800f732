package sandbox_test

import (
	"testing"

	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/sandbox/jobs"
)

// TestOneFeaturePerCore: a feature that registers hooks is built once per core however many
// surfaces ask for it (the REST API, the MCP server and the run workers each call jobs.New), so
// its hooks run once per event.
func TestOneFeaturePerCore(t *testing.T) {
	e := newFakeEnv(t, sandbox.Config{})
	core := e.svc.Core()
	type key struct{}
	built := 0
	build := func() any { built++; return &built }
	a, b := core.Feature(key{}, build), core.Feature(key{}, build)
	if built != 1 || a != b {
		t.Fatalf("built %d times; same value: %v", built, a == b)
	}
	if j1, j2 := jobs.New(core, e.st), jobs.New(e.svc.Core(), e.st); j1 != j2 || j1 != e.jobs {
		t.Fatalf("jobs.New on one core gave different features: %p %p %p", j1, j2, e.jobs)
	}
}
