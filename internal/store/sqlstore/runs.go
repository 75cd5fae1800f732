package sqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/runs"
)

// runs.Store: a run is one row of runs whose doc is the whole record as JSON, beside the
// columns queries select and order on; its events are rows of run_events; a batch is one row
// of batches likewise. Every time is written in UTC with millisecond precision, in the JSON as
// in the columns, so a record reads back exactly as the columns order it.

var _ runs.Store = (*Store)(nil)

const (
	runColumns   = `owner, version, doc`
	batchColumns = `owner, idempotency_key, version, doc`
)

// unsettledRunStates and activeRunStates are query args.
func unsettledRunStates() []any {
	return []any{string(runs.Queued), string(runs.Preparing), string(runs.Running), string(runs.Validating),
		string(runs.Collecting), string(runs.Cleaning)}
}

func activeRunStates() []any {
	out := make([]any, len(runs.ActiveStates))
	for i, st := range runs.ActiveStates {
		out[i] = string(st)
	}
	return out
}

func runNotFound(id string) error {
	return errcode.New(errcode.RunNotFound, "run %s not found; run_list shows the runs kept", id)
}

func batchNotFound(id string) error {
	return errcode.New(errcode.RunNotFound, "batch %s not found; the batch list shows the batches kept", id)
}

// msTime is t in UTC at millisecond precision (the zero time stays zero).
func msTime(t time.Time) time.Time {
	if t.IsZero() {
		return time.Time{}
	}
	return fromMillis(millis(t))
}

func msTimePtr(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	v := msTime(*t)
	return &v
}

// normalizeRun returns r with every time in UTC at millisecond precision, without touching
// what r's slices and pointers share with the caller.
func normalizeRun(r runs.Run) runs.Run {
	r.CreatedAt, r.UpdatedAt = msTime(r.CreatedAt), msTime(r.UpdatedAt)
	r.StartedAt, r.FinishedAt, r.KeptUntil = msTimePtr(r.StartedAt), msTimePtr(r.FinishedAt), msTimePtr(r.KeptUntil)
	if r.Phases != nil {
		r.Phases = slices.Clone(r.Phases)
		for i := range r.Phases {
			r.Phases[i].StartedAt, r.Phases[i].FinishedAt = msTimePtr(r.Phases[i].StartedAt), msTimePtr(r.Phases[i].FinishedAt)
		}
	}
	if r.Artifacts != nil {
		r.Artifacts = slices.Clone(r.Artifacts)
		for i := range r.Artifacts {
			r.Artifacts[i].ExpiresAt = msTime(r.Artifacts[i].ExpiresAt)
		}
	}
	return r
}

func normalizeBatch(b runs.Batch) runs.Batch {
	b.CreatedAt, b.SettledAt = msTime(b.CreatedAt), msTimePtr(b.SettledAt)
	return b
}

// checkRun validates a run record about to be written.
func checkRun(r runs.Run) error {
	switch {
	case r.ID == "":
		return errcode.New(errcode.InvalidArgument, "a run record needs an id")
	case !r.State.Valid():
		return errcode.New(errcode.InvalidArgument, "run %s has unknown state %q", r.ID, r.State)
	case r.Version < 1:
		return errcode.New(errcode.InvalidArgument, "run %s has version %d; versions start at 1", r.ID, r.Version)
	}
	return nil
}

// checkRunEvent validates ev of run id; an empty RunID is id's, an empty To the record's state.
func checkRunEvent(id string, state runs.State, ev *runs.Event) error {
	if ev.RunID == "" {
		ev.RunID = id
	}
	if ev.To == "" {
		ev.To = state
	}
	if ev.RunID != id {
		return errcode.New(errcode.InvalidArgument, "an event of run %s was given with the record of run %s", ev.RunID, id)
	}
	if !ev.To.Valid() || (ev.From != "" && !ev.From.Valid()) {
		return errcode.New(errcode.InvalidArgument, "event of run %s has an unknown state (%q → %q)", id, ev.From, ev.To)
	}
	return nil
}

// settledAt is the settled_at column of r: null until it is settled.
func settledAt(r runs.Run) any {
	if !r.State.Settled() {
		return nil
	}
	if r.FinishedAt != nil {
		return millis(*r.FinishedAt)
	}
	return millis(r.UpdatedAt)
}

func scanRun(row rowScanner) (runs.Run, error) {
	var owner, doc string
	var version int64
	if err := row.Scan(&owner, &version, &doc); err != nil {
		return runs.Run{}, err
	}
	var r runs.Run
	if err := json.Unmarshal([]byte(doc), &r); err != nil {
		return runs.Run{}, fmt.Errorf("decode run record: %w", err)
	}
	r.Owner, r.Version = owner, version
	return r, nil
}

func scanBatch(row rowScanner) (runs.Batch, error) {
	var owner, key, doc string
	var version int64
	if err := row.Scan(&owner, &key, &version, &doc); err != nil {
		return runs.Batch{}, err
	}
	var b runs.Batch
	if err := json.Unmarshal([]byte(doc), &b); err != nil {
		return runs.Batch{}, fmt.Errorf("decode batch record: %w", err)
	}
	b.Owner, b.IdempotencyKey, b.Version = owner, key, version
	return b, nil
}

// newRun checks and normalizes a run about to be inserted: state queued (or empty), version 1
// (or 0), its event defaulted.
func newRun(r runs.Run, ev *runs.Event) (runs.Run, error) {
	if r.State == "" {
		r.State = runs.Queued
	}
	if r.Version == 0 {
		r.Version = 1
	}
	if err := checkRun(r); err != nil {
		return runs.Run{}, err
	}
	if r.State != runs.Queued || r.Version != 1 {
		return runs.Run{}, errcode.New(errcode.InvalidArgument, "a new run record must be queued at version 1, not %s at version %d", r.State, r.Version)
	}
	if err := checkRunEvent(r.ID, r.State, ev); err != nil {
		return runs.Run{}, err
	}
	return normalizeRun(r), nil
}

func insertRun(ctx context.Context, tx *Tx, r runs.Run, ev runs.Event) error {
	doc, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("encode run record: %w", err)
	}
	_, err = tx.ExecContext(ctx, `INSERT INTO runs (id, owner, idempotency_key, batch_id, state, created_at, updated_at,
		settled_at, version, doc) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		r.ID, r.Owner, r.Spec.IdempotencyKey, r.BatchID, string(r.State), millis(r.CreatedAt), millis(r.UpdatedAt),
		settledAt(r), r.Version, string(doc))
	if isPrimaryKeyViolation(err) {
		return errcode.Wrap(errcode.Conflict, err, "run %s already exists", r.ID)
	}
	if isUniqueViolation(err) {
		return errcode.Wrap(errcode.Conflict, err, "idempotency key %q was already used by this owner", r.Spec.IdempotencyKey)
	}
	if err != nil {
		return fmt.Errorf("insert run %s: %w", r.ID, err)
	}
	return appendRunEvents(ctx, tx, ev)
}

// appendRunEvents inserts evs (checked by checkRunEvent); a zero Time is now.
func appendRunEvents(ctx context.Context, tx *Tx, evs ...runs.Event) error {
	for _, ev := range evs {
		at := ev.Time
		if at.IsZero() {
			at = time.Now()
		}
		tx.changed = true // watchers of another process hear of it on commit
		_, err := tx.ExecContext(ctx, `INSERT INTO run_events (run_id, time, from_state, to_state, phase, reason)
			VALUES (?, ?, ?, ?, ?, ?)`, ev.RunID, millis(at), string(ev.From), string(ev.To), ev.Phase, ev.Reason)
		if err != nil {
			return fmt.Errorf("insert event of run %s: %w", ev.RunID, err)
		}
	}
	return nil
}

// CreateRun inserts r (queued, version 1) and ev in one transaction, or returns the run r.Owner
// already has under r.Spec.IdempotencyKey (created false). The lookup and the insert are one
// write transaction (under the write lock), so concurrent creates with one key insert one run.
func (s *Store) CreateRun(ctx context.Context, r runs.Run, ev runs.Event) (runs.Run, bool, error) {
	r, err := newRun(r, &ev)
	if err != nil {
		return runs.Run{}, false, s.opErr("create run", r.ID, err)
	}
	var existing runs.Run
	found := false
	err = s.inTx(ctx, func(tx *Tx) error {
		if r.Spec.IdempotencyKey != "" {
			var err error
			existing, err = scanRun(tx.QueryRowContext(ctx, `SELECT `+runColumns+` FROM runs WHERE owner = ? AND idempotency_key = ?`,
				r.Owner, r.Spec.IdempotencyKey))
			if err == nil {
				found = true
				return nil
			}
			if !errors.Is(err, sql.ErrNoRows) {
				return fmt.Errorf("look up idempotency key: %w", err)
			}
		}
		return insertRun(ctx, tx, r, ev)
	})
	if err != nil {
		return runs.Run{}, false, s.opErr("create run", r.ID, err)
	}
	if found {
		return existing, false, nil
	}
	return r, true, nil
}

// GetRun returns the run with id, or RUN_NOT_FOUND.
func (s *Store) GetRun(ctx context.Context, id string) (runs.Run, error) {
	r, err := scanRun(s.read.QueryRowContext(ctx, `SELECT `+runColumns+` FROM runs WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return runs.Run{}, s.opErr("get run", id, runNotFound(id))
	}
	if err != nil {
		return runs.Run{}, s.opErr("get run", id, err)
	}
	return r, nil
}

// UpdateRun writes r if the stored version is r.Version-1 and appends evs, in one transaction;
// otherwise it writes nothing (CONFLICT, or RUN_NOT_FOUND).
func (s *Store) UpdateRun(ctx context.Context, r runs.Run, evs ...runs.Event) error {
	if err := checkRun(r); err != nil {
		return s.opErr("update run", r.ID, err)
	}
	evs = slices.Clone(evs)
	for i := range evs {
		if err := checkRunEvent(r.ID, r.State, &evs[i]); err != nil {
			return s.opErr("update run", r.ID, err)
		}
	}
	r = normalizeRun(r)
	err := s.inTx(ctx, func(tx *Tx) error {
		if err := updateRun(ctx, tx, r); err != nil {
			return err
		}
		return appendRunEvents(ctx, tx, evs...)
	})
	if err != nil {
		return s.opErr("update run", r.ID, err)
	}
	return nil
}

// updateRun writes r over version r.Version-1 in tx. The owner and idempotency key of a run
// never change.
func updateRun(ctx context.Context, tx *Tx, r runs.Run) error {
	doc, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("encode run record: %w", err)
	}
	res, err := tx.ExecContext(ctx, `UPDATE runs SET batch_id = ?, state = ?, updated_at = ?, settled_at = ?, version = ?, doc = ?
		WHERE id = ? AND version = ?`,
		r.BatchID, string(r.State), millis(r.UpdatedAt), settledAt(r), r.Version, string(doc), r.ID, r.Version-1)
	if err != nil {
		return fmt.Errorf("update: %w", err)
	}
	return versioned(ctx, tx, res, "run "+r.ID, r.Version-1, func() error { return runNotFound(r.ID) },
		`SELECT version FROM runs WHERE id = ?`, r.ID)
}

// listLimit checks a page size: 0 is def, else 1..max.
func listLimit(arg string, n, def, max int) (int, error) {
	if n == 0 {
		return def, nil
	}
	if n < 0 || n > max {
		return 0, errcode.New(errcode.InvalidArgument, "%s must be 1..%d, not %d", arg, max, n).With("argument", arg)
	}
	return n, nil
}

// cursor returns the condition selecting rows of table created before the row id (newest-first
// paging by created_at, then id), or INVALID_ARGUMENT if id is not known.
func (s *Store) cursor(ctx context.Context, table, what, id string) (string, []any, error) {
	var created int64
	err := s.read.QueryRowContext(ctx, `SELECT created_at FROM `+table+` WHERE id = ?`, id).Scan(&created)
	if errors.Is(err, sql.ErrNoRows) {
		return "", nil, errcode.New(errcode.InvalidArgument, "before: %s %s is not known (a cursor must be the next of a previous page, whose %s may since have been pruned)", what, id, what).
			With("argument", "before")
	}
	if err != nil {
		return "", nil, fmt.Errorf("read cursor %s: %w", id, err)
	}
	return `(created_at < ? OR (created_at = ? AND id < ?))`, []any{created, created, id}, nil
}

// ListRuns returns the runs f selects, newest first (created_at, then id), at most f.Limit
// (default runs.DefaultList, at most runs.MaxList); Next is the last run's id when more match.
func (s *Store) ListRuns(ctx context.Context, f runs.Filter) (runs.RunList, error) {
	fail := func(err error) (runs.RunList, error) {
		return runs.RunList{}, fmt.Errorf("%s: list runs: %w", s.name, err)
	}
	lim, err := listLimit("limit", f.Limit, runs.DefaultList, runs.MaxList)
	if err != nil {
		return fail(err)
	}
	where := []string{"1 = 1"}
	var args []any
	if len(f.States) > 0 {
		where = append(where, "state IN ("+placeholders(len(f.States))+")")
		for _, st := range f.States {
			if !st.Valid() {
				return fail(errcode.New(errcode.InvalidArgument, "state %q is not a run state", st).With("argument", "state"))
			}
			args = append(args, string(st))
		}
	}
	if f.BatchID != "" {
		where, args = append(where, "batch_id = ?"), append(args, f.BatchID)
	}
	if f.Owner != "" {
		where, args = append(where, "owner = ?"), append(args, f.Owner)
	}
	for name, value := range f.Labels {
		where = append(where, s.d.RunLabelMatch)
		args = append(args, name, value)
	}
	if f.Before != "" {
		cond, cargs, err := s.cursor(ctx, "runs", "run", f.Before)
		if err != nil {
			return fail(err)
		}
		where, args = append(where, cond), append(args, cargs...)
	}
	rows, err := s.read.QueryContext(ctx, `SELECT `+runColumns+` FROM runs WHERE `+strings.Join(where, " AND ")+
		` ORDER BY created_at DESC, id DESC LIMIT ?`, append(args, lim+1)...)
	if err != nil {
		return fail(err)
	}
	out, err := collectRuns(rows)
	if err != nil {
		return fail(err)
	}
	list := runs.RunList{Runs: out}
	if len(out) > lim {
		list.Runs = out[:lim]
		list.Next = list.Runs[lim-1].ID
	}
	if list.Runs == nil {
		list.Runs = []runs.Run{}
	}
	return list, nil
}

func collectRuns(rows *sql.Rows) ([]runs.Run, error) {
	defer rows.Close()
	var out []runs.Run
	for rows.Next() {
		r, err := scanRun(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// UnsettledRuns returns every run not settled, oldest first (created_at, then id).
func (s *Store) UnsettledRuns(ctx context.Context) ([]runs.Run, error) {
	st := unsettledRunStates()
	rows, err := s.read.QueryContext(ctx, `SELECT `+runColumns+` FROM runs WHERE state IN (`+placeholders(len(st))+`)
		ORDER BY created_at, id`, st...)
	if err != nil {
		return nil, fmt.Errorf("%s: unsettled runs: %w", s.name, err)
	}
	out, err := collectRuns(rows)
	if err != nil {
		return nil, fmt.Errorf("%s: unsettled runs: %w", s.name, err)
	}
	return out, nil
}

// QueuedRuns returns up to limit queued runs, oldest first, reading only their ids (the
// runs_state_created_idx index).
func (s *Store) QueuedRuns(ctx context.Context, limit int) ([]runs.QueuedRun, error) {
	if limit <= 0 {
		return nil, nil
	}
	rows, err := s.read.QueryContext(ctx, `SELECT id, batch_id FROM runs WHERE state = ? ORDER BY created_at, id LIMIT ?`,
		string(runs.Queued), limit)
	if err != nil {
		return nil, fmt.Errorf("%s: queued runs: %w", s.name, err)
	}
	defer rows.Close()
	var out []runs.QueuedRun
	for rows.Next() {
		var q runs.QueuedRun
		if err := rows.Scan(&q.ID, &q.BatchID); err != nil {
			return nil, fmt.Errorf("%s: queued runs: %w", s.name, err)
		}
		out = append(out, q)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("%s: queued runs: %w", s.name, err)
	}
	return out, nil
}

// ClaimRun moves queued run id to preparing (StartedAt and UpdatedAt at, version bump, ev
// appended; ev defaults to queued → preparing at at) if its batch has fewer than maxParallel
// runs in runs.ActiveStates (0: unbounded). The read, the count and the write are one
// write transaction (under the write lock), so concurrent claims, of this process or another, never pass the bound.
// claimed is false, with the run as stored, when it is not queued or its batch is at its bound.
func (s *Store) ClaimRun(ctx context.Context, id string, maxParallel int, at time.Time, ev runs.Event) (runs.Run, bool, error) {
	if maxParallel < 0 {
		return runs.Run{}, false, s.opErr("claim run", id, errcode.New(errcode.InvalidArgument,
			"max_parallel must be 0 (unbounded) or more, not %d", maxParallel).With("argument", "max_parallel"))
	}
	if ev.From == "" {
		ev.From = runs.Queued
	}
	if ev.Time.IsZero() {
		ev.Time = at
	}
	if err := checkRunEvent(id, runs.Preparing, &ev); err != nil {
		return runs.Run{}, false, s.opErr("claim run", id, err)
	}
	var r runs.Run
	claimed := false
	err := s.inTx(ctx, func(tx *Tx) error {
		var err error
		r, err = scanRun(tx.QueryRowContext(ctx, `SELECT `+runColumns+` FROM runs WHERE id = ?`, id))
		if errors.Is(err, sql.ErrNoRows) {
			return runNotFound(id)
		}
		if err != nil {
			return fmt.Errorf("read run: %w", err)
		}
		if r.State != runs.Queued {
			return nil
		}
		if r.BatchID != "" && maxParallel > 0 {
			active := activeRunStates()
			var n int
			if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM runs WHERE batch_id = ? AND state IN (`+placeholders(len(active))+`)`,
				append([]any{r.BatchID}, active...)...).Scan(&n); err != nil {
				return fmt.Errorf("count active runs of batch %s: %w", r.BatchID, err)
			}
			if n >= maxParallel {
				return nil
			}
		}
		next := r
		t := msTime(at)
		next.State, next.StartedAt, next.UpdatedAt, next.Version = runs.Preparing, &t, t, r.Version+1
		next = normalizeRun(next)
		if err := updateRun(ctx, tx, next); err != nil {
			return err
		}
		if err := appendRunEvents(ctx, tx, ev); err != nil {
			return err
		}
		r, claimed = next, true
		return nil
	})
	if err != nil {
		return runs.Run{}, false, s.opErr("claim run", id, err)
	}
	return r, claimed, nil
}

// RunEvents returns run runID's events with seq after after, oldest first, at most limit
// (default and most runs.MaxEventsPage); RUN_NOT_FOUND for an unknown run.
func (s *Store) RunEvents(ctx context.Context, runID string, after int64, limit int) ([]runs.Event, error) {
	lim, err := listLimit("limit", limit, runs.MaxEventsPage, runs.MaxEventsPage)
	if err != nil {
		return nil, s.opErr("run events", runID, err)
	}
	if after < 0 {
		return nil, s.opErr("run events", runID, errcode.New(errcode.InvalidArgument, "after must be 0 or more, not %d", after).With("argument", "after"))
	}
	rows, err := s.read.QueryContext(ctx, `SELECT seq, run_id, time, from_state, to_state, phase, reason FROM run_events
		WHERE run_id = ? AND seq > ? ORDER BY seq LIMIT ?`, runID, after, lim)
	if err != nil {
		return nil, s.opErr("run events", runID, err)
	}
	defer rows.Close()
	out := []runs.Event{}
	for rows.Next() {
		var ev runs.Event
		var at int64
		var from, to string
		if err := rows.Scan(&ev.Seq, &ev.RunID, &at, &from, &to, &ev.Phase, &ev.Reason); err != nil {
			return nil, s.opErr("run events", runID, err)
		}
		ev.Time, ev.From, ev.To = fromMillis(at), runs.State(from), runs.State(to)
		out = append(out, ev)
	}
	if err := rows.Err(); err != nil {
		return nil, s.opErr("run events", runID, err)
	}
	if len(out) == 0 {
		var one int
		err := s.read.QueryRowContext(ctx, `SELECT 1 FROM runs WHERE id = ?`, runID).Scan(&one)
		if errors.Is(err, sql.ErrNoRows) {
			return nil, s.opErr("run events", runID, runNotFound(runID))
		}
		if err != nil {
			return nil, s.opErr("run events", runID, err)
		}
	}
	return out, nil
}

// CreateBatch inserts b (version 1) and runs, evs[i] being runs[i]'s first event, in one
// transaction; or returns the batch b.Owner already has under b.IdempotencyKey (created false,
// nothing inserted). Each run must be b's (BatchID b.ID or empty, Owner b.Owner).
func (s *Store) CreateBatch(ctx context.Context, b runs.Batch, rs []runs.Run, evs []runs.Event) (runs.Batch, bool, error) {
	fail := func(err error) (runs.Batch, bool, error) {
		return runs.Batch{}, false, s.opErr("create batch", b.ID, err)
	}
	if b.ID == "" {
		return fail(errcode.New(errcode.InvalidArgument, "a batch record needs an id"))
	}
	if b.Version == 0 {
		b.Version = 1
	}
	if b.Version != 1 {
		return fail(errcode.New(errcode.InvalidArgument, "a new batch record must have version 1, not %d", b.Version))
	}
	if len(evs) != len(rs) {
		return fail(errcode.New(errcode.InvalidArgument, "batch %s: %d runs were given with %d first events; each run needs one", b.ID, len(rs), len(evs)))
	}
	if most := max(runs.MaxBatchRuns, runs.MaxMatrixCells, 2*runs.MaxRepetitions); len(rs) > most {
		return fail(errcode.New(errcode.InvalidArgument, "batch %s has %d runs, more than %d", b.ID, len(rs), most))
	}
	rs, evs = slices.Clone(rs), slices.Clone(evs)
	for i := range rs {
		if rs[i].BatchID == "" {
			rs[i].BatchID = b.ID
		}
		if rs[i].BatchID != b.ID || rs[i].Owner != b.Owner {
			return fail(errcode.New(errcode.InvalidArgument, "run %s (batch %q, owner %q) is not of batch %s (owner %q)",
				rs[i].ID, rs[i].BatchID, rs[i].Owner, b.ID, b.Owner))
		}
		var err error
		if rs[i], err = newRun(rs[i], &evs[i]); err != nil {
			return fail(err)
		}
	}
	b = normalizeBatch(b)
	doc, err := json.Marshal(b)
	if err != nil {
		return fail(fmt.Errorf("encode batch record: %w", err))
	}
	var existing runs.Batch
	found := false
	err = s.inTx(ctx, func(tx *Tx) error {
		if b.IdempotencyKey != "" {
			var err error
			existing, err = scanBatch(tx.QueryRowContext(ctx, `SELECT `+batchColumns+` FROM batches WHERE owner = ? AND idempotency_key = ?`,
				b.Owner, b.IdempotencyKey))
			if err == nil {
				found = true
				return nil
			}
			if !errors.Is(err, sql.ErrNoRows) {
				return fmt.Errorf("look up idempotency key: %w", err)
			}
		}
		var settled any
		if b.SettledAt != nil {
			settled = millis(*b.SettledAt)
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO batches (id, owner, idempotency_key, kind, created_at, settled_at, version, doc)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?)`, b.ID, b.Owner, b.IdempotencyKey, b.Kind, millis(b.CreatedAt), settled, b.Version, string(doc))
		if isPrimaryKeyViolation(err) {
			return errcode.Wrap(errcode.Conflict, err, "batch %s already exists", b.ID)
		}
		if isUniqueViolation(err) {
			return errcode.Wrap(errcode.Conflict, err, "idempotency key %q was already used by this owner", b.IdempotencyKey)
		}
		if err != nil {
			return fmt.Errorf("insert batch: %w", err)
		}
		for i := range rs {
			if err := insertRun(ctx, tx, rs[i], evs[i]); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fail(err)
	}
	if found {
		return existing, false, nil
	}
	return b, true, nil
}

// GetBatch returns the batch with id as last written, or RUN_NOT_FOUND.
func (s *Store) GetBatch(ctx context.Context, id string) (runs.Batch, error) {
	b, err := scanBatch(s.read.QueryRowContext(ctx, `SELECT `+batchColumns+` FROM batches WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return runs.Batch{}, s.opErr("get batch", id, batchNotFound(id))
	}
	if err != nil {
		return runs.Batch{}, s.opErr("get batch", id, err)
	}
	return b, nil
}

// UpdateBatch writes b if the stored version is b.Version-1 (else CONFLICT, or RUN_NOT_FOUND);
// its owner and idempotency key never change.
func (s *Store) UpdateBatch(ctx context.Context, b runs.Batch) error {
	if b.ID == "" || b.Version < 2 {
		return s.opErr("update batch", b.ID, errcode.New(errcode.InvalidArgument, "an updated batch record needs an id and a version of 2 or more (it has %d)", b.Version))
	}
	b = normalizeBatch(b)
	doc, err := json.Marshal(b)
	if err != nil {
		return s.opErr("update batch", b.ID, fmt.Errorf("encode batch record: %w", err))
	}
	var settled any
	if b.SettledAt != nil {
		settled = millis(*b.SettledAt)
	}
	err = s.inTx(ctx, func(tx *Tx) error {
		res, err := tx.ExecContext(ctx, `UPDATE batches SET kind = ?, settled_at = ?, version = ?, doc = ? WHERE id = ? AND version = ?`,
			b.Kind, settled, b.Version, string(doc), b.ID, b.Version-1)
		if err != nil {
			return fmt.Errorf("update: %w", err)
		}
		return versioned(ctx, tx, res, "batch "+b.ID, b.Version-1, func() error { return batchNotFound(b.ID) },
			`SELECT version FROM batches WHERE id = ?`, b.ID)
	})
	if err != nil {
		return s.opErr("update batch", b.ID, err)
	}
	return nil
}

// ListBatches returns owner's batches (every owner's if owner is ""), newest first, created
// before the batch before (if set), at most limit (default runs.DefaultList, at most
// runs.MaxList); Next is the last batch's id when more match.
func (s *Store) ListBatches(ctx context.Context, owner string, before string, limit int) (runs.BatchList, error) {
	fail := func(err error) (runs.BatchList, error) {
		return runs.BatchList{}, fmt.Errorf("%s: list batches: %w", s.name, err)
	}
	lim, err := listLimit("limit", limit, runs.DefaultList, runs.MaxList)
	if err != nil {
		return fail(err)
	}
	where := []string{"1 = 1"}
	var args []any
	if owner != "" {
		where, args = append(where, "owner = ?"), append(args, owner)
	}
	if before != "" {
		cond, cargs, err := s.cursor(ctx, "batches", "batch", before)
		if err != nil {
			return fail(err)
		}
		where, args = append(where, cond), append(args, cargs...)
	}
	rows, err := s.read.QueryContext(ctx, `SELECT `+batchColumns+` FROM batches WHERE `+strings.Join(where, " AND ")+
		` ORDER BY created_at DESC, id DESC LIMIT ?`, append(args, lim+1)...)
	if err != nil {
		return fail(err)
	}
	defer rows.Close()
	list := runs.BatchList{Batches: []runs.Batch{}}
	for rows.Next() {
		b, err := scanBatch(rows)
		if err != nil {
			return fail(err)
		}
		list.Batches = append(list.Batches, b)
	}
	if err := rows.Err(); err != nil {
		return fail(err)
	}
	if len(list.Batches) > lim {
		list.Batches = list.Batches[:lim]
		list.Next = list.Batches[lim-1].ID
	}
	return list, nil
}

// BatchCounts returns how many of batch batchID's runs are in each state (RUN_NOT_FOUND for an
// unknown batch).
func (s *Store) BatchCounts(ctx context.Context, batchID string) (map[runs.State]int, error) {
	var one int
	err := s.read.QueryRowContext(ctx, `SELECT 1 FROM batches WHERE id = ?`, batchID).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, s.opErr("count runs of batch", batchID, batchNotFound(batchID))
	}
	if err != nil {
		return nil, s.opErr("count runs of batch", batchID, err)
	}
	rows, err := s.read.QueryContext(ctx, `SELECT state, COUNT(*) FROM runs WHERE batch_id = ? GROUP BY state`, batchID)
	if err != nil {
		return nil, s.opErr("count runs of batch", batchID, err)
	}
	defer rows.Close()
	out := map[runs.State]int{}
	for rows.Next() {
		var st string
		var n int
		if err := rows.Scan(&st, &n); err != nil {
			return nil, s.opErr("count runs of batch", batchID, err)
		}
		out[runs.State(st)] = n
	}
	if err := rows.Err(); err != nil {
		return nil, s.opErr("count runs of batch", batchID, err)
	}
	return out, nil
}

// PruneRuns deletes the runs settled before t with their events, then the batches none of
// whose runs remain and that settled (or, never marked settled, were created) before t, in
// one transaction; it returns the ids of the runs deleted.
func (s *Store) PruneRuns(ctx context.Context, t time.Time) ([]string, error) {
	cut := millis(t)
	ids := []string{}
	err := s.inTx(ctx, func(tx *Tx) error {
		rows, err := tx.QueryContext(ctx, `SELECT id FROM runs WHERE settled_at IS NOT NULL AND settled_at < ? ORDER BY settled_at, id`, cut)
		if err != nil {
			return fmt.Errorf("select: %w", err)
		}
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				rows.Close()
				return fmt.Errorf("select: %w", err)
			}
			ids = append(ids, id)
		}
		if err := errors.Join(rows.Err(), rows.Close()); err != nil {
			return fmt.Errorf("select: %w", err)
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM run_events WHERE run_id IN (
			SELECT id FROM runs WHERE settled_at IS NOT NULL AND settled_at < ?)`, cut); err != nil {
			return fmt.Errorf("delete events: %w", err)
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM runs WHERE settled_at IS NOT NULL AND settled_at < ?`, cut); err != nil {
			return fmt.Errorf("delete runs: %w", err)
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM batches WHERE COALESCE(settled_at, created_at) < ?
			AND NOT EXISTS (SELECT 1 FROM runs WHERE runs.batch_id = batches.id)`, cut); err != nil {
			return fmt.Errorf("delete batches: %w", err)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("%s: prune runs settled before %s: %w", s.name, t.UTC().Format(time.RFC3339Nano), err)
	}
	return ids, nil
}
