package mcpserver_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/gate"
	"github.com/agentbox/agentbox/internal/mcpserver"
	"github.com/agentbox/agentbox/internal/sandbox"
)

type toolGate struct {
	mu       sync.Mutex
	calls    []gate.Call
	outcomes []error
	observed []error
}

func (g *toolGate) Observe(c *gate.Call, outcome error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.observed = append(g.observed, outcome)
}

func (g *toolGate) Enter(ctx context.Context, c *gate.Call) (func(error), error) {
	g.mu.Lock()
	g.calls = append(g.calls, *c)
	g.mu.Unlock()
	if c.Tool == "sandbox_destroy" {
		return nil, errcode.New(errcode.AuthFailed, "refused by the test gate")
	}
	return func(err error) {
		g.mu.Lock()
		g.outcomes = append(g.outcomes, err)
		g.mu.Unlock()
	}, nil
}

// TestGateSeesToolCalls: every tool call passes Options.Gate with its name, arguments and
// sandbox (the stdio surface and caller when no HTTP request carried one) and its outcome; a
// refusal is the tool's error result and nothing acts.
func TestGateSeesToolCalls(t *testing.T) {
	svc := fakeService(t)
	g := &toolGate{}
	srv := mcpserver.New(svc, mcpserver.Options{Gate: gate.Chain{g}})
	defer srv.Close()
	c := connect(t, srv, "2025-11-25")
	var sb mcpserver.SandboxInfo
	c.ok("sandbox_create", map[string]any{}, &sb)
	res := c.call("exec", map[string]any{"sandbox_id": sb.SandboxID, "command": []string{"false"}})
	if res.IsError {
		t.Fatalf("exec: %+v", res)
	}
	// Arguments the schema refuses never reach the gates' Enter; observers hear of the call.
	if res := c.call("exec", map[string]any{"sandbox_id": sb.SandboxID, "command": "not an argv"}); !res.IsError {
		t.Fatalf("exec with a string command succeeded")
	}
	res = c.call("sandbox_destroy", map[string]any{"sandbox_id": sb.SandboxID})
	if !res.IsError {
		t.Fatalf("destroy through a refusing gate succeeded")
	}
	if got, err := svc.Get(t.Context(), sb.SandboxID); err != nil || got.State != sandbox.StateRunning {
		t.Fatalf("refused destroy acted: %s %v", got.State, err)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.observed) != 1 || !errcode.Is(g.observed[0], errcode.InvalidArgument) {
		t.Fatalf("observed %v, want the one INVALID_ARGUMENT call", g.observed)
	}
	if len(g.calls) != 3 || len(g.outcomes) != 2 || g.outcomes[0] != nil || g.outcomes[1] != nil {
		t.Fatalf("calls %d outcomes %v", len(g.calls), g.outcomes)
	}
	e := g.calls[1]
	if e.Tool != "exec" || e.Action != "exec" || e.SandboxID != sb.SandboxID || e.Surface != gate.SurfaceMCPStdio ||
		e.Caller.Name != "stdio" || !strings.Contains(string(e.Args), `"command":["false"]`) {
		t.Fatalf("exec call %+v args %s", e, e.Args)
	}
}
