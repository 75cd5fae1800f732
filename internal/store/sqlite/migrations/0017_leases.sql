-- 0017_leases: leases: which server replica holds a named piece of lifecycle work
-- (a sandbox's TTL, reconcile, a run's worker, a pool's refill) until expires_at. A holder
-- takes a free or expired lease, or renews its own, in one write transaction; times are unix
-- milliseconds from the database's clock, so replicas with skewed clocks agree.

CREATE TABLE leases (
    name        TEXT PRIMARY KEY,
    holder      TEXT NOT NULL,
    acquired_at BIGINT NOT NULL,
    expires_at  BIGINT NOT NULL
);
