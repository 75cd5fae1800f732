package postgres

// execute_sql on Postgres: read-only SQL over the published views (sqlquery.Views).
//
// Enforcement is the database's own, in layers:
//
//   - The views live in a schema of their own, agentbox_views, with the contract's names and
//     columns (created or replaced at every Open), beside now_ms() and json_extract(text, path)
//     (the helpers SQLite's queries may use).
//   - A NOLOGIN role, agentbox_query, holds USAGE on that schema and SELECT on its views, and
//     nothing else: a view reads its table with its owner's rights, so the role reads the
//     published columns and no table. set_config is revoked from PUBLIC in this database, so a
//     query cannot take back the store's own role (SET ROLE is a statement of its own, and only
//     SELECT, WITH, VALUES, TABLE or EXPLAIN statements are run). Open sets all this up; when it cannot
//     (the store's user may not create roles or revoke), execute_sql answers
//     UNSUPPORTED_OPERATION with the reason.
//   - Each query runs in a READ ONLY transaction that sets statement_timeout to
//     sqlquery.Timeout, search_path to agentbox_views alone and then the role (SET LOCAL
//     ROLE), and is rolled back. The extended protocol runs exactly one statement. Rows stop at
//     the row limit and at sqlquery.MaxResultBytes; a value over sqlquery.MaxValueBytes fails
//     the query with OUTPUT_LIMIT_EXCEEDED.

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"
	"unicode"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/sqlquery"
)

// QueryRole is the role execute_sql's queries run as.
const QueryRole = "agentbox_query"

// viewSchema holds the published views.
const viewSchema = "agentbox_views"

// iso renders a unix-milliseconds column as ISO-8601 UTC text with milliseconds.
func iso(col string) string {
	return fmt.Sprintf(`to_char(timestamp 'epoch' + %s * interval '1 millisecond', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')`, col)
}

func timeCols(col, name string) string {
	return iso(col) + " AS " + name + ", " + col + " AS " + name + "_ms"
}

// queryViews are the published views: the same names, columns and order as SQLite's
// (internal/store/sqlite/sqlview.go), booleans as integers 0/1.
var queryViews = []struct{ name, table, selectList string }{
	{"audit_log", "audit_log",
		"seq, " + timeCols("at", "time") + ", surface, caller_id, caller_name, tool, action, sandbox_id, args_sha256, summary, outcome, duration_ms, approval_id"},
	{"events", "events",
		"seq, sandbox_id, type, from_state, to_state, reason, " + timeCols("at", "time")},
	{"sandboxes", "sandboxes",
		"id, state, image, image_digest, runtime, isolation, cpu, memory_mb, disk_mb, pids_limit, labels, owner, node, network, error_msg AS error, " +
			timeCols("created_at", "created_at") + ", " + timeCols("updated_at", "updated_at") + ", " + timeCols("expires_at", "expires_at")},
	{"jobs", "jobs",
		"id, sandbox_id, argv, env_names, cwd, user_name, state, exit_code, signal, oom_killed::int AS oom_killed, cpu_seconds, log_bytes, log_truncated::int AS log_truncated, error_msg AS error, " +
			timeCols("started_at", "started_at") + ", " + timeCols("finished_at", "finished_at") + ", " + timeCols("created_at", "created_at") + ", " + timeCols("updated_at", "updated_at")},
	{"runs", "runs",
		"id, owner, batch_id, state, " + timeCols("created_at", "created_at") + ", " + timeCols("updated_at", "updated_at") + ", " + timeCols("settled_at", "settled_at")},
	{"run_events", "run_events",
		"seq, run_id, from_state, to_state, phase, reason, " + timeCols("time", "time")},
	{"conversations", "conversations",
		"id, principal, title, model, endpoint, sandbox_id, tools, messages, prompt_tokens, completion_tokens, " +
			timeCols("created_at", "created_at") + ", " + timeCols("updated_at", "updated_at")},
	{"conversation_messages", "conversation_messages",
		"conversation_id, seq, role, content, tool_calls, tool_call_id, tool, is_error, truncated, output_bytes, prompt_tokens, completion_tokens, duration_ms, model, " +
			timeCols("created_at", "created_at")},
}

// setupViews creates or replaces the views and helpers and grants the query role what it may
// read. It returns why execute_sql cannot run (an UNSUPPORTED_OPERATION), or nil.
func setupViews(ctx context.Context, db *sql.DB) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return unsupported("begin", err)
	}
	defer tx.Rollback() //nolint:errcheck // after Commit, a no-op
	stmts := []string{
		// Serialised with migrations: two processes opening at once replace the views in turn.
		fmt.Sprintf(`SELECT pg_advisory_xact_lock(%d)`, migrateLock),
		`CREATE SCHEMA IF NOT EXISTS ` + viewSchema,
	}
	for _, v := range queryViews {
		stmts = append(stmts, `CREATE OR REPLACE VIEW `+viewSchema+`.`+v.name+` AS SELECT `+v.selectList+` FROM public.`+v.table)
	}
	stmts = append(stmts,
		`CREATE OR REPLACE FUNCTION `+viewSchema+`.now_ms() RETURNS bigint LANGUAGE sql STABLE
			AS $$ SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint $$`,
		`CREATE OR REPLACE FUNCTION `+viewSchema+`.json_extract(doc text, path text) RETURNS text LANGUAGE sql IMMUTABLE
			AS $$ SELECT jsonb_path_query_first(doc::jsonb, path::jsonpath) #>> '{}' $$`,
	)
	for _, q := range stmts {
		if _, err := tx.ExecContext(ctx, q); err != nil {
			return unsupported("create the views", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return unsupported("create the views", err)
	}
	// The role is the cluster's, shared by every agentbox database on it; creating it may race
	// another process (duplicate_object, unique_violation): that is fine.
	grants := []string{
		`DO $$ BEGIN
			IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '` + QueryRole + `') THEN
				CREATE ROLE ` + QueryRole + ` NOLOGIN;
			END IF;
		EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
		END $$`,
		`REVOKE ALL ON SCHEMA ` + viewSchema + ` FROM PUBLIC`,
		`GRANT USAGE ON SCHEMA ` + viewSchema + ` TO ` + QueryRole,
		`GRANT SELECT ON ALL TABLES IN SCHEMA ` + viewSchema + ` TO ` + QueryRole,
		`REVOKE EXECUTE ON FUNCTION pg_catalog.set_config(text, text, boolean) FROM PUBLIC`,
		`GRANT ` + QueryRole + ` TO CURRENT_USER`,
	}
	for _, q := range grants {
		if _, err := db.ExecContext(ctx, q); err != nil {
			var pe *pgconn.PgError
			if strings.HasPrefix(q, "GRANT "+QueryRole) && errors.As(err, &pe) && pe.Code == "0LP01" {
				continue // invalid_grant_operation: already a member (or the role's own user)
			}
			return unsupported("set up the role "+QueryRole, err)
		}
	}
	return nil
}

func unsupported(step string, err error) error {
	return errcode.New(errcode.UnsupportedOp, "execute_sql is not available on this Postgres store: %s: %v (the store's user must be allowed to create the NOLOGIN role %s and to revoke set_config from PUBLIC in its database; a superuser or the database's owner with CREATEROLE can)", step, err, QueryRole)
}

// Query runs one read-only query over the published views (sqlquery.Querier).
func (s *Store) Query(ctx context.Context, query string, maxRows int) (sqlquery.Result, error) {
	maxRows, err := sqlquery.Check(query, maxRows)
	if err != nil {
		return sqlquery.Result{}, err
	}
	if s.queryOK != nil {
		return sqlquery.Result{}, s.queryOK
	}
	if err := selectOnly(query); err != nil {
		return sqlquery.Result{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, sqlquery.Timeout+time.Second)
	defer cancel()
	start := time.Now()
	tx, err := s.db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return sqlquery.Result{}, fmt.Errorf("postgres: execute_sql: begin: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // read only: nothing to keep
	for _, q := range []string{
		fmt.Sprintf(`SET LOCAL statement_timeout = %d`, sqlquery.Timeout.Milliseconds()),
		`SET LOCAL search_path = ` + viewSchema,
		`SET LOCAL ROLE ` + QueryRole,
	} {
		if _, err := tx.ExecContext(ctx, q); err != nil {
			return sqlquery.Result{}, fmt.Errorf("postgres: execute_sql: %s: %w", q, err)
		}
	}
	rows, err := tx.QueryContext(ctx, query)
	if err != nil {
		return sqlquery.Result{}, queryError(ctx, err)
	}
	defer rows.Close()
	res := sqlquery.Result{Rows: [][]any{}}
	if res.Columns, err = rows.Columns(); err != nil {
		return sqlquery.Result{}, queryError(ctx, err)
	}
	size := 0
	for rows.Next() {
		if len(res.Rows) == maxRows {
			res.Truncated, res.TruncatedBy = true, "max_rows"
			break
		}
		vals := make([]any, len(res.Columns))
		ptrs := make([]any, len(vals))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			return sqlquery.Result{}, queryError(ctx, err)
		}
		row := make([]any, len(vals))
		rowSize := 2
		for i, v := range vals {
			if n := valueLen(v); n > sqlquery.MaxValueBytes {
				return sqlquery.Result{}, errcode.New(errcode.OutputLimitExceeded, "query: a value of %d bytes exceeds %d bytes (the bound of one string or blob)", n, sqlquery.MaxValueBytes).
					With("limit", sqlquery.MaxValueBytes)
			}
			row[i] = jsonValue(v)
			b, _ := json.Marshal(row[i])
			rowSize += len(b) + 1
		}
		if size+rowSize > sqlquery.MaxResultBytes {
			res.Truncated, res.TruncatedBy = true, "max_bytes"
			break
		}
		size += rowSize
		res.Rows = append(res.Rows, row)
	}
	if err := rows.Err(); err != nil {
		return sqlquery.Result{}, queryError(ctx, err)
	}
	res.RowCount = len(res.Rows)
	res.ElapsedMS = float64(time.Since(start).Microseconds()) / 1000
	return res, nil
}

// selectOnly refuses a statement other than SELECT, WITH, VALUES, TABLE or EXPLAIN (of a
// query) — DO, SET, RESET, COPY, … —, looking past leading blanks, comments and parentheses.
func selectOnly(q string) error {
	for {
		q = strings.TrimLeftFunc(q, unicode.IsSpace)
		switch {
		case strings.HasPrefix(q, "--"):
			if i := strings.IndexByte(q, '\n'); i >= 0 {
				q = q[i+1:]
				continue
			}
			q = ""
		case strings.HasPrefix(q, "/*"):
			if i := strings.Index(q, "*/"); i >= 0 {
				q = q[i+2:]
				continue
			}
			q = ""
		case strings.HasPrefix(q, "("):
			q = q[1:]
			continue
		}
		break
	}
	end := strings.IndexFunc(q, func(r rune) bool { return !unicode.IsLetter(r) })
	if end < 0 {
		end = len(q)
	}
	word := strings.ToUpper(q[:end])
	switch word {
	case "SELECT", "WITH", "VALUES", "TABLE", "EXPLAIN": // EXPLAIN wraps a query (no SET, DO, …)
		return nil
	}
	return errcode.New(errcode.InvalidArgument, "query: refused: a %s statement. %s", word, sqlquery.Allowed())
}

func valueLen(v any) int {
	switch x := v.(type) {
	case string:
		return len(x)
	case []byte:
		return len(x)
	}
	return 0
}

// jsonValue turns a scanned value into a JSON value.
func jsonValue(v any) any {
	switch x := v.(type) {
	case float64:
		if math.IsInf(x, 0) || math.IsNaN(x) {
			return fmt.Sprint(x)
		}
		return x
	case float32:
		return jsonValue(float64(x))
	case time.Time:
		return x.UTC().Format(time.RFC3339Nano)
	default:
		return x
	}
}

// queryError translates a query's failure into a typed error.
func queryError(ctx context.Context, err error) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return timedOut()
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch {
		case pe.Code == "57014": // query_canceled: the statement timeout
			return timedOut()
		case pe.Code == "42601" && strings.Contains(pe.Message, "multiple commands"):
			return errcode.New(errcode.InvalidArgument, "query: refused: more than one statement. %s", sqlquery.Allowed())
		case pe.Code == "42501": // insufficient_privilege
			return errcode.New(errcode.InvalidArgument, "query: refused: %s. %s", pe.Message, sqlquery.Allowed())
		case pe.Code == "25006": // read_only_sql_transaction
			return errcode.New(errcode.InvalidArgument, "query: refused: a write. %s", sqlquery.Allowed())
		case pe.Code == "54000" || pe.Code == "53200": // program_limit_exceeded, out_of_memory
			return errcode.New(errcode.OutputLimitExceeded, "query: %s", pe.Message).With("limit", sqlquery.MaxValueBytes)
		case strings.HasPrefix(pe.Code, "42") || strings.HasPrefix(pe.Code, "22") || strings.HasPrefix(pe.Code, "0A"):
			// Syntax errors, no such view or column, bad values: the caller's to fix.
			return errcode.New(errcode.InvalidArgument, "query: %s. %s", pe.Message, sqlquery.Allowed())
		}
	}
	return fmt.Errorf("postgres: execute_sql: %w", err)
}

func timedOut() error {
	return errcode.New(errcode.CommandTimeout, "query: ran past the %s limit and was interrupted; narrow it (a WHERE on an indexed _ms column, a LIMIT, no unbounded recursion)", sqlquery.Timeout).
		With("timeout_ms", sqlquery.Timeout.Milliseconds())
}
