-- PLACEHOLDER on branch g-auth only, so that 0011_api_keys runs (versions have no gaps).
-- The real 0010_approvals.sql comes from its own branch: on merge, take that one.
SELECT 1;
