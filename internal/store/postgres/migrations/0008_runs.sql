-- 0008_runs: durable runs (internal/runs), their events, and batches.
--
-- runs.doc is the whole runs.Run as JSON (times in UTC, millisecond precision); the columns
-- beside it are what queries select and order on, and owner and version, which the JSON leaves
-- out. idempotency_key is the spec's (unique per owner when set). settled_at is set once the
-- run is settled (its finished_at, else its updated_at) and is what pruning compares. batch_id
-- is '' for a run outside a batch. run_events.seq is AUTOINCREMENT so a cursor never sees a seq
-- reused after pruning. batches.doc is the whole runs.Batch as JSON likewise.

CREATE TABLE runs (
    id              TEXT PRIMARY KEY,
    owner           TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    batch_id        TEXT NOT NULL,
    state           TEXT NOT NULL,
    created_at      BIGINT NOT NULL,
    updated_at      BIGINT NOT NULL,
    settled_at      BIGINT,
    version         BIGINT NOT NULL,
    doc             TEXT NOT NULL
);

CREATE UNIQUE INDEX runs_owner_key_idx ON runs (owner, idempotency_key) WHERE idempotency_key <> '';
CREATE INDEX runs_batch_state_idx ON runs (batch_id, state);
CREATE INDEX runs_state_created_idx ON runs (state, created_at, id);
CREATE INDEX runs_created_idx ON runs (created_at, id);
CREATE INDEX runs_owner_created_idx ON runs (owner, created_at, id);

CREATE TABLE run_events (
    seq        BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id     TEXT NOT NULL REFERENCES runs (id),
    time       BIGINT NOT NULL,
    from_state TEXT NOT NULL,
    to_state   TEXT NOT NULL,
    phase      TEXT NOT NULL,
    reason     TEXT NOT NULL
);

CREATE INDEX run_events_run_seq_idx ON run_events (run_id, seq);

CREATE TABLE batches (
    id              TEXT PRIMARY KEY,
    owner           TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    kind            TEXT NOT NULL,
    created_at      BIGINT NOT NULL,
    settled_at      BIGINT,
    version         BIGINT NOT NULL,
    doc             TEXT NOT NULL
);

CREATE UNIQUE INDEX batches_owner_key_idx ON batches (owner, idempotency_key) WHERE idempotency_key <> '';
CREATE INDEX batches_owner_created_idx ON batches (owner, created_at, id);
CREATE INDEX batches_created_idx ON batches (created_at, id);
