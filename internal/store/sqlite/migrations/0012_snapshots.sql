-- 0012_snapshots: PLACEHOLDER on the pools branch so that 0013 has its predecessor; the
-- cp-snap branch's 0012_snapshots.sql (the snapshots table and its sandboxes columns)
-- replaces this file when the branches merge.
SELECT 1;
