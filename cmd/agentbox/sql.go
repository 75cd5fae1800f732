package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/sqlquery"
	"github.com/agentbox/agentbox/internal/wire"
)

// cmdSQL is `agentbox sql [--max-rows N] [--json] QUERY` (execute_sql): one read-only
// query over the published views, printed as a table (--json: the whole result).
func cmdSQL(args []string) int {
	c := newClientCmd("sql", "agentbox sql [--max-rows N] [--json] QUERY   (read-only SELECT over audit_log, events, sandboxes, jobs, runs, run_events)")
	maxRows := c.fs.Int("max-rows", 0, fmt.Sprintf("row limit, 1-%d (default %d)", sqlquery.MaxMaxRows, sqlquery.DefaultMaxRows))
	return c.run(args, exactly(1), func(ctx context.Context, cl *client.Client, pos []string) int {
		res, err := cl.Query(ctx, pos[0], *maxRows)
		if err != nil {
			return fail(err)
		}
		if c.json {
			printJSON(res)
			return 0
		}
		printSQL(res)
		return 0
	})
}

// printSQL prints a result as a table, then its count (and truncation) on stderr.
func printSQL(res wire.SQLResult) {
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, strings.ToUpper(strings.Join(res.Columns, "\t")))
	for _, row := range res.Rows {
		cells := make([]string, len(row))
		for i, v := range row {
			switch x := v.(type) {
			case nil:
				cells[i] = "NULL"
			case float64:
				cells[i] = fmt.Sprint(x) // JSON numbers: integers print without an exponent up to 2^53
				if x == float64(int64(x)) {
					cells[i] = fmt.Sprintf("%d", int64(x))
				}
			default:
				cells[i] = strings.NewReplacer("\t", " ", "\n", " ").Replace(fmt.Sprint(x))
			}
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	tw.Flush()
	note := fmt.Sprintf("(%d rows, %.1f ms)", res.RowCount, res.ElapsedMS)
	if res.Truncated {
		note = fmt.Sprintf("(%d rows, %.1f ms; truncated by %s: more rows matched)", res.RowCount, res.ElapsedMS, res.TruncatedBy)
	}
	fmt.Fprintln(os.Stderr, note)
}
