package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/sqlquery"
	"github.com/agentbox/agentbox/internal/testenv/pglab"
)

// The secret values the fixture stores where no view may show them.
const (
	secretEnv         = "S3CR3T-ENV-VALUE"
	secretPlaceholder = "AGENTBOX-PLACEHOLDER-XYZ"
)

// sqlFixture opens a store with a row in every published view's table (a sandbox whose env and
// secrets hold secret values, an event, a job, a run and its event, audit records).
func sqlFixture(t *testing.T) *Store {
	t.Helper()
	s := open(t)
	t.Cleanup(func() { s.Close() })
	ctx := t.Context()
	now := time.Date(2026, 12, 2, 14, 3, 5, 123e6, time.UTC).UnixMilli()
	stmts := []string{
		fmt.Sprintf(`INSERT INTO sandboxes (id, state, image, runtime, isolation, cpu, memory_mb, disk_mb, pids_limit, env, labels,
			created_at, updated_at, expires_at, error_msg, version, owner, idempotency_key, node, handle, network, secrets)
			VALUES ('sb_1', 'running', 'host', 'runc', 'process', 1, 512, 1024, 256, '{"TOKEN":"%s"}', '{"team":"a"}',
			%d, %d, %d, '', 1, 'alice', 'idem', 'local', 'h', '', '[{"name":"K","placeholder":"%s","from":"env:K"}]')`, secretEnv, now, now, now+3600e3, secretPlaceholder),
		fmt.Sprintf(`INSERT INTO events (sandbox_id, type, from_state, to_state, reason, at) VALUES ('sb_1', 'state_changed', 'creating', 'running', 'started', %d)`, now),
		fmt.Sprintf(`INSERT INTO jobs (id, sandbox_id, argv, env_names, cwd, user_name, state, exit_code, signal, oom_killed, started_at, finished_at,
			log_bytes, log_truncated, tail, error_msg, created_at, updated_at, version) VALUES ('job_1', 'sb_1', '["sleep","1"]', '["TOKEN"]', '/workspace',
			'agent', 'exited', 0, '', FALSE, %d, %d, 3, FALSE, '\x736563726574'::bytea, '', %d, %d, 1)`, now, now+1000, now, now),
		fmt.Sprintf(`INSERT INTO runs (id, owner, idempotency_key, batch_id, state, created_at, updated_at, settled_at, version, doc)
			VALUES ('run_1', 'alice', '', '', 'succeeded', %d, %d, %d, 1, '{"spec":{"env":{"X":"%s"}}}')`, now, now, now, secretEnv),
		fmt.Sprintf(`INSERT INTO run_events (run_id, time, from_state, to_state, phase, reason) VALUES ('run_1', %d, 'queued', 'running', 'start', '')`, now),
	}
	for i, tool := range []string{"exec", "exec", "file_write", "run_python"} {
		stmts = append(stmts, fmt.Sprintf(`INSERT INTO audit_log (at, surface, caller_id, caller_name, tool, action, sandbox_id, args_sha256, summary, outcome, duration_ms, approval_id)
			VALUES (%d, 'mcp', 'key_1', 'ci', '%s', '%s', 'sb_1', 'abc', '{}', 'ok', 1.5, '')`, now+int64(i), tool, tool))
	}
	for _, q := range stmts {
		if _, err := s.db.ExecContext(ctx, q); err != nil {
			t.Fatalf("fixture %.60s: %v", q, err)
		}
	}
	return s
}

// wantRefused runs q and wants INVALID_ARGUMENT saying what is allowed, and mention in the
// message.
func wantRefused(t *testing.T, s *Store, q, mention string) {
	t.Helper()
	res, err := s.Query(t.Context(), q, 0)
	if err == nil {
		t.Fatalf("Query(%q) = %d rows, want INVALID_ARGUMENT", q, res.RowCount)
	}
	if errcode.Of(err) != errcode.InvalidArgument {
		t.Fatalf("Query(%q): %v (code %s), want INVALID_ARGUMENT", q, err, errcode.Of(err))
	}
	msg := errcode.Message(err)
	if !strings.Contains(msg, "read-only SELECT") || !strings.Contains(msg, sqlquery.ViewNames()) {
		t.Errorf("Query(%q): message %q does not say what is allowed", q, msg)
	}
	if !strings.Contains(strings.ToLower(msg), strings.ToLower(mention)) {
		t.Errorf("Query(%q): message %q does not mention %q", q, msg, mention)
	}
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

// TestSQLViews: a typical query per view answers (the same queries and answers as SQLite's),
// every view's columns are the contract's, and no value in any view is a secret.
func TestSQLViews(t *testing.T) {
	s := sqlFixture(t)
	ctx := t.Context()
	typical := map[string]string{
		"audit_log":  `SELECT tool, count(*) AS n FROM audit_log WHERE time_ms >= now_ms() - 3600000::bigint * 24 * 365 * 10 GROUP BY tool ORDER BY n DESC, tool`,
		"events":     `SELECT sandbox_id, to_state, time FROM events ORDER BY seq`,
		"sandboxes":  `SELECT id, state, json_extract(labels, '$.team') AS team, created_at FROM sandboxes WHERE state = 'running'`,
		"jobs":       `SELECT id, state, exit_code, finished_at_ms - started_at_ms AS ms, oom_killed FROM jobs`,
		"runs":       `SELECT state, count(*) FROM runs GROUP BY state`,
		"run_events": `SELECT r.id, e.phase FROM runs r JOIN run_events e ON e.run_id = r.id`,
	}
	want := map[string][][]any{
		"audit_log":  {{"exec", float64(2)}, {"file_write", float64(1)}, {"run_python", float64(1)}},
		"events":     {{"sb_1", "running", "2026-12-02T14:03:05.123Z"}},
		"sandboxes":  {{"sb_1", "running", "a", "2026-12-02T14:03:05.123Z"}},
		"jobs":       {{"job_1", "exited", float64(0), float64(1000), float64(0)}},
		"runs":       {{"succeeded", float64(1)}},
		"run_events": {{"run_1", "start"}},
	}
	for _, v := range sqlquery.Views {
		t.Run(v.Name, func(t *testing.T) {
			res, err := s.Query(ctx, typical[v.Name], 0)
			if err != nil {
				t.Fatalf("typical query: %v", err)
			}
			b, _ := json.Marshal(res.Rows)
			var got [][]any
			json.Unmarshal(b, &got)
			if fmt.Sprint(got) != fmt.Sprint(want[v.Name]) {
				t.Errorf("typical query: rows %v, want %v", got, want[v.Name])
			}
			all, err := s.Query(ctx, "SELECT * FROM "+v.Name, 0)
			if err != nil {
				t.Fatalf("SELECT *: %v", err)
			}
			var names []string
			for _, c := range v.Columns {
				names = append(names, c.Name)
			}
			if !slices.Equal(all.Columns, names) {
				t.Errorf("columns %v, want the contract's %v", all.Columns, names)
			}
			if all.RowCount == 0 {
				t.Fatalf("no rows")
			}
			b, _ = json.Marshal(all)
			for _, secret := range []string{secretEnv, secretPlaceholder, "c2VjcmV0" /* the job's output, base64 */, "idem", `"h"`} {
				if strings.Contains(string(b), secret) {
					t.Errorf("view %s shows %q: %s", v.Name, secret, b)
				}
			}
		})
	}
}

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
