package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/agentbox/agentbox/internal/auth"
	"github.com/agentbox/agentbox/internal/errcode"
)

const apiKeyColumns = `id, name, scope, prefix, created_at, expires_at, revoked_at, last_used_at`

func scanAPIKey(r rowScanner, extra ...any) (auth.Key, error) {
	var k auth.Key
	var created int64
	var expires, revoked, used sql.NullInt64
	dest := append([]any{&k.ID, &k.Name, &k.Scope, &k.Prefix, &created, &expires, &revoked, &used}, extra...)
	if err := r.Scan(dest...); err != nil {
		return k, err
	}
	k.CreatedAt = fromMillis(created)
	opt := func(n sql.NullInt64) *time.Time {
		if !n.Valid {
			return nil
		}
		t := fromMillis(n.Int64)
		return &t
	}
	k.ExpiresAt, k.RevokedAt, k.LastUsedAt = opt(expires), opt(revoked), opt(used)
	return k, nil
}

func optMillis(t *time.Time) any {
	if t == nil {
		return nil
	}
	return millis(*t)
}

// CreateAPIKey implements auth.Store.
func (s *Store) CreateAPIKey(ctx context.Context, k auth.Key, hash []byte, max int) error {
	return s.inTx(ctx, func(tx *Tx) error {
		var n, taken int
		if err := tx.QueryRowContext(ctx, `SELECT COUNT(*), COALESCE(SUM(CASE WHEN name = ? AND revoked_at IS NULL THEN 1 ELSE 0 END), 0) FROM api_keys`, k.Name).Scan(&n, &taken); err != nil {
			return fmt.Errorf("count api keys: %w", err)
		}
		if taken > 0 {
			return errcode.New(errcode.Conflict, "an API key named %q exists; revoke it first or choose another name", k.Name)
		}
		if n >= max {
			return errcode.New(errcode.InvalidArgument, "this server holds %d API keys, the most it may; revoke some", n)
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO api_keys (`+apiKeyColumns+`, hash) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			k.ID, k.Name, k.Scope, k.Prefix, millis(k.CreatedAt), optMillis(k.ExpiresAt), optMillis(k.RevokedAt), optMillis(k.LastUsedAt), hash)
		if err != nil {
			return fmt.Errorf("insert api key: %w", err)
		}
		return nil
	})
}

// APIKeyByHash implements auth.Store.
func (s *Store) APIKeyByHash(ctx context.Context, hash []byte) (auth.Key, []byte, bool, error) {
	var stored []byte
	k, err := scanAPIKey(s.read.QueryRowContext(ctx, `SELECT `+apiKeyColumns+`, hash FROM api_keys WHERE hash = ?`, hash), &stored)
	if errors.Is(err, sql.ErrNoRows) {
		return auth.Key{}, nil, false, nil
	}
	if err != nil {
		return auth.Key{}, nil, false, fmt.Errorf("read api key: %w", err)
	}
	return k, stored, true, nil
}

// ListAPIKeys implements auth.Store.
func (s *Store) ListAPIKeys(ctx context.Context, limit int) ([]auth.Key, error) {
	if limit <= 0 {
		return nil, errcode.New(errcode.InvalidArgument, "limit must be positive; got %d", limit)
	}
	rows, err := s.read.QueryContext(ctx, `SELECT `+apiKeyColumns+` FROM api_keys ORDER BY created_at DESC, id DESC LIMIT ?`, limit)
	if err != nil {
		return nil, fmt.Errorf("list api keys: %w", err)
	}
	defer rows.Close()
	out := []auth.Key{}
	for rows.Next() {
		k, err := scanAPIKey(rows)
		if err != nil {
			return nil, fmt.Errorf("list api keys: %w", err)
		}
		out = append(out, k)
	}
	return out, rows.Err()
}

// RevokeAPIKey implements auth.Store.
func (s *Store) RevokeAPIKey(ctx context.Context, ref string, at time.Time) (auth.Key, error) {
	var k auth.Key
	err := s.inTx(ctx, func(tx *Tx) error {
		var err error
		k, err = scanAPIKey(tx.QueryRowContext(ctx, `SELECT `+apiKeyColumns+` FROM api_keys
			WHERE id = ? OR (name = ? AND revoked_at IS NULL) ORDER BY id = ? DESC LIMIT 1`, ref, ref, ref))
		if errors.Is(err, sql.ErrNoRows) {
			return errcode.New(errcode.InvalidArgument, "no API key with id or name %q; `agentbox token ls` lists them", ref)
		}
		if err != nil {
			return fmt.Errorf("read api key: %w", err)
		}
		if k.RevokedAt != nil {
			return nil // already revoked: the same answer
		}
		if _, err := tx.ExecContext(ctx, `UPDATE api_keys SET revoked_at = ? WHERE id = ?`, millis(at), k.ID); err != nil {
			return fmt.Errorf("revoke api key: %w", err)
		}
		t := fromMillis(millis(at))
		k.RevokedAt = &t
		return nil
	})
	return k, err
}

// TouchAPIKey implements auth.Store.
func (s *Store) TouchAPIKey(ctx context.Context, id string, at time.Time) error {
	_, err := s.write.ExecContext(ctx, `UPDATE api_keys SET last_used_at = ? WHERE id = ?`, millis(at), id)
	if err != nil {
		return fmt.Errorf("touch api key: %w", err)
	}
	return nil
}
