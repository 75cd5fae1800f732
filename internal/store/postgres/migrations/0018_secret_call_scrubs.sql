-- 0018_secret_call_scrubs: a secret call may record a response from the secret's host that
-- carried the value back; scrubbed is how many times it was replaced by the placeholder before
-- the response reached the sandbox (0 for a request's record).

ALTER TABLE secret_calls ADD COLUMN scrubbed BIGINT NOT NULL DEFAULT 0;
