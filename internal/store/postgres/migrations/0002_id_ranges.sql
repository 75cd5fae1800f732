-- 0002_id_ranges: the block of host uids and gids that each sandbox's user namespace maps to.
--
-- A row exists while its sandbox holds the range: from admission until the sandbox's host
-- resources are deleted. sandbox_id is the primary key (one range per sandbox) and base is
-- unique; the driver also refuses a range that overlaps another inside the inserting
-- transaction, so two sandboxes never share a host id.

CREATE TABLE id_ranges (
    sandbox_id   TEXT PRIMARY KEY REFERENCES sandboxes (id),
    base         BIGINT NOT NULL UNIQUE,
    count        BIGINT NOT NULL,
    allocated_at BIGINT NOT NULL
);
