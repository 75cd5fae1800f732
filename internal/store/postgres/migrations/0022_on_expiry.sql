-- 0022_on_expiry: what happens to a sandbox when its TTL runs out ('' destroys it, 'sleep' puts
-- it to sleep), and the TTL it was created with, which a wake gives back to a sandbox that slept
-- at its expiry. Existing rows: destroyed at expiry, as before; their TTL unknown (0).

ALTER TABLE sandboxes ADD COLUMN on_expiry TEXT NOT NULL DEFAULT '';
ALTER TABLE sandboxes ADD COLUMN ttl_seconds BIGINT NOT NULL DEFAULT 0;
