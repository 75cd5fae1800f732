package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// Warm pools (migration 0013_pools.sql).

var _ sandbox.PoolStore = (*Store)(nil)

// maxPoolRows bounds ListPools whatever the table holds (the service keeps at most
// sandbox.MaxPools).
const maxPoolRows = 1000

// PutPool inserts p or replaces the pool of that name, keeping its created_at.
func (s *Store) PutPool(ctx context.Context, p sandbox.Pool) error {
	if p.Name == "" {
		return errcode.New(errcode.InvalidArgument, "a pool needs a name")
	}
	err := s.inTx(ctx, func(tx *Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO pools (name, image, runtime, cpu, memory_mb, disk_mb, network, size, created_at, updated_at)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
			ON CONFLICT (name) DO UPDATE SET image = excluded.image, runtime = excluded.runtime, cpu = excluded.cpu,
				memory_mb = excluded.memory_mb, disk_mb = excluded.disk_mb, network = excluded.network,
				size = excluded.size, updated_at = excluded.updated_at`,
			p.Name, p.Image, p.Runtime, p.CPU, p.MemoryMB, p.DiskMB, p.Network, p.Size, millis(p.CreatedAt), millis(p.UpdatedAt))
		return err
	})
	if err != nil {
		return fmt.Errorf("%s: put pool %s: %w", s.name, p.Name, err)
	}
	return nil
}

// ListPools returns every pool by name.
func (s *Store) ListPools(ctx context.Context) ([]sandbox.Pool, error) {
	rows, err := s.read.QueryContext(ctx, `SELECT name, image, runtime, cpu, memory_mb, disk_mb, network, size, created_at, updated_at
		FROM pools ORDER BY name LIMIT ?`, maxPoolRows)
	if err != nil {
		return nil, fmt.Errorf("%s: list pools: %w", s.name, err)
	}
	defer rows.Close()
	var out []sandbox.Pool
	for rows.Next() {
		var p sandbox.Pool
		var created, updated int64
		if err := rows.Scan(&p.Name, &p.Image, &p.Runtime, &p.CPU, &p.MemoryMB, &p.DiskMB, &p.Network, &p.Size, &created, &updated); err != nil {
			return nil, fmt.Errorf("%s: list pools: %w", s.name, err)
		}
		p.CreatedAt, p.UpdatedAt = fromMillis(created), fromMillis(updated)
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("%s: list pools: %w", s.name, err)
	}
	return out, nil
}

// DeletePool removes the pool's configuration; its sandboxes stay until the service retires them.
func (s *Store) DeletePool(ctx context.Context, name string) error {
	var n int64
	err := s.inTx(ctx, func(tx *Tx) error {
		res, err := tx.ExecContext(ctx, `DELETE FROM pools WHERE name = ?`, name)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return fmt.Errorf("%s: delete pool %s: %w", s.name, name, err)
	}
	if n == 0 {
		return errcode.New(errcode.PoolNotFound, "pool %q not found; pool_list shows the pools", name)
	}
	return nil
}

// ClaimPooled hands the oldest ready sandbox of c.Pool to a create, in one write
// transaction (under the write lock: see inTx) (the write lock serialises claimants of every process); the update is also
// conditional on the sandbox's state, pool and version, so a driver without that lock stays
// correct.
func (s *Store) ClaimPooled(ctx context.Context, c sandbox.PoolClaim) (claimed, prior sandbox.Sandbox, err error) {
	env, err := encodeMap(c.Env)
	if err != nil {
		return claimed, prior, fmt.Errorf("%s: claim from pool %s: encode env: %w", s.name, c.Pool, err)
	}
	labels, err := encodeMap(c.Labels)
	if err != nil {
		return claimed, prior, fmt.Errorf("%s: claim from pool %s: encode labels: %w", s.name, c.Pool, err)
	}
	err = s.inTx(ctx, func(tx *Tx) error {
		if c.IdempotencyKey != "" {
			row := tx.QueryRowContext(ctx, `SELECT `+sandboxColumns+` FROM sandboxes WHERE owner = ? AND idempotency_key = ?`,
				c.Owner, c.IdempotencyKey)
			p, err := scanSandbox(row)
			if err == nil {
				prior = p
				return nil
			}
			if !errors.Is(err, sql.ErrNoRows) {
				return fmt.Errorf("look up idempotency key: %w", err)
			}
		}
		row := tx.QueryRowContext(ctx, `SELECT `+sandboxColumns+` FROM sandboxes
			WHERE pool = ? AND node = ? AND state = ? ORDER BY created_at, id LIMIT 1`, c.Pool, c.Node, string(sandbox.StateRunning))
		sb, err := scanSandbox(row)
		if errors.Is(err, sql.ErrNoRows) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("find a ready sandbox: %w", err)
		}
		sb.Pool, sb.FromPool = "", true
		sb.Owner, sb.IdempotencyKey, sb.Env, sb.Labels = c.Owner, c.IdempotencyKey, c.Env, c.Labels
		sb.Principal = c.Principal
		sb.ExpiresAt, sb.UpdatedAt = c.ExpiresAt, c.At
		if c.Network.Policy != nil && sb.Network.Policy != nil { // an egress sandbox takes the claimant's policy and secrets
			sb.Network, sb.Secrets = c.Network, c.Secrets
		}
		network, secrets, err := encodeNetwork(sb)
		if err != nil {
			return fmt.Errorf("claim %s: %w", sb.ID, err)
		}
		sb.Version++
		res, err := tx.ExecContext(ctx, `UPDATE sandboxes SET pool = '', from_pool = TRUE, owner = ?, principal = ?, idempotency_key = ?,
			env = ?, labels = ?, expires_at = ?, updated_at = ?, version = ?, network = ?, secrets = ?
			WHERE id = ? AND pool = ? AND state = ? AND version = ?`,
			sb.Owner, sb.Principal, sb.IdempotencyKey, env, labels, millis(sb.ExpiresAt), millis(sb.UpdatedAt), sb.Version, network, secrets,
			sb.ID, c.Pool, string(sandbox.StateRunning), sb.Version-1)
		if isUniqueViolation(err) {
			return errcode.Wrap(errcode.Conflict, err, "idempotency key %q was already used by this owner", c.IdempotencyKey)
		}
		if err != nil {
			return fmt.Errorf("claim %s: %w", sb.ID, err)
		}
		if err := versioned(ctx, tx, res, "sandbox "+sb.ID, sb.Version-1, func() error { return notFound(sb.ID) },
			`SELECT version FROM sandboxes WHERE id = ?`, sb.ID); err != nil {
			return err
		}
		if err := insertLabels(ctx, tx, sb.ID, sb.Labels); err != nil {
			return err
		}
		ev := sandbox.Event{SandboxID: sb.ID, Type: "claim", From: sb.State, To: sb.State, At: c.At,
			Reason: "claimed from pool " + c.Pool}
		if err := appendEvent(ctx, tx, sb.ID, ev); err != nil {
			return err
		}
		claimed = sb
		return nil
	})
	if err != nil {
		return sandbox.Sandbox{}, sandbox.Sandbox{}, fmt.Errorf("%s: claim from pool %s: %w", s.name, c.Pool, err)
	}
	return claimed, prior, nil
}

// CountPooled counts the creating and running sandboxes of node that each pool holds.
func (s *Store) CountPooled(ctx context.Context, node string) (map[string]sandbox.PoolCount, error) {
	rows, err := s.read.QueryContext(ctx, `SELECT pool, state, COUNT(*) FROM sandboxes
		WHERE pool <> '' AND node = ? AND state IN (?, ?) GROUP BY pool, state LIMIT ?`,
		node, string(sandbox.StateCreating), string(sandbox.StateRunning), 2*maxPoolRows)
	if err != nil {
		return nil, fmt.Errorf("%s: count pooled sandboxes: %w", s.name, err)
	}
	defer rows.Close()
	out := map[string]sandbox.PoolCount{}
	for rows.Next() {
		var pool, state string
		var n int
		if err := rows.Scan(&pool, &state, &n); err != nil {
			return nil, fmt.Errorf("%s: count pooled sandboxes: %w", s.name, err)
		}
		c := out[pool]
		if state == string(sandbox.StateRunning) {
			c.Ready = n
		} else {
			c.Starting = n
		}
		out[pool] = c
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("%s: count pooled sandboxes: %w", s.name, err)
	}
	return out, nil
}
