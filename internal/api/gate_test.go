package api_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"

	"github.com/agentbox/agentbox/internal/api"
	"github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/gate"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/wire"
)

// gateLog is a gate that keeps every call and outcome, refusing calls to refuse.
type gateLog struct {
	mu       sync.Mutex
	calls    []gate.Call
	outcomes []error
	observed []gate.Call
	refuse   string
}

func (g *gateLog) Observe(c *gate.Call, outcome error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	c.ApprovalID = string(errcode.Of(outcome)) // (the test keeps the outcome's code here)
	g.observed = append(g.observed, *c)
}

func (g *gateLog) Enter(ctx context.Context, c *gate.Call) (func(error), error) {
	g.mu.Lock()
	g.calls = append(g.calls, *c)
	g.mu.Unlock()
	if c.Action != "" && c.Action == g.refuse {
		return nil, errcode.New(errcode.AuthFailed, "refused by the test gate")
	}
	return func(err error) {
		g.mu.Lock()
		g.outcomes = append(g.outcomes, err)
		g.mu.Unlock()
	}, nil
}

// TestGateSeesRESTCalls: every routed call passes the gate with its route, action, sandbox,
// arguments and typed outcome; a refusal is the reply and nothing acts.
func TestGateSeesRESTCalls(t *testing.T) {
	g := &gateLog{refuse: "sandbox_destroy"}
	s := newImageServer(t, api.Options{Gate: gate.Chain{g}})
	sb, err := s.c.Create(t.Context(), wire.CreateRequest{Labels: map[string]string{"k": "v"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.c.Get(t.Context(), "sb-000000000000"); !errcode.Is(err, errcode.SandboxNotFound) {
		t.Fatalf("get unknown: %v", err)
	}
	if _, err := s.c.Destroy(t.Context(), sb.ID); !errcode.Is(err, errcode.AuthFailed) {
		t.Fatalf("destroy through a refusing gate: %v", err)
	}
	if got, err := s.svc.Get(t.Context(), sb.ID); err != nil || got.State != sandbox.StateRunning {
		t.Fatalf("refused destroy acted: %s %v", got.State, err)
	}
	// A request that fails authentication never reaches Enter; observers hear of it, without
	// the credential.
	bad := client.New(s.url, "wrong-token")
	if _, err := bad.Get(t.Context(), sb.ID); !errcode.Is(err, errcode.AuthFailed) {
		t.Fatalf("wrong token: %v", err)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.observed) != 1 || g.observed[0].Tool != "GET /v1/sandboxes/{id}" || g.observed[0].ApprovalID != string(errcode.AuthFailed) ||
		strings.Contains(string(g.observed[0].Args), "wrong-token") {
		t.Fatalf("observed %+v, want the one refused GET", g.observed)
	}
	if len(g.calls) != 3 || len(g.outcomes) != 2 {
		t.Fatalf("calls %d outcomes %d, want 3 and 2", len(g.calls), len(g.outcomes))
	}
	c := g.calls[0]
	var args map[string]any
	if c.Surface != gate.SurfaceREST || c.Tool != "POST /v1/sandboxes" || c.Action != "sandbox_create" ||
		json.Unmarshal(c.Args, &args) != nil || !strings.Contains(string(c.Args), `"labels":{"k":"v"}`) || args["method"] != "POST" {
		t.Fatalf("create call %+v args %s", c, c.Args)
	}
	if g.outcomes[0] != nil || !errcode.Is(g.outcomes[1], errcode.SandboxNotFound) {
		t.Fatalf("outcomes %v", g.outcomes)
	}
	if c := g.calls[2]; c.Tool != "DELETE /v1/sandboxes/{id}" || c.SandboxID != sb.ID {
		t.Fatalf("destroy call %+v", c)
	}
}
