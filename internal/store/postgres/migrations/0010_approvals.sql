-- 0010_approvals: the approval queue (internal/approval).
--
-- One row per gated call's request for an operator's decision. digest is the SHA-256 of the
-- call's canonical JSON (tool and every argument); summary is what the operator sees (JSON,
-- never a file's content or a secret). Times are Unix milliseconds (UTC). decided_at, used_at
-- are NULL until then; outcome is '' until the call that used the approval returned ('ok' or
-- its error code). bound = 1: only the request that asked may use it (its digest does not
-- cover a streamed body).

CREATE TABLE approvals (
    id          TEXT PRIMARY KEY,
    state       TEXT NOT NULL,
    tool        TEXT NOT NULL,
    action      TEXT NOT NULL,
    surface     TEXT NOT NULL,
    sandbox_id  TEXT NOT NULL,
    digest      TEXT NOT NULL,
    summary     TEXT NOT NULL,
    caller_id   TEXT NOT NULL,
    caller_name TEXT NOT NULL,
    created_at  BIGINT NOT NULL,
    expires_at  BIGINT NOT NULL,
    decided_at  BIGINT,
    decider     TEXT NOT NULL,
    reason      TEXT NOT NULL,
    used_at     BIGINT,
    outcome     TEXT NOT NULL,
    bound       INTEGER NOT NULL
);

CREATE INDEX approvals_digest_idx ON approvals (caller_id, digest, created_at);
CREATE INDEX approvals_state_expires_idx ON approvals (state, expires_at);
CREATE INDEX approvals_created_idx ON approvals (created_at, id);
