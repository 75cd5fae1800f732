-- 0012_snapshots: snapshots of sandboxes, and what a sandbox record says of them.
--
-- A snapshot record is written (state 'creating') before the runtime saves anything, becomes
-- 'ready' once it has (snapshot.json written), 'failed' if it could not, and 'deleting' while
-- its files are removed; the record goes last. It has no foreign key to sandboxes: a user
-- snapshot outlives its sandbox (create --snapshot, fork), so pruning a sandbox's record leaves
-- it. labels and secrets (references only, never values) are JSON text, network is the egress
-- policy as JSON ('' for none), like the sandboxes table. Times are unix milliseconds (UTC).

CREATE TABLE snapshots (
    id           TEXT PRIMARY KEY,
    sandbox_id   TEXT NOT NULL,
    state        TEXT NOT NULL,
    kind         TEXT NOT NULL,
    purpose      TEXT NOT NULL,
    size_bytes   BIGINT NOT NULL,
    runtime      TEXT NOT NULL,
    image        TEXT NOT NULL,
    image_digest TEXT NOT NULL,
    cpu          DOUBLE PRECISION NOT NULL,
    memory_mb    BIGINT NOT NULL,
    disk_mb      BIGINT NOT NULL,
    network      TEXT NOT NULL,
    secrets      TEXT NOT NULL,
    id_base      BIGINT NOT NULL,
    labels       TEXT NOT NULL,
    node         TEXT NOT NULL,
    created_at   BIGINT NOT NULL,
    error_msg    TEXT NOT NULL,
    version      BIGINT NOT NULL
);

CREATE INDEX snapshots_created_idx ON snapshots (created_at, id);
CREATE INDEX snapshots_sandbox_created_idx ON snapshots (sandbox_id, created_at, id);
CREATE INDEX snapshots_state_idx ON snapshots (state);

-- The sandboxes' new fields: the snapshot a sandbox was made from, its sleep options, and
-- while it sleeps, the snapshot holding it and when it went to sleep. slept_at's default is
-- the zero time's unix milliseconds (Go's time.Time{}), which reads back as "never".
ALTER TABLE sandboxes ADD COLUMN from_snapshot TEXT NOT NULL DEFAULT '';
ALTER TABLE sandboxes ADD COLUMN auto_wake BOOLEAN NOT NULL DEFAULT FALSE;
ALTER TABLE sandboxes ADD COLUMN ttl_while_sleeping BOOLEAN NOT NULL DEFAULT FALSE;
ALTER TABLE sandboxes ADD COLUMN sleep_snapshot TEXT NOT NULL DEFAULT '';
ALTER TABLE sandboxes ADD COLUMN slept_at BIGINT NOT NULL DEFAULT -62135596800000;
