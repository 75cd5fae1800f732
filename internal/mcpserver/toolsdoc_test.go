package mcpserver_test

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestToolsDocumented holds docs/TOOLS.md, the MCP contract, to the tools the server lists: every
// tool a "### " heading of its Tools section names (in backticks) is one the server serves, and
// every tool the server serves has such a heading.
func TestToolsDocumented(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "TOOLS.md"))
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	start, end := strings.Index(doc, "\n## Tools"), strings.Index(doc, "\n## Resources")
	if start < 0 || end < start {
		t.Fatalf("docs/TOOLS.md has no \"## Tools\" section before \"## Resources\"")
	}
	name := regexp.MustCompile("`([a-z_]+)`")
	var documented []string
	for _, line := range strings.Split(doc[start:end], "\n") {
		if !strings.HasPrefix(line, "### ") {
			continue
		}
		for _, m := range name.FindAllStringSubmatch(line, -1) {
			documented = append(documented, m[1])
		}
	}
	slices.Sort(documented)
	documented = slices.Compact(documented)
	for _, n := range documented {
		if !slices.Contains(allTools, n) {
			t.Errorf("docs/TOOLS.md documents tool %q, which the server does not serve", n)
		}
	}
	for _, n := range allTools {
		if !slices.Contains(documented, n) {
			t.Errorf("the server serves tool %q, which no heading of docs/TOOLS.md documents", n)
		}
	}
}
