-- 0011_api_keys: named API keys (internal/auth). hash is the SHA-256 of the key (the key
-- itself is never stored); name is unique among unrevoked keys. Times are unix milliseconds;
-- expires_at, revoked_at and last_used_at are NULL when unset.

CREATE TABLE api_keys (
    id           TEXT PRIMARY KEY,
    name         TEXT NOT NULL,
    scope        TEXT NOT NULL,
    prefix       TEXT NOT NULL,
    hash         BYTEA NOT NULL,
    created_at   BIGINT NOT NULL,
    expires_at   BIGINT,
    revoked_at   BIGINT,
    last_used_at BIGINT
);

CREATE UNIQUE INDEX api_keys_hash_idx ON api_keys (hash);
CREATE UNIQUE INDEX api_keys_live_name_idx ON api_keys (name) WHERE revoked_at IS NULL;
CREATE INDEX api_keys_created_idx ON api_keys (created_at, id);
