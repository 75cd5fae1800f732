// Package sqlite is the SQLite driver of agentbox's durable store (store.Store), built on the
// pure-Go modernc.org/sqlite so the binary needs no cgo.
//
// The database runs in WAL mode with foreign keys on and a busy timeout. Writes go through one
// dedicated connection, each in a BEGIN IMMEDIATE transaction, so writers in this process queue
// in Go instead of racing for SQLite's lock and callers never see SQLITE_BUSY; reads use a
// separate pool of read-only connections that WAL lets run alongside the writer. The schema is
// created and upgraded by embedded, versioned migrations (migrations/NNNN_name.sql) when the
// store is opened.
package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	msqlite "modernc.org/sqlite" // also registers the "sqlite" database/sql driver
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/agentbox/agentbox/internal/store"
	"github.com/agentbox/agentbox/internal/store/sqlstore"
)

// busyTimeoutMS is how long a connection waits for a lock held by another connection (another
// process, or this process's writer during a checkpoint) before giving up.
const busyTimeoutMS = 10000

// Store is a store.Store on one SQLite database file. It is safe for concurrent use.
type Store struct {
	*sqlstore.Store // the SQL shared with the other drivers, in the SQLite dialect
	path            string
	write           *sql.DB // exactly one connection: every write is serialized in-process
	read            *sql.DB // read-only connections; the same pool as write for an in-memory database
	// execute_sql's own read-only connections (sqlview.go), opened on first use.
	queryOnce sync.Once
	query     *sql.DB
	queryErr  error
	optMu     sync.Mutex
	optAt     time.Time // the last planner-statistics refresh (maybeOptimize)
}

var _ store.Store = (*Store)(nil)

// Open opens (creating if needed) the SQLite database at path and migrates its schema to the
// newest version this binary knows. It refuses a database whose schema is newer than that.
// The path ":memory:" opens a private in-memory database, for tests.
func Open(ctx context.Context, path string) (*Store, error) {
	if path == "" {
		return nil, errors.New("sqlite: open: empty database path")
	}
	migrations, err := embeddedMigrations()
	if err != nil {
		return nil, fmt.Errorf("sqlite: open %s: %w", path, err)
	}

	write, err := sql.Open("sqlite", dsn(path, false))
	if err != nil {
		return nil, fmt.Errorf("sqlite: open %s: %w", path, err)
	}
	write.SetMaxOpenConns(1)
	write.SetMaxIdleConns(1)
	write.SetConnMaxLifetime(0)
	write.SetConnMaxIdleTime(0)
	s := &Store{path: path, write: write, read: write}
	done := func() (*Store, error) {
		s.Store = sqlstore.New(dialect, s.write, s.read)
		return s, nil
	}

	if err := migrate(ctx, write, migrations); err != nil {
		_ = write.Close()
		return nil, fmt.Errorf("sqlite: open %s: %w", path, err)
	}
	if path == ":memory:" {
		// Every connection to ":memory:" is a database of its own: share the writer.
		return done()
	}
	// The database holds sandboxes' environments. Its directory is searchable by others (a
	// state dir must be, for sandboxes in user namespaces), so the files themselves are
	// private; SQLite gives the WAL and shared-memory files it creates later the database's
	// mode.
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		if err := os.Chmod(p, 0o600); err != nil && !errors.Is(err, fs.ErrNotExist) {
			_ = write.Close()
			return nil, fmt.Errorf("sqlite: open %s: make it private: %w", path, err)
		}
	}

	read, err := sql.Open("sqlite", dsn(path, true))
	if err != nil {
		_ = write.Close()
		return nil, fmt.Errorf("sqlite: open %s for reading: %w", path, err)
	}
	if err := read.PingContext(ctx); err != nil {
		_ = read.Close()
		_ = write.Close()
		return nil, fmt.Errorf("sqlite: open %s for reading: %w", path, err)
	}
	s.read = read
	return done()
}

// Close closes the database. It is safe to call more than once.
func (s *Store) Close() error {
	var errs []error
	s.queryOnce.Do(func() {}) // no execute_sql pool opens after Close
	if s.query != nil {
		if err := s.query.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := s.Store.Close(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("sqlite: close %s: %w", s.path, err)
	}
	return nil
}

// dialect is SQLite's: `?` placeholders, modernc.org/sqlite's extended result codes for
// constraint violations, no write hook (the writer's transactions begin IMMEDIATE on its one
// connection), LIMIT -1 and json_each.
var dialect = sqlstore.Dialect{
	Name:          "sqlite",
	Classify:      classify,
	Unavailable:   unavailable,
	LimitAll:      "-1",
	NowMillis:     `CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)`,
	RunLabelMatch: `EXISTS (SELECT 1 FROM json_each(runs.doc, '$.spec.labels') AS l WHERE l.key = ? AND l.value = ?)`,
}

// unavailable says why err means the database cannot take work now: its file system is full,
// read-only or failing, or its lock stayed held past the busy timeout.
func unavailable(err error) string {
	var e *msqlite.Error
	if !errors.As(err, &e) {
		// Some paths (a COMMIT's) report the result only in the text.
		switch msg := err.Error(); {
		case strings.Contains(msg, "database or disk is full"), errors.Is(err, syscall.ENOSPC):
			return "the file system of its database is full; free space there (the state dir)"
		case strings.Contains(msg, "disk I/O error"):
			return "its database file cannot be read or written (an I/O error, often a full or failing disk); check the state dir's file system"
		}
		return ""
	}
	switch e.Code() & 0xff {
	case sqlite3.SQLITE_FULL:
		return "the file system of its database is full; free space there (the state dir)"
	case sqlite3.SQLITE_IOERR:
		return "its database file cannot be read or written (an I/O error, often a full or failing disk); check the state dir's file system"
	case sqlite3.SQLITE_READONLY:
		return "its database is read-only; make the state dir writable"
	case sqlite3.SQLITE_CANTOPEN:
		return "its database file cannot be opened; check the state dir"
	case sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED:
		return "its database stayed locked by another writer past the busy timeout"
	}
	return ""
}

// classify tells a unique-index violation from a primary-key one.
func classify(err error) sqlstore.ErrorKind {
	var e *msqlite.Error
	if !errors.As(err, &e) {
		return sqlstore.ErrOther
	}
	switch e.Code() {
	case sqlite3.SQLITE_CONSTRAINT_UNIQUE:
		return sqlstore.ErrUnique
	case sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY:
		return sqlstore.ErrPrimaryKey
	}
	return sqlstore.ErrOther
}

// dsn returns the modernc.org/sqlite data source name for path. Every connection gets the busy
// timeout and foreign keys; the writer also sets WAL (persistent in the file), synchronous
// NORMAL, and BEGIN IMMEDIATE so a transaction takes the write lock before it reads; readers
// are query_only.
func dsn(path string, readOnly bool) string {
	params := []string{
		fmt.Sprintf("_pragma=busy_timeout(%d)", busyTimeoutMS),
		"_pragma=foreign_keys(1)",
	}
	if readOnly {
		params = append(params, "_pragma=query_only(1)")
	} else {
		params = append(params,
			"_pragma=journal_mode(WAL)",
			// NORMAL in WAL mode: a commit survives the process being killed (SIGKILL loses
			// nothing) and the database never corrupts; only a power loss can drop the last
			// commits — and a power loss ends every sandbox too, which reconcile then records.
			// FULL would fsync on every transition, on the create path.
			"_pragma=synchronous(NORMAL)",
			"_txlock=immediate")
	}
	// A "file:" URI, so that a path holding '?' or '#' cannot be mistaken for parameters.
	// An absolute path gets an empty authority ("file:///..."), so that "//x" stays a path.
	escaped := strings.NewReplacer("%", "%25", "?", "%3f", "#", "%23").Replace(path)
	if strings.HasPrefix(escaped, "/") {
		escaped = "//" + escaped
	}
	return "file:" + escaped + "?" + strings.Join(params, "&")
}
