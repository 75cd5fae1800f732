-- 0006_network: a sandbox's network (its egress policy and its secrets), the records of its
-- connections and secret swaps, and its preview URLs.
--
-- sandboxes.network is '' for network none, else the policy as JSON {"allow": [...], "deny":
-- [...]}; sandboxes.secrets is '' or a JSON array of egress.Secret: names, placeholders and
-- references ("env:VAR", "file:/path") only, never a value. connections and secret_calls are
-- written in batches and kept per sandbox to the newest 10,000 each (trimmed as they are
-- written); seq is AUTOINCREMENT so a cursor never sees a seq reused. exposures keeps the
-- SHA-256 (hex) of a private exposure's access token, never the token. All three go with
-- their sandbox's record when it is pruned; exposures also when the sandbox is destroyed.

ALTER TABLE sandboxes ADD COLUMN network TEXT NOT NULL DEFAULT '';
ALTER TABLE sandboxes ADD COLUMN secrets TEXT NOT NULL DEFAULT '';

CREATE TABLE connections (
    seq         BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    sandbox_id  TEXT NOT NULL REFERENCES sandboxes (id),
    at          BIGINT NOT NULL,
    kind        TEXT NOT NULL,
    host        TEXT NOT NULL,
    port        BIGINT NOT NULL,
    addr        TEXT NOT NULL,
    decision    TEXT NOT NULL,
    rule        TEXT NOT NULL,
    reason      TEXT NOT NULL,
    bytes_out   BIGINT NOT NULL,
    bytes_in    BIGINT NOT NULL,
    duration_ms BIGINT NOT NULL,
    intercepted BOOLEAN NOT NULL
);

CREATE INDEX connections_sandbox_seq_idx ON connections (sandbox_id, seq);

CREATE TABLE secret_calls (
    seq        BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    sandbox_id TEXT NOT NULL REFERENCES sandboxes (id),
    at         BIGINT NOT NULL,
    secret     TEXT NOT NULL,
    host       TEXT NOT NULL,
    method     TEXT NOT NULL,
    path       TEXT NOT NULL,
    replaced   BOOLEAN NOT NULL,
    reason     TEXT NOT NULL
);

CREATE INDEX secret_calls_sandbox_seq_idx ON secret_calls (sandbox_id, seq);

CREATE TABLE exposures (
    sandbox_id   TEXT NOT NULL REFERENCES sandboxes (id),
    port         BIGINT NOT NULL,
    public       BOOLEAN NOT NULL,
    token_sha256 TEXT NOT NULL,
    created_at   BIGINT NOT NULL,
    PRIMARY KEY (sandbox_id, port)
);
