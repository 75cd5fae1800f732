package auth_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentbox/agentbox/internal/api"
	"github.com/agentbox/agentbox/internal/auth"
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

// restEntries are the scope table's entries that are REST patterns.
func restEntries() []string {
	var out []string
	for k := range auth.Required {
		if strings.Contains(k, "/") {
			out = append(out, k)
		}
	}
	return out
}

// TestScopeTableCoversEveryRoute: every REST route the server registers has a scope in
// auth.Required, and every REST entry there is a route (none stale).
func TestScopeTableCoversEveryRoute(t *testing.T) {
	h := api.New(fakeService(t), api.Options{Prometheus: api.NewPrometheus(), Token: "t0123456789abcdef"})
	defer h.Close()
	routes := h.Routes()
	if len(routes) < 50 {
		t.Fatalf("only %d routes: %v", len(routes), routes)
	}
	for _, r := range routes {
		if _, ok := auth.Required[r]; !ok {
			t.Errorf("REST route %q has no scope in auth.Required (internal/auth/scopes.go)", r)
		}
	}
	for _, e := range restEntries() {
		if e != "/v1/" && !slices.Contains(routes, e) { // "/v1/": the catch-all answering unknown paths
			t.Errorf("auth.Required names %q, which is no route", e)
		}
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
