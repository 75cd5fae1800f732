-- 0015_blobs: the file relay (internal/blobs). A blob's record is written pending
-- before its bytes (under the state dir's blobs/ directory), then marked ready with its size and
-- SHA-256; the sweeper deletes expired and stale pending ones. blob_transfers is each owner's
-- ledger for the quotas (transfers per hour, bytes admitted per rolling 24 h). Times are unix
-- milliseconds.

CREATE TABLE blobs (
    id         TEXT PRIMARY KEY,
    owner      TEXT NOT NULL,
    state      TEXT NOT NULL,
    name       TEXT NOT NULL,
    size       BIGINT NOT NULL,
    sha256     TEXT NOT NULL,
    source     TEXT NOT NULL,
    machine    TEXT NOT NULL,
    path       TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL
);

CREATE INDEX blobs_expires_idx ON blobs (expires_at);
CREATE INDEX blobs_pending_idx ON blobs (created_at) WHERE state = 'pending';

CREATE TABLE blob_transfers (
    id    TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    kind  TEXT NOT NULL,
    bytes BIGINT NOT NULL,
    at    BIGINT NOT NULL
);

CREATE INDEX blob_transfers_owner_idx ON blob_transfers (owner, at);
CREATE INDEX blob_transfers_at_idx ON blob_transfers (at);
