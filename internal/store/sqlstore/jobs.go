package sqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/sandbox"
)

const jobColumns = `id, sandbox_id, argv, env_names, cwd, user_name, state, exit_code, signal, oom_killed,
	started_at, finished_at, log_bytes, log_truncated, tail, error_msg, created_at, updated_at, version, cpu_seconds`

// activeJobStates are the states of jobs that may still run, as query args.
func activeJobStates() []any { return []any{string(sandbox.JobStarting), string(sandbox.JobRunning)} }

func checkJob(j sandbox.Job) error {
	switch {
	case !sandbox.ValidJobID(j.ID):
		return errcode.New(errcode.InvalidArgument, "job id %q is malformed", j.ID)
	case j.SandboxID == "":
		return errcode.New(errcode.InvalidArgument, "job %s has no sandbox id", j.ID)
	case !j.State.Valid():
		return errcode.New(errcode.InvalidArgument, "job %s has unknown state %q", j.ID, j.State)
	case len(j.Tail) > sandbox.TailBytes:
		return errcode.New(errcode.InvalidArgument, "job %s: its kept output is %d bytes, more than %d", j.ID, len(j.Tail), sandbox.TailBytes)
	}
	return nil
}

func jobArgs(j sandbox.Job) ([]any, error) {
	argv, err := json.Marshal(j.Argv)
	if err != nil {
		return nil, err
	}
	names := j.EnvNames
	if names == nil {
		names = []string{}
	}
	env, err := json.Marshal(names)
	if err != nil {
		return nil, err
	}
	var exit, finished any
	if j.ExitCode != nil {
		exit = int64(*j.ExitCode)
	}
	if j.FinishedAt != nil {
		finished = millis(*j.FinishedAt)
	}
	tail := j.Tail
	if tail == nil {
		tail = []byte{}
	}
	return []any{j.ID, j.SandboxID, string(argv), string(env), j.Cwd, j.User, string(j.State), exit, j.Signal,
		j.OOMKilled, millis(j.StartedAt), finished, j.LogBytes, j.LogTruncated, tail, j.Error,
		millis(j.UpdatedAt), millis(j.UpdatedAt), j.Version, j.CPUSeconds}, nil
}

// CreateJob inserts j if its sandbox exists and has fewer than maxActive starting or running
// jobs, then trims that sandbox's finished jobs to the newest MaxJobRecords, in one transaction.
func (s *Store) CreateJob(ctx context.Context, j sandbox.Job, maxActive int) error {
	if err := checkJob(j); err != nil {
		return s.opErr("create job", j.ID, err)
	}
	if j.Version != 1 {
		return s.opErr("create job", j.ID, errcode.New(errcode.InvalidArgument, "a new job record must have version 1, not %d", j.Version))
	}
	args, err := jobArgs(j)
	if err != nil {
		return s.opErr("create job", j.ID, err)
	}
	err = s.inTx(ctx, func(tx *Tx) error {
		var one int
		err := tx.QueryRowContext(ctx, `SELECT 1 FROM sandboxes WHERE id = ?`, j.SandboxID).Scan(&one)
		if errors.Is(err, sql.ErrNoRows) {
			return notFound(j.SandboxID)
		}
		if err != nil {
			return fmt.Errorf("read sandbox: %w", err)
		}
		if maxActive > 0 {
			var n int
			if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM jobs WHERE sandbox_id = ? AND state IN (?, ?)`,
				append([]any{j.SandboxID}, activeJobStates()...)...).Scan(&n); err != nil {
				return fmt.Errorf("count running jobs: %w", err)
			}
			if n >= maxActive {
				return errcode.New(errcode.JobLimitExceeded, "sandbox %s has %d running jobs, the most it may", j.SandboxID, n).With("limit", maxActive)
			}
		}
		_, err = tx.ExecContext(ctx, `INSERT INTO jobs (`+jobColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`, args...)
		if isPrimaryKeyViolation(err) {
			return errcode.Wrap(errcode.Conflict, err, "job %s already exists", j.ID)
		}
		if err != nil {
			return fmt.Errorf("insert: %w", err)
		}
		_, err = tx.ExecContext(ctx, `DELETE FROM jobs WHERE id IN (
			SELECT id FROM jobs WHERE sandbox_id = ? AND state NOT IN (?, ?)
			ORDER BY created_at DESC, id DESC LIMIT `+s.d.LimitAll+` OFFSET ?)`,
			append(append([]any{j.SandboxID}, activeJobStates()...), sandbox.MaxJobRecords)...)
		if err != nil {
			return fmt.Errorf("trim finished jobs: %w", err)
		}
		return nil
	})
	if err != nil {
		return s.opErr("create job", j.ID, err)
	}
	return nil
}

// GetJob returns one job of sandboxID, or JOB_NOT_FOUND.
func (s *Store) GetJob(ctx context.Context, sandboxID, jobID string) (sandbox.Job, error) {
	row := s.read.QueryRowContext(ctx, `SELECT `+jobColumns+` FROM jobs WHERE id = ? AND sandbox_id = ?`, jobID, sandboxID)
	j, err := scanJob(row)
	if errors.Is(err, sql.ErrNoRows) {
		return sandbox.Job{}, s.opErr("get job", jobID, errcode.New(errcode.JobNotFound,
			"job %s of sandbox %s not found; job_list shows the jobs kept", jobID, sandboxID))
	}
	if err != nil {
		return sandbox.Job{}, s.opErr("get job", jobID, err)
	}
	return j, nil
}

// ListJobs returns sandboxID's jobs in states (all if none), newest first, at most limit, and
// how many more matched.
func (s *Store) ListJobs(ctx context.Context, sandboxID string, states []sandbox.JobState, lim int) ([]sandbox.Job, int, error) {
	where := `sandbox_id = ?`
	args := []any{sandboxID}
	if len(states) > 0 {
		where += ` AND state IN (` + placeholders(len(states)) + `)`
		for _, st := range states {
			args = append(args, string(st))
		}
	}
	var total int
	if err := s.read.QueryRowContext(ctx, `SELECT COUNT(*) FROM jobs WHERE `+where, args...).Scan(&total); err != nil {
		return nil, 0, fmt.Errorf("%s: list jobs of %s: %w", s.name, sandboxID, err)
	}
	rows, err := s.read.QueryContext(ctx, `SELECT `+jobColumns+` FROM jobs WHERE `+where+
		` ORDER BY created_at DESC, id DESC LIMIT ?`, append(args, limit(lim))...)
	if err != nil {
		return nil, 0, fmt.Errorf("%s: list jobs of %s: %w", s.name, sandboxID, err)
	}
	defer rows.Close()
	var out []sandbox.Job
	for rows.Next() {
		j, err := scanJob(rows)
		if err != nil {
			return nil, 0, fmt.Errorf("%s: list jobs of %s: %w", s.name, sandboxID, err)
		}
		out = append(out, j)
	}
	if err := rows.Err(); err != nil {
		return nil, 0, fmt.Errorf("%s: list jobs of %s: %w", s.name, sandboxID, err)
	}
	return out, max(0, total-len(out)), nil
}

// UpdateJob writes j if the stored version is j.Version-1 and appends ev (if ev.Type is set)
// with the sandbox's current state as From and To, in one transaction.
func (s *Store) UpdateJob(ctx context.Context, j sandbox.Job, ev sandbox.Event) error {
	if err := checkJob(j); err != nil {
		return s.opErr("update job", j.ID, err)
	}
	args, err := jobArgs(j)
	if err != nil {
		return s.opErr("update job", j.ID, err)
	}
	err = s.inTx(ctx, func(tx *Tx) error {
		// args: id, sandbox_id, argv, env, cwd, user, state, exit, signal, oom, started,
		// finished, log_bytes, truncated, tail, error, created (unused), updated, version, cpu.
		res, err := tx.ExecContext(ctx, `UPDATE jobs SET argv = ?, env_names = ?, cwd = ?, user_name = ?, state = ?,
			exit_code = ?, signal = ?, oom_killed = ?, started_at = ?, finished_at = ?, log_bytes = ?,
			log_truncated = ?, tail = ?, error_msg = ?, updated_at = ?, version = ?, cpu_seconds = ?
			WHERE id = ? AND sandbox_id = ? AND version = ?`,
			args[2], args[3], args[4], args[5], args[6], args[7], args[8], args[9], args[10], args[11],
			args[12], args[13], args[14], args[15], args[17], args[18], args[19], j.ID, j.SandboxID, j.Version-1)
		if err != nil {
			return fmt.Errorf("update: %w", err)
		}
		if err := versioned(ctx, tx, res, "job "+j.ID, j.Version-1, func() error {
			return errcode.New(errcode.JobNotFound, "job %s of sandbox %s not found", j.ID, j.SandboxID)
		}, `SELECT version FROM jobs WHERE id = ? AND sandbox_id = ?`, j.ID, j.SandboxID); err != nil {
			return err
		}
		if ev.Type == "" {
			return nil
		}
		at := ev.At
		if at.IsZero() {
			at = time.Now()
		}
		tx.changed = true // watchers of another process hear of it on commit
		_, err = tx.ExecContext(ctx, `INSERT INTO events (sandbox_id, type, from_state, to_state, reason, at)
			SELECT id, ?, state, state, ?, ? FROM sandboxes WHERE id = ?`, ev.Type, ev.Reason, millis(at), j.SandboxID)
		if err != nil {
			return fmt.Errorf("insert event: %w", err)
		}
		return nil
	})
	if err != nil {
		return s.opErr("update job", j.ID, err)
	}
	return nil
}

// PruneJobs deletes finished jobs whose record was last updated before the given time.
func (s *Store) PruneJobs(ctx context.Context, before time.Time) (int, error) {
	var n int64
	err := s.inTx(ctx, func(tx *Tx) error {
		res, err := tx.ExecContext(ctx, `DELETE FROM jobs WHERE state NOT IN (?, ?) AND updated_at < ?`,
			append(activeJobStates(), millis(before))...)
		if err != nil {
			return fmt.Errorf("delete: %w", err)
		}
		n, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("%s: prune jobs updated before %s: %w", s.name, before.UTC().Format(time.RFC3339Nano), err)
	}
	return int(n), nil
}

func scanJob(r rowScanner) (sandbox.Job, error) {
	var j sandbox.Job
	var argv, env, state string
	var exit, finished sql.NullInt64
	var started, created, updated int64
	err := r.Scan(&j.ID, &j.SandboxID, &argv, &env, &j.Cwd, &j.User, &state, &exit, &j.Signal, &j.OOMKilled,
		&started, &finished, &j.LogBytes, &j.LogTruncated, &j.Tail, &j.Error, &created, &updated, &j.Version, &j.CPUSeconds)
	if err != nil {
		return sandbox.Job{}, err
	}
	j.State = sandbox.JobState(state)
	if err := json.Unmarshal([]byte(argv), &j.Argv); err != nil {
		return sandbox.Job{}, fmt.Errorf("decode argv of job %s: %w", j.ID, err)
	}
	if err := json.Unmarshal([]byte(env), &j.EnvNames); err != nil {
		return sandbox.Job{}, fmt.Errorf("decode env names of job %s: %w", j.ID, err)
	}
	if len(j.EnvNames) == 0 {
		j.EnvNames = nil
	}
	if exit.Valid {
		c := int(exit.Int64)
		j.ExitCode = &c
	}
	if finished.Valid {
		t := fromMillis(finished.Int64)
		j.FinishedAt = &t
	}
	if len(j.Tail) == 0 {
		j.Tail = nil
	}
	j.StartedAt, j.UpdatedAt = fromMillis(started), fromMillis(updated)
	return j, nil
}

// CountJobs returns how many job records are in each state.
func (s *Store) CountJobs(ctx context.Context) (map[sandbox.JobState]int, error) {
	rows, err := s.read.QueryContext(ctx, `SELECT state, COUNT(*) FROM jobs GROUP BY state`)
	if err != nil {
		return nil, fmt.Errorf("%s: count jobs: %w", s.name, err)
	}
	defer rows.Close()
	out := map[sandbox.JobState]int{}
	for rows.Next() {
		var st string
		var n int
		if err := rows.Scan(&st, &n); err != nil {
			return nil, fmt.Errorf("%s: count jobs: %w", s.name, err)
		}
		out[sandbox.JobState(st)] = n
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("%s: count jobs: %w", s.name, err)
	}
	return out, nil
}

// ActiveJobsBySandbox returns how many starting or running job records each sandbox has.
func (s *Store) ActiveJobsBySandbox(ctx context.Context) (map[string]int, error) {
	rows, err := s.read.QueryContext(ctx, `SELECT sandbox_id, COUNT(*) FROM jobs WHERE state IN (?, ?) GROUP BY sandbox_id`, activeJobStates()...)
	if err != nil {
		return nil, fmt.Errorf("%s: count active jobs: %w", s.name, err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			return nil, fmt.Errorf("%s: count active jobs: %w", s.name, err)
		}
		out[id] = n
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("%s: count active jobs: %w", s.name, err)
	}
	return out, nil
}
