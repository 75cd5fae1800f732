-- 0004_jobs: detached jobs, one row per job the control plane started.
--
-- The record is written before the agent is asked to start the job (state 'starting') and
-- follows what the agent reports; once a job ends it keeps the last 64 KiB of its output (tail),
-- so job_list, job_status and job_logs answer after the sandbox is gone. Rows go with their
-- sandbox's record when it is pruned, and finished ones after the job retention. env_names
-- holds the names of the job's environment only (JSON array); values are never stored.

CREATE TABLE jobs (
    id            TEXT PRIMARY KEY,
    sandbox_id    TEXT NOT NULL REFERENCES sandboxes (id),
    argv          TEXT NOT NULL,
    env_names     TEXT NOT NULL,
    cwd           TEXT NOT NULL,
    user_name     TEXT NOT NULL,
    state         TEXT NOT NULL,
    exit_code     BIGINT,
    signal        TEXT NOT NULL,
    oom_killed    BOOLEAN NOT NULL,
    started_at    BIGINT NOT NULL,
    finished_at   BIGINT,
    log_bytes     BIGINT NOT NULL,
    log_truncated BOOLEAN NOT NULL,
    tail          BYTEA NOT NULL,
    error_msg     TEXT NOT NULL,
    created_at    BIGINT NOT NULL,
    updated_at    BIGINT NOT NULL,
    version       BIGINT NOT NULL
);

CREATE INDEX jobs_sandbox_created_idx ON jobs (sandbox_id, created_at, id);
CREATE INDEX jobs_state_updated_idx ON jobs (state, updated_at);
