package mcpserver

import (
	"context"
	"fmt"
	"strings"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/sqlquery"
)

// execute_sql: read-only SQL over the store's published views (sqlquery.Views).

// SQLIn is execute_sql's input.
type SQLIn struct {
	Query   string `json:"query" jsonschema:"one read-only SELECT (or WITH … SELECT) statement over the views audit_log, events, sandboxes, jobs, runs, run_events"`
	MaxRows int    `json:"max_rows,omitempty" jsonschema:"the row limit: 1–10000 (default 100)"`
}

// sqlText bounds the text rendering of a result (the structured content carries every row).
const sqlText = 16 << 10

func (s *Server) addSQLTool() {
	var views strings.Builder
	for _, v := range sqlquery.Views {
		names := make([]string, len(v.Columns))
		for i, c := range v.Columns {
			names[i] = c.Name
		}
		fmt.Fprintf(&views, "- %s (%s): %s\n", v.Name, v.Doc, strings.Join(names, ", "))
	}
	addTool(s, &mcp.Tool{
		Name:  "execute_sql",
		Title: "Query the audit log, events, sandboxes, jobs and runs with SQL",
		Description: `Run one read-only SQL SELECT (or WITH … SELECT) over agentbox's published views and get the rows, e.g. "how many run_python calls in the last hour?": SELECT tool, count(*) FROM audit_log WHERE time_ms >= now_ms() - 3600000 GROUP BY tool.
Arguments: query (required), max_rows (1–10000, default 100).
Views (every time is two columns: NAME as ISO-8601 UTC text and NAME_ms as unix milliseconds; filter and sort on the _ms column; now_ms() is the current time in unix milliseconds; JSON columns are text, use json_extract):
` + views.String() + `Nothing else can be read or changed: writes, DDL, PRAGMA, ATTACH, transactions, other tables and unlisted functions are refused. Bounds: 100 rows by default (max_rows up to 10000), 4 MiB of rows (then truncated: true, truncated_by "max_bytes"), 1 MiB per value, 5 s per query.
Reply: {columns, rows (arrays of JSON values), row_count, truncated, truncated_by, elapsed_ms}.
` + errorsDoc("INVALID_ARGUMENT (not a single SELECT over the views, or a SQL error: the message says which and what is allowed)",
			"COMMAND_TIMEOUT (the query ran past 5 s: narrow it with a WHERE on a _ms column or a LIMIT)",
			"OUTPUT_LIMIT_EXCEEDED (one value over 1 MiB)", "UNSUPPORTED_OPERATION (this server has no SQL)"),
		Annotations: &mcp.ToolAnnotations{Title: "Query with SQL", ReadOnlyHint: true, IdempotentHint: true, OpenWorldHint: ptr(false)},
	}, func(in *jsonschema.Schema) {
		in.Properties["query"].MinLength = ptr(1)
		in.Properties["query"].MaxLength = ptr(sqlquery.MaxQueryBytes)
		in.Properties["max_rows"].Minimum = ptr(0.0)
		in.Properties["max_rows"].Maximum = ptr(float64(sqlquery.MaxMaxRows))
	}, s.executeSQL)
}

func (s *Server) executeSQL(ctx context.Context, _ *mcp.CallToolRequest, in SQLIn) (sqlquery.Result, string, error) {
	if s.opts.SQL == nil {
		return sqlquery.Result{}, "", errcode.New(errcode.UnsupportedOp, "this agentbox server has no SQL (execute_sql is served by agentbox serve and agentbox mcp over a database file)")
	}
	if _, err := sqlquery.Check(in.Query, in.MaxRows); err != nil {
		return sqlquery.Result{}, "", err
	}
	res, err := s.opts.SQL.Query(ctx, in.Query, in.MaxRows)
	if err != nil {
		return sqlquery.Result{}, "", err
	}
	return res, renderSQL(res), nil
}

// renderSQL is a result as tab-separated text, cut at sqlText bytes.
func renderSQL(res sqlquery.Result) string {
	var b strings.Builder
	b.WriteString(strings.Join(res.Columns, "\t"))
	b.WriteByte('\n')
	for i, row := range res.Rows {
		if b.Len() > sqlText {
			fmt.Fprintf(&b, "… %d more rows in the structured result\n", len(res.Rows)-i)
			break
		}
		for j, v := range row {
			if j > 0 {
				b.WriteByte('\t')
			}
			if v == nil {
				b.WriteString("NULL")
			} else {
				fmt.Fprint(&b, v)
			}
		}
		b.WriteByte('\n')
	}
	fmt.Fprintf(&b, "(%d rows, %.1f ms", res.RowCount, res.ElapsedMS)
	if res.Truncated {
		fmt.Fprintf(&b, "; truncated by %s", res.TruncatedBy)
	}
	b.WriteString(")")
	return b.String()
}
