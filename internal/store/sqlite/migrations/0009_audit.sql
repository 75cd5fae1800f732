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
-- The planner's statistics for audit_log are fixed here, the shape of a full log (a million
-- rows, tens of tools, hundreds of sandboxes), so that from the first row on, and on every
-- connection (statistics are read when a connection loads the schema), "by tool in the last
-- hour" reads a range of (tool, at) or (action, at) (a skip-scan when grouped by tool), never
-- the whole table. Nothing runs ANALYZE on this table.

CREATE TABLE audit_log (
    seq         INTEGER PRIMARY KEY AUTOINCREMENT,
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

ANALYZE audit_log; -- creates sqlite_stat1 if it does not exist (no rows for an empty table)
DELETE FROM sqlite_stat1 WHERE tbl = 'audit_log';
INSERT INTO sqlite_stat1 (tbl, idx, stat) VALUES
    ('audit_log', 'audit_log_at_idx', '1000000 1'),
    ('audit_log', 'audit_log_tool_at_idx', '1000000 20000 1'),
    ('audit_log', 'audit_log_action_at_idx', '1000000 20000 1'),
    ('audit_log', 'audit_log_sandbox_seq_idx', '1000000 100 1');
