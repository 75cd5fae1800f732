-- 0001_init: sandboxes, an index of their labels, and their state events.
--
-- The Postgres dialect of internal/store/sqlite/migrations, version for version: the same
-- tables, columns and indexes; SQLite's INTEGER PRIMARY KEY AUTOINCREMENT is BIGINT GENERATED
-- ALWAYS AS IDENTITY PRIMARY KEY (a sequence never hands out a seq twice, so a consumer paging
-- with AfterSeq never skips an event), BLOB is BYTEA and REAL DOUBLE PRECISION.

CREATE TABLE sandboxes (
    id         TEXT PRIMARY KEY,
    state      TEXT NOT NULL,
    image      TEXT NOT NULL,
    runtime    TEXT NOT NULL,
    isolation  TEXT NOT NULL,
    cpu        DOUBLE PRECISION NOT NULL,
    memory_mb  BIGINT NOT NULL,
    disk_mb    BIGINT NOT NULL,
    pids_limit BIGINT NOT NULL,
    env        TEXT NOT NULL,
    labels     TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL,
    error_msg  TEXT NOT NULL,
    version    BIGINT NOT NULL
);

CREATE INDEX sandboxes_created_idx ON sandboxes (created_at, id);
CREATE INDEX sandboxes_state_updated_idx ON sandboxes (state, updated_at);

-- sandbox_labels mirrors sandboxes.labels (the record's source of truth) so that label filters
-- are plain, indexed SQL rather than a dialect's JSON operators.
CREATE TABLE sandbox_labels (
    sandbox_id TEXT NOT NULL REFERENCES sandboxes (id),
    name       TEXT NOT NULL,
    value      TEXT NOT NULL,
    PRIMARY KEY (sandbox_id, name)
);

CREATE INDEX sandbox_labels_name_value_idx ON sandbox_labels (name, value);

CREATE TABLE events (
    seq        BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    sandbox_id TEXT NOT NULL REFERENCES sandboxes (id),
    type       TEXT NOT NULL,
    from_state TEXT NOT NULL,
    to_state   TEXT NOT NULL,
    reason     TEXT NOT NULL,
    at         BIGINT NOT NULL
);

CREATE INDEX events_sandbox_seq_idx ON events (sandbox_id, seq);
