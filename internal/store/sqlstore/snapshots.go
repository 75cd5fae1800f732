package sqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// snapshotColumns is the column list every snapshot query selects, in scanSnapshot's order.
const snapshotColumns = `id, sandbox_id, state, kind, purpose, size_bytes, runtime, image, image_digest, cpu,
	memory_mb, disk_mb, network, secrets, id_base, labels, node, created_at, error_msg, version, principal`

func checkSnapshot(sn sandbox.Snapshot) error {
	switch {
	case !sandbox.ValidSnapshotID(sn.ID):
		return errcode.New(errcode.InvalidArgument, "snapshot id %q is malformed (want snap- and 12 hex digits)", sn.ID)
	case sn.SandboxID == "":
		return errcode.New(errcode.InvalidArgument, "snapshot %s has no sandbox id", sn.ID)
	case !sn.State.Valid():
		return errcode.New(errcode.InvalidArgument, "snapshot %s has unknown state %q", sn.ID, sn.State)
	}
	return nil
}

func snapshotArgs(sn sandbox.Snapshot) ([]any, error) {
	labels, err := encodeMap(sn.Labels)
	if err != nil {
		return nil, fmt.Errorf("encode labels: %w", err)
	}
	var network, secrets string
	if sn.Network != nil && sn.Network.Policy != nil {
		b, err := json.Marshal(sn.Network)
		if err != nil {
			return nil, fmt.Errorf("encode network: %w", err)
		}
		network = string(b)
	}
	if len(sn.Secrets) > 0 {
		b, err := json.Marshal(sn.Secrets)
		if err != nil {
			return nil, fmt.Errorf("encode secrets: %w", err)
		}
		secrets = string(b)
	}
	return []any{sn.ID, sn.SandboxID, string(sn.State), sn.Kind, sn.Purpose, sn.SizeBytes, sn.Runtime, sn.Image,
		sn.ImageDigest, sn.CPU, sn.MemoryMB, sn.DiskMB, network, secrets, sn.IDBase, labels, sn.Node,
		millis(sn.CreatedAt), sn.Error, sn.Version, sn.Principal}, nil
}

func scanSnapshot(r rowScanner) (sandbox.Snapshot, error) {
	var sn sandbox.Snapshot
	var state, network, secrets, labels string
	var created int64
	err := r.Scan(&sn.ID, &sn.SandboxID, &state, &sn.Kind, &sn.Purpose, &sn.SizeBytes, &sn.Runtime, &sn.Image,
		&sn.ImageDigest, &sn.CPU, &sn.MemoryMB, &sn.DiskMB, &network, &secrets, &sn.IDBase, &labels, &sn.Node,
		&created, &sn.Error, &sn.Version, &sn.Principal)
	if err != nil {
		return sandbox.Snapshot{}, err
	}
	sn.State, sn.CreatedAt = sandbox.SnapshotState(state), fromMillis(created)
	if sn.Labels, err = decodeMap(labels); err != nil {
		return sandbox.Snapshot{}, fmt.Errorf("decode labels of %s: %w", sn.ID, err)
	}
	if network != "" {
		sn.Network = &sandbox.Network{}
		if err := json.Unmarshal([]byte(network), sn.Network); err != nil {
			return sandbox.Snapshot{}, fmt.Errorf("decode network of %s: %w", sn.ID, err)
		}
	}
	if secrets != "" {
		if err := json.Unmarshal([]byte(secrets), &sn.Secrets); err != nil {
			return sandbox.Snapshot{}, fmt.Errorf("decode secrets of %s: %w", sn.ID, err)
		}
	}
	return sn, nil
}

func snapshotNotFound(id string) error {
	return errcode.New(errcode.SnapshotNotFound, "snapshot %s not found; snapshot_list shows which exist", id)
}

// CreateSnapshot inserts sn (version 1) if its sandbox's record exists.
func (s *Store) CreateSnapshot(ctx context.Context, sn sandbox.Snapshot) error {
	if err := checkSnapshot(sn); err != nil {
		return s.opErr("create snapshot", sn.ID, err)
	}
	if sn.Version != 1 {
		return s.opErr("create snapshot", sn.ID, errcode.New(errcode.InvalidArgument, "a new snapshot record must have version 1, not %d", sn.Version))
	}
	args, err := snapshotArgs(sn)
	if err != nil {
		return s.opErr("create snapshot", sn.ID, err)
	}
	err = s.inTx(ctx, func(tx *Tx) error {
		var principal string
		err := tx.QueryRowContext(ctx, `SELECT principal FROM sandboxes WHERE id = ?`, sn.SandboxID).Scan(&principal)
		if errors.Is(err, sql.ErrNoRows) {
			return notFound(sn.SandboxID)
		}
		if err != nil {
			return fmt.Errorf("look up sandbox %s: %w", sn.SandboxID, err)
		}
		if sn.Principal == "" { // a snapshot is its sandbox's principal's
			args[len(args)-1] = principal
		}
		_, err = tx.ExecContext(ctx, `INSERT INTO snapshots (`+snapshotColumns+`)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`, args...)
		if isPrimaryKeyViolation(err) {
			return errcode.Wrap(errcode.Conflict, err, "snapshot %s already exists", sn.ID)
		}
		if err != nil {
			return fmt.Errorf("insert: %w", err)
		}
		return nil
	})
	if err != nil {
		return s.opErr("create snapshot", sn.ID, err)
	}
	return nil
}

// UpdateSnapshot writes every field of sn but its principal if the stored version is
// sn.Version-1.
func (s *Store) UpdateSnapshot(ctx context.Context, sn sandbox.Snapshot) error {
	if err := checkSnapshot(sn); err != nil {
		return s.opErr("update snapshot", sn.ID, err)
	}
	args, err := snapshotArgs(sn)
	if err != nil {
		return s.opErr("update snapshot", sn.ID, err)
	}
	err = s.inTx(ctx, func(tx *Tx) error {
		res, err := tx.ExecContext(ctx, `UPDATE snapshots SET id = ?, sandbox_id = ?, state = ?, kind = ?,
			purpose = ?, size_bytes = ?, runtime = ?, image = ?, image_digest = ?, cpu = ?, memory_mb = ?,
			disk_mb = ?, network = ?, secrets = ?, id_base = ?, labels = ?, node = ?, created_at = ?,
			error_msg = ?, version = ?
			WHERE id = ? AND version = ?`, append(args[:len(args)-1], sn.ID, sn.Version-1)...) // (its principal never changes)
		if err != nil {
			return fmt.Errorf("update: %w", err)
		}
		return versioned(ctx, tx, res, "snapshot "+sn.ID, sn.Version-1, func() error { return snapshotNotFound(sn.ID) },
			`SELECT version FROM snapshots WHERE id = ?`, sn.ID)
	})
	if err != nil {
		return s.opErr("update snapshot", sn.ID, err)
	}
	return nil
}

// GetSnapshot returns the snapshot with id, or SNAPSHOT_NOT_FOUND.
func (s *Store) GetSnapshot(ctx context.Context, id string) (sandbox.Snapshot, error) {
	sn, err := scanSnapshot(s.read.QueryRowContext(ctx, `SELECT `+snapshotColumns+` FROM snapshots WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return sandbox.Snapshot{}, s.opErr("get snapshot", id, snapshotNotFound(id))
	}
	if err != nil {
		return sandbox.Snapshot{}, s.opErr("get snapshot", id, err)
	}
	return sn, nil
}

// ListSnapshots returns the snapshots f selects, oldest first, after the cursor f.After.
func (s *Store) ListSnapshots(ctx context.Context, f sandbox.SnapshotFilter) ([]sandbox.Snapshot, error) {
	n := f.Limit
	switch {
	case n == 0:
		n = sandbox.DefaultSnapshotList
	case n < 0 || n > sandbox.MaxSnapshotList:
		return nil, errcode.New(errcode.InvalidArgument, "limit must be 1–%d (0: %d); got %d",
			sandbox.MaxSnapshotList, sandbox.DefaultSnapshotList, f.Limit)
	}
	var where []string
	var args []any
	if f.SandboxID != "" {
		where = append(where, "sandbox_id = ?")
		args = append(args, f.SandboxID)
	}
	if f.Principal != "" {
		where = append(where, "principal = ?")
		args = append(args, f.Principal)
	}
	if f.Purpose != "" {
		where = append(where, "purpose = ?")
		args = append(args, f.Purpose)
	}
	if len(f.States) > 0 {
		where = append(where, "state IN ("+placeholders(len(f.States))+")")
		for _, st := range f.States {
			args = append(args, string(st))
		}
	}
	if f.After != "" {
		var created int64
		err := s.read.QueryRowContext(ctx, `SELECT created_at FROM snapshots WHERE id = ?`, f.After).Scan(&created)
		if errors.Is(err, sql.ErrNoRows) {
			return nil, errcode.New(errcode.InvalidArgument, "after %q names no snapshot; give the snapshot_id of the last snapshot of the previous page", f.After)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: list snapshots: cursor: %w", s.name, err)
		}
		where = append(where, "(created_at > ? OR (created_at = ? AND id > ?))")
		args = append(args, created, created, f.After)
	}
	query := `SELECT ` + snapshotColumns + ` FROM snapshots`
	if len(where) > 0 {
		query += ` WHERE ` + strings.Join(where, " AND ")
	}
	query += ` ORDER BY created_at, id LIMIT ?`
	args = append(args, n)
	rows, err := s.read.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("%s: list snapshots: %w", s.name, err)
	}
	defer rows.Close()
	var out []sandbox.Snapshot
	for rows.Next() {
		sn, err := scanSnapshot(rows)
		if err != nil {
			return nil, fmt.Errorf("%s: list snapshots: %w", s.name, err)
		}
		out = append(out, sn)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("%s: list snapshots: %w", s.name, err)
	}
	return out, nil
}

// DeleteSnapshot removes the record of snapshot id.
func (s *Store) DeleteSnapshot(ctx context.Context, id string) error {
	err := s.inTx(ctx, func(tx *Tx) error {
		res, err := tx.ExecContext(ctx, `DELETE FROM snapshots WHERE id = ?`, id)
		if err != nil {
			return fmt.Errorf("delete: %w", err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return fmt.Errorf("delete: %w", err)
		}
		if n == 0 {
			return snapshotNotFound(id)
		}
		return nil
	})
	if err != nil {
		return s.opErr("delete snapshot", id, err)
	}
	return nil
}

// SnapshotBytes returns the sum of size_bytes of the ready user snapshots.
func (s *Store) SnapshotBytes(ctx context.Context) (int64, error) {
	var n int64
	err := s.read.QueryRowContext(ctx, `SELECT COALESCE(SUM(size_bytes), 0) FROM snapshots WHERE state = ? AND purpose = ?`,
		string(sandbox.SnapshotReady), sandbox.SnapshotPurposeUser).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("%s: snapshot bytes: %w", s.name, err)
	}
	return n, nil
}
