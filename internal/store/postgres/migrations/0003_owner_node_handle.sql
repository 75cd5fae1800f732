-- 0003_owner_node_handle: who created a sandbox, the idempotency key its create carried, the
-- node it runs on and the runtime's opaque handle for it.
--
-- An idempotency key is unique per owner while the record exists (a partial unique index, which
-- Postgres has too). Admission counts live sandboxes per node.

ALTER TABLE sandboxes ADD COLUMN owner TEXT NOT NULL DEFAULT '';
ALTER TABLE sandboxes ADD COLUMN idempotency_key TEXT NOT NULL DEFAULT '';
ALTER TABLE sandboxes ADD COLUMN node TEXT NOT NULL DEFAULT '';
ALTER TABLE sandboxes ADD COLUMN handle TEXT NOT NULL DEFAULT '';

UPDATE sandboxes SET node = 'local';

CREATE UNIQUE INDEX sandboxes_owner_idempotency_idx ON sandboxes (owner, idempotency_key)
    WHERE idempotency_key <> '';
CREATE INDEX sandboxes_node_state_idx ON sandboxes (node, state);
