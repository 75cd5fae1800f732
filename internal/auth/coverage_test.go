package auth_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentbox/agentbox/internal/auth"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/gate"
	"github.com/agentbox/agentbox/internal/mcpserver"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/sandbox/jobs"
	"github.com/agentbox/agentbox/internal/testenv/fakecp"
)

// fakeService is a control plane over the fake runtime: enough to register every route and
// tool.
func fakeService(t *testing.T) *sandbox.Service {
	t.Helper()
	svc := fakecp.Service(t)
	return svc
}

// TestScopeTableHasNoRoutes: REST routes declare their scope in the API's route table
// (internal/api/routetable.go, checked by TestEveryRouteDeclared), never here, so that there
// is one declaration per route.
func TestScopeTableHasNoRoutes(t *testing.T) {
	for k := range auth.Required {
		if strings.Contains(k, "/") {
			t.Errorf("auth.Required names the REST route %q: declare it in internal/api/routetable.go", k)
		}
	}
}

// TestScopeOfRESTCalls: a REST call needs the scope its surface declared; one that declares
// none needs admin (deny by default), whatever its tool.
func TestScopeOfRESTCalls(t *testing.T) {
	for _, tc := range []struct {
		c    gate.Call
		want string
	}{
		{gate.Call{Surface: gate.SurfaceREST, Tool: "GET /v1/sandboxes", Scope: auth.ScopeRead}, auth.ScopeRead},
		{gate.Call{Surface: gate.SurfaceREST, Tool: "GET /v1/sandboxes/{id}/pty", Scope: auth.ScopeOperate}, auth.ScopeOperate},
		{gate.Call{Surface: gate.SurfaceREST, Tool: "sandbox_list"}, auth.ScopeAdmin},
		{gate.Call{Surface: gate.SurfaceMCP, Tool: "sandbox_list"}, auth.ScopeRead},
		{gate.Call{Surface: gate.SurfaceMCP, Tool: "no_such_tool"}, auth.ScopeAdmin},
	} {
		if got := auth.NeededScope(&tc.c); got != tc.want {
			t.Errorf("%s %s (scope %q): needs %s, want %s", tc.c.Surface, tc.c.Tool, tc.c.Scope, got, tc.want)
		}
	}
	c := gate.Call{Surface: gate.SurfaceREST, Tool: "GET /v1/sandboxes/{id}/pty", Scope: auth.ScopeOperate, Caller: gate.Caller{Name: "r", Scope: auth.ScopeRead}}
	if _, err := (auth.ScopeGate{}).Enter(t.Context(), &c); errcode.Of(err) != errcode.PermissionDenied {
		t.Fatalf("read key on the terminal: %v, want PERMISSION_DENIED", err)
	}
}

// TestScopeTableCoversEveryTool: every MCP tool has a scope in auth.Required, and every tool
// entry there is a tool.
func TestScopeTableCoversEveryTool(t *testing.T) {
	srv := mcpserver.New(jobs.With(fakeService(t)), mcpserver.Options{})
	defer srv.Close()
	ct, st := mcp.NewInMemoryTransports()
	ctx := t.Context()
	ss, err := srv.MCP().Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ss.Close()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "scope-test", Version: "1"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	var tools []string
	for tl, err := range cs.Tools(ctx, nil) {
		if err != nil {
			t.Fatal(err)
		}
		tools = append(tools, tl.Name)
	}
	if len(tools) < 30 {
		t.Fatalf("only %d tools: %v", len(tools), tools)
	}
	for _, name := range tools {
		if _, ok := auth.Required[name]; !ok {
			t.Errorf("MCP tool %q has no scope in auth.Required (internal/auth/scopes.go)", name)
		}
	}
	for k := range auth.Required {
		if !strings.Contains(k, "/") && !slices.Contains(tools, k) {
			t.Errorf("auth.Required names %q, which is no MCP tool", k)
		}
	}
}
