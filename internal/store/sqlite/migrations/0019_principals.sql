-- 0019_principals: who owns a sandbox and a snapshot, for the authorization gate. A principal
-- is an API key ("key:<id>", what auth.Key.Owner records) or 'admin' (the server's token, the
-- stdio session, and records made before principals were). A sandbox's owner column stays what
-- it was (an MCP session, a run, a pool: it scopes idempotency keys and "the sandboxes this
-- client created"); principal is the key behind it. Existing rows: a key's sandbox gets its
-- key, a run's sandbox its run's key, everything else admin; a snapshot gets its sandbox's.

ALTER TABLE sandboxes ADD COLUMN principal TEXT NOT NULL DEFAULT 'admin';
UPDATE sandboxes SET principal = owner WHERE owner LIKE 'key:%';
UPDATE sandboxes SET principal = COALESCE((SELECT r.owner FROM runs r
    WHERE 'run:' || r.id = sandboxes.owner AND r.owner LIKE 'key:%'), 'admin')
    WHERE owner LIKE 'run:%';
CREATE INDEX sandboxes_principal_idx ON sandboxes (principal, created_at, id);

ALTER TABLE snapshots ADD COLUMN principal TEXT NOT NULL DEFAULT 'admin';
UPDATE snapshots SET principal = COALESCE((SELECT s.principal FROM sandboxes s
    WHERE s.id = snapshots.sandbox_id), 'admin');
CREATE INDEX snapshots_principal_idx ON snapshots (principal, created_at, id);
