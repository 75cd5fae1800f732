package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	goruntime "runtime"
	"time"

	"github.com/agentbox/agentbox/internal/audit"
	"github.com/agentbox/agentbox/internal/sqlquery"
	"github.com/agentbox/agentbox/internal/store/sqlite"
)

// The execute_sql figure: over an audit log of 1,000,000 records (written through the
// store's AppendAudit, spread over the last 24 hours across 20 tools, so the last hour holds
// about 42,000), the typical question "how many calls of each tool in the last hour?" through
// Store.Query — the read-only connection, its views and authorizer — p50/p99 ≤ 100 ms.

type sqlBenchFlags struct {
	only    *bool
	rows    *int
	queries *int
}

func sqlFlags() sqlBenchFlags {
	return sqlBenchFlags{
		only:    flag.Bool("sql-only", false, "measure only execute_sql over the audit log (no sandboxes, no root; make bench-sql writes bench/results-sql.json)"),
		rows:    flag.Int("sql-rows", 1000000, "audit records written before the execute_sql figure"),
		queries: flag.Int("sql-queries", 200, "timed execute_sql queries"),
	}
}

// Names of the execute_sql figures.
const (
	measureSQLCount = "execute_sql: count by tool, last hour"
	measureSQLFill  = "audit records written (AppendAudit, 5,000 a batch)"
	sqlCountByTool  = "SELECT tool, count(*) AS calls FROM audit_log WHERE time_ms >= now_ms() - 3600000 GROUP BY tool ORDER BY calls DESC"
)

// runSQLBench writes the records into a fresh store and times the query.
func runSQLBench(ctx context.Context, f sqlBenchFlags, out string) {
	dir, err := os.MkdirTemp("", "abbench-sql")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	st, err := sqlite.Open(ctx, filepath.Join(dir, "agentbox.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer st.Close()

	tools := make([]string, 20)
	for i := range tools {
		tools[i] = fmt.Sprintf("tool_%02d", i)
	}
	tools[0], tools[1], tools[2] = "exec", "run_python", "file_write"
	now := time.Now()
	span := 24 * time.Hour
	const batch = 5000
	t0 := time.Now()
	recs := make([]audit.Record, 0, batch)
	for i := range *f.rows {
		tool := tools[(i*7+i/3)%len(tools)]
		recs = append(recs, audit.Record{
			Time:    now.Add(-span + time.Duration(float64(span)*float64(i)/float64(*f.rows))),
			Surface: "mcp", CallerID: "key_bench", CallerName: "bench", Tool: tool, Action: tool,
			SandboxID: fmt.Sprintf("sb_%06d", i%5000), ArgsSHA256: "0000000000000000000000000000000000000000000000000000000000000000",
			Summary: []byte(`{"command":["true"]}`), Outcome: "ok", DurationMS: 1.25,
		})
		if len(recs) == batch || i == *f.rows-1 {
			if err := st.AppendAudit(ctx, recs); err != nil {
				log.Fatal(err)
			}
			recs = recs[:0]
		}
	}
	fill := time.Since(t0)
	log.Printf("wrote %d audit records in %s", *f.rows, fill.Round(time.Millisecond))

	res := Results{CPUs: goruntime.NumCPU(), When: time.Now().UTC(), Skipped: map[string]string{}}
	res.Host, _ = os.Hostname()
	var xs []float64
	var rows, lastHour int
	for i := range *f.queries + 5 {
		q0 := time.Now()
		r, err := st.Query(ctx, sqlCountByTool, 0)
		d := time.Since(q0)
		if err != nil {
			log.Fatal(err)
		}
		if i < 5 {
			continue // warm-up: the first query opens the read-only connections
		}
		xs = append(xs, ms(d))
		rows, lastHour = r.RowCount, 0
		for _, row := range r.Rows {
			if n, ok := row[1].(int64); ok {
				lastHour += int(n)
			}
		}
	}
	s := summarize(measureSQLCount, "ms", xs)
	s.Floor = fmt.Sprintf("≤ 100 ms; %d records, %d in the last hour, %d tools", *f.rows, lastHour, rows)
	res.Stats = append(res.Stats, s,
		Stat{Name: measureSQLFill, Unit: "rows/s", N: *f.rows, P50: float64(*f.rows) / fill.Seconds(), P99: float64(*f.rows) / fill.Seconds(), Mean: float64(*f.rows) / fill.Seconds()})
	printStats(res.Stats)
	fmt.Printf("\nquery: %s (limit %s)\n", sqlCountByTool, sqlquery.Timeout)
	if out != "bench/results.json" {
		writeResults(res, out)
	}
}
