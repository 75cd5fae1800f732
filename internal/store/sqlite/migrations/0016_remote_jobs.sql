-- 0016_remote_jobs: jobs on joined machines. The server writes a job's record (state
-- 'starting') before it asks the machine to start it, and the machine's replies move it on:
-- 'running', then 'exited', 'canceled' or 'unknown'; 'failed' when the machine refused it or
-- never heard of it. A job that asked for a GPU holds a row of remote_gpu_reservations, inserted
-- in the same transaction as the record: the primary key (machine_id, gpu_index) makes a GPU
-- exclusive to one job, and the row is deleted in the same transaction that ends the job.
-- Times are unix milliseconds.

CREATE TABLE remote_jobs (
    id          TEXT PRIMARY KEY,
    machine_id  TEXT NOT NULL,
    owner       TEXT NOT NULL DEFAULT '',
    command     TEXT NOT NULL,
    shell       TEXT NOT NULL DEFAULT '',
    gpu_index   BIGINT,
    state       TEXT NOT NULL,
    exit_code   BIGINT,
    message     TEXT NOT NULL DEFAULT '',
    created_at  BIGINT NOT NULL,
    updated_at  BIGINT NOT NULL,
    ended_at    BIGINT
);

-- Lists of a machine's jobs, newest first; the reconciler's scan of jobs not yet ended.
CREATE INDEX remote_jobs_machine_idx ON remote_jobs (machine_id, created_at);
CREATE INDEX remote_jobs_active_idx ON remote_jobs (state) WHERE state IN ('starting', 'running');

CREATE TABLE remote_gpu_reservations (
    machine_id TEXT NOT NULL,
    gpu_index  BIGINT NOT NULL,
    job_id     TEXT NOT NULL UNIQUE REFERENCES remote_jobs (id),
    created_at BIGINT NOT NULL,
    PRIMARY KEY (machine_id, gpu_index)
);
