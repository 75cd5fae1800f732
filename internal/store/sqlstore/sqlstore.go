// Package sqlstore is the SQL implementation of agentbox's durable store (store.Store), shared by
// its SQL drivers (internal/store/sqlite, internal/store/postgres) and written on database/sql.
//
// The SQL is portable by design (times are BIGINT unix milliseconds, maps JSON text, booleans
// BOOLEAN); what differs between databases is a small Dialect: how placeholders are written
// (`?` here, rebound to `$N` once per query string for Postgres), how a constraint violation is
// recognised, what a write transaction does first (Postgres takes one advisory lock, so writes
// are serialised across processes as SQLite's single writer serialises them), and the few
// expressions that are not standard SQL. A driver opens the database, migrates it and hands
// New its write and read pools.
package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/agentbox/agentbox/internal/errcode"
)

// ErrorKind is what a database error means to the store.
type ErrorKind int

// The error kinds a Dialect's Classify tells apart.
const (
	ErrOther      ErrorKind = iota
	ErrUnique               // a UNIQUE constraint or unique index (other than the primary key)
	ErrPrimaryKey           // the primary key
)

// Dialect is what differs between the SQL databases the store runs on.
type Dialect struct {
	// Name prefixes every error the store returns ("sqlite", "postgres").
	Name string
	// Numbered rewrites the `?` placeholders of every query as $1, $2, … (Postgres).
	Numbered bool
	// Classify tells what a database error means; nil reads every error as ErrOther.
	Classify func(err error) ErrorKind
	// Unavailable says why err means the database refuses work now — its disk is full, it is
	// read-only, down or restarting — and what to do ("" for any other error): the store then
	// returns UNAVAILABLE (errcode), which every surface answers 503 with a Retry-After.
	Unavailable func(err error) string
	// BeginWrite runs first in every write transaction (nil: nothing). Postgres takes its
	// advisory transaction lock here.
	BeginWrite func(ctx context.Context, tx *sql.Tx) error
	// Notify runs last, before commit, in a write transaction that appended sandbox or run
	// events (nil: nothing). Postgres sends its NOTIFY here, delivered on commit.
	Notify func(ctx context.Context, tx *sql.Tx) error
	// LimitAll is the LIMIT that means no limit, before an OFFSET ("-1", "ALL").
	LimitAll string
	// NowMillis is an expression for the database clock's current time in unix milliseconds.
	NowMillis string
	// RunLabelMatch is the condition that a run's spec carries label ? with value ? (two
	// placeholders: name, then value); its document is runs.doc, JSON text.
	RunLabelMatch string
}

// Store is a store.Store (all of it but execute_sql, which each driver provides over its own
// published views) on a SQL database. It is safe for concurrent use.
type Store struct {
	d     Dialect
	name  string
	write *DB      // where every write transaction runs
	read  *DB      // reads; may be the same pool as write
	binds sync.Map // query string → its rebound form (Numbered only)
}

// New returns a Store on write (where write transactions run) and read (reads; may be write).
// The Store owns both: Close closes them.
func New(d Dialect, write, read *sql.DB) *Store {
	if d.LimitAll == "" {
		d.LimitAll = "ALL"
	}
	s := &Store{d: d, name: d.Name}
	s.write = &DB{db: write, s: s, writer: true}
	s.read = &DB{db: read, s: s}
	return s
}

// Close closes the store's pools. It is safe to call more than once.
func (s *Store) Close() error {
	var errs []error
	if s.read.db != s.write.db {
		errs = append(errs, s.read.db.Close())
	}
	errs = append(errs, s.write.db.Close())
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%s: close: %w", s.name, err)
	}
	return nil
}

// bind rewrites q's placeholders for the dialect, caching the result per query string.
func (s *Store) bind(q string) string {
	if !s.d.Numbered {
		return q
	}
	if b, ok := s.binds.Load(q); ok {
		return b.(string)
	}
	b := Rebind(q)
	s.binds.Store(q, b)
	return b
}

// Rebind rewrites each `?` placeholder of q outside quotes and comments as $1, $2, ….
func Rebind(q string) string {
	var b strings.Builder
	b.Grow(len(q) + 16)
	n := 0
	for i := 0; i < len(q); i++ {
		c := q[i]
		switch {
		case c == '\'' || c == '"':
			j := i + 1
			for j < len(q) {
				if q[j] == c {
					if j+1 < len(q) && q[j+1] == c { // a doubled quote inside the literal
						j += 2
						continue
					}
					break
				}
				j++
			}
			end := min(j+1, len(q))
			b.WriteString(q[i:end])
			i = end - 1
		case c == '-' && i+1 < len(q) && q[i+1] == '-':
			j := strings.IndexByte(q[i:], '\n')
			if j < 0 {
				j = len(q) - i
			}
			b.WriteString(q[i : i+j])
			i += j - 1
		case c == '?':
			n++
			b.WriteByte('$')
			b.WriteString(strconv.Itoa(n))
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

// dbError is a database error the dialect classified.
type dbError struct {
	kind ErrorKind
	err  error
}

func (e *dbError) Error() string { return e.err.Error() }
func (e *dbError) Unwrap() error { return e.err }

// classify wraps err with its kind, so isUniqueViolation and isPrimaryKeyViolation read it,
// and a database that refuses work now as UNAVAILABLE.
func (s *Store) classify(err error) error {
	if err == nil {
		return nil
	}
	if _, typed := errcode.As(err); typed {
		return err
	}
	if s.d.Unavailable != nil {
		if why := s.d.Unavailable(err); why != "" {
			return errcode.Wrap(errcode.Unavailable, err, "the server's store (%s) refuses work now: %s; nothing of this call was acknowledged, retry shortly", s.name, why).
				With("retry_after_seconds", errcode.RetryAfterSeconds)
		}
	}
	if s.d.Classify == nil {
		return err
	}
	if k := s.d.Classify(err); k != ErrOther {
		return &dbError{kind: k, err: err}
	}
	return err
}

func isUniqueViolation(err error) bool {
	var e *dbError
	return errors.As(err, &e) && e.kind == ErrUnique
}

func isPrimaryKeyViolation(err error) bool {
	var e *dbError
	return errors.As(err, &e) && e.kind == ErrPrimaryKey
}

// DB is a pool whose queries are written with `?` placeholders.
type DB struct {
	db     *sql.DB
	s      *Store
	writer bool
}

// ExecContext runs a statement. On the writer of a dialect with a BeginWrite, the statement
// runs in a write transaction of its own, so it is serialised like every other write.
func (d *DB) ExecContext(ctx context.Context, q string, args ...any) (sql.Result, error) {
	if d.writer && d.s.d.BeginWrite != nil {
		var res sql.Result
		err := d.s.inTx(ctx, func(tx *Tx) error {
			var err error
			res, err = tx.ExecContext(ctx, q, args...)
			return err
		})
		return res, err
	}
	res, err := d.db.ExecContext(ctx, d.s.bind(q), args...)
	return res, d.s.classify(err)
}

// QueryContext runs a query.
func (d *DB) QueryContext(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	rows, err := d.db.QueryContext(ctx, d.s.bind(q), args...)
	return rows, d.s.classify(err)
}

// QueryRowContext runs a query expected to return at most one row.
func (d *DB) QueryRowContext(ctx context.Context, q string, args ...any) *Row {
	return &Row{r: d.db.QueryRowContext(ctx, d.s.bind(q), args...), s: d.s}
}

// Row is a *sql.Row whose errors are classified like every other of the store's.
type Row struct {
	r *sql.Row
	s *Store
}

// Scan copies the row's columns into dest (sql.ErrNoRows when there is none).
func (r *Row) Scan(dest ...any) error {
	err := r.r.Scan(dest...)
	if errors.Is(err, sql.ErrNoRows) {
		return err
	}
	return r.s.classify(err)
}

// Err is the error of the query, if any.
func (r *Row) Err() error { return r.s.classify(r.r.Err()) }

// Tx is a write transaction whose statements are written with `?` placeholders.
type Tx struct {
	tx      *sql.Tx
	s       *Store
	changed bool // events or run events were appended: notify on commit
}

// ExecContext runs a statement in the transaction.
func (t *Tx) ExecContext(ctx context.Context, q string, args ...any) (sql.Result, error) {
	res, err := t.tx.ExecContext(ctx, t.s.bind(q), args...)
	return res, t.s.classify(err)
}

// QueryContext runs a query in the transaction.
func (t *Tx) QueryContext(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	rows, err := t.tx.QueryContext(ctx, t.s.bind(q), args...)
	return rows, t.s.classify(err)
}

// QueryRowContext runs a query expected to return at most one row in the transaction.
func (t *Tx) QueryRowContext(ctx context.Context, q string, args ...any) *Row {
	return &Row{r: t.tx.QueryRowContext(ctx, t.s.bind(q), args...), s: t.s}
}

// inTx runs fn in a write transaction, committing if fn returns nil. SQLite's writer begins
// IMMEDIATE (one connection, so writers queue in Go); Postgres's BeginWrite takes the advisory
// lock every write transaction takes, so fn holds the write lock from its first statement.
func (s *Store) inTx(ctx context.Context, fn func(tx *Tx) error) error {
	sqlTx, err := s.write.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin: %w", s.classify(err))
	}
	tx := &Tx{tx: sqlTx, s: s}
	if s.d.BeginWrite != nil {
		if err := s.d.BeginWrite(ctx, sqlTx); err != nil {
			return errors.Join(fmt.Errorf("begin write: %w", s.classify(err)), rollback(sqlTx))
		}
	}
	if err := fn(tx); err != nil {
		return errors.Join(s.classify(err), rollback(sqlTx))
	}
	if tx.changed && s.d.Notify != nil {
		if err := s.d.Notify(ctx, sqlTx); err != nil {
			return errors.Join(fmt.Errorf("notify: %w", err), rollback(sqlTx))
		}
	}
	if err := sqlTx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", s.classify(err))
	}
	return nil
}

// rollback rolls tx back, ignoring the error of a transaction that already ended.
func rollback(tx *sql.Tx) error {
	if err := tx.Rollback(); err != nil && !errors.Is(err, sql.ErrTxDone) {
		return fmt.Errorf("rollback: %w", err)
	}
	return nil
}

// PrepareContext prepares a statement in the transaction.
func (t *Tx) PrepareContext(ctx context.Context, q string) (*sql.Stmt, error) {
	st, err := t.tx.PrepareContext(ctx, t.s.bind(q))
	return st, t.s.classify(err)
}
