package sqlite

import (
	"context"
	"database/sql/driver"
	"encoding/json"
	"strings"
	"testing"
	"time"

	sqlitedrv "modernc.org/sqlite"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/sqlquery"
	"github.com/agentbox/agentbox/internal/store/storetest"
)

// sqlFixture opens a store holding storetest.SQLFixture's rows.
func sqlFixture(t *testing.T) *Store {
	t.Helper()
	s, _ := openTemp(t)
	t.Cleanup(func() { s.Close() })
	for _, q := range storetest.SQLFixture(`X'736563726574'`) {
		if _, err := s.write.ExecContext(t.Context(), q); err != nil {
			t.Fatalf("fixture %.60s: %v", q, err)
		}
	}
	return s
}

// wantRefused runs q and wants INVALID_ARGUMENT naming mention.
func wantRefused(t *testing.T, s *Store, q, mention string) {
	t.Helper()
	storetest.WantSQLRefused(t, s, q, mention)
}

// TestSQLRefused: every statement kind but a SELECT over the views is refused with
// INVALID_ARGUMENT, and nothing changed.
func TestSQLRefused(t *testing.T) {
	s := sqlFixture(t)
	cases := []struct{ name, q, mention string }{
		{"insert", `INSERT INTO sandboxes (id) VALUES ('x')`, "refused"},
		{"insert into raw table", `INSERT INTO main.events (sandbox_id, type, from_state, to_state, reason, at) VALUES ('sb_1','x','','','',0)`, "write"},
		{"update", `UPDATE main.sandboxes SET state = 'destroyed'`, "write"},
		{"update view", `UPDATE sandboxes SET state = 'destroyed'`, "refused"},
		{"delete", `DELETE FROM main.audit_log`, "write"},
		{"replace", `REPLACE INTO main.id_ranges (base, count, sandbox_id) VALUES (1, 1, 'x')`, "write"},
		{"create table", `CREATE TABLE t (x)`, "DDL"},
		{"create temp view", `CREATE TEMP VIEW v AS SELECT 1`, "DDL"},
		{"drop view", `DROP VIEW sandboxes`, "DDL"},
		{"drop table", `DROP TABLE main.sandboxes`, "DDL"},
		{"alter", `ALTER TABLE main.sandboxes ADD COLUMN x TEXT`, "DDL"},
		{"create index", `CREATE INDEX i ON main.sandboxes (state)`, "DDL"},
		{"create trigger", `CREATE TEMP TRIGGER tr AFTER INSERT ON main.events BEGIN SELECT 1; END`, "DDL"},
		{"attach", `ATTACH DATABASE '/tmp/x.db' AS x`, "ATTACH"},
		{"detach", `DETACH DATABASE temp`, "DETACH"},
		{"pragma", `PRAGMA query_only = 0`, "PRAGMA"},
		{"pragma read", `PRAGMA table_info(sandboxes)`, "PRAGMA"},
		{"pragma function", `SELECT * FROM pragma_table_info('sandboxes')`, "directly"},
		{"load_extension", `SELECT load_extension('/tmp/evil.so')`, "load_extension"},
		{"randomblob", `SELECT randomblob(10)`, "randomblob"},
		{"sqlite_master", `SELECT name, sql FROM sqlite_master`, "sqlite_master"},
		{"sqlite_temp_master", `SELECT sql FROM sqlite_temp_master`, "sqlite_temp_master"},
		{"id_ranges", `SELECT * FROM id_ranges`, "id_ranges"},
		{"raw table columns", `SELECT env FROM main.sandboxes`, "main.sandboxes"},
		// (count(*) FROM main.sandboxes is allowed: SQLite reports it as a count(*) over the
		// flattened view sandboxes, and it says no more than that count.)
		{"raw exposures", `SELECT token_sha256 FROM exposures`, "exposures"},
		{"raw table in subquery", `SELECT id FROM sandboxes WHERE id IN (SELECT sandbox_id FROM main.secret_calls)`, "secret_calls"},
		{"raw table in cte", `WITH x AS (SELECT secrets FROM main.sandboxes) SELECT * FROM x`, "main.sandboxes"},
		{"cte named like a view", `WITH sandboxes AS (SELECT env FROM main.sandboxes) SELECT * FROM sandboxes`, "env"},
		{"cte named like a view, other table", `WITH sandboxes AS (SELECT base FROM main.id_ranges) SELECT * FROM sandboxes`, "id_ranges"},
		{"raw rowid", `SELECT rowid FROM main.id_ranges`, "id_ranges"},
		{"raw count of other table", `SELECT count(*) FROM main.secret_calls`, "secret_calls"},
		{"env through view", `SELECT env FROM sandboxes`, "no such column"},
		{"multiple statements", `SELECT 1; SELECT 2`, "more than one statement"},
		{"select then delete", `SELECT 1; DELETE FROM main.events`, "more than one statement"},
		{"begin", `BEGIN`, "transaction"},
		{"commit", `COMMIT`, "transaction"},
		{"savepoint", `SAVEPOINT a`, "transaction"},
		{"vacuum", `VACUUM`, "refused"},
		{"analyze", `ANALYZE`, "refused"},
		{"reindex", `REINDEX`, "refused"},
		{"json_each", `SELECT * FROM json_each('[1,2]')`, "json_each"},
		{"syntax", `SELEC 1`, "syntax error"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) { wantRefused(t, s, tc.q, tc.mention) })
	}
	// Nothing changed: the sandbox is still running, every row is there.
	var state string
	var n int
	if err := s.read.QueryRowContext(t.Context(), `SELECT state, (SELECT count(*) FROM events) FROM sandboxes WHERE id = 'sb_1'`).Scan(&state, &n); err != nil || state != "running" || n != 1 {
		t.Fatalf("after the refusals: state %q, events %d, err %v", state, n, err)
	}
}

// The statement splitter sees through strings, quoted names and comments.
func TestSQLOneStatement(t *testing.T) {
	ok := []string{`SELECT 1`, `SELECT 1;`, `SELECT 1;  -- done`, "SELECT 1; /* x */ \n", `SELECT ';' AS x`, `SELECT 'a'';b' AS "c;d"`, "SELECT 1 -- ; DROP\n", `SELECT [a;b] FROM (SELECT 1 AS [a;b])`}
	for _, q := range ok {
		if err := oneStatement(q); err != nil {
			t.Errorf("oneStatement(%q): %v", q, err)
		}
	}
	bad := []string{`SELECT 1; SELECT 2`, `SELECT ';'; DROP TABLE x`, "SELECT 1; -- x\n SELECT 2", `SELECT 1;/**/SELECT 2`}
	for _, q := range bad {
		if err := oneStatement(q); err == nil {
			t.Errorf("oneStatement(%q) = nil, want refused", q)
		}
	}
}

// TestSQLViews: storetest.RunSQLViews on the fixture (the same queries and answers on
// every driver).
func TestSQLViews(t *testing.T) { storetest.RunSQLViews(t, sqlFixture(t)) }

// TestSQLRowBound: max_rows cuts the rows and says so; a bad max_rows is refused.
func TestSQLRowBound(t *testing.T) {
	s := sqlFixture(t)
	res, err := s.Query(t.Context(), `WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n LIMIT 20000) SELECT i FROM n`, 0)
	if err != nil {
		t.Fatal(err)
	}
	if res.RowCount != sqlquery.DefaultMaxRows || len(res.Rows) != 100 || !res.Truncated || res.TruncatedBy != "max_rows" {
		t.Errorf("default: %d rows, truncated %v by %q; want 100, true, max_rows", res.RowCount, res.Truncated, res.TruncatedBy)
	}
	res, err = s.Query(t.Context(), `WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n LIMIT 20000) SELECT i FROM n`, 10000)
	if err != nil || res.RowCount != 10000 || !res.Truncated {
		t.Errorf("max_rows 10000: %d rows, truncated %v, err %v", res.RowCount, res.Truncated, err)
	}
	res, err = s.Query(t.Context(), `SELECT tool FROM audit_log`, 4)
	if err != nil || res.RowCount != 4 || res.Truncated {
		t.Errorf("exactly max_rows rows: %d, truncated %v, err %v; want 4, false", res.RowCount, res.Truncated, err)
	}
	for _, n := range []int{-1, 10001} {
		_, err := s.Query(t.Context(), `SELECT 1`, n)
		if errcode.Of(err) != errcode.InvalidArgument || !strings.Contains(errcode.Message(err), "max_rows") || !strings.Contains(errcode.Message(err), "10000") {
			t.Errorf("max_rows %d: %v, want INVALID_ARGUMENT naming max_rows and its range", n, err)
		}
	}
}

// TestSQLSizeBound: past MaxResultBytes the rows stop and the result says so; a value over
// MaxValueBytes fails the query.
func TestSQLSizeBound(t *testing.T) {
	s := sqlFixture(t)
	// 10,000 rows of 1 KiB: 10 MiB, over the 4 MiB bound.
	res, err := s.Query(t.Context(), `WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n LIMIT 10000) SELECT printf('%.1024c', 'x') AS v FROM n`, 10000)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(res.Rows)
	if !res.Truncated || res.TruncatedBy != "max_bytes" || len(b) > sqlquery.MaxResultBytes || len(b) < sqlquery.MaxResultBytes-4096 {
		t.Errorf("%d rows, %d bytes of JSON, truncated %v by %q; want just under %d bytes, max_bytes", res.RowCount, len(b), res.Truncated, res.TruncatedBy, sqlquery.MaxResultBytes)
	}
	_, err = s.Query(t.Context(), `SELECT printf('%.2000000c', 'x')`, 0)
	if errcode.Of(err) != errcode.OutputLimitExceeded {
		t.Errorf("a 2 MB value: %v, want OUTPUT_LIMIT_EXCEEDED", err)
	}
}

// TestSQLTimeout: a runaway recursive query is interrupted at the timeout with a clear error,
// and the connection serves the next query.
func TestSQLTimeout(t *testing.T) {
	s := sqlFixture(t)
	start := time.Now()
	_, err := s.Query(t.Context(), `WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT count(*) FROM n`, 0)
	took := time.Since(start)
	if errcode.Of(err) != errcode.CommandTimeout || !strings.Contains(errcode.Message(err), "interrupted") {
		t.Fatalf("runaway query: %v, want COMMAND_TIMEOUT saying it was interrupted", err)
	}
	if took < sqlquery.Timeout || took > sqlquery.Timeout+5*time.Second {
		t.Errorf("runaway query ended after %s, want about %s", took, sqlquery.Timeout)
	}
	for range queryConns + 1 {
		if res, err := s.Query(t.Context(), `SELECT count(*) FROM sandboxes`, 0); err != nil || res.RowCount != 1 {
			t.Fatalf("after the timeout: %v", err)
		}
	}
	// The caller's own cancellation is not a timeout.
	ctx, cancel := context.WithCancel(t.Context())
	time.AfterFunc(200*time.Millisecond, cancel)
	_, err = s.Query(ctx, `WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT count(*) FROM n`, 0)
	if err == nil || errcode.Of(err) == errcode.CommandTimeout {
		t.Errorf("cancelled query: %v, want the cancellation", err)
	}
}

// TestSQLInMemory: a store in memory has no second connection to give execute_sql.
func TestSQLInMemory(t *testing.T) {
	s, err := Open(t.Context(), ":memory:")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Query(t.Context(), `SELECT 1`, 0); errcode.Of(err) != errcode.UnsupportedOp {
		t.Errorf("in memory: %v, want UNSUPPORTED_OPERATION", err)
	}
}

// The database file is opened read-only by execute_sql's connections: with the authorizer
// removed and query_only turned off, a write still fails.
func TestSQLReadOnlyFile(t *testing.T) {
	s := sqlFixture(t)
	if _, err := s.Query(t.Context(), `SELECT 1`, 0); err != nil {
		t.Fatal(err)
	}
	db, _ := s.queryDB()
	conn, err := db.Conn(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Raw(func(any) error { return driver.ErrBadConn }) // never reuse this connection
	if err := conn.Raw(func(dc any) error {
		return dc.(sqlitedrv.AuthorizerRegisterer).RegisterAuthorizer(nil)
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.ExecContext(t.Context(), `PRAGMA query_only = 0`); err != nil {
		t.Fatal(err)
	}
	_, err = conn.ExecContext(t.Context(), `DELETE FROM main.events`)
	if err == nil || !strings.Contains(err.Error(), "readonly") {
		t.Fatalf("a write on the read-only file: %v, want SQLITE_READONLY", err)
	}
}
