-- 0014_machines: joined machines and their join tokens. A join token's secret is
-- never stored: hash is its SHA-256. uses_left counts down with each enrollment, in the same
-- transaction that creates the machine. A machine keeps its ed25519 public key (32 bytes) and
-- what it last reported (platform, arch, agent_version, gpus as JSON); last_seen is when the
-- server received its last heartbeat (NULL before the first). removed_at is set when it is
-- removed: its key is refused and its name and aliases are free again. Times are unix
-- milliseconds.

CREATE TABLE machine_join_tokens (
    id         TEXT PRIMARY KEY,
    prefix     TEXT NOT NULL,
    hash       BLOB NOT NULL,
    created_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL,
    uses       BIGINT NOT NULL,
    uses_left  BIGINT NOT NULL,
    revoked_at BIGINT
);

CREATE UNIQUE INDEX machine_join_tokens_hash_idx ON machine_join_tokens (hash);

CREATE TABLE machines (
    id            TEXT PRIMARY KEY,
    name          TEXT NOT NULL,
    public_key    BLOB NOT NULL,
    platform      TEXT NOT NULL,
    arch          TEXT NOT NULL,
    agent_version TEXT NOT NULL,
    gpus          TEXT NOT NULL DEFAULT '[]',
    last_seen     BIGINT,
    created_at    BIGINT NOT NULL,
    removed_at    BIGINT,
    token_id      TEXT NOT NULL
);

CREATE UNIQUE INDEX machines_live_name_idx ON machines (name) WHERE removed_at IS NULL;

-- A live machine's aliases; removing the machine deletes them.
CREATE TABLE machine_aliases (
    alias      TEXT PRIMARY KEY,
    machine_id TEXT NOT NULL REFERENCES machines (id)
);

CREATE INDEX machine_aliases_machine_idx ON machine_aliases (machine_id);
