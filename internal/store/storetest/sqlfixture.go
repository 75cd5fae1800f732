package storetest

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/sqlquery"
)

// The secret values SQLFixture stores where no view may show them.
const (
	SQLSecretEnv         = "S3CR3T-ENV-VALUE"
	SQLSecretPlaceholder = "AGENTBOX-PLACEHOLDER-XYZ"
)

// SQLFixture is the raw rows a driver's execute_sql tests insert, in the driver's own SQL, so
// that every published view's table holds a row with what no view may show: a sandbox whose
// env and secrets hold secret values, an event, a job whose output is "secret", a run whose
// spec holds a secret and its event, four audit records. blob is the dialect's literal of the
// bytes "secret" (X'736563726574' in SQLite, '\x736563726574'::bytea in Postgres).
func SQLFixture(blob string) []string {
	now := time.Date(2026, 12, 2, 14, 3, 5, 123e6, time.UTC).UnixMilli()
	stmts := []string{
		fmt.Sprintf(`INSERT INTO sandboxes (id, state, image, runtime, isolation, cpu, memory_mb, disk_mb, pids_limit, env, labels,
			created_at, updated_at, expires_at, error_msg, version, owner, idempotency_key, node, handle, network, secrets)
			VALUES ('sb_1', 'running', 'host', 'runc', 'process', 1, 512, 1024, 256, '{"TOKEN":"%s"}', '{"team":"a"}',
			%d, %d, %d, '', 1, 'alice', 'idem', 'local', 'h', '', '[{"name":"K","placeholder":"%s","from":"env:K"}]')`, SQLSecretEnv, now, now, now+3600e3, SQLSecretPlaceholder),
		fmt.Sprintf(`INSERT INTO events (sandbox_id, type, from_state, to_state, reason, at) VALUES ('sb_1', 'state_changed', 'creating', 'running', 'started', %d)`, now),
		fmt.Sprintf(`INSERT INTO jobs (id, sandbox_id, argv, env_names, cwd, user_name, state, exit_code, signal, oom_killed, started_at, finished_at,
			log_bytes, log_truncated, tail, error_msg, created_at, updated_at, version) VALUES ('job_1', 'sb_1', '["sleep","1"]', '["TOKEN"]', '/workspace',
			'agent', 'exited', 0, '', FALSE, %d, %d, 3, FALSE, %s, '', %d, %d, 1)`, now, now+1000, blob, now, now),
		fmt.Sprintf(`INSERT INTO runs (id, owner, idempotency_key, batch_id, state, created_at, updated_at, settled_at, version, doc)
			VALUES ('run_1', 'alice', '', '', 'succeeded', %d, %d, %d, 1, '{"spec":{"env":{"X":"%s"}}}')`, now, now, now, SQLSecretEnv),
		fmt.Sprintf(`INSERT INTO run_events (run_id, time, from_state, to_state, phase, reason) VALUES ('run_1', %d, 'queued', 'running', 'start', '')`, now),
		fmt.Sprintf(`INSERT INTO conversations (id, principal, title, model, endpoint, sandbox_id, tools, messages, prompt_tokens, completion_tokens, created_at, updated_at)
			VALUES ('conv_1', 'admin', 'how many?', 'm', 'http://127.0.0.1:1/v1', 'sb_1', '[]', 2, 10, 3, %d, %d)`, now, now),
		fmt.Sprintf(`INSERT INTO conversation_messages (conversation_id, seq, role, content, tool_calls, created_at) VALUES ('conv_1', 1, 'user', 'how many?', '[]', %d)`, now),
		fmt.Sprintf(`INSERT INTO conversation_messages (conversation_id, seq, role, content, tool_calls, prompt_tokens, completion_tokens, model, created_at)
			VALUES ('conv_1', 2, 'assistant', '', '[{"id":"c1","name":"execute_sql","arguments":"{}"}]', 10, 3, 'm', %d)`, now),
	}
	for i, tool := range []string{"exec", "exec", "file_write", "run_python"} {
		stmts = append(stmts, fmt.Sprintf(`INSERT INTO audit_log (at, surface, caller_id, caller_name, tool, action, sandbox_id, args_sha256, summary, outcome, duration_ms, approval_id)
			VALUES (%d, 'mcp', 'key_1', 'ci', '%s', '%s', 'sb_1', 'abc', '{}', 'ok', 1.5, '')`, now+int64(i), tool, tool))
	}
	return stmts
}

// WantSQLRefused runs query and wants INVALID_ARGUMENT saying what is allowed, and mention in
// the message.
func WantSQLRefused(t *testing.T, q sqlquery.Querier, query, mention string) {
	t.Helper()
	res, err := q.Query(t.Context(), query, 0)
	if err == nil {
		t.Fatalf("Query(%q) = %d rows, want INVALID_ARGUMENT", query, res.RowCount)
	}
	if errcode.Of(err) != errcode.InvalidArgument {
		t.Fatalf("Query(%q): %v (code %s), want INVALID_ARGUMENT", query, err, errcode.Of(err))
	}
	msg := errcode.Message(err)
	if !strings.Contains(msg, "read-only SELECT") || !strings.Contains(msg, sqlquery.ViewNames()) {
		t.Errorf("Query(%q): message %q does not say what is allowed", query, msg)
	}
	if !strings.Contains(strings.ToLower(msg), strings.ToLower(mention)) {
		t.Errorf("Query(%q): message %q does not mention %q", query, msg, mention)
	}
}

// RunSQLViews checks a store holding SQLFixture's rows: a typical query per view answers the
// same rows on every driver, every view's columns are the contract's (sqlquery.Views), and no
// value in any view is a secret.
func RunSQLViews(t *testing.T, q sqlquery.Querier) {
	ctx := t.Context()
	typical := map[string]string{
		"audit_log":             `SELECT tool, count(*) AS n FROM audit_log WHERE time_ms >= now_ms() - 315360000000 GROUP BY tool ORDER BY n DESC, tool`,
		"events":                `SELECT sandbox_id, to_state, time FROM events ORDER BY seq`,
		"sandboxes":             `SELECT id, state, json_extract(labels, '$.team') AS team, created_at FROM sandboxes WHERE state = 'running'`,
		"jobs":                  `SELECT id, state, exit_code, finished_at_ms - started_at_ms AS ms, oom_killed FROM jobs`,
		"runs":                  `SELECT state, count(*) FROM runs GROUP BY state`,
		"run_events":            `SELECT r.id, e.phase FROM runs r JOIN run_events e ON e.run_id = r.id`,
		"conversations":         `SELECT id, model, messages, prompt_tokens + completion_tokens FROM conversations`,
		"conversation_messages": `SELECT seq, role, json_extract(tool_calls, '$[0].name') FROM conversation_messages ORDER BY seq`,
	}
	want := map[string][][]any{
		"audit_log":             {{"exec", float64(2)}, {"file_write", float64(1)}, {"run_python", float64(1)}},
		"events":                {{"sb_1", "running", "2026-12-02T14:03:05.123Z"}},
		"sandboxes":             {{"sb_1", "running", "a", "2026-12-02T14:03:05.123Z"}},
		"jobs":                  {{"job_1", "exited", float64(0), float64(1000), float64(0)}},
		"runs":                  {{"succeeded", float64(1)}},
		"run_events":            {{"run_1", "start"}},
		"conversations":         {{"conv_1", "m", float64(2), float64(13)}},
		"conversation_messages": {{float64(1), "user", nil}, {float64(2), "assistant", "execute_sql"}},
	}
	for _, v := range sqlquery.Views {
		t.Run(v.Name, func(t *testing.T) {
			res, err := q.Query(ctx, typical[v.Name], 0)
			if err != nil {
				t.Fatalf("typical query: %v", err)
			}
			b, _ := json.Marshal(res.Rows)
			var got [][]any
			json.Unmarshal(b, &got)
			if fmt.Sprint(got) != fmt.Sprint(want[v.Name]) {
				t.Errorf("typical query: rows %v, want %v", got, want[v.Name])
			}
			all, err := q.Query(ctx, "SELECT * FROM "+v.Name, 0)
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
			for _, secret := range []string{SQLSecretEnv, SQLSecretPlaceholder, "c2VjcmV0" /* the job's output, base64 */, "idem", `"h"`} {
				if strings.Contains(string(b), secret) {
					t.Errorf("view %s shows %q: %s", v.Name, secret, b)
				}
			}
		})
	}
}
