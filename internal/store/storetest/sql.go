package storetest

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/sqlquery"
	"github.com/agentbox/agentbox/internal/store"
)

// sqlTests cover sqlquery.Querier: the published views' contract, the same on every driver.
var sqlTests = []struct {
	name string
	run  func(t *testing.T, s store.Store)
}{
	{"SQLViewsContract", testSQLViewsContract},
}

// testSQLViewsContract: every view has the contract's columns in order and reads what the
// store API wrote (times as ISO-8601 UTC and unix ms), never an environment value; a write is
// INVALID_ARGUMENT. A store that cannot serve SQL (SQLite in memory) skips.
func testSQLViewsContract(t *testing.T, s store.Store) {
	ctx := t.Context()
	if _, err := s.Query(ctx, "SELECT 1", 0); errcode.Is(err, errcode.UnsupportedOp) {
		t.Skip("this store serves no SQL: ", err)
	}
	sb := newSandbox(7, sandbox.StateRunning, base(), map[string]string{"team": "sql"})
	sb.Env = map[string]string{"API_KEY": "storetest-secret-value"}
	mustCreate(t, s, sb)
	mustAppendAudit(t, s, 3, base())
	for _, v := range sqlquery.Views {
		res, err := s.Query(ctx, "SELECT * FROM "+v.Name, 0)
		if err != nil {
			t.Fatalf("SELECT * FROM %s: %v", v.Name, err)
		}
		var names []string
		for _, c := range v.Columns {
			names = append(names, c.Name)
		}
		if !slices.Equal(res.Columns, names) {
			t.Errorf("%s: columns %v, want %v", v.Name, res.Columns, names)
		}
		if s := fmt.Sprint(res.Rows); strings.Contains(s, "storetest-secret-value") {
			t.Errorf("%s shows an environment value: %s", v.Name, s)
		}
	}
	res, err := s.Query(ctx, "SELECT id, created_at, created_at_ms, json_extract(labels, '$.team') FROM sandboxes", 0)
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprint([][]any{{sb.ID, base().UTC().Format("2006-01-02T15:04:05.000Z"), base().UnixMilli(), "sql"}})
	if got := fmt.Sprint(res.Rows); got != want {
		t.Errorf("sandboxes: %s, want %s", got, want)
	}
	res, err = s.Query(ctx, fmt.Sprintf("SELECT tool, count(*) FROM audit_log WHERE time_ms >= %d GROUP BY tool ORDER BY tool", base().Add(-time.Hour).UnixMilli()), 0)
	if err != nil || res.RowCount != 3 {
		t.Errorf("audit_log by tool: %+v, %v; want 3 tools", res, err)
	}
	if _, err := s.Query(ctx, "DELETE FROM sandboxes", 0); !errcode.Is(err, errcode.InvalidArgument) {
		t.Errorf("DELETE: %v, want INVALID_ARGUMENT", err)
	}
	mustGet(t, s, sb.ID)
}
