package sqlite

import (
	"strings"
	"testing"
	"time"
)

// TestAuditPlans: with the statistics migration 0009 fixes, the typical queries over the audit
// log read index ranges, never the whole table or a whole index, and a sandbox's pages by seq
// need no sort — on every connection, from the first row on.
func TestAuditPlans(t *testing.T) {
	s, _ := openTemp(t)
	defer s.Close()
	now := time.Now().UnixMilli()
	_, err := s.write.ExecContext(t.Context(), `WITH RECURSIVE c(n) AS (SELECT 0 UNION ALL SELECT n+1 FROM c WHERE n < 49999)
		INSERT INTO audit_log (at, surface, caller_id, caller_name, tool, action, sandbox_id, args_sha256, summary, outcome, duration_ms, approval_id)
		SELECT ? - (50000-n)*2500, 'mcp', 'k', 'n', 't'||(n%8), 't'||(n%8), 'sb-'||(n%50), printf('%064x', n), '{}', 'ok', 1.5, '' FROM c`, now)
	if err != nil {
		t.Fatal(err)
	}
	hourAgo := now - 3600_000
	for _, tc := range []struct {
		q    string
		args []any
		want string
	}{
		{`SELECT action, count(*) FROM audit_log WHERE at >= ? GROUP BY action`, []any{hourAgo}, "USING COVERING INDEX audit_log_action_at_idx (ANY(action) AND at>?)"},
		{`SELECT tool, count(*) FROM audit_log WHERE at >= ? GROUP BY tool`, []any{hourAgo}, "USING COVERING INDEX audit_log_tool_at_idx (ANY(tool) AND at>?)"},
		{`SELECT count(*) FROM audit_log WHERE tool = ? AND at >= ?`, []any{"t1", hourAgo}, "USING COVERING INDEX audit_log_tool_at_idx (tool=? AND at>?)"},
		{`SELECT count(*) FROM audit_log WHERE action = ? AND at >= ?`, []any{"t1", hourAgo}, "USING COVERING INDEX audit_log_action_at_idx (action=? AND at>?)"},
		{`SELECT count(*) FROM audit_log WHERE at >= ?`, []any{hourAgo}, "USING COVERING INDEX audit_log_at_idx (at>?)"},
		{`SELECT seq FROM audit_log WHERE sandbox_id = ? AND seq > ? ORDER BY seq LIMIT 100`, []any{"sb-1", 5}, "USING COVERING INDEX audit_log_sandbox_seq_idx (sandbox_id=? AND seq>?)"},
		{`DELETE FROM audit_log WHERE at < ?`, []any{hourAgo}, "audit_log_at_idx (at<?)"},
	} {
		rows, err := s.read.QueryContext(t.Context(), `EXPLAIN QUERY PLAN `+tc.q, tc.args...)
		if err != nil {
			t.Fatal(err)
		}
		var plan []string
		for rows.Next() {
			var id, parent, unused int
			var detail string
			if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
				t.Fatal(err)
			}
			plan = append(plan, detail)
		}
		rows.Close()
		p := strings.Join(plan, "; ")
		if !strings.Contains(p, tc.want) || strings.Contains(p, "SCAN audit_log") || (strings.Contains(tc.q, "ORDER BY") && strings.Contains(p, "TEMP B-TREE")) {
			t.Errorf("%s: plan %q, want %q", tc.q, p, tc.want)
		}
	}
}
