-- 0009_audit: the audit log: one row per call on every surface (REST, MCP, MCP
-- over stdio), written in batches by audit.Recorder.
--
-- at is unix milliseconds (UTC) when the call began; tool is the MCP tool or the REST route's
-- pattern, action the MCP tool either is ('' for REST routes that are none); caller_id and
-- caller_name name an API key (never the key) or the stdio session; args_sha256 is the hex
-- SHA-256 of the arguments' canonical JSON; summary is the arguments redacted, a JSON object
-- (never a file's content, stdin, a body, an environment variable's value or a secret);
-- outcome is 'ok' or the error code; approval_id is '' unless the call waited for one. seq is
-- AUTOINCREMENT so a cursor never sees a seq reused. Kept for --audit-retention and to the
-- newest --audit-max-rows (pruned hourly). The indexes serve "calls of a tool in the last
-- hour" (by tool — an MCP tool or a route pattern — or by action across surfaces), the
-- time-based prune, and pages of a sandbox's calls.
--
-- (SQLite's version also fixes the planner's statistics of audit_log; Postgres's autovacuum
-- keeps its own.)

CREATE TABLE audit_log (
    seq         BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at          BIGINT NOT NULL,
    surface     TEXT NOT NULL,
    caller_id   TEXT NOT NULL,
    caller_name TEXT NOT NULL,
    tool        TEXT NOT NULL,
    action      TEXT NOT NULL,
    sandbox_id  TEXT NOT NULL,
    args_sha256 TEXT NOT NULL,
    summary     TEXT NOT NULL,
    outcome     TEXT NOT NULL,
    duration_ms DOUBLE PRECISION NOT NULL,
    approval_id TEXT NOT NULL
);

CREATE INDEX audit_log_at_idx ON audit_log (at);
CREATE INDEX audit_log_tool_at_idx ON audit_log (tool, at);
CREATE INDEX audit_log_action_at_idx ON audit_log (action, at);
CREATE INDEX audit_log_sandbox_seq_idx ON audit_log (sandbox_id, seq);

