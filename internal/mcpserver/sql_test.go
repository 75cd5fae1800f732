package mcpserver_test

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/api"
	apiclient "github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/mcpserver"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/sandbox/jobs"
	"github.com/agentbox/agentbox/internal/sqlquery"
	"github.com/agentbox/agentbox/internal/testenv/fakecp"
)

// TestExecuteSQL: execute_sql answers over the store in process and over the REST API
// (POST /v1/sql through the client), with a sandbox created through the service; its
// environment value never shows; refusals and bad arguments are INVALID_ARGUMENT; a server
// without SQL says UNSUPPORTED_OPERATION.
func TestExecuteSQL(t *testing.T) {
	cp := fakecp.New(t, sandbox.Config{})
	svc, st := cp.Service, cp.Store
	svj := jobs.With(svc)
	const secret = "TOP-SECRET-VALUE-42"
	sb, err := svc.Create(t.Context(), sandbox.CreateRequest{Env: map[string]string{"API_KEY": secret}, Labels: map[string]string{"team": "sql"}})
	if err != nil {
		t.Fatal(err)
	}
	rest := httptest.NewServer(api.New(svc, api.Options{Token: "tok", SQL: st, SandboxJobs: svj.Jobs()}))
	t.Cleanup(rest.Close)

	bare := mcpserver.New(svj, mcpserver.Options{})
	t.Cleanup(bare.Close)
	if msg := connect(t, bare, protocolVersions[0]).fails("execute_sql", obj{"query": "SELECT 1"}, "UNSUPPORTED_OPERATION"); !strings.Contains(msg, "no SQL") {
		t.Errorf("without SQL: %q", msg)
	}

	for _, tc := range []struct {
		name string
		sql  sqlquery.Querier
	}{{"in process", st}, {"over REST", restSQL{apiclient.New(rest.URL, "tok")}}} {
		t.Run(tc.name, func(t *testing.T) {
			srv := mcpserver.New(svj, mcpserver.Options{SQL: tc.sql})
			t.Cleanup(srv.Close)
			c := connect(t, srv, protocolVersions[0])
			var res sqlquery.Result
			txt := c.ok("execute_sql", obj{"query": "SELECT id, state, json_extract(labels, '$.team') AS team FROM sandboxes"}, &res)
			if res.RowCount != 1 || len(res.Rows) != 1 || res.Rows[0][0] != sb.ID || res.Rows[0][1] != "running" || res.Rows[0][2] != "sql" {
				t.Fatalf("sandboxes: %+v", res)
			}
			if !strings.Contains(txt, sb.ID) || !strings.Contains(txt, "(1 rows") {
				t.Errorf("text: %q", txt)
			}
			c.ok("execute_sql", obj{"query": "SELECT * FROM sandboxes"}, &res)
			for _, row := range res.Rows {
				for _, v := range row {
					if s, _ := v.(string); strings.Contains(s, secret) {
						t.Fatalf("sandboxes shows the env value: %v", row)
					}
				}
			}
			c.ok("execute_sql", obj{"query": "SELECT type, to_state FROM events WHERE sandbox_id = '" + sb.ID + "' ORDER BY seq", "max_rows": 1}, &res)
			if res.RowCount != 1 || !res.Truncated || res.TruncatedBy != "max_rows" {
				t.Errorf("events with max_rows 1: %+v", res)
			}
			for _, q := range []string{"DELETE FROM main.sandboxes", "SELECT env FROM main.sandboxes", "PRAGMA query_only = 0", "ATTACH DATABASE '/tmp/x' AS x", "SELECT 1; SELECT 2"} {
				if msg := c.fails("execute_sql", obj{"query": q}, "INVALID_ARGUMENT"); !strings.Contains(msg, "read-only SELECT") {
					t.Errorf("%s: %q does not say what is allowed", q, msg)
				}
			}
			c.fails("execute_sql", obj{"query": "SELECT 1", "max_rows": 10001}, "INVALID_ARGUMENT")
			c.fails("execute_sql", obj{"query": ""}, "INVALID_ARGUMENT")
			if _, err := svc.Get(t.Context(), sb.ID); err != nil {
				t.Fatalf("after the refusals: %v", err)
			}
		})
	}
}

// restSQL is execute_sql's querier over the REST API: the Go client's query, its reply read as
// sqlquery's.
type restSQL struct{ c *apiclient.Client }

func (r restSQL) Query(ctx context.Context, query string, maxRows int) (sqlquery.Result, error) {
	res, err := r.c.Query(ctx, query, maxRows)
	return sqlquery.Result(res), err
}
