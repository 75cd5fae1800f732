-- 0005_job_cpu: a job's CPU time in seconds (user + system of its processes), as the agent last
-- reported it; the rusage of its tree once it ended.

ALTER TABLE jobs ADD COLUMN cpu_seconds DOUBLE PRECISION NOT NULL DEFAULT 0;
