package sqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/agentbox/agentbox/internal/egress"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// encodeNetwork returns the network and secrets columns of sb: ” for none.
func encodeNetwork(sb sandbox.Sandbox) (network, secrets string, err error) {
	if sb.Network.Policy != nil {
		b, err := json.Marshal(sb.Network)
		if err != nil {
			return "", "", fmt.Errorf("encode network: %w", err)
		}
		network = string(b)
	}
	if len(sb.Secrets) > 0 {
		b, err := json.Marshal(sb.Secrets)
		if err != nil {
			return "", "", fmt.Errorf("encode secrets: %w", err)
		}
		secrets = string(b)
	}
	return network, secrets, nil
}

func decodeNetwork(sb *sandbox.Sandbox, network, secrets string) error {
	if network != "" {
		if err := json.Unmarshal([]byte(network), &sb.Network); err != nil {
			return err
		}
	}
	if secrets != "" {
		if err := json.Unmarshal([]byte(secrets), &sb.Secrets); err != nil {
			return err
		}
	}
	return nil
}

const (
	connectionColumns = `seq, sandbox_id, at, kind, host, port, addr, decision, rule, reason, bytes_out, bytes_in, duration_ms, intercepted`
	secretCallColumns = `seq, sandbox_id, at, secret, host, method, path, replaced, reason, scrubbed`
)

// AppendNetRecords inserts conns, calls and evs (each only if its sandbox's record exists) in
// one transaction, then trims each sandbox it touched to its newest keep connections and
// newest keep secret calls.
func (s *Store) AppendNetRecords(ctx context.Context, conns []egress.Connection, calls []egress.SecretCall, evs []sandbox.Event, keep int) error {
	if keep <= 0 {
		return errcode.New(errcode.InvalidArgument, "keep must be positive; got %d", keep)
	}
	touched := map[string]bool{}
	err := s.inTx(ctx, func(tx *Tx) error {
		exists := map[string]bool{}
		has := func(id string) (bool, error) {
			if v, ok := exists[id]; ok {
				return v, nil
			}
			var one int
			err := tx.QueryRowContext(ctx, `SELECT 1 FROM sandboxes WHERE id = ?`, id).Scan(&one)
			if errors.Is(err, sql.ErrNoRows) {
				exists[id] = false
				return false, nil
			}
			if err != nil {
				return false, fmt.Errorf("look up sandbox %s: %w", id, err)
			}
			exists[id] = true
			return true, nil
		}
		for _, c := range conns {
			if ok, err := has(c.SandboxID); err != nil || !ok {
				if err != nil {
					return err
				}
				continue
			}
			_, err := tx.ExecContext(ctx, `INSERT INTO connections (sandbox_id, at, kind, host, port, addr, decision, rule, reason,
				bytes_out, bytes_in, duration_ms, intercepted) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
				c.SandboxID, millis(c.Time), string(c.Kind), c.Host, c.Port, c.Addr, c.Decision, c.Rule, c.Reason,
				c.BytesOut, c.BytesIn, c.DurationMS, c.Intercepted)
			if err != nil {
				return fmt.Errorf("insert connection: %w", err)
			}
			touched[c.SandboxID] = true
		}
		for _, c := range calls {
			if ok, err := has(c.SandboxID); err != nil || !ok {
				if err != nil {
					return err
				}
				continue
			}
			_, err := tx.ExecContext(ctx, `INSERT INTO secret_calls (sandbox_id, at, secret, host, method, path, replaced, reason, scrubbed)
				VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`,
				c.SandboxID, millis(c.Time), c.Secret, c.Host, c.Method, c.Path, c.Replaced, c.Reason, c.Scrubbed)
			if err != nil {
				return fmt.Errorf("insert secret call: %w", err)
			}
			touched[c.SandboxID] = true
		}
		for _, ev := range evs {
			if ok, err := has(ev.SandboxID); err != nil || !ok {
				if err != nil {
					return err
				}
				continue
			}
			if err := appendEvent(ctx, tx, ev.SandboxID, ev); err != nil {
				return err
			}
		}
		ids := make([]string, 0, len(touched))
		for id := range touched {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		for _, id := range ids {
			for _, table := range []string{"connections", "secret_calls"} {
				_, err := tx.ExecContext(ctx, `DELETE FROM `+table+` WHERE sandbox_id = ? AND seq <=
					(SELECT seq FROM `+table+` WHERE sandbox_id = ? ORDER BY seq DESC LIMIT 1 OFFSET ?)`, id, id, keep)
				if err != nil {
					return fmt.Errorf("trim %s of %s: %w", table, id, err)
				}
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("%s: append network records: %w", s.name, err)
	}
	return nil
}

// pageRecords selects a page of table for sandboxID: seq > after ascending, or (after 0) the
// newest limit, ascending, and how many older ones that left out.
func (s *Store) pageRecords(ctx context.Context, table, columns, sandboxID string, after int64, limit int,
	scan func(rowScanner) (int64, error)) (omitted int64, err error) {
	if limit <= 0 || limit > defaultLimit {
		return 0, errcode.New(errcode.InvalidArgument, "limit must be between 1 and %d; got %d", defaultLimit, limit)
	}
	var rows *sql.Rows
	if after > 0 {
		rows, err = s.read.QueryContext(ctx, `SELECT `+columns+` FROM `+table+` WHERE sandbox_id = ? AND seq > ? ORDER BY seq LIMIT ?`,
			sandboxID, after, limit)
	} else {
		rows, err = s.read.QueryContext(ctx, `SELECT `+columns+` FROM (SELECT `+columns+` FROM `+table+`
			WHERE sandbox_id = ? ORDER BY seq DESC LIMIT ?) AS newest ORDER BY seq`, sandboxID, limit)
	}
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	first := int64(-1)
	for rows.Next() {
		seq, err := scan(rows)
		if err != nil {
			return 0, err
		}
		if first < 0 {
			first = seq
		}
	}
	if err := rows.Err(); err != nil {
		return 0, err
	}
	if after > 0 || first < 0 {
		return 0, nil
	}
	err = s.read.QueryRowContext(ctx, `SELECT COUNT(*) FROM `+table+` WHERE sandbox_id = ? AND seq < ?`, sandboxID, first).Scan(&omitted)
	return omitted, err
}

// ListConnections returns a page of sandboxID's connection records (sandbox.NetStore).
func (s *Store) ListConnections(ctx context.Context, sandboxID string, after int64, limit int) ([]egress.Connection, int64, error) {
	var out []egress.Connection
	omitted, err := s.pageRecords(ctx, "connections", connectionColumns, sandboxID, after, limit, func(r rowScanner) (int64, error) {
		var c egress.Connection
		var at int64
		var kind string
		err := r.Scan(&c.Seq, &c.SandboxID, &at, &kind, &c.Host, &c.Port, &c.Addr, &c.Decision, &c.Rule, &c.Reason,
			&c.BytesOut, &c.BytesIn, &c.DurationMS, &c.Intercepted)
		c.Time, c.Kind = fromMillis(at), egress.Kind(kind)
		out = append(out, c)
		return c.Seq, err
	})
	if err != nil {
		return nil, 0, s.opErr("list connections", sandboxID, err)
	}
	return out, omitted, nil
}

// ListSecretCalls returns a page of sandboxID's secret-call records (sandbox.NetStore).
func (s *Store) ListSecretCalls(ctx context.Context, sandboxID string, after int64, limit int) ([]egress.SecretCall, int64, error) {
	var out []egress.SecretCall
	omitted, err := s.pageRecords(ctx, "secret_calls", secretCallColumns, sandboxID, after, limit, func(r rowScanner) (int64, error) {
		var c egress.SecretCall
		var at int64
		err := r.Scan(&c.Seq, &c.SandboxID, &at, &c.Secret, &c.Host, &c.Method, &c.Path, &c.Replaced, &c.Reason, &c.Scrubbed)
		c.Time = fromMillis(at)
		out = append(out, c)
		return c.Seq, err
	})
	if err != nil {
		return nil, 0, s.opErr("list secret calls", sandboxID, err)
	}
	return out, omitted, nil
}

func notExposed(sandboxID string, port int) error {
	return errcode.New(errcode.SandboxNotFound, "port %d of %s is not exposed; expose it with sandbox_expose", port, sandboxID).With("port", port)
}

// PutExposure records e, replacing the exposure of the same port (sandbox.NetStore).
func (s *Store) PutExposure(ctx context.Context, e sandbox.Exposure) error {
	err := s.inTx(ctx, func(tx *Tx) error {
		var one int
		err := tx.QueryRowContext(ctx, `SELECT 1 FROM sandboxes WHERE id = ?`, e.SandboxID).Scan(&one)
		if errors.Is(err, sql.ErrNoRows) {
			return notFound(e.SandboxID)
		}
		if err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, `INSERT INTO exposures (sandbox_id, port, public, token_sha256, created_at) VALUES (?, ?, ?, ?, ?)
			ON CONFLICT (sandbox_id, port) DO UPDATE SET public = excluded.public, token_sha256 = excluded.token_sha256,
			created_at = excluded.created_at`, e.SandboxID, e.Port, e.Public, e.TokenHash, millis(e.CreatedAt))
		return err
	})
	if err != nil {
		return s.opErr("put exposure", e.SandboxID, err)
	}
	return nil
}

func scanExposure(r rowScanner) (sandbox.Exposure, error) {
	var e sandbox.Exposure
	var created int64
	err := r.Scan(&e.SandboxID, &e.Port, &e.Public, &e.TokenHash, &created)
	e.CreatedAt = fromMillis(created)
	return e, err
}

// GetExposure returns the exposure of port, or SANDBOX_NOT_FOUND naming it (sandbox.NetStore).
func (s *Store) GetExposure(ctx context.Context, sandboxID string, port int) (sandbox.Exposure, error) {
	e, err := scanExposure(s.read.QueryRowContext(ctx, `SELECT sandbox_id, port, public, token_sha256, created_at
		FROM exposures WHERE sandbox_id = ? AND port = ?`, sandboxID, port))
	if errors.Is(err, sql.ErrNoRows) {
		return sandbox.Exposure{}, notExposed(sandboxID, port)
	}
	if err != nil {
		return sandbox.Exposure{}, s.opErr("get exposure", sandboxID, err)
	}
	return e, nil
}

// ListExposures returns sandboxID's exposures by port (sandbox.NetStore).
func (s *Store) ListExposures(ctx context.Context, sandboxID string) ([]sandbox.Exposure, error) {
	rows, err := s.read.QueryContext(ctx, `SELECT sandbox_id, port, public, token_sha256, created_at
		FROM exposures WHERE sandbox_id = ? ORDER BY port`, sandboxID)
	if err != nil {
		return nil, s.opErr("list exposures", sandboxID, err)
	}
	defer rows.Close()
	var out []sandbox.Exposure
	for rows.Next() {
		e, err := scanExposure(rows)
		if err != nil {
			return nil, s.opErr("list exposures", sandboxID, err)
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, s.opErr("list exposures", sandboxID, err)
	}
	return out, nil
}

// DeleteExposure removes the exposure of port, or is SANDBOX_NOT_FOUND naming it
// (sandbox.NetStore).
func (s *Store) DeleteExposure(ctx context.Context, sandboxID string, port int) error {
	var n int64
	err := s.inTx(ctx, func(tx *Tx) error {
		res, err := tx.ExecContext(ctx, `DELETE FROM exposures WHERE sandbox_id = ? AND port = ?`, sandboxID, port)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return s.opErr("delete exposure", sandboxID, err)
	}
	if n == 0 {
		return notExposed(sandboxID, port)
	}
	return nil
}

// DeleteExposures removes every exposure of sandboxID (sandbox.NetStore).
func (s *Store) DeleteExposures(ctx context.Context, sandboxID string) error {
	err := s.inTx(ctx, func(tx *Tx) error {
		_, err := tx.ExecContext(ctx, `DELETE FROM exposures WHERE sandbox_id = ?`, sandboxID)
		return err
	})
	if err != nil {
		return s.opErr("delete exposures", sandboxID, err)
	}
	return nil
}
