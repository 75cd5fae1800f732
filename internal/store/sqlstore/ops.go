package sqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// defaultLimit bounds a listing whose filter gives no limit.
const defaultLimit = 1000

// sandboxColumns is the column list every sandbox query selects, in scanSandbox's order.
const sandboxColumns = `id, state, image, runtime, isolation, cpu, memory_mb, disk_mb, pids_limit,
	env, labels, created_at, updated_at, expires_at, error_msg, version, owner, idempotency_key, node, handle,
	network, secrets, image_digest, from_snapshot, auto_wake, ttl_while_sleeping, sleep_snapshot, slept_at, pool, from_pool, principal,
	on_expiry, ttl_seconds`

// CreateSandbox inserts sb (whose Version must be 1) and, if ev.To is set, its first event, in
// one transaction. An existing id, or an idempotency key its owner already used, is a CONFLICT.
// See appendEvent for the event defaults.
func (s *Store) CreateSandbox(ctx context.Context, sb sandbox.Sandbox, ev sandbox.Event) error {
	if err := checkNew(sb, ev); err != nil {
		return s.opErr("create sandbox", sb.ID, err)
	}
	if err := s.inTx(ctx, func(tx *Tx) error { return insertSandbox(ctx, tx, sb, ev) }); err != nil {
		return s.opErr("create sandbox", sb.ID, err)
	}
	return nil
}

// AdmitSandbox inserts sb and ev unless its owner already used its idempotency key (then it
// returns that sandbox) or it would take its node past a bound of a (then an
// *sandbox.OverCapacityError). The lookup, the count and the insert are one write
// transaction (under the write lock: see inTx): the database's write lock serialises admissions of every process.
func (s *Store) AdmitSandbox(ctx context.Context, sb sandbox.Sandbox, ev sandbox.Event, a sandbox.Admission) (sandbox.Sandbox, bool, error) {
	if err := checkNew(sb, ev); err != nil {
		return sandbox.Sandbox{}, false, s.opErr("admit sandbox", sb.ID, err)
	}
	var existing sandbox.Sandbox
	found := false
	err := s.inTx(ctx, func(tx *Tx) error {
		if sb.IdempotencyKey != "" {
			row := tx.QueryRowContext(ctx, `SELECT `+sandboxColumns+` FROM sandboxes WHERE owner = ? AND idempotency_key = ?`,
				sb.Owner, sb.IdempotencyKey)
			var err error
			existing, err = scanSandbox(row)
			if err == nil {
				found = true
				return nil
			}
			if !errors.Is(err, sql.ErrNoRows) {
				return fmt.Errorf("look up idempotency key: %w", err)
			}
		}
		live := liveStates()
		var u sandbox.Usage
		err := tx.QueryRowContext(ctx, `SELECT `+usageColumns+`
			FROM sandboxes WHERE node = ? AND state IN (`+placeholders(len(live))+`)`, append([]any{sb.Node}, live...)...).
			Scan(&u.Live, &u.CPU, &u.MemoryMB, &u.DiskMB, &u.Sleeping)
		if err != nil {
			return fmt.Errorf("count live sandboxes of node %q: %w", sb.Node, err)
		}
		if over := a.Check(u, sb); over != nil {
			return over
		}
		return insertSandbox(ctx, tx, sb, ev)
	})
	if err != nil {
		return sandbox.Sandbox{}, false, s.opErr("admit sandbox", sb.ID, err)
	}
	if found {
		return existing, false, nil
	}
	return sb, true, nil
}

// checkNew validates a record about to be inserted.
func checkNew(sb sandbox.Sandbox, ev sandbox.Event) error {
	if err := validate(sb, ev); err != nil {
		return err
	}
	if sb.Version != 1 {
		return errcode.New(errcode.InvalidArgument, "a new sandbox record must have version 1, not %d", sb.Version)
	}
	return nil
}

func insertSandbox(ctx context.Context, tx *Tx, sb sandbox.Sandbox, ev sandbox.Event) error {
	env, labels, err := encodeMaps(sb)
	if err != nil {
		return err
	}
	network, secrets, err := encodeNetwork(sb)
	if err != nil {
		return err
	}
	_, err = tx.ExecContext(ctx, `INSERT INTO sandboxes (`+sandboxColumns+`)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		sb.ID, string(sb.State), sb.Image, sb.Runtime, sb.Isolation, sb.CPU, sb.MemoryMB,
		sb.DiskMB, sb.PidsLimit, env, labels, millis(sb.CreatedAt), millis(sb.UpdatedAt),
		millis(sb.ExpiresAt), sb.Error, sb.Version, sb.Owner, sb.IdempotencyKey, sb.Node, sb.Handle,
		network, secrets, sb.ImageDigest, sb.FromSnapshot, sb.AutoWake, sb.TTLWhileSleeping, sb.SleepSnapshot, millis(sb.SleptAt), sb.Pool, sb.FromPool, sb.Principal,
		sb.OnExpiry, sb.TTLSeconds)
	if isPrimaryKeyViolation(err) {
		return errcode.Wrap(errcode.Conflict, err, "sandbox %s already exists", sb.ID)
	}
	if isUniqueViolation(err) {
		return errcode.Wrap(errcode.Conflict, err, "idempotency key %q was already used by this owner", sb.IdempotencyKey)
	}
	if err != nil {
		return fmt.Errorf("insert: %w", err)
	}
	if err := insertLabels(ctx, tx, sb.ID, sb.Labels); err != nil {
		return err
	}
	return appendEvent(ctx, tx, sb.ID, ev)
}

// GetSandbox returns the sandbox with id, or SANDBOX_NOT_FOUND.
func (s *Store) GetSandbox(ctx context.Context, id string) (sandbox.Sandbox, error) {
	row := s.read.QueryRowContext(ctx, `SELECT `+sandboxColumns+` FROM sandboxes WHERE id = ?`, id)
	sb, err := scanSandbox(row)
	if errors.Is(err, sql.ErrNoRows) {
		return sandbox.Sandbox{}, s.opErr("get sandbox", id, notFound(id))
	}
	if err != nil {
		return sandbox.Sandbox{}, s.opErr("get sandbox", id, err)
	}
	return sb, nil
}

// ListSandboxes returns the sandboxes in any of filter.States (all, if none) that carry every
// label in filter.Labels, oldest first (created_at, then id), at most filter.Limit (or 1000).
func (s *Store) ListSandboxes(ctx context.Context, filter sandbox.ListFilter) ([]sandbox.Sandbox, error) {
	var where []string
	var args []any
	if len(filter.States) > 0 {
		where = append(where, "state IN ("+placeholders(len(filter.States))+")")
		for _, st := range filter.States {
			args = append(args, string(st))
		}
	}
	if filter.Principal != "" {
		where, args = append(where, "principal = ?"), append(args, filter.Principal)
	}
	switch {
	case filter.Pool != "":
		where, args = append(where, "pool = ?"), append(args, filter.Pool)
	case filter.NoPooled:
		where = append(where, "pool = ''")
	}
	names := make([]string, 0, len(filter.Labels))
	for name := range filter.Labels {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		where = append(where, `EXISTS (SELECT 1 FROM sandbox_labels l
			WHERE l.sandbox_id = sandboxes.id AND l.name = ? AND l.value = ?)`)
		args = append(args, name, filter.Labels[name])
	}
	query := `SELECT ` + sandboxColumns + ` FROM sandboxes`
	if len(where) > 0 {
		query += ` WHERE ` + strings.Join(where, " AND ")
	}
	query += ` ORDER BY created_at, id LIMIT ?`
	args = append(args, limit(filter.Limit))

	rows, err := s.read.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("%s: list sandboxes: %w", s.name, err)
	}
	defer rows.Close()
	var out []sandbox.Sandbox
	for rows.Next() {
		sb, err := scanSandbox(rows)
		if err != nil {
			return nil, fmt.Errorf("%s: list sandboxes: %w", s.name, err)
		}
		out = append(out, sb)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("%s: list sandboxes: %w", s.name, err)
	}
	return out, nil
}

// CountLive returns how many sandboxes are live (creating, running, stopping) and the sums of
// their cpu, memory_mb and disk_mb.
func (s *Store) CountLive(ctx context.Context) (sandbox.Usage, error) {
	live := liveStates()
	var u sandbox.Usage
	err := s.read.QueryRowContext(ctx, `SELECT `+usageColumns+`
		FROM sandboxes WHERE state IN (`+placeholders(len(live))+`)`, live...).Scan(&u.Live, &u.CPU, &u.MemoryMB, &u.DiskMB, &u.Sleeping)
	if err != nil {
		return sandbox.Usage{}, fmt.Errorf("%s: count live sandboxes: %w", s.name, err)
	}
	return u, nil
}

// ImagesInUse returns the image digests that live sandboxes' records pin, with how many live
// sandboxes pin each (at most one row per distinct digest: bounded by the live bound).
func (s *Store) ImagesInUse(ctx context.Context) (map[string]int, error) {
	live := liveStates()
	rows, err := s.read.QueryContext(ctx, `SELECT image_digest, COUNT(*) FROM sandboxes
		WHERE image_digest <> '' AND state IN (`+placeholders(len(live))+`) GROUP BY image_digest`, live...)
	if err != nil {
		return nil, fmt.Errorf("%s: images in use: %w", s.name, err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var d string
		var n int
		if err := rows.Scan(&d, &n); err != nil {
			return nil, fmt.Errorf("%s: images in use: %w", s.name, err)
		}
		out[d] = n
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("%s: images in use: %w", s.name, err)
	}
	return out, nil
}

// UpdateSandbox writes every field of sb if the stored version is sb.Version-1, and appends ev
// if ev.To is set, in one transaction. A version mismatch is a CONFLICT and changes nothing;
// an unknown id is SANDBOX_NOT_FOUND.
func (s *Store) UpdateSandbox(ctx context.Context, sb sandbox.Sandbox, ev sandbox.Event) error {
	if err := validate(sb, ev); err != nil {
		return s.opErr("update sandbox", sb.ID, err)
	}
	env, labels, err := encodeMaps(sb)
	if err != nil {
		return s.opErr("update sandbox", sb.ID, err)
	}
	network, secrets, err := encodeNetwork(sb)
	if err != nil {
		return s.opErr("update sandbox", sb.ID, err)
	}
	err = s.inTx(ctx, func(tx *Tx) error {
		res, err := tx.ExecContext(ctx, `UPDATE sandboxes SET state = ?, image = ?, runtime = ?,
			isolation = ?, cpu = ?, memory_mb = ?, disk_mb = ?, pids_limit = ?, env = ?, labels = ?,
			created_at = ?, updated_at = ?, expires_at = ?, error_msg = ?, version = ?, node = ?, handle = ?,
			network = ?, secrets = ?, image_digest = ?, from_snapshot = ?, auto_wake = ?, ttl_while_sleeping = ?,
			sleep_snapshot = ?, slept_at = ?, pool = ?, from_pool = ?, on_expiry = ?, ttl_seconds = ?
			WHERE id = ? AND version = ?`,
			string(sb.State), sb.Image, sb.Runtime, sb.Isolation, sb.CPU, sb.MemoryMB, sb.DiskMB,
			sb.PidsLimit, env, labels, millis(sb.CreatedAt), millis(sb.UpdatedAt),
			millis(sb.ExpiresAt), sb.Error, sb.Version, sb.Node, sb.Handle, network, secrets, sb.ImageDigest,
			sb.FromSnapshot, sb.AutoWake, sb.TTLWhileSleeping, sb.SleepSnapshot, millis(sb.SleptAt), sb.Pool, sb.FromPool, sb.OnExpiry, sb.TTLSeconds, sb.ID, sb.Version-1)
		if err != nil {
			return fmt.Errorf("update: %w", err)
		}
		if err := versioned(ctx, tx, res, "sandbox "+sb.ID, sb.Version-1, func() error { return notFound(sb.ID) },
			`SELECT version FROM sandboxes WHERE id = ?`, sb.ID); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM sandbox_labels WHERE sandbox_id = ?`, sb.ID); err != nil {
			return fmt.Errorf("delete labels: %w", err)
		}
		if err := insertLabels(ctx, tx, sb.ID, sb.Labels); err != nil {
			return err
		}
		return appendEvent(ctx, tx, sb.ID, ev)
	})
	if err != nil {
		return s.opErr("update sandbox", sb.ID, err)
	}
	return nil
}

// ListEvents returns events of filter.SandboxID (all sandboxes, if empty) with seq greater than
// filter.AfterSeq, in seq order, at most filter.Limit (or 1000).
func (s *Store) ListEvents(ctx context.Context, filter sandbox.EventFilter) ([]sandbox.Event, error) {
	query := `SELECT seq, sandbox_id, type, from_state, to_state, reason, at FROM events WHERE seq > ?`
	args := []any{filter.AfterSeq}
	if filter.SandboxID != "" {
		query += ` AND sandbox_id = ?`
		args = append(args, filter.SandboxID)
	}
	query += ` ORDER BY seq LIMIT ?`
	args = append(args, limit(filter.Limit))

	rows, err := s.read.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("%s: list events %s: %w", s.name, filter.SandboxID, err)
	}
	defer rows.Close()
	var out []sandbox.Event
	for rows.Next() {
		var ev sandbox.Event
		var from, to string
		var at int64
		if err := rows.Scan(&ev.Seq, &ev.SandboxID, &ev.Type, &from, &to, &ev.Reason, &at); err != nil {
			return nil, fmt.Errorf("%s: list events %s: %w", s.name, filter.SandboxID, err)
		}
		ev.From, ev.To, ev.At = sandbox.State(from), sandbox.State(to), fromMillis(at)
		out = append(out, ev)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("%s: list events %s: %w", s.name, filter.SandboxID, err)
	}
	return out, nil
}

// PruneSandboxes deletes the sandboxes in a non-live state whose updated_at is before the
// given time, with their labels, events, jobs, network records, preview URLs and any id range still recorded for them, and returns
// how many sandboxes it deleted.
func (s *Store) PruneSandboxes(ctx context.Context, before time.Time) (int, error) {
	live := liveStates()
	match := `SELECT id FROM sandboxes WHERE state NOT IN (` + placeholders(len(live)) + `) AND updated_at < ?`
	args := append(live, millis(before))
	var n int64
	err := s.inTx(ctx, func(tx *Tx) error {
		if _, err := tx.ExecContext(ctx, `DELETE FROM events WHERE sandbox_id IN (`+match+`)`, args...); err != nil {
			return fmt.Errorf("delete events: %w", err)
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM sandbox_labels WHERE sandbox_id IN (`+match+`)`, args...); err != nil {
			return fmt.Errorf("delete labels: %w", err)
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM jobs WHERE sandbox_id IN (`+match+`)`, args...); err != nil {
			return fmt.Errorf("delete jobs: %w", err)
		}
		for _, table := range []string{"connections", "secret_calls", "exposures"} {
			if _, err := tx.ExecContext(ctx, `DELETE FROM `+table+` WHERE sandbox_id IN (`+match+`)`, args...); err != nil {
				return fmt.Errorf("delete %s: %w", table, err)
			}
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM id_ranges WHERE sandbox_id IN (`+match+`)`, args...); err != nil {
			return fmt.Errorf("delete id ranges: %w", err)
		}
		res, err := tx.ExecContext(ctx, `DELETE FROM sandboxes WHERE id IN (`+match+`)`, args...)
		if err != nil {
			return fmt.Errorf("delete sandboxes: %w", err)
		}
		if n, err = res.RowsAffected(); err != nil {
			return fmt.Errorf("delete sandboxes: %w", err)
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("%s: prune sandboxes updated before %s: %w", s.name, before.UTC().Format(time.RFC3339Nano), err)
	}
	return int(n), nil
}

// appendEvent inserts ev for sandbox id, if ev.To is set. An empty Type defaults to "state" and
// a zero At to the current time.
func appendEvent(ctx context.Context, tx *Tx, id string, ev sandbox.Event) error {
	if ev.To == "" {
		return nil
	}
	if ev.Type == "" {
		ev.Type = "state"
	}
	if ev.At.IsZero() {
		ev.At = time.Now()
	}
	tx.changed = true // watchers of another process hear of it on commit
	_, err := tx.ExecContext(ctx, `INSERT INTO events (sandbox_id, type, from_state, to_state, reason, at)
		VALUES (?, ?, ?, ?, ?, ?)`, id, ev.Type, string(ev.From), string(ev.To), ev.Reason, millis(ev.At))
	if err != nil {
		return fmt.Errorf("insert event: %w", err)
	}
	return nil
}

// insertLabels indexes labels of sandbox id in sandbox_labels.
func insertLabels(ctx context.Context, tx *Tx, id string, labels map[string]string) error {
	for name, value := range labels {
		if _, err := tx.ExecContext(ctx, `INSERT INTO sandbox_labels (sandbox_id, name, value) VALUES (?, ?, ?)`,
			id, name, value); err != nil {
			return fmt.Errorf("insert label %q: %w", name, err)
		}
	}
	return nil
}

// validate checks what the database cannot: a record the rest of agentbox could read back.
func validate(sb sandbox.Sandbox, ev sandbox.Event) error {
	if sb.ID == "" {
		return errcode.New(errcode.InvalidArgument, "a sandbox record needs an id")
	}
	if !sb.State.Valid() {
		return errcode.New(errcode.InvalidArgument, "sandbox %s has unknown state %q", sb.ID, sb.State)
	}
	if ev.To == "" {
		return nil
	}
	if ev.SandboxID != "" && ev.SandboxID != sb.ID {
		return errcode.New(errcode.InvalidArgument, "event for sandbox %s was given with the record of sandbox %s", ev.SandboxID, sb.ID)
	}
	if !ev.To.Valid() || (ev.From != "" && !ev.From.Valid()) {
		return errcode.New(errcode.InvalidArgument, "event for sandbox %s has an unknown state (%q → %q)", sb.ID, ev.From, ev.To)
	}
	return nil
}

// rowScanner is what *sql.Row and *sql.Rows have in common.
type rowScanner interface {
	Scan(dest ...any) error
}

func scanSandbox(r rowScanner) (sandbox.Sandbox, error) {
	var sb sandbox.Sandbox
	var state, env, labels, network, secrets string
	var created, updated, expires, slept int64
	err := r.Scan(&sb.ID, &state, &sb.Image, &sb.Runtime, &sb.Isolation, &sb.CPU, &sb.MemoryMB,
		&sb.DiskMB, &sb.PidsLimit, &env, &labels, &created, &updated, &expires, &sb.Error, &sb.Version,
		&sb.Owner, &sb.IdempotencyKey, &sb.Node, &sb.Handle, &network, &secrets, &sb.ImageDigest,
		&sb.FromSnapshot, &sb.AutoWake, &sb.TTLWhileSleeping, &sb.SleepSnapshot, &slept, &sb.Pool, &sb.FromPool, &sb.Principal,
		&sb.OnExpiry, &sb.TTLSeconds)
	if err != nil {
		return sandbox.Sandbox{}, err
	}
	sb.State = sandbox.State(state)
	sb.CreatedAt, sb.UpdatedAt, sb.ExpiresAt = fromMillis(created), fromMillis(updated), fromMillis(expires)
	sb.SleptAt = fromMillis(slept)
	if sb.Env, err = decodeMap(env); err != nil {
		return sandbox.Sandbox{}, fmt.Errorf("decode env of %s: %w", sb.ID, err)
	}
	if sb.Labels, err = decodeMap(labels); err != nil {
		return sandbox.Sandbox{}, fmt.Errorf("decode labels of %s: %w", sb.ID, err)
	}
	if err := decodeNetwork(&sb, network, secrets); err != nil {
		return sandbox.Sandbox{}, fmt.Errorf("decode network of %s: %w", sb.ID, err)
	}
	return sb, nil
}

func encodeMaps(sb sandbox.Sandbox) (env, labels string, err error) {
	if env, err = encodeMap(sb.Env); err != nil {
		return "", "", fmt.Errorf("encode env: %w", err)
	}
	if labels, err = encodeMap(sb.Labels); err != nil {
		return "", "", fmt.Errorf("encode labels: %w", err)
	}
	return env, labels, nil
}

// encodeMap stores m as a JSON object; nil and empty are both "{}".
func encodeMap(m map[string]string) (string, error) {
	if len(m) == 0 {
		return "{}", nil
	}
	b, err := json.Marshal(m)
	return string(b), err
}

// decodeMap reads a JSON object; an empty one is a nil map.
func decodeMap(s string) (map[string]string, error) {
	var m map[string]string
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		return nil, err
	}
	if len(m) == 0 {
		return nil, nil
	}
	return m, nil
}

// millis is t as unix milliseconds; the zero time maps to its own (far negative) value, so it
// reads back as the zero time.
func millis(t time.Time) int64 { return t.UnixMilli() }

// fromMillis is the UTC time ms unix milliseconds denote, and the zero time for millis(zero).
func fromMillis(ms int64) time.Time {
	t := time.UnixMilli(ms).UTC()
	if t.IsZero() {
		return time.Time{}
	}
	return t
}

// usageColumns sums a sandbox.Usage over live sandboxes, in Scan order Live, CPU, MemoryMB,
// DiskMB, Sleeping: a sleeping sandbox counts against the live bound and disk, not cpu and
// memory (sandbox.State.HoldsCompute).
const usageColumns = `COUNT(*),
	COALESCE(SUM(CASE WHEN state = 'sleeping' THEN 0 ELSE cpu END), 0),
	COALESCE(SUM(CASE WHEN state = 'sleeping' THEN 0 ELSE memory_mb END), 0),
	COALESCE(SUM(disk_mb), 0),
	COALESCE(SUM(CASE WHEN state = 'sleeping' THEN 1 ELSE 0 END), 0)`

// liveStates are the states that count against capacity and are never pruned, as query args.
func liveStates() []any {
	var out []any
	for _, st := range []sandbox.State{sandbox.StateCreating, sandbox.StateRunning, sandbox.StateStopping,
		sandbox.StateDestroyed, sandbox.StateFailed, sandbox.StateLost, sandbox.StateSleeping} {
		if st.Live() {
			out = append(out, string(st))
		}
	}
	return out
}

func limit(n int) int {
	if n <= 0 {
		return defaultLimit
	}
	return n
}

func placeholders(n int) string {
	return strings.TrimSuffix(strings.Repeat("?, ", n), ", ")
}

func notFound(id string) error {
	return errcode.New(errcode.SandboxNotFound, "sandbox %s not found; list sandboxes to see which exist", id)
}

// opErr wraps err with the driver, the operation and the sandbox id.
func (s *Store) opErr(op, id string, err error) error {
	return fmt.Errorf("%s: %s %s: %w", s.name, op, id, err)
}
