package api_test

import (
	"bytes"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/api"
	"github.com/agentbox/agentbox/internal/audit"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/gate"
	"github.com/agentbox/agentbox/internal/store/sqlite"
	"github.com/agentbox/agentbox/internal/wire"
)

// TestAuditRecordsRESTCalls: with the audit recorder as the gate, REST calls are recorded
// with their route, action, sandbox, caller and outcome, GET /v1/audit pages and filters
// them, and neither a file's content, an environment value nor stdin reaches the database.
func TestAuditRecordsRESTCalls(t *testing.T) {
	const (
		content = "REST-FILE-CONTENT-91b2"
		secret  = "REST-SECRET-VALUE-33aa"
		stdin   = "REST-STDIN-TEXT-77cd"
		qsecret = "REST-QUERY-TOKEN-4e4e"
	)
	dir := t.TempDir()
	ast, err := sqlite.Open(t.Context(), filepath.Join(dir, "audit.db"))
	if err != nil {
		t.Fatal(err)
	}
	rec := audit.New(ast, audit.Config{}, nil)
	s := newImageServer(t, api.Options{Gate: gate.Chain{rec}, Audit: ast})
	sb, err := s.c.Create(t.Context(), wire.CreateRequest{Env: map[string]string{"API_KEY": secret}})
	if err != nil {
		t.Fatal(err)
	}
	res, err := s.c.Exec(t.Context(), sb.ID, wire.ExecRequest{Command: []string{"cat"}, Stdin: stdin, Env: map[string]string{"X": secret}}, nil)
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("exec: %+v %v", res, err)
	}
	if _, err := s.c.WriteFile(t.Context(), sb.ID, "/tmp/f.txt", 0o644, strings.NewReader(content)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.c.Get(t.Context(), "sb-000000000000"); !errcode.Is(err, errcode.SandboxNotFound) {
		t.Fatalf("get unknown: %v", err)
	}
	req, _ := http.NewRequest(http.MethodGet, s.url+"/v1/sandboxes?access_token="+qsecret, nil)
	req.Header.Set("Authorization", "Bearer "+testToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if err := rec.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}

	l, err := s.c.Audit(t.Context(), 0, 100, "", "")
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Records) != 5 {
		t.Fatalf("%d records, want 5 (create, exec, file write, get, list): %+v", len(l.Records), l.Records)
	}
	want := []struct{ tool, action, sandbox, outcome string }{
		{"POST /v1/sandboxes", "sandbox_create", "", "ok"},
		{"POST /v1/sandboxes/{id}/exec", "exec", sb.ID, "ok"},
		{"PUT /v1/sandboxes/{id}/files", "file_write", sb.ID, "ok"},
		{"GET /v1/sandboxes/{id}", "sandbox_get", "sb-000000000000", string(errcode.SandboxNotFound)},
		{"GET /v1/sandboxes", "sandbox_list", "", "ok"},
	}
	for i, w := range want {
		r := l.Records[i]
		if r.Tool != w.tool || r.Action != w.action || r.SandboxID != w.sandbox || r.Outcome != w.outcome || r.Surface != gate.SurfaceREST ||
			r.CallerName != "token" || r.CallerID == "" || len(r.ArgsSHA256) != 64 || r.DurationMS <= 0 {
			t.Errorf("record %d = %+v, want %+v", i, r, w)
		}
	}
	if sum := string(l.Records[2].Summary); !strings.Contains(sum, `"body_bytes":22`) || !strings.Contains(sum, `"path":["/tmp/f.txt"]`) {
		t.Errorf("file write summary %s", sum)
	}
	if sum := string(l.Records[1].Summary); !strings.Contains(sum, `"command":["cat"]`) || !strings.Contains(sum, `"X":"[redacted]"`) {
		t.Errorf("exec summary %s", sum)
	}
	if sum := string(l.Records[4].Summary); !strings.Contains(sum, `"access_token":"[redacted]"`) {
		t.Errorf("list summary %s", sum)
	}
	// Paging and filters.
	page, err := s.c.Audit(t.Context(), l.Records[1].Seq, 2, "", "")
	if err != nil || len(page.Records) != 2 || page.Records[0].Seq != l.Records[2].Seq || page.Next != l.Records[3].Seq {
		t.Fatalf("page after %d: %+v %v", l.Records[1].Seq, page, err)
	}
	f, err := s.c.Audit(t.Context(), 0, 10, "exec", sb.ID)
	if err != nil || len(f.Records) != 1 || f.Records[0].Action != "exec" {
		t.Fatalf("tool exec in %s: %+v %v", sb.ID, f, err)
	}
	if err := rec.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	newest, err := s.c.Audit(t.Context(), 0, 2, "", "")
	if err != nil || len(newest.Records) != 2 || newest.Omitted != 6 || newest.Records[1].Tool != "GET /v1/audit" { // the GET /v1/audit calls are recorded too
		t.Fatalf("newest 2: %+v %v", newest, err)
	}
	if _, err := s.c.Audit(t.Context(), 0, audit.MaxPage+1, "", ""); !errcode.Is(err, errcode.InvalidArgument) {
		t.Errorf("limit %d: %v, want INVALID_ARGUMENT", audit.MaxPage+1, err)
	}
	// The database never holds the content, the secret, stdin or the query's token.
	rec.Close()
	ast.Close()
	for _, name := range []string{"audit.db", "audit.db-wal"} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			if name == "audit.db" {
				t.Fatal(err)
			}
			continue
		}
		for _, leak := range []string{content, secret, stdin, qsecret, testToken} {
			if bytes.Contains(b, []byte(leak)) {
				t.Errorf("%s holds %q", name, leak)
			}
		}
		if !bytes.Contains(b, []byte("/tmp/f.txt")) && name == "audit.db" {
			t.Errorf("%s lacks the written file's path: the grep looks at the wrong bytes", name)
		}
	}
}
