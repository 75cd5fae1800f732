package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/store"
)

// Remote jobs (migration 0016_remote_jobs.sql).

var _ store.RemoteJobStore = (*Store)(nil)

// maxRemoteJobRows bounds every list whatever the tables hold.
const maxRemoteJobRows = 1000

const remoteJobCols = `id, machine_id, owner, command, shell, gpu_index, state, exit_code, message, created_at, updated_at, ended_at`

func remoteJobNotFound(id string) error {
	return errcode.New(errcode.JobNotFound, "no remote job %s (remote_job_list lists a machine's jobs)", id).With("job_id", id)
}

// CreateRemoteJob inserts j and reserves its GPU in one transaction.
func (s *Store) CreateRemoteJob(ctx context.Context, j store.RemoteJob) error {
	var busy error
	err := s.inTx(ctx, func(tx *Tx) error {
		if j.GPUIndex != nil {
			var holder string
			err := tx.QueryRowContext(ctx, `SELECT job_id FROM remote_gpu_reservations WHERE machine_id = ? AND gpu_index = ?`,
				j.MachineID, *j.GPUIndex).Scan(&holder)
			if err == nil {
				busy = errcode.New(errcode.GPUBusy, "GPU %d of this machine is reserved by job %s until it ends or is canceled: wait for it (remote_job_status) or pick another gpu_index",
					*j.GPUIndex, holder).With("job_id", holder).With("gpu_index", *j.GPUIndex)
				return busy
			}
			if !errors.Is(err, sql.ErrNoRows) {
				return err
			}
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO remote_jobs (`+remoteJobCols+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			j.ID, j.MachineID, j.Owner, j.Command, j.Shell, nullInt(j.GPUIndex), j.State, nullInt(j.ExitCode), j.Message,
			millis(j.CreatedAt), millis(j.UpdatedAt), nullMillis(j.EndedAt)); err != nil {
			return err
		}
		if j.GPUIndex != nil && !store.RemoteJobEnded(j.State) {
			// The primary key is the guard: of two concurrent reservations one commits.
			if _, err := tx.ExecContext(ctx, `INSERT INTO remote_gpu_reservations (machine_id, gpu_index, job_id, created_at) VALUES (?, ?, ?, ?)`,
				j.MachineID, *j.GPUIndex, j.ID, millis(j.CreatedAt)); err != nil {
				return err
			}
		}
		return nil
	})
	switch {
	case busy != nil:
		return busy
	case isPrimaryKeyViolation(err) || isUniqueViolation(err):
		if j.GPUIndex != nil {
			if rs, e := s.GPUReservations(ctx, j.MachineID); e == nil {
				for _, r := range rs {
					if r.GPUIndex == *j.GPUIndex {
						return errcode.New(errcode.GPUBusy, "GPU %d of this machine is reserved by job %s until it ends or is canceled: wait for it (remote_job_status) or pick another gpu_index",
							r.GPUIndex, r.JobID).With("job_id", r.JobID).With("gpu_index", r.GPUIndex)
					}
				}
			}
		}
		return errcode.Wrap(errcode.Conflict, err, "remote job %s exists", j.ID)
	case err != nil:
		return fmt.Errorf("%s: create remote job %s: %w", s.name, j.ID, err)
	}
	return nil
}

func scanRemoteJob(sc interface{ Scan(...any) error }) (store.RemoteJob, error) {
	var j store.RemoteJob
	var gpu, code, ended sql.NullInt64
	var created, updated int64
	if err := sc.Scan(&j.ID, &j.MachineID, &j.Owner, &j.Command, &j.Shell, &gpu, &j.State, &code, &j.Message,
		&created, &updated, &ended); err != nil {
		return j, err
	}
	j.GPUIndex, j.ExitCode = intPtr(gpu), intPtr(code)
	j.CreatedAt, j.UpdatedAt = fromMillis(created), fromMillis(updated)
	j.EndedAt = timePtr(ended)
	return j, nil
}

// GetRemoteJob returns the job of id.
func (s *Store) GetRemoteJob(ctx context.Context, id string) (store.RemoteJob, error) {
	j, err := scanRemoteJob(s.read.QueryRowContext(ctx, `SELECT `+remoteJobCols+` FROM remote_jobs WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return j, remoteJobNotFound(id)
	}
	if err != nil {
		return j, fmt.Errorf("%s: get remote job %s: %w", s.name, id, err)
	}
	return j, nil
}

// UpdateRemoteJob moves a job on; ending it releases its GPU in the same transaction.
func (s *Store) UpdateRemoteJob(ctx context.Context, j store.RemoteJob) (store.RemoteJob, error) {
	var out store.RemoteJob
	err := s.inTx(ctx, func(tx *Tx) error {
		cur, err := scanRemoteJob(tx.QueryRowContext(ctx, `SELECT `+remoteJobCols+` FROM remote_jobs WHERE id = ?`, j.ID))
		if errors.Is(err, sql.ErrNoRows) {
			return remoteJobNotFound(j.ID)
		}
		if err != nil {
			return err
		}
		if store.RemoteJobEnded(cur.State) {
			out = cur
			return nil
		}
		if _, err := tx.ExecContext(ctx, `UPDATE remote_jobs SET state = ?, exit_code = ?, message = ?, updated_at = ?, ended_at = ? WHERE id = ?`,
			j.State, nullInt(j.ExitCode), j.Message, millis(j.UpdatedAt), nullMillis(j.EndedAt), j.ID); err != nil {
			return err
		}
		if store.RemoteJobEnded(j.State) {
			if _, err := tx.ExecContext(ctx, `DELETE FROM remote_gpu_reservations WHERE job_id = ?`, j.ID); err != nil {
				return err
			}
		}
		out = cur
		out.State, out.ExitCode, out.Message, out.UpdatedAt, out.EndedAt = j.State, j.ExitCode, j.Message, fromMillis(millis(j.UpdatedAt)), nil
		if j.EndedAt != nil {
			t := fromMillis(millis(*j.EndedAt))
			out.EndedAt = &t
		}
		return nil
	})
	if err != nil {
		if _, ok := errcode.As(err); ok {
			return store.RemoteJob{}, err
		}
		return store.RemoteJob{}, fmt.Errorf("%s: update remote job %s: %w", s.name, j.ID, err)
	}
	return out, nil
}

// ListRemoteJobs returns a machine's newest limit jobs and how many older ones there are.
func (s *Store) ListRemoteJobs(ctx context.Context, machineID string, limit int) ([]store.RemoteJob, int, error) {
	limit = max(min(limit, maxRemoteJobRows), 1)
	var total int
	if err := s.read.QueryRowContext(ctx, `SELECT count(*) FROM remote_jobs WHERE machine_id = ?`, machineID).Scan(&total); err != nil {
		return nil, 0, fmt.Errorf("%s: list remote jobs: %w", s.name, err)
	}
	jobs, err := s.queryRemoteJobs(ctx, `SELECT `+remoteJobCols+` FROM remote_jobs WHERE machine_id = ? ORDER BY created_at DESC, id DESC LIMIT ?`, machineID, limit)
	if err != nil {
		return nil, 0, err
	}
	return jobs, max(total-len(jobs), 0), nil
}

// ActiveRemoteJobs returns up to limit jobs not yet ended, oldest first.
func (s *Store) ActiveRemoteJobs(ctx context.Context, limit int) ([]store.RemoteJob, error) {
	limit = max(min(limit, maxRemoteJobRows), 1)
	return s.queryRemoteJobs(ctx, `SELECT `+remoteJobCols+` FROM remote_jobs WHERE state IN ('starting', 'running') ORDER BY created_at, id LIMIT ?`, limit)
}

func (s *Store) queryRemoteJobs(ctx context.Context, q string, args ...any) ([]store.RemoteJob, error) {
	rows, err := s.read.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("%s: list remote jobs: %w", s.name, err)
	}
	defer rows.Close()
	var out []store.RemoteJob
	for rows.Next() {
		j, err := scanRemoteJob(rows)
		if err != nil {
			return nil, fmt.Errorf("%s: list remote jobs: %w", s.name, err)
		}
		out = append(out, j)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("%s: list remote jobs: %w", s.name, err)
	}
	return out, nil
}

// GPUReservations returns the GPUs of a machine held now.
func (s *Store) GPUReservations(ctx context.Context, machineID string) ([]store.GPUReservation, error) {
	rows, err := s.read.QueryContext(ctx, `SELECT machine_id, gpu_index, job_id, created_at FROM remote_gpu_reservations
		WHERE machine_id = ? ORDER BY gpu_index LIMIT ?`, machineID, maxRemoteJobRows)
	if err != nil {
		return nil, fmt.Errorf("%s: gpu reservations: %w", s.name, err)
	}
	defer rows.Close()
	var out []store.GPUReservation
	for rows.Next() {
		var r store.GPUReservation
		var created int64
		if err := rows.Scan(&r.MachineID, &r.GPUIndex, &r.JobID, &created); err != nil {
			return nil, fmt.Errorf("%s: gpu reservations: %w", s.name, err)
		}
		r.CreatedAt = fromMillis(created)
		out = append(out, r)
	}
	return out, rows.Err()
}

func nullInt(p *int) sql.NullInt64 {
	if p == nil {
		return sql.NullInt64{}
	}
	return sql.NullInt64{Int64: int64(*p), Valid: true}
}

func intPtr(n sql.NullInt64) *int {
	if !n.Valid {
		return nil
	}
	v := int(n.Int64)
	return &v
}
