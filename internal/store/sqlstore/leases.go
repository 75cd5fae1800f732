package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/store"
)

var _ store.Leases = (*Store)(nil)

func checkLeaseNames(name, holder string, needHolder bool) error {
	if name == "" || len(name) > store.MaxLeaseName {
		return errcode.New(errcode.InvalidArgument, "a lease needs a name of 1 to %d bytes; got %d", store.MaxLeaseName, len(name))
	}
	if needHolder && (holder == "" || len(holder) > store.MaxLeaseName) {
		return errcode.New(errcode.InvalidArgument, "a lease needs a holder of 1 to %d bytes; got %d", store.MaxLeaseName, len(holder))
	}
	return nil
}

// now reads the database's clock, in unix milliseconds.
func (s *Store) now(ctx context.Context, q interface {
	QueryRowContext(ctx context.Context, q string, args ...any) *Row
}) (int64, error) {
	var now int64
	if err := q.QueryRowContext(ctx, `SELECT `+s.d.NowMillis).Scan(&now); err != nil {
		return 0, fmt.Errorf("read the database's clock: %w", err)
	}
	return now, nil
}

// AcquireLease implements store.Leases.
func (s *Store) AcquireLease(ctx context.Context, name, holder string, ttl time.Duration) (bool, time.Time, error) {
	if err := checkLeaseNames(name, holder, true); err != nil {
		return false, time.Time{}, s.opErr("acquire lease", name, err)
	}
	if ttl < store.MinLeaseTTL || ttl > store.MaxLeaseTTL {
		return false, time.Time{}, s.opErr("acquire lease", name, errcode.New(errcode.InvalidArgument,
			"a lease's ttl must be between %s and %s; got %s", store.MinLeaseTTL, store.MaxLeaseTTL, ttl))
	}
	var held bool
	var expires int64
	err := s.inTx(ctx, func(tx *Tx) error {
		now, err := s.now(ctx, tx)
		if err != nil {
			return err
		}
		var cur string
		var curExpires int64
		err = tx.QueryRowContext(ctx, `SELECT holder, expires_at FROM leases WHERE name = ?`, name).Scan(&cur, &curExpires)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			expires, held = now+ttl.Milliseconds(), true
			if _, err := tx.ExecContext(ctx, `INSERT INTO leases (name, holder, acquired_at, expires_at) VALUES (?, ?, ?, ?)`,
				name, holder, now, expires); err != nil {
				return fmt.Errorf("insert: %w", err)
			}
		case err != nil:
			return fmt.Errorf("read: %w", err)
		case cur == holder:
			expires, held = now+ttl.Milliseconds(), true
			if _, err := tx.ExecContext(ctx, `UPDATE leases SET expires_at = ? WHERE name = ?`, expires, name); err != nil {
				return fmt.Errorf("renew: %w", err)
			}
		case curExpires <= now:
			expires, held = now+ttl.Milliseconds(), true
			if _, err := tx.ExecContext(ctx, `UPDATE leases SET holder = ?, acquired_at = ?, expires_at = ? WHERE name = ?`,
				holder, now, expires, name); err != nil {
				return fmt.Errorf("take over: %w", err)
			}
		default:
			expires = curExpires
		}
		return nil
	})
	if err != nil {
		return false, time.Time{}, s.opErr("acquire lease", name, err)
	}
	return held, fromMillis(expires), nil
}

// ReleaseLease implements store.Leases.
func (s *Store) ReleaseLease(ctx context.Context, name, holder string) (bool, error) {
	if err := checkLeaseNames(name, holder, true); err != nil {
		return false, s.opErr("release lease", name, err)
	}
	var n int64
	err := s.inTx(ctx, func(tx *Tx) error {
		res, err := tx.ExecContext(ctx, `DELETE FROM leases WHERE name = ? AND holder = ?`, name, holder)
		if err != nil {
			return fmt.Errorf("delete: %w", err)
		}
		n, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return false, s.opErr("release lease", name, err)
	}
	return n == 1, nil
}

const leaseColumns = `name, holder, acquired_at, expires_at`

func scanLease(r rowScanner, now int64) (store.Lease, error) {
	var l store.Lease
	var acquired, expires int64
	if err := r.Scan(&l.Name, &l.Holder, &acquired, &expires); err != nil {
		return l, err
	}
	l.AcquiredAt, l.ExpiresAt, l.Live = fromMillis(acquired), fromMillis(expires), expires > now
	return l, nil
}

// GetLease implements store.Leases.
func (s *Store) GetLease(ctx context.Context, name string) (store.Lease, bool, error) {
	if err := checkLeaseNames(name, "", false); err != nil {
		return store.Lease{}, false, s.opErr("get lease", name, err)
	}
	now, err := s.now(ctx, s.read)
	if err != nil {
		return store.Lease{}, false, s.opErr("get lease", name, err)
	}
	l, err := scanLease(s.read.QueryRowContext(ctx, `SELECT `+leaseColumns+` FROM leases WHERE name = ?`, name), now)
	if errors.Is(err, sql.ErrNoRows) {
		return store.Lease{}, false, nil
	}
	if err != nil {
		return store.Lease{}, false, s.opErr("get lease", name, err)
	}
	return l, true, nil
}

// ListLeases implements store.Leases.
func (s *Store) ListLeases(ctx context.Context, prefix string, limit int) ([]store.Lease, error) {
	if limit < 1 || limit > 1000 {
		return nil, s.opErr("list leases", prefix, errcode.New(errcode.InvalidArgument, "limit must be between 1 and 1000; got %d", limit))
	}
	now, err := s.now(ctx, s.read)
	if err != nil {
		return nil, s.opErr("list leases", prefix, err)
	}
	// A range on the primary key, not LIKE: a prefix may hold % or _.
	q := `SELECT ` + leaseColumns + ` FROM leases WHERE name >= ?`
	args := []any{prefix}
	if end, ok := prefixEnd(prefix); ok {
		q += ` AND name < ?`
		args = append(args, end)
	}
	rows, err := s.read.QueryContext(ctx, q+` ORDER BY name LIMIT ?`, append(args, limit)...)
	if err != nil {
		return nil, s.opErr("list leases", prefix, err)
	}
	defer rows.Close()
	out := []store.Lease{}
	for rows.Next() {
		l, err := scanLease(rows, now)
		if err != nil {
			return nil, s.opErr("list leases", prefix, err)
		}
		if strings.HasPrefix(l.Name, prefix) {
			out = append(out, l)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, s.opErr("list leases", prefix, err)
	}
	return out, nil
}

// prefixEnd is the least string greater than every string starting with prefix (false when
// there is none: an empty prefix, or one of 0xff bytes).
func prefixEnd(prefix string) (string, bool) {
	b := []byte(prefix)
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] < 0xff {
			b[i]++
			return string(b[:i+1]), true
		}
	}
	return "", false
}
