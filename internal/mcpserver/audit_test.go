package mcpserver_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/audit"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/gate"
	"github.com/agentbox/agentbox/internal/mcpserver"
	"github.com/agentbox/agentbox/internal/store/sqlite"
)

// TestAuditRecordsToolCalls: with the audit recorder as the gate, tool calls (on the fake
// runtime: the recorder is tool logic) are recorded with their tool, sandbox, the stdio caller,
// digest and outcome, and the database never holds a file's content, an environment value or
// stdin.
func TestAuditRecordsToolCalls(t *testing.T) {
	const (
		content = "MCP-FILE-CONTENT-a1b2c3"
		secret  = "MCP-SECRET-VALUE-d4e5f6"
		stdin   = "MCP-STDIN-TEXT-0a0b0c"
	)
	svc := fakeService(t)
	dir := t.TempDir()
	ast, err := sqlite.Open(t.Context(), filepath.Join(dir, "audit.db"))
	if err != nil {
		t.Fatal(err)
	}
	rec := audit.New(ast, audit.Config{}, nil)
	srv := mcpserver.New(svc, mcpserver.Options{Gate: gate.Chain{rec}})
	defer srv.Close()
	c := connect(t, srv, "2025-11-25")
	var sb mcpserver.SandboxInfo
	c.ok("sandbox_create", map[string]any{"env": map[string]string{"API_TOKEN": secret}}, &sb)
	if res := c.call("file_write", map[string]any{"sandbox_id": sb.SandboxID, "path": "a.txt", "content": content}); res.IsError {
		t.Fatalf("file_write: %+v", res)
	}
	res := c.call("exec", map[string]any{"sandbox_id": sb.SandboxID, "command": []string{"sh", "-c", "cat a.txt; cat; echo $K"},
		"env": map[string]string{"K": secret}, "stdin": stdin})
	if res.IsError {
		t.Fatalf("exec: %+v", res)
	}
	if res := c.call("exec", map[string]any{"sandbox_id": "sb-000000000000", "command": []string{"true"}}); !res.IsError {
		t.Fatal("exec in an unknown sandbox succeeded")
	}
	if err := rec.Close(); err != nil { // Close flushes
		t.Fatal(err)
	}
	recs, _, err := ast.ListAudit(t.Context(), audit.Filter{Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	want := []struct{ tool, sandbox, outcome string }{
		{"sandbox_create", "", "ok"},
		{"file_write", sb.SandboxID, "ok"},
		{"exec", sb.SandboxID, "ok"},
		{"exec", "sb-000000000000", string(errcode.SandboxNotFound)},
	}
	if len(recs) != len(want) {
		t.Fatalf("%d records, want %d: %+v", len(recs), len(want), recs)
	}
	for i, w := range want {
		r := recs[i]
		if r.Tool != w.tool || r.Action != w.tool || r.SandboxID != w.sandbox || r.Outcome != w.outcome || r.Surface != gate.SurfaceMCPStdio ||
			r.CallerName != "stdio" || r.CallerID == "" || len(r.ArgsSHA256) != 64 || r.DurationMS <= 0 {
			t.Errorf("record %d = %+v, want %+v", i, r, w)
		}
	}
	if s := string(recs[1].Summary); !strings.Contains(s, `"path":"a.txt"`) || !strings.Contains(s, `"bytes":23`) {
		t.Errorf("file_write summary %s", s)
	}
	if s := string(recs[2].Summary); !strings.Contains(s, `"command":["sh","-c","cat a.txt; cat; echo $K"]`) || !strings.Contains(s, `"K":"[redacted]"`) {
		t.Errorf("exec summary %s", s)
	}
	ast.Close()
	for _, name := range []string{"audit.db", "audit.db-wal"} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			if name == "audit.db" {
				t.Fatal(err)
			}
			continue
		}
		for _, leak := range []string{content, secret, stdin} {
			if bytes.Contains(b, []byte(leak)) {
				t.Errorf("%s holds %q", name, leak)
			}
		}
		if name == "audit.db" && !bytes.Contains(b, []byte("a.txt")) {
			t.Errorf("%s lacks the file's path: the grep looks at the wrong bytes", name)
		}
	}
}
