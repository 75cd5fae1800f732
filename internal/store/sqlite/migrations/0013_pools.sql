-- 0013_pools: warm pools. A pool is a name, a shape (image, runtime, cpu,
-- memory_mb, disk_mb, network) and a size: how many ready sandboxes of that shape the server
-- keeps for creates to claim. A pooled sandbox is an ordinary sandbox record whose pool column
-- names the pool holding it; a create that claims it sets pool to '' and from_pool to 1 in
-- one conditional update, so a pooled sandbox is claimed at most once and never reused.
-- Times are unix milliseconds.

CREATE TABLE pools (
    name       TEXT PRIMARY KEY,
    image      TEXT NOT NULL,
    runtime    TEXT NOT NULL,
    cpu        REAL NOT NULL,
    memory_mb  BIGINT NOT NULL,
    disk_mb    BIGINT NOT NULL,
    network    TEXT NOT NULL DEFAULT 'none',
    size       BIGINT NOT NULL,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);

ALTER TABLE sandboxes ADD COLUMN pool TEXT NOT NULL DEFAULT '';
ALTER TABLE sandboxes ADD COLUMN from_pool BOOLEAN NOT NULL DEFAULT FALSE;

-- Claims and refills look up a pool's members by state, oldest first.
CREATE INDEX sandboxes_pool_idx ON sandboxes (pool, state, created_at) WHERE pool <> '';
