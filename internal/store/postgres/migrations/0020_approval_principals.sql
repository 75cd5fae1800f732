-- 0020_approval_principals: the principal an approval was asked for (the requesting key's:
-- "key:<id>", or 'admin' for the server's token and the stdio session), so that a key that is
-- not admin lists and reads its own principal's approvals only (deciding stays the admin's).
-- Existing rows: a key's approval gets its key, everything else admin.

ALTER TABLE approvals ADD COLUMN principal TEXT NOT NULL DEFAULT 'admin';
UPDATE approvals SET principal = 'key:' || caller_id
    WHERE EXISTS (SELECT 1 FROM api_keys k WHERE k.id = approvals.caller_id);
CREATE INDEX approvals_principal_idx ON approvals (principal, created_at, id);
