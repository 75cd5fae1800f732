package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/audit"
	"github.com/agentbox/agentbox/internal/store/sqlite"
	"github.com/agentbox/agentbox/internal/testenv"
)

// TestServeAudit: serve refuses bad audit flags; a real server records the CLI's calls
// (REST), `agentbox audit ls` lists them, and a record still queued when the server is
// stopped (SIGTERM) is in the database afterwards (flushed before the store closes); the
// bearer token never is.
func TestServeAudit(t *testing.T) {
	bin := testenv.Binary(t)
	state := filepath.Join(t.TempDir(), "state")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--audit-retention", "1m"}, "--audit-retention 1m0s must be at least 1h0m0s"},
		{[]string{"--audit-max-rows", "5"}, "--audit-max-rows 5 must be between 1000 and 100000000"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		cmd := exec.CommandContext(ctx, bin, append([]string{"serve", "--listen", "127.0.0.1:0", "--state-dir", state}, tc.args...)...)
		cmd.Env = append(os.Environ(), "AGENTBOX_TOKEN="+testToken)
		out, err := cmd.CombinedOutput()
		cancel()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(string(out), tc.want) {
			t.Errorf("serve %v: %v\n%s\nwant exit 1 with %q", tc.args, err, out, tc.want)
		}
	}

	testenv.RequireRoot(t)
	dir := testenv.ShortTempDir(t, "abaudit")
	srv := testenv.StartServer(t, dir, testToken, "--audit-retention", "48h", "--audit-max-rows", "5000")
	cli := func(args ...string) (string, int) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Env = append(os.Environ(), "AGENTBOX_URL="+srv.URL, "AGENTBOX_TOKEN="+testToken)
		out, err := cmd.CombinedOutput()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return string(out), code
	}
	if out, code := cli("sandbox", "ls"); code != 0 {
		t.Fatalf("sandbox ls: %d %s", code, out)
	}
	if out, code := cli("sandbox", "get", "sb-000000000000"); code == 0 {
		t.Fatalf("get unknown: %d %s", code, out)
	}
	time.Sleep(300 * time.Millisecond) // the recorder's tick writes them
	out, code := cli("audit", "ls", "--json")
	var l audit.List
	if err := json.Unmarshal([]byte(out), &l); code != 0 || err != nil || len(l.Records) != 2 {
		t.Fatalf("audit ls --json: %d %v %s\nserver:\n%s", code, err, out, srv.Logs)
	}
	if r := l.Records[1]; r.Tool != "GET /v1/sandboxes/{id}" || r.Outcome != "SANDBOX_NOT_FOUND" || r.CallerName != "token" || r.Surface != "rest" {
		t.Errorf("record %+v", r)
	}
	if out, code := cli("audit", "ls", "--tool", "sandbox_list"); code != 0 || !strings.Contains(out, "GET /v1/sandboxes ") || strings.Contains(out, "{id}") {
		t.Errorf("audit ls --tool sandbox_list: %d\n%s", code, out)
	}
	// A call whose record is still queued when the server stops.
	const marker = "queued-at-stop-8d8d"
	if out, code := cli("sandbox", "ls", "--label", "k="+marker); code != 0 {
		t.Fatalf("sandbox ls --label: %d %s", code, out)
	}
	srv.Stop()
	st, err := sqlite.Open(t.Context(), filepath.Join(dir, "agentbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	recs, _, err := st.ListAudit(t.Context(), audit.Filter{Limit: 100})
	st.Close()
	if err != nil {
		t.Fatal(err)
	}
	last := recs[len(recs)-1]
	if len(recs) < 5 || last.Tool != "GET /v1/sandboxes" || !strings.Contains(string(last.Summary), marker) {
		t.Fatalf("after stop: %d records, the last %+v %s", len(recs), last, last.Summary)
	}
	// The bearer token never reaches the database.
	b, err := os.ReadFile(filepath.Join(dir, "agentbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(b, []byte(testToken)) {
		t.Error("the database holds the bearer token")
	}
}
