package sqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/gpu"
	"github.com/agentbox/agentbox/internal/store"
)

const joinTokenColumns = `id, prefix, created_at, expires_at, uses, uses_left, revoked_at`

func scanJoinToken(r rowScanner) (store.JoinToken, error) {
	var t store.JoinToken
	var created, expires int64
	var revoked sql.NullInt64
	if err := r.Scan(&t.ID, &t.Prefix, &created, &expires, &t.Uses, &t.UsesLeft, &revoked); err != nil {
		return t, err
	}
	t.CreatedAt, t.ExpiresAt = fromMillis(created), fromMillis(expires)
	if revoked.Valid {
		at := fromMillis(revoked.Int64)
		t.RevokedAt = &at
	}
	return t, nil
}

// CreateJoinToken implements store.MachineStore.
func (s *Store) CreateJoinToken(ctx context.Context, t store.JoinToken, hash []byte, max int) error {
	return s.inTx(ctx, func(tx *Tx) error {
		var n int
		if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM machine_join_tokens WHERE revoked_at IS NULL AND expires_at > ? AND uses_left > 0`,
			millis(t.CreatedAt)).Scan(&n); err != nil {
			return fmt.Errorf("count join tokens: %w", err)
		}
		if n >= max {
			return errcode.New(errcode.InvalidArgument, "this server holds %d usable join tokens, the most it may; revoke some (`agentbox machine token revoke`)", n)
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO machine_join_tokens (`+joinTokenColumns+`, hash) VALUES (?, ?, ?, ?, ?, ?, ?, ?)`,
			t.ID, t.Prefix, millis(t.CreatedAt), millis(t.ExpiresAt), t.Uses, t.UsesLeft, optMillis(t.RevokedAt), hash)
		if err != nil {
			return fmt.Errorf("insert join token: %w", err)
		}
		return nil
	})
}

// ListJoinTokens implements store.MachineStore.
func (s *Store) ListJoinTokens(ctx context.Context, limit int) ([]store.JoinToken, error) {
	if limit <= 0 {
		return nil, errcode.New(errcode.InvalidArgument, "limit must be positive; got %d", limit)
	}
	rows, err := s.read.QueryContext(ctx, `SELECT `+joinTokenColumns+` FROM machine_join_tokens ORDER BY created_at DESC, id DESC LIMIT ?`, limit)
	if err != nil {
		return nil, fmt.Errorf("list join tokens: %w", err)
	}
	defer rows.Close()
	out := []store.JoinToken{}
	for rows.Next() {
		t, err := scanJoinToken(rows)
		if err != nil {
			return nil, fmt.Errorf("list join tokens: %w", err)
		}
		out = append(out, t)
	}
	return out, rows.Err()
}

// RevokeJoinToken implements store.MachineStore.
func (s *Store) RevokeJoinToken(ctx context.Context, ref string, at time.Time) (store.JoinToken, error) {
	var t store.JoinToken
	err := s.inTx(ctx, func(tx *Tx) error {
		var err error
		t, err = scanJoinToken(tx.QueryRowContext(ctx, `SELECT `+joinTokenColumns+` FROM machine_join_tokens
			WHERE id = ? OR prefix = ? ORDER BY id = ? DESC LIMIT 1`, ref, ref, ref))
		if errors.Is(err, sql.ErrNoRows) {
			return errcode.New(errcode.InvalidArgument, "no join token with id or prefix %q; `agentbox machine token ls` lists them", ref)
		}
		if err != nil {
			return fmt.Errorf("read join token: %w", err)
		}
		if t.RevokedAt != nil {
			return nil
		}
		if _, err := tx.ExecContext(ctx, `UPDATE machine_join_tokens SET revoked_at = ? WHERE id = ?`, millis(at), t.ID); err != nil {
			return fmt.Errorf("revoke join token: %w", err)
		}
		r := fromMillis(millis(at))
		t.RevokedAt = &r
		return nil
	})
	return t, err
}

// EnrollMachine implements store.MachineStore.
func (s *Store) EnrollMachine(ctx context.Context, tokenHash []byte, m store.Machine, max int) (store.Machine, error) {
	err := s.inTx(ctx, func(tx *Tx) error {
		var id string
		var expires, usesLeft int64
		var revoked sql.NullInt64
		err := tx.QueryRowContext(ctx, `SELECT id, expires_at, uses_left, revoked_at FROM machine_join_tokens WHERE hash = ?`, tokenHash).
			Scan(&id, &expires, &usesLeft, &revoked)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			return errcode.New(errcode.AuthFailed, "unknown join token: create one on the server with `agentbox machine token create`")
		case err != nil:
			return fmt.Errorf("read join token: %w", err)
		case revoked.Valid:
			return errcode.New(errcode.AuthFailed, "join token %s was revoked; create a new one with `agentbox machine token create`", id)
		case expires <= millis(m.CreatedAt):
			return errcode.New(errcode.AuthFailed, "join token %s expired at %s; create a new one with `agentbox machine token create`", id, fromMillis(expires).Format(time.RFC3339))
		case usesLeft <= 0:
			return errcode.New(errcode.AuthFailed, "join token %s is used up; create a new one with `agentbox machine token create --uses N`", id)
		}
		if err := nameFree(ctx, tx, m.Name, ""); err != nil {
			return err
		}
		var n int
		if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM machines WHERE removed_at IS NULL`).Scan(&n); err != nil {
			return fmt.Errorf("count machines: %w", err)
		}
		if n >= max {
			return errcode.New(errcode.InvalidArgument, "this server holds %d machines, the most it may; remove some (`agentbox machine rm`)", n)
		}
		res, err := tx.ExecContext(ctx, `UPDATE machine_join_tokens SET uses_left = uses_left - 1 WHERE id = ? AND uses_left > 0`, id)
		if err != nil {
			return fmt.Errorf("spend join token: %w", err)
		}
		if k, _ := res.RowsAffected(); k != 1 {
			return errcode.New(errcode.AuthFailed, "join token %s is used up", id)
		}
		gpus, err := json.Marshal(nonNilGPUs(m.GPUs))
		if err != nil {
			return fmt.Errorf("encode gpus: %w", err)
		}
		_, err = tx.ExecContext(ctx, `INSERT INTO machines (id, name, public_key, platform, arch, agent_version, gpus, last_seen, created_at, removed_at, token_id)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, ?)`,
			m.ID, m.Name, m.PublicKey, m.Platform, m.Arch, m.AgentVersion, string(gpus), optMillis(m.LastSeen), millis(m.CreatedAt), id)
		if err != nil {
			return fmt.Errorf("insert machine: %w", err)
		}
		return nil
	})
	if err != nil {
		return store.Machine{}, err
	}
	return s.MachineByID(ctx, m.ID)
}

// nameFree reports CONFLICT when name is a live machine's name or alias (other than machine
// self's own).
func nameFree(ctx context.Context, tx *Tx, name, self string) error {
	var owner string
	err := tx.QueryRowContext(ctx, `SELECT id FROM machines WHERE name = ? AND removed_at IS NULL
		UNION ALL SELECT machine_id FROM machine_aliases WHERE alias = ? LIMIT 1`, name, name).Scan(&owner)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return nil
	case err != nil:
		return fmt.Errorf("check machine name: %w", err)
	case owner == self:
		return nil
	}
	return errcode.New(errcode.Conflict, "machine %s already has the name or alias %q; choose another (or remove it with `agentbox machine rm`)", owner, name).With("machine_id", owner)
}

func nonNilGPUs(g []gpu.GPU) []gpu.GPU {
	if g == nil {
		return []gpu.GPU{}
	}
	return g
}

const machineColumns = `id, name, public_key, platform, arch, agent_version, gpus, last_seen, created_at, removed_at`

type querier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *Row
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

func scanMachine(r rowScanner) (store.Machine, error) {
	var m store.Machine
	var gpus string
	var created int64
	var seen, removed sql.NullInt64
	if err := r.Scan(&m.ID, &m.Name, &m.PublicKey, &m.Platform, &m.Arch, &m.AgentVersion, &gpus, &seen, &created, &removed); err != nil {
		return m, err
	}
	if err := json.Unmarshal([]byte(gpus), &m.GPUs); err != nil {
		return m, fmt.Errorf("machine %s: gpus: %w", m.ID, err)
	}
	m.GPUs = nonNilGPUs(m.GPUs)
	m.CreatedAt = fromMillis(created)
	if seen.Valid {
		t := fromMillis(seen.Int64)
		m.LastSeen = &t
	}
	if removed.Valid {
		t := fromMillis(removed.Int64)
		m.RemovedAt = &t
	}
	m.Aliases = []string{}
	return m, nil
}

// withAliases fills ms' aliases (sorted).
func withAliases(ctx context.Context, q querier, ms []store.Machine) error {
	if len(ms) == 0 {
		return nil
	}
	idx := make(map[string]int, len(ms))
	for i, m := range ms {
		idx[m.ID] = i
	}
	query := `SELECT machine_id, alias FROM machine_aliases ORDER BY alias`
	args := []any{}
	if len(ms) == 1 {
		query = `SELECT machine_id, alias FROM machine_aliases WHERE machine_id = ? ORDER BY alias`
		args = append(args, ms[0].ID)
	}
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return fmt.Errorf("read machine aliases: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var id, alias string
		if err := rows.Scan(&id, &alias); err != nil {
			return fmt.Errorf("read machine aliases: %w", err)
		}
		if i, ok := idx[id]; ok {
			ms[i].Aliases = append(ms[i].Aliases, alias)
		}
	}
	return rows.Err()
}

func machineNotFound(ref string) error {
	return errcode.New(errcode.MachineNotFound, "no joined machine with id, name or alias %q; `agentbox machine ls` (MCP machine_list) lists them", ref)
}

// resolveMachine returns the live machine whose id, name or alias is ref.
func resolveMachine(ctx context.Context, q querier, ref string) (store.Machine, error) {
	m, err := scanMachine(q.QueryRowContext(ctx, `SELECT `+machineColumns+` FROM machines WHERE removed_at IS NULL AND
		(id = ? OR name = ? OR id = (SELECT machine_id FROM machine_aliases WHERE alias = ?))
		ORDER BY id = ? DESC, name = ? DESC LIMIT 1`, ref, ref, ref, ref, ref))
	if errors.Is(err, sql.ErrNoRows) {
		return m, machineNotFound(ref)
	}
	if err != nil {
		return m, fmt.Errorf("read machine: %w", err)
	}
	ms := []store.Machine{m}
	if err := withAliases(ctx, q, ms); err != nil {
		return m, err
	}
	return ms[0], nil
}

// Machine implements store.MachineStore.
func (s *Store) Machine(ctx context.Context, ref string) (store.Machine, error) {
	return resolveMachine(ctx, s.read, ref)
}

// MachineByID implements store.MachineStore.
func (s *Store) MachineByID(ctx context.Context, id string) (store.Machine, error) {
	m, err := scanMachine(s.read.QueryRowContext(ctx, `SELECT `+machineColumns+` FROM machines WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return m, machineNotFound(id)
	}
	if err != nil {
		return m, fmt.Errorf("read machine: %w", err)
	}
	ms := []store.Machine{m}
	if err := withAliases(ctx, s.read, ms); err != nil {
		return m, err
	}
	return ms[0], nil
}

// ListMachines implements store.MachineStore.
func (s *Store) ListMachines(ctx context.Context, limit int) ([]store.Machine, error) {
	if limit <= 0 {
		return nil, errcode.New(errcode.InvalidArgument, "limit must be positive; got %d", limit)
	}
	rows, err := s.read.QueryContext(ctx, `SELECT `+machineColumns+` FROM machines WHERE removed_at IS NULL ORDER BY name, id LIMIT ?`, limit)
	if err != nil {
		return nil, fmt.Errorf("list machines: %w", err)
	}
	out := []store.Machine{}
	for rows.Next() {
		m, err := scanMachine(rows)
		if err != nil {
			rows.Close()
			return nil, fmt.Errorf("list machines: %w", err)
		}
		out = append(out, m)
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return nil, fmt.Errorf("list machines: %w", err)
	}
	if err := withAliases(ctx, s.read, out); err != nil {
		return nil, err
	}
	return out, nil
}

// RecordHeartbeat implements store.MachineStore.
func (s *Store) RecordHeartbeat(ctx context.Context, id string, f store.MachineFacts, at time.Time) error {
	gpus, err := json.Marshal(nonNilGPUs(f.GPUs))
	if err != nil {
		return fmt.Errorf("encode gpus: %w", err)
	}
	res, err := s.write.ExecContext(ctx, `UPDATE machines SET platform = ?, arch = ?, agent_version = ?, gpus = ?, last_seen = ?
		WHERE id = ? AND removed_at IS NULL`, f.Platform, f.Arch, f.AgentVersion, string(gpus), millis(at), id)
	if err != nil {
		return fmt.Errorf("record heartbeat: %w", err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return machineNotFound(id)
	}
	return nil
}

// AddMachineAlias implements store.MachineStore.
func (s *Store) AddMachineAlias(ctx context.Context, ref, alias string, max int) (store.Machine, error) {
	var m store.Machine
	err := s.inTx(ctx, func(tx *Tx) error {
		var err error
		if m, err = resolveMachine(ctx, tx, ref); err != nil {
			return err
		}
		for _, a := range m.Aliases {
			if a == alias {
				return nil
			}
		}
		if m.Name == alias {
			return errcode.New(errcode.Conflict, "%q is machine %s's name already", alias, m.ID)
		}
		if err := nameFree(ctx, tx, alias, ""); err != nil {
			return err
		}
		if len(m.Aliases) >= max {
			return errcode.New(errcode.InvalidArgument, "machine %s has %d aliases, the most it may; remove one first", m.ID, len(m.Aliases))
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO machine_aliases (alias, machine_id) VALUES (?, ?)`, alias, m.ID); err != nil {
			return fmt.Errorf("add machine alias: %w", err)
		}
		m.Aliases = append(m.Aliases, alias)
		sort.Strings(m.Aliases)
		return nil
	})
	return m, err
}

// RemoveMachineAlias implements store.MachineStore.
func (s *Store) RemoveMachineAlias(ctx context.Context, ref, alias string) (store.Machine, error) {
	var m store.Machine
	err := s.inTx(ctx, func(tx *Tx) error {
		var err error
		if m, err = resolveMachine(ctx, tx, ref); err != nil {
			return err
		}
		res, err := tx.ExecContext(ctx, `DELETE FROM machine_aliases WHERE alias = ? AND machine_id = ?`, alias, m.ID)
		if err != nil {
			return fmt.Errorf("remove machine alias: %w", err)
		}
		if n, _ := res.RowsAffected(); n != 1 {
			return errcode.New(errcode.InvalidArgument, "machine %s has no alias %q (its aliases: %v)", m.ID, alias, m.Aliases)
		}
		out := m.Aliases[:0]
		for _, a := range m.Aliases {
			if a != alias {
				out = append(out, a)
			}
		}
		m.Aliases = out
		return nil
	})
	return m, err
}

// RemoveMachine implements store.MachineStore.
func (s *Store) RemoveMachine(ctx context.Context, ref string, at time.Time) (store.Machine, error) {
	var m store.Machine
	err := s.inTx(ctx, func(tx *Tx) error {
		var err error
		if m, err = resolveMachine(ctx, tx, ref); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM machine_aliases WHERE machine_id = ?`, m.ID); err != nil {
			return fmt.Errorf("remove machine aliases: %w", err)
		}
		if _, err := tx.ExecContext(ctx, `UPDATE machines SET removed_at = ? WHERE id = ?`, millis(at), m.ID); err != nil {
			return fmt.Errorf("remove machine: %w", err)
		}
		t := fromMillis(millis(at))
		m.RemovedAt = &t
		return nil
	})
	return m, err
}
