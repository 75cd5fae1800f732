package postgres

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/sqlquery"
	"github.com/agentbox/agentbox/internal/store/storetest"
	"github.com/agentbox/agentbox/internal/testenv/pglab"
)

// sqlFixture opens a store holding storetest.SQLFixture's rows.
func sqlFixture(t *testing.T) *Store {
	t.Helper()
	s := open(t)
	t.Cleanup(func() { s.Close() })
	for _, q := range storetest.SQLFixture(`'\\x736563726574'::bytea`) {
		if _, err := s.db.ExecContext(t.Context(), q); err != nil {
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
// INVALID_ARGUMENT, and nothing changed; in particular nothing gets the store's own role back.
func TestSQLRefused(t *testing.T) {
	s := sqlFixture(t)
	cases := []struct{ name, q, mention string }{
		{"insert", `INSERT INTO sandboxes (id) VALUES ('x')`, "INSERT"},
		{"insert into raw table", `INSERT INTO public.events (sandbox_id, type, from_state, to_state, reason, at) VALUES ('sb_1','x','','','',0)`, "INSERT"},
		{"update", `UPDATE public.sandboxes SET state = 'destroyed'`, "UPDATE"},
		{"delete", `DELETE FROM public.audit_log`, "DELETE"},
		{"write in a cte", `WITH d AS (DELETE FROM public.events RETURNING 1) SELECT * FROM d`, "refused"},
		{"create table", `CREATE TABLE t (x int)`, "CREATE"},
		{"drop view", `DROP VIEW sandboxes`, "DROP"},
		{"alter", `ALTER TABLE public.sandboxes ADD COLUMN x TEXT`, "ALTER"},
		{"set role", `SET ROLE NONE`, "SET"},
		{"reset role", `RESET ROLE`, "RESET"},
		{"do block", `DO $$ BEGIN RESET ROLE; END $$`, "DO"},
		{"copy", `COPY public.sandboxes TO STDOUT`, "COPY"},
		{"set_config", `SELECT set_config('role', 'none', true)`, "set_config"},
		{"set_config then read", `SELECT set_config('role', 'none', true), (SELECT count(*) FROM public.id_ranges)`, "refused"},
		{"dynamic sql", `SELECT query_to_xml('SELECT env FROM public.sandboxes', true, true, '')`, "sandboxes"},
		{"read a file", `SELECT pg_read_file('/etc/passwd')`, "pg_read_file"},
		{"id_ranges", `SELECT * FROM public.id_ranges`, "id_ranges"},
		{"raw table columns", `SELECT env FROM public.sandboxes`, "sandboxes"},
		{"raw exposures", `SELECT token_sha256 FROM public.exposures`, "exposures"},
		{"raw table in subquery", `SELECT id FROM sandboxes WHERE id IN (SELECT sandbox_id FROM public.secret_calls)`, "secret_calls"},
		{"cte named like a view", `WITH sandboxes AS (SELECT env FROM public.sandboxes) SELECT * FROM sandboxes`, "sandboxes"},
		{"raw count of other table", `SELECT count(*) FROM public.secret_calls`, "secret_calls"},
		{"api keys", `SELECT hash FROM public.api_keys`, "api_keys"},
		{"env through view", `SELECT env FROM sandboxes`, "does not exist"},
		{"multiple statements", `SELECT 1; SELECT 2`, "more than one statement"},
		{"select then delete", `SELECT 1; DELETE FROM public.events`, "more than one statement"},
		{"begin", `BEGIN`, "BEGIN"},
		{"commit", `COMMIT`, "COMMIT"},
		{"vacuum", `VACUUM`, "VACUUM"},
		{"explain a write", `EXPLAIN ANALYZE DELETE FROM public.events`, "events"},
		{"syntax", `SELEC 1`, "SELEC"},
		{"syntax in select", `SELECT FROM WHERE`, "syntax error"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) { wantRefused(t, s, tc.q, tc.mention) })
	}
	var state string
	var n int
	if err := s.db.QueryRowContext(t.Context(), `SELECT state, (SELECT count(*) FROM events) FROM sandboxes WHERE id = 'sb_1'`).Scan(&state, &n); err != nil || state != "running" || n != 1 {
		t.Fatalf("after the refusals: state %q, events %d, err %v", state, n, err)
	}
}

// TestSQLViews: storetest.RunSQLViews on the fixture (the same queries and answers on
// every driver).
func TestSQLViews(t *testing.T) { storetest.RunSQLViews(t, sqlFixture(t)) }

// TestSQLBounds: max_rows and the result's byte bound cut the rows and say so; one value over
// MaxValueBytes is OUTPUT_LIMIT_EXCEEDED; a runaway query is interrupted at the timeout and
// the store answers after it; a cancelled query ends with the cancellation.
func TestSQLBounds(t *testing.T) {
	s := sqlFixture(t)
	ctx := t.Context()
	res, err := s.Query(ctx, `SELECT i FROM generate_series(1, 20000) AS i`, 0)
	if err != nil || res.RowCount != sqlquery.DefaultMaxRows || !res.Truncated || res.TruncatedBy != "max_rows" {
		t.Errorf("default: %d rows, truncated %v by %q, %v; want 100, true, max_rows", res.RowCount, res.Truncated, res.TruncatedBy, err)
	}
	if res, err := s.Query(ctx, `EXPLAIN SELECT * FROM audit_log WHERE time_ms > 0`, 0); err != nil || res.RowCount == 0 {
		t.Errorf("EXPLAIN of a query: %+v, %v", res, err)
	}
	res, err = s.Query(ctx, `SELECT tool FROM audit_log`, 4)
	if err != nil || res.RowCount != 4 || res.Truncated {
		t.Errorf("exactly max_rows rows: %d, truncated %v, err %v; want 4, false", res.RowCount, res.Truncated, err)
	}
	res, err = s.Query(ctx, `SELECT repeat('x', 1024) AS v FROM generate_series(1, 10000)`, 10000)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(res.Rows)
	if !res.Truncated || res.TruncatedBy != "max_bytes" || len(b) > sqlquery.MaxResultBytes || len(b) < sqlquery.MaxResultBytes-2048 {
		t.Errorf("%d rows, %d bytes of JSON, truncated %v by %q; want just under %d bytes, max_bytes", res.RowCount, len(b), res.Truncated, res.TruncatedBy, sqlquery.MaxResultBytes)
	}
	if _, err := s.Query(ctx, `SELECT repeat('x', 2000000)`, 0); errcode.Of(err) != errcode.OutputLimitExceeded {
		t.Errorf("a 2 MB value: %v, want OUTPUT_LIMIT_EXCEEDED", err)
	}
	start := time.Now()
	_, err = s.Query(ctx, `SELECT count(*) FROM generate_series(1, 1000000000000)`, 0)
	took := time.Since(start)
	if errcode.Of(err) != errcode.CommandTimeout || !strings.Contains(errcode.Message(err), "interrupted") {
		t.Fatalf("runaway query: %v, want COMMAND_TIMEOUT saying it was interrupted", err)
	}
	if took < sqlquery.Timeout || took > sqlquery.Timeout+3*time.Second {
		t.Errorf("runaway query ended after %s, want about %s", took, sqlquery.Timeout)
	}
	if res, err := s.Query(ctx, `SELECT count(*) FROM sandboxes`, 0); err != nil || res.RowCount != 1 {
		t.Fatalf("after the timeout: %+v, %v", res, err)
	}
	// The caller's own cancellation is not a timeout.
	cctx, cancel := context.WithCancel(ctx)
	time.AfterFunc(300*time.Millisecond, cancel)
	_, err = s.Query(cctx, `SELECT count(*) FROM generate_series(1, 1000000000000)`, 0)
	if err == nil || errcode.Of(err) == errcode.CommandTimeout {
		t.Errorf("cancelled query: %v, want the cancellation", err)
	}
}

// TestSQLUnsupportedWithoutRights: a store whose user may not create the query role nor
// revoke set_config serves everything but execute_sql, which says why.
func TestSQLUnsupportedWithoutRights(t *testing.T) {
	dsn := pglab.DSN(t)
	ctx := t.Context()
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	cfg, _ := pgx.ParseConfig(dsn)
	user := "agentbox_plain_" + strings.TrimPrefix(cfg.Database, "agentbox_test_")
	for _, q := range []string{
		`CREATE ROLE ` + user + ` LOGIN`,
		`ALTER DATABASE ` + cfg.Database + ` OWNER TO ` + user,
		`ALTER SCHEMA public OWNER TO ` + user,
	} {
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	t.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), pglab.AdminDSN())
		if err == nil {
			defer c.Close(context.Background())
			_, _ = c.Exec(context.Background(), `DROP DATABASE IF EXISTS `+cfg.Database+` WITH (FORCE)`)
			_, _ = c.Exec(context.Background(), `DROP ROLE IF EXISTS `+user)
		}
	})
	u := strings.Replace(dsn, "postgres://postgres@", "postgres://"+user+"@", 1)
	if u == dsn {
		t.Fatalf("cannot swap the user in %s", dsn)
	}
	s, err := Open(ctx, u)
	if err != nil {
		t.Fatalf("Open as a plain user: %v", err)
	}
	defer s.Close()
	_, err = s.Query(ctx, `SELECT 1`, 0)
	if errcode.Of(err) != errcode.UnsupportedOp || !strings.Contains(errcode.Message(err), QueryRole) {
		t.Fatalf("execute_sql as a plain user: %v, want UNSUPPORTED_OPERATION naming %s", err, QueryRole)
	}
	if _, err := s.CountLive(ctx); err != nil {
		t.Fatalf("the rest of the store: %v", err)
	}
}
