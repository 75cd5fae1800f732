package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestDocumentedVerbsExist holds README.md and docs/TOOLS.md to the binary: every `agentbox VERB`
// they show as a command (in a code span or a fenced block) is a verb the binary has.
func TestDocumentedVerbsExist(t *testing.T) {
	t.Parallel()
	verb := regexp.MustCompile(`(?:^|[\s$(|;&]|sudo )agentbox ([a-z][a-z-]*)(:?)`)
	cmds := commands()
	seen := 0
	for _, f := range []string{filepath.Join("..", "..", "README.md"), filepath.Join("..", "..", "docs", "TOOLS.md")} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, code := range codeOf(string(b)) {
			for _, m := range verb.FindAllStringSubmatch(code, -1) {
				if m[2] == ":" {
					continue // a message ("agentbox egress: …") or an MCP server's name before a URL
				}
				seen++
				if _, ok := cmds[m[1]]; !ok && m[1] != "help" {
					t.Errorf("%s shows `agentbox %s`, which is not a verb of the binary", f, m[1])
				}
			}
		}
	}
	if seen < 10 {
		t.Fatalf("found only %d documented commands: the pattern no longer reads the docs", seen)
	}
}

// codeOf returns a markdown document's fenced blocks and code spans.
func codeOf(doc string) []string {
	var out []string
	fenced := false
	var block strings.Builder
	for _, line := range strings.Split(doc, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			if fenced {
				out = append(out, block.String())
				block.Reset()
			}
			fenced = !fenced
			continue
		}
		if fenced {
			block.WriteString(line + "\n")
			continue
		}
		parts := strings.Split(line, "`")
		for i := 1; i < len(parts); i += 2 {
			out = append(out, parts[i])
		}
	}
	return out
}
