package sqlite

// execute_sql: read-only SQL over the published views (sqlquery.Views).
//
// Enforcement is the database's own, in layers, on a connection pool of its own:
//
//   - The connections are opened by a privately registered driver ("agentbox-sqlite-query")
//     whose connection hook runs before the pool ever hands a connection out, and fails the
//     open (so the query) if any step fails: the file is opened mode=ro (SQLite refuses every
//     write to the database file); the views are created as TEMP views named like the
//     contract (audit_log, events, …), which shadow the tables of the same names for
//     unqualified names; PRAGMA query_only=1 then stops every further write, even to the temp
//     schema; and an authorizer (sqlite3_set_authorizer) is installed last.
//   - The authorizer allows only SQLITE_SELECT, SQLITE_RECURSIVE (WITH RECURSIVE), reads of a
//     base table's listed columns made *through one of the published views* (SQLite names the
//     view in the callback's fourth argument; a direct read, e.g. main.sandboxes or
//     sqlite_master, names none), and the functions in allowedFunctions. Everything else —
//     INSERT/UPDATE/DELETE, DDL, PRAGMA, ATTACH/DETACH, transactions and savepoints,
//     load_extension, table-valued functions (pragma_*, json_each) — is denied while the
//     statement is compiled: it never runs.
//   - sqlite3_limit bounds one string or blob at sqlquery.MaxValueBytes and ATTACHed databases
//     at 0; a deadline interrupts a query at sqlquery.Timeout (sqlite3_interrupt through the
//     driver's context handling); rows stop at the row limit and at sqlquery.MaxResultBytes.
//   - One statement per call: the text is scanned (strings, quoted names and comments skipped)
//     and anything after the first statement's ';' is refused.

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"sync"
	"time"

	sqlitedrv "modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/sqlquery"
)

// queryDriverName is the private database/sql driver of execute_sql's connections.
const queryDriverName = "agentbox-sqlite-query"

// queryConns bounds execute_sql's connections (concurrent queries wait for one).
const queryConns = 2

// iso renders a unix-milliseconds column as ISO-8601 UTC text with milliseconds.
func iso(col string) string {
	return fmt.Sprintf("CASE WHEN %[1]s IS NULL THEN NULL ELSE strftime('%%Y-%%m-%%dT%%H:%%M:%%S', %[1]s / 1000, 'unixepoch') || '.' || substr('00' || (%[1]s %% 1000), -3, 3) || 'Z' END", col)
}

// timeCols renders the two columns of one time: name (ISO) and name_ms.
func timeCols(col, name string) string {
	return iso(col) + " AS " + name + ", " + col + " AS " + name + "_ms"
}

// queryView is one published view on SQLite: its base table, the base columns it reads (the
// authorizer allows exactly these, through this view) and its SELECT list, in the order of
// sqlquery.Views' columns.
type queryView struct {
	name, table string
	reads       []string
	selectList  string
}

var queryViews = []queryView{
	{name: "audit_log", table: "audit_log",
		reads:      []string{"seq", "at", "surface", "caller_id", "caller_name", "tool", "action", "sandbox_id", "args_sha256", "summary", "outcome", "duration_ms", "approval_id"},
		selectList: "seq, " + timeCols("at", "time") + ", surface, caller_id, caller_name, tool, action, sandbox_id, args_sha256, summary, outcome, duration_ms, approval_id"},
	{name: "events", table: "events",
		reads:      []string{"seq", "sandbox_id", "type", "from_state", "to_state", "reason", "at"},
		selectList: "seq, sandbox_id, type, from_state, to_state, reason, " + timeCols("at", "time")},
	{name: "sandboxes", table: "sandboxes",
		reads: []string{"id", "state", "image", "image_digest", "runtime", "isolation", "cpu", "memory_mb", "disk_mb", "pids_limit", "labels", "owner", "node", "network", "error_msg", "created_at", "updated_at", "expires_at"},
		selectList: "id, state, image, image_digest, runtime, isolation, cpu, memory_mb, disk_mb, pids_limit, labels, owner, node, network, error_msg AS error, " +
			timeCols("created_at", "created_at") + ", " + timeCols("updated_at", "updated_at") + ", " + timeCols("expires_at", "expires_at")},
	{name: "jobs", table: "jobs",
		reads: []string{"id", "sandbox_id", "argv", "env_names", "cwd", "user_name", "state", "exit_code", "signal", "oom_killed", "cpu_seconds", "log_bytes", "log_truncated", "error_msg", "started_at", "finished_at", "created_at", "updated_at"},
		selectList: "id, sandbox_id, argv, env_names, cwd, user_name, state, exit_code, signal, oom_killed, cpu_seconds, log_bytes, log_truncated, error_msg AS error, " +
			timeCols("started_at", "started_at") + ", " + timeCols("finished_at", "finished_at") + ", " + timeCols("created_at", "created_at") + ", " + timeCols("updated_at", "updated_at")},
	{name: "runs", table: "runs",
		reads:      []string{"id", "owner", "batch_id", "state", "created_at", "updated_at", "settled_at"},
		selectList: "id, owner, batch_id, state, " + timeCols("created_at", "created_at") + ", " + timeCols("updated_at", "updated_at") + ", " + timeCols("settled_at", "settled_at")},
	{name: "run_events", table: "run_events",
		reads:      []string{"seq", "run_id", "from_state", "to_state", "phase", "reason", "time"},
		selectList: "seq, run_id, from_state, to_state, phase, reason, " + timeCols("time", "time")},
	{name: "conversations", table: "conversations",
		reads: []string{"id", "principal", "title", "model", "endpoint", "sandbox_id", "tools", "messages", "prompt_tokens", "completion_tokens", "created_at", "updated_at"},
		selectList: "id, principal, title, model, endpoint, sandbox_id, tools, messages, prompt_tokens, completion_tokens, " +
			timeCols("created_at", "created_at") + ", " + timeCols("updated_at", "updated_at")},
	{name: "conversation_messages", table: "conversation_messages",
		reads: []string{"conversation_id", "seq", "role", "content", "tool_calls", "tool_call_id", "tool", "is_error", "truncated", "output_bytes", "prompt_tokens", "completion_tokens", "duration_ms", "model", "created_at"},
		selectList: "conversation_id, seq, role, content, tool_calls, tool_call_id, tool, is_error, truncated, output_bytes, prompt_tokens, completion_tokens, duration_ms, model, " +
			timeCols("created_at", "created_at")},
}

// allowedFunctions are the SQL functions a query may call: SQLite's core scalar, aggregate,
// window, date and JSON functions that neither touch anything outside the query nor need more
// than MaxValueBytes, and now_ms() (the current time in unix milliseconds, the one helper the
// contract adds; a Postgres store defines it too). Not load_extension, not randomblob or
// zeroblob, not sqlite_* introspection.
var allowedFunctions = func() map[string]bool {
	m := map[string]bool{}
	for _, f := range strings.Fields(`now_ms
		count sum total avg min max group_concat string_agg
		abs coalesce ifnull iif nullif length octet_length lower upper substr substring trim ltrim rtrim
		replace instr round typeof printf format char unicode quote hex unhex like glob
		date time datetime julianday strftime unixepoch timediff
		json json_extract json_array json_object json_array_length json_type json_valid json_quote json_group_array json_group_object
		row_number rank dense_rank percent_rank cume_dist ntile lag lead first_value last_value nth_value
		ceil ceiling floor trunc sign sqrt pow power exp ln log log10 log2 mod pi`) {
		m[f] = true
	}
	return m
}()

// queryConnState is what one execute_sql connection's authorizer saw last: the first thing it
// denied while compiling the current statement.
type queryConnState struct {
	mu     sync.Mutex
	denied string
}

func (st *queryConnState) deny(what string) sqlitedrv.AuthorizerReturnCode {
	st.mu.Lock()
	if st.denied == "" {
		st.denied = what
	}
	st.mu.Unlock()
	return sqlitedrv.AuthorizerDeny
}

func (st *queryConnState) take() string {
	st.mu.Lock()
	defer st.mu.Unlock()
	d := st.denied
	st.denied = ""
	return d
}

// authorize is the authorizer of an execute_sql connection whose published views are views.
func (st *queryConnState) authorize(views map[string]map[string]bool) sqlitedrv.AuthorizerFn {
	return func(action sqlitedrv.AuthorizerActionCode, arg1, arg2, db, viewName string) sqlitedrv.AuthorizerReturnCode {
		switch action {
		case sqlitedrv.AuthSelect, sqlitedrv.AuthRecursive:
			return sqlitedrv.AuthorizerOK
		case sqlitedrv.AuthRead:
			// arg1 is the table, arg2 the column ("" when a FROM item is used but none of its
			// columns is read, as in count(*)); viewName is the view (or WITH name) whose body
			// is being compiled, "" at the query's own level.
			switch {
			case db == "temp" && views[arg1] != nil:
				return sqlitedrv.AuthorizerOK // a published view's own columns
			case db == "main" && views[viewName] != nil && (arg2 == "" || views[viewName][arg1+"."+arg2]):
				return sqlitedrv.AuthorizerOK // a listed base column, read by a published view
			case db == "main" && arg2 == "" && baseTables[arg1]:
				// No column read: SQLite reports a count(*) over a flattened view this way. It
				// says only how many rows a published view's table has, which the view says.
				return sqlitedrv.AuthorizerOK
			case db == "" && arg2 == "":
				return sqlitedrv.AuthorizerOK // a WITH table or subquery (no stored table)
			case viewName == "" && arg2 == "":
				return st.deny(fmt.Sprintf("reading %s.%s directly (only the published views may be read)", db, arg1))
			case viewName == "":
				return st.deny(fmt.Sprintf("reading %s.%s.%s directly (only the published views may be read)", db, arg1, arg2))
			default:
				return st.deny(fmt.Sprintf("reading %s.%s.%s (in %s)", db, arg1, arg2, viewName))
			}
		case sqlitedrv.AuthFunction:
			if allowedFunctions[strings.ToLower(arg2)] {
				return sqlitedrv.AuthorizerOK
			}
			return st.deny("the function " + arg2 + "()")
		case sqlitedrv.AuthInsert, sqlitedrv.AuthUpdate, sqlitedrv.AuthDelete:
			return st.deny("a write (INSERT, UPDATE, DELETE or REPLACE) to " + arg1)
		case sqlitedrv.AuthPragma:
			return st.deny("PRAGMA " + arg1)
		case sqlitedrv.AuthAttach:
			return st.deny("ATTACH")
		case sqlitedrv.AuthDetach:
			return st.deny("DETACH")
		case sqlitedrv.AuthTransaction, sqlitedrv.AuthSavepoint:
			return st.deny("a transaction statement (" + arg1 + ")")
		default:
			return st.deny(fmt.Sprintf("DDL or another statement than SELECT (action %d %s)", action, arg1))
		}
	}
}

// baseTables are the tables the published views read.
var baseTables = func() map[string]bool {
	m := map[string]bool{}
	for _, v := range queryViews {
		m[v.table] = true
	}
	return m
}()

var (
	queryDriverOnce sync.Once
	// queryConnStates maps each open execute_sql connection (the driver's own value) to its
	// state, for the refusal's message.
	queryConnStates sync.Map
)

// registerQueryDriver registers the private driver of execute_sql's connections once.
func registerQueryDriver() {
	queryDriverOnce.Do(func() {
		drv := &sqlitedrv.Driver{}
		drv.MustRegisterScalarFunction("now_ms", 0, func(*sqlitedrv.FunctionContext, []driver.Value) (driver.Value, error) {
			return time.Now().UnixMilli(), nil
		})
		drv.RegisterConnectionHook(setupQueryConn)
		sql.Register(queryDriverName, drv)
	})
}

// setupQueryConn makes a fresh connection an execute_sql connection (see the file's comment);
// an error fails the open.
func setupQueryConn(c sqlitedrv.ExecQuerierContext, _ string) error {
	ctx := context.Background()
	rows, err := c.QueryContext(ctx, "SELECT name FROM main.sqlite_master WHERE type = 'table'", nil)
	if err != nil {
		return fmt.Errorf("list tables: %w", err)
	}
	tables := map[string]bool{}
	vals := make([]driver.Value, 1)
	for {
		if err := rows.Next(vals); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			rows.Close()
			return fmt.Errorf("list tables: %w", err)
		}
		if s, ok := vals[0].(string); ok {
			tables[s] = true
		}
	}
	rows.Close()
	views := map[string]map[string]bool{}
	for _, v := range queryViews {
		if !tables[v.table] {
			continue // a table a later migration adds (audit_log before 0009): no view
		}
		if _, err := c.ExecContext(ctx, "CREATE TEMP VIEW "+v.name+" AS SELECT "+v.selectList+" FROM main."+v.table, nil); err != nil {
			return fmt.Errorf("create view %s: %w", v.name, err)
		}
		cols := map[string]bool{}
		for _, r := range v.reads {
			cols[v.table+"."+r] = true
		}
		views[v.name] = cols
	}
	if _, err := c.ExecContext(ctx, "PRAGMA query_only = 1", nil); err != nil {
		return fmt.Errorf("query_only: %w", err)
	}
	reg, ok := c.(sqlitedrv.AuthorizerRegisterer)
	if !ok {
		return fmt.Errorf("the sqlite driver's connection %T has no authorizer", c)
	}
	st := &queryConnState{}
	if err := reg.RegisterAuthorizer(st.authorize(views)); err != nil {
		return fmt.Errorf("install the authorizer: %w", err)
	}
	queryConnStates.Store(c, st)
	return nil
}

// queryDB returns execute_sql's connection pool, opening it on first use.
func (s *Store) queryDB() (*sql.DB, error) {
	s.queryOnce.Do(func() {
		if s.path == ":memory:" {
			s.queryErr = errcode.New(errcode.UnsupportedOp, "execute_sql needs a database file (this store is in memory)")
			return
		}
		registerQueryDriver()
		// The readers' DSN but for query_only, which the hook sets once the temp views exist.
		dsn := strings.Replace(dsn(s.path, true), "&_pragma=query_only(1)", "", 1) + "&mode=ro"
		db, err := sql.Open(queryDriverName, dsn)
		if err != nil {
			s.queryErr = fmt.Errorf("sqlite: open %s for execute_sql: %w", s.path, err)
			return
		}
		db.SetMaxOpenConns(queryConns)
		db.SetMaxIdleConns(queryConns)
		db.SetConnMaxLifetime(0)
		db.SetConnMaxIdleTime(0)
		s.query = db
	})
	return s.query, s.queryErr
}

// optimizeEvery is how often (at most) execute_sql has the planner's statistics refreshed.
const optimizeEvery = 10 * time.Minute

// maybeOptimize refreshes the query planner's statistics (sqlite_stat1) through the writer, at
// most every optimizeEvery: PRAGMA optimize analyzes only the tables whose size changed a lot
// since, and analysis_limit keeps each ANALYZE to a sample (milliseconds). Without statistics
// SQLite cannot know that audit_log.tool has few values, and answers "count by tool in the last
// hour" by scanning the whole (tool, at) index (300 ms at 300,000 records) instead of a
// skip-scan of it (under 1 ms). Failures only cost speed: they are ignored.
func (s *Store) maybeOptimize(ctx context.Context) {
	s.optMu.Lock()
	if !s.optAt.IsZero() && time.Since(s.optAt) < optimizeEvery {
		s.optMu.Unlock()
		return
	}
	s.optAt = time.Now()
	s.optMu.Unlock()
	if _, err := s.write.ExecContext(ctx, "PRAGMA analysis_limit = 1000"); err != nil {
		return
	}
	_, _ = s.write.ExecContext(ctx, "PRAGMA optimize = 0x10002")
}

var _ sqlquery.Querier = (*Store)(nil)

// Query runs one read-only query over the published views (sqlquery.Querier).
func (s *Store) Query(ctx context.Context, query string, maxRows int) (sqlquery.Result, error) {
	maxRows, err := sqlquery.Check(query, maxRows)
	if err != nil {
		return sqlquery.Result{}, err
	}
	if err := oneStatement(query); err != nil {
		return sqlquery.Result{}, err
	}
	db, err := s.queryDB()
	if err != nil {
		return sqlquery.Result{}, err
	}
	s.maybeOptimize(ctx)
	ctx, cancel := context.WithTimeout(ctx, sqlquery.Timeout)
	defer cancel()
	start := time.Now()
	conn, err := db.Conn(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return sqlquery.Result{}, queryError(ctx, nil, err)
		}
		return sqlquery.Result{}, fmt.Errorf("sqlite: execute_sql connection: %w", err)
	}
	defer conn.Close()
	var st *queryConnState
	if err := conn.Raw(func(dc any) error {
		v, ok := queryConnStates.Load(dc)
		if !ok {
			return errors.New("sqlite: an execute_sql connection without its authorizer")
		}
		st = v.(*queryConnState)
		st.take()
		return nil
	}); err != nil {
		return sqlquery.Result{}, err
	}
	// Bounds on this connection (sqlite3_limit): one value, and no attached database.
	if _, err := sqlitedrv.Limit(conn, sqlite3.SQLITE_LIMIT_LENGTH, sqlquery.MaxValueBytes); err != nil {
		return sqlquery.Result{}, fmt.Errorf("sqlite: execute_sql limit: %w", err)
	}
	if _, err := sqlitedrv.Limit(conn, sqlite3.SQLITE_LIMIT_ATTACHED, 0); err != nil {
		return sqlquery.Result{}, fmt.Errorf("sqlite: execute_sql limit: %w", err)
	}
	rows, err := conn.QueryContext(ctx, query)
	if err != nil {
		return sqlquery.Result{}, queryError(ctx, st, err)
	}
	defer rows.Close()
	res := sqlquery.Result{Rows: [][]any{}}
	if res.Columns, err = rows.Columns(); err != nil {
		return sqlquery.Result{}, queryError(ctx, st, err)
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
			return sqlquery.Result{}, queryError(ctx, st, err)
		}
		row := make([]any, len(vals))
		rowSize := 2
		for i, v := range vals {
			row[i] = jsonValue(v)
			rowSize += jsonSize(row[i]) + 1
		}
		if size+rowSize > sqlquery.MaxResultBytes {
			res.Truncated, res.TruncatedBy = true, "max_bytes"
			break
		}
		size += rowSize
		res.Rows = append(res.Rows, row)
	}
	if err := rows.Err(); err != nil {
		return sqlquery.Result{}, queryError(ctx, st, err)
	}
	res.RowCount = len(res.Rows)
	res.ElapsedMS = float64(time.Since(start).Microseconds()) / 1000
	return res, nil
}

// jsonValue turns a scanned SQLite value into a JSON value.
func jsonValue(v any) any {
	switch x := v.(type) {
	case []byte:
		return x // encoding/json writes base64
	case float64:
		if math.IsInf(x, 0) || math.IsNaN(x) {
			return fmt.Sprint(x)
		}
		return x
	case time.Time:
		return x.UTC().Format(time.RFC3339Nano)
	default:
		return x
	}
}

// jsonSize is the size of v's JSON encoding.
func jsonSize(v any) int {
	switch x := v.(type) {
	case nil:
		return 4
	case string:
		if len(x) < 256 && !strings.ContainsAny(x, "\"\\<>&") && isPrintableASCII(x) {
			return len(x) + 2
		}
	case int64:
		return len(fmt.Sprint(x))
	}
	b, _ := json.Marshal(v)
	return len(b)
}

func isPrintableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// queryError translates a query's failure into a typed error.
func queryError(ctx context.Context, st *queryConnState, err error) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return errcode.New(errcode.CommandTimeout, "query: ran past the %s limit and was interrupted; narrow it (a WHERE on an indexed _ms column, a LIMIT, no unbounded recursion)", sqlquery.Timeout).
			With("timeout_ms", sqlquery.Timeout.Milliseconds())
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	var se *sqlitedrv.Error
	if errors.As(err, &se) {
		switch se.Code() & 0xff {
		case sqlite3.SQLITE_AUTH:
			what := ""
			if st != nil {
				what = st.take()
			}
			if what == "" {
				what = "the statement"
			}
			return errcode.New(errcode.InvalidArgument, "query: refused: %s. %s", what, sqlquery.Allowed())
		case sqlite3.SQLITE_READONLY:
			return errcode.New(errcode.InvalidArgument, "query: refused: a write. %s", sqlquery.Allowed())
		case sqlite3.SQLITE_TOOBIG:
			return errcode.New(errcode.OutputLimitExceeded, "query: a value exceeds %d bytes (the bound of one string or blob)", sqlquery.MaxValueBytes).
				With("limit", sqlquery.MaxValueBytes)
		case sqlite3.SQLITE_INTERRUPT:
			return errcode.New(errcode.CommandTimeout, "query: interrupted (limit %s)", sqlquery.Timeout)
		case sqlite3.SQLITE_ERROR:
			// Syntax errors, no such table or column, …: the caller's to fix.
			return errcode.New(errcode.InvalidArgument, "query: %s. %s", sqliteMessage(se), sqlquery.Allowed())
		}
	}
	return fmt.Errorf("sqlite: execute_sql: %w", err)
}

// sqliteMessage is SQLite's own message of an error, without the driver's code suffix.
func sqliteMessage(e *sqlitedrv.Error) string {
	msg := e.Error()
	if i := strings.LastIndex(msg, " ("); i > 0 && strings.HasSuffix(msg, ")") {
		msg = msg[:i]
	}
	return msg
}

// oneStatement refuses a query holding more than one statement: after the first ';' outside
// string literals, quoted names and comments, only blanks and comments may follow.
func oneStatement(q string) error {
	end := -1
	for i := 0; i < len(q); i++ {
		switch ch := q[i]; {
		case ch == '\'' || ch == '"' || ch == '`':
			j := i + 1
			for ; j < len(q); j++ {
				if q[j] == ch {
					if j+1 < len(q) && q[j+1] == ch { // doubled quote: an escaped one
						j++
						continue
					}
					break
				}
			}
			i = j
		case ch == '[':
			if j := strings.IndexByte(q[i:], ']'); j >= 0 {
				i += j
			} else {
				i = len(q)
			}
		case ch == '-' && i+1 < len(q) && q[i+1] == '-':
			if j := strings.IndexByte(q[i:], '\n'); j >= 0 {
				i += j
			} else {
				i = len(q)
			}
		case ch == '/' && i+1 < len(q) && q[i+1] == '*':
			if j := strings.Index(q[i+2:], "*/"); j >= 0 {
				i += j + 3
			} else {
				i = len(q)
			}
		case ch == ';':
			if end < 0 {
				end = i
			}
		case ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\f':
		default:
			if end >= 0 {
				return errcode.New(errcode.InvalidArgument, "query: refused: more than one statement. %s", sqlquery.Allowed())
			}
		}
	}
	return nil
}
