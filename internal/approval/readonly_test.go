package approval_test

import (
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentbox/agentbox/internal/approval"
	"github.com/agentbox/agentbox/internal/mcpserver"
)

// TestReadOnlyMatchesToolAnnotations: approval.ReadOnly (never gated) is exactly the set of
// the MCP server's tools annotated readOnlyHint, so that a new tool that acts is gated and a
// read is not.
func TestReadOnlyMatchesToolAnnotations(t *testing.T) {
	t.Parallel()
	srv := mcpserver.New(nil, mcpserver.Options{}) // listing never reaches the backend
	defer srv.Close()
	ct, st := mcp.NewInMemoryTransports()
	ss, err := srv.MCP().Connect(t.Context(), st, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ss.Close()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "t", Version: "1"}, nil).Connect(t.Context(), ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	seen := map[string]bool{}
	for tool, err := range cs.Tools(t.Context(), nil) {
		if err != nil {
			t.Fatal(err)
		}
		seen[tool.Name] = true
		ro := tool.Annotations != nil && tool.Annotations.ReadOnlyHint
		if ro != approval.ReadOnly[tool.Name] {
			t.Errorf("%s: readOnlyHint %v, approval.ReadOnly %v", tool.Name, ro, approval.ReadOnly[tool.Name])
		}
	}
	if len(seen) < 20 {
		t.Fatalf("only %d tools listed", len(seen))
	}
}
