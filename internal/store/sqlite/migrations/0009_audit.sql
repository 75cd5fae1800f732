-- 0009_audit: PLACEHOLDER on branch g-approvals so that 0010 has its predecessor; the audit
-- branch (g-audit) owns this file: take its version when merging.
SELECT 1;
