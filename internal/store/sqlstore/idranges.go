package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// AllocateIDRange records r as held by r.SandboxID. The write transaction holds the write lock (inTx), so
// the overlap check and the insert see no concurrent writer: two sandboxes never get
// overlapping ranges, even from two processes on one database.
func (s *Store) AllocateIDRange(ctx context.Context, r sandbox.IDRange) error {
	if err := sandbox.ValidateIDRange(r); err != nil {
		return s.opErr("allocate id range", r.SandboxID, err)
	}
	err := s.inTx(ctx, func(tx *Tx) error {
		var one int
		err := tx.QueryRowContext(ctx, `SELECT 1 FROM sandboxes WHERE id = ?`, r.SandboxID).Scan(&one)
		if errors.Is(err, sql.ErrNoRows) {
			return notFound(r.SandboxID)
		}
		if err != nil {
			return fmt.Errorf("read sandbox: %w", err)
		}
		var holder string
		var base, count int64
		err = tx.QueryRowContext(ctx, `SELECT sandbox_id, base, count FROM id_ranges
			WHERE sandbox_id = ? OR (base < ? AND base + count > ?) ORDER BY base LIMIT 1`,
			r.SandboxID, r.End(), r.Base).Scan(&holder, &base, &count)
		switch {
		case err == nil && holder == r.SandboxID:
			return errcode.New(errcode.Conflict, "sandbox %s already holds host ids [%d, %d)", r.SandboxID, base, base+count)
		case err == nil:
			return errcode.New(errcode.Conflict, "host ids [%d, %d) overlap [%d, %d), held by sandbox %s", r.Base, r.End(), base, base+count, holder).
				With("holder", holder)
		case !errors.Is(err, sql.ErrNoRows):
			return fmt.Errorf("check overlap: %w", err)
		}
		at := r.AllocatedAt
		if _, err := tx.ExecContext(ctx, `INSERT INTO id_ranges (sandbox_id, base, count, allocated_at) VALUES (?, ?, ?, ?)`,
			r.SandboxID, r.Base, r.Count, millis(at)); err != nil {
			return fmt.Errorf("insert: %w", err)
		}
		return nil
	})
	if err != nil {
		return s.opErr("allocate id range", r.SandboxID, err)
	}
	return nil
}

// ReleaseIDRange deletes the range sandboxID holds, if any.
func (s *Store) ReleaseIDRange(ctx context.Context, sandboxID string) error {
	err := s.inTx(ctx, func(tx *Tx) error {
		if _, err := tx.ExecContext(ctx, `DELETE FROM id_ranges WHERE sandbox_id = ?`, sandboxID); err != nil {
			return fmt.Errorf("delete: %w", err)
		}
		return nil
	})
	if err != nil {
		return s.opErr("release id range", sandboxID, err)
	}
	return nil
}

// ListIDRanges returns every held range by base. There are at most a few per live sandbox, so
// the list is not paged.
func (s *Store) ListIDRanges(ctx context.Context) ([]sandbox.IDRange, error) {
	rows, err := s.read.QueryContext(ctx, `SELECT sandbox_id, base, count, allocated_at FROM id_ranges ORDER BY base`)
	if err != nil {
		return nil, fmt.Errorf("%s: list id ranges: %w", s.name, err)
	}
	defer rows.Close()
	var out []sandbox.IDRange
	for rows.Next() {
		var r sandbox.IDRange
		var at int64
		if err := rows.Scan(&r.SandboxID, &r.Base, &r.Count, &at); err != nil {
			return nil, fmt.Errorf("%s: list id ranges: %w", s.name, err)
		}
		r.AllocatedAt = fromMillis(at)
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("%s: list id ranges: %w", s.name, err)
	}
	return out, nil
}
