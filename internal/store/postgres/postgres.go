// Package postgres is the Postgres driver of agentbox's durable store (store.Store), on
// jackc/pgx/v5 through its database/sql adapter, sharing the SQL of internal/store/sqlstore.
//
// Writes are serialised as SQLite's single writer serialises them, across every process on the
// database: each write transaction first takes one transaction-scoped advisory lock
// (pg_advisory_xact_lock(writeLock)), so admission counts, id-range allocation, quotas and the
// order of event seqs behave exactly as on SQLite, for several agentbox replicas at once. Reads
// run without it, READ COMMITTED. The schema is created and upgraded by embedded, versioned
// migrations (migrations/NNNN_name.sql, the same numbers as SQLite's) under a second advisory
// lock, so two processes opening one database at once migrate it once. A write transaction that
// appended sandbox or run events sends NOTIFY agentbox_events, delivered on commit; Changes
// LISTENs for it on a connection of its own.
package postgres

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"embed"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/agentbox/agentbox/internal/store"
	"github.com/agentbox/agentbox/internal/store/sqlstore"
)

// Advisory lock keys (one 64-bit space per database): writeLock is taken by every write
// transaction, migrateLock while the schema is migrated.
const (
	writeLock   int64 = 0x6167656e74626f78 // "agentbox"
	migrateLock int64 = 0x6167656e74626f79
)

// Channel is the NOTIFY channel a write transaction that appended events signals on.
const Channel = "agentbox_events"

// maxConns bounds the store's connections to the database (Changes adds one of its own).
const maxConns = 16

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Store is a store.Store on one Postgres database. It is safe for concurrent use.
type Store struct {
	*sqlstore.Store
	db      *sql.DB
	cfg     *pgx.ConnConfig
	where   string // the DSN without its password, for errors
	schema  int64  // the schema version after Open
	queryOK error  // why execute_sql cannot run (nil: it can)
}

var _ store.Store = (*Store)(nil)

// dialect is Postgres's: $N placeholders, SQLSTATE 23505 (a primary key's constraint is named
// <table>_pkey), the advisory write lock, NOTIFY, LIMIT ALL and jsonb.
var dialect = sqlstore.Dialect{
	Name:        "postgres",
	Numbered:    true,
	Classify:    classify,
	Unavailable: unavailable,
	BeginWrite: func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock($1)`, writeLock)
		return err
	},
	Notify: func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `SELECT pg_notify($1, '')`, Channel)
		return err
	},
	LimitAll:      "ALL",
	NowMillis:     `(extract(epoch FROM clock_timestamp()) * 1000)::bigint`,
	RunLabelMatch: `(runs.doc::jsonb -> 'spec' -> 'labels' ->> ?) = ?`,
}

// unavailable says why err means Postgres cannot take work now: it is out of disk, memory or
// connections, shutting down or starting, read-only (a standby), or the connection to it failed.
func unavailable(err error) string {
	var e *pgconn.PgError
	if errors.As(err, &e) {
		switch {
		case e.Code == "53100":
			return "Postgres is out of disk space (" + e.Message + "); free space on its data directory"
		case strings.HasPrefix(e.Code, "53"):
			return "Postgres is out of resources (" + e.Code + ": " + e.Message + ")"
		case strings.HasPrefix(e.Code, "57P"), strings.HasPrefix(e.Code, "08"):
			return "Postgres is shutting down, starting or unreachable (" + e.Code + ": " + e.Message + ")"
		case e.Code == "25006":
			return "Postgres accepts no writes (a read-only standby?)"
		}
		return ""
	}
	var ce *pgconn.ConnectError
	var ne net.Error
	switch {
	case errors.As(err, &ce):
		return "Postgres cannot be reached"
	case errors.Is(err, driver.ErrBadConn), errors.Is(err, io.ErrUnexpectedEOF), errors.As(err, &ne), pgconn.SafeToRetry(err):
		return "the connection to Postgres failed"
	}
	return ""
}

func classify(err error) sqlstore.ErrorKind {
	var e *pgconn.PgError
	if !errors.As(err, &e) || e.Code != "23505" {
		return sqlstore.ErrOther
	}
	if strings.HasSuffix(e.ConstraintName, "_pkey") {
		return sqlstore.ErrPrimaryKey
	}
	return sqlstore.ErrUnique
}

// Redact returns dsn with any password replaced by "xxxxx", for logs and errors.
func Redact(dsn string) string {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return "postgres://… (a DSN that does not parse as a URL)"
		}
		if _, ok := u.User.Password(); ok {
			u.User = url.UserPassword(u.User.Username(), "xxxxx")
		}
		q := u.Query()
		if q.Has("password") {
			q.Set("password", "xxxxx")
			u.RawQuery = q.Encode()
		}
		return u.String()
	}
	return kvPassword.ReplaceAllString(dsn, "password=xxxxx")
}

// kvPassword matches a password in a key=value DSN, quoted or not.
var kvPassword = regexp.MustCompile(`password\s*=\s*('(?:[^'\\]|\\.)*'|\S+)`)

// Open connects to the Postgres database of dsn (a postgres:// URL or key=value DSN) and
// migrates its schema to the newest version this binary knows. It refuses a database whose
// schema is newer than that. Errors never hold the DSN's password.
func Open(ctx context.Context, dsn string) (*Store, error) {
	where := Redact(dsn)
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		// pgx's parse error may quote the DSN: say only what is wrong with it.
		return nil, fmt.Errorf("postgres: open %s: the DSN does not parse; it must be postgres://user:password@host:port/database?sslmode=… or key=value pairs", where)
	}
	ms, err := loadMigrations()
	if err != nil {
		return nil, fmt.Errorf("postgres: open %s: %w", where, err)
	}
	db := stdlib.OpenDB(*cfg)
	db.SetMaxOpenConns(maxConns)
	db.SetMaxIdleConns(maxConns)
	db.SetConnMaxIdleTime(5 * time.Minute)
	fail := func(err error) (*Store, error) {
		_ = db.Close()
		return nil, fmt.Errorf("postgres: open %s: %w", where, err)
	}
	if err := db.PingContext(ctx); err != nil {
		return fail(err)
	}
	schema, err := migrate(ctx, db, ms)
	if err != nil {
		return fail(err)
	}
	s := &Store{Store: sqlstore.New(dialect, db, db), db: db, cfg: cfg, where: where, schema: schema}
	s.queryOK = setupViews(ctx, db)
	return s, nil
}

// Close closes the store's connections. It is safe to call more than once.
func (s *Store) Close() error { return s.Store.Close() }

// migration is one schema step (sqlstore.Migration, shared with the SQLite driver).
type migration = sqlstore.Migration

// loadMigrations reads the embedded Postgres migrations.
func loadMigrations() ([]migration, error) {
	sub, err := fs.Sub(migrationFiles, "migrations")
	if err != nil {
		return nil, err
	}
	return sqlstore.LoadMigrations(sub)
}

// migrate brings db's schema to the newest of ms in one transaction holding migrateLock, so a
// second process opening the database at the same time waits and then finds it migrated. It
// returns the schema version.
func migrate(ctx context.Context, db *sql.DB, ms []migration) (_ int64, err error) {
	latest := ms[len(ms)-1].Version
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("migrate: begin: %w", err)
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock($1)`, migrateLock); err != nil {
		return 0, fmt.Errorf("migrate: lock: %w", err)
	}
	if _, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
    version    BIGINT PRIMARY KEY,
    name       TEXT NOT NULL,
    applied_at BIGINT NOT NULL
)`); err != nil {
		return 0, fmt.Errorf("migrate: create schema_migrations: %w", err)
	}
	var current int64
	if err := tx.QueryRowContext(ctx, `SELECT COALESCE(MAX(version), 0) FROM schema_migrations`).Scan(&current); err != nil {
		return 0, fmt.Errorf("migrate: read schema version: %w", err)
	}
	if current > latest {
		return 0, fmt.Errorf("migrate: database schema version %d is newer than the newest this agentbox binary knows (%d); upgrade agentbox, or point it at another database", current, latest)
	}
	now := time.Now().UnixMilli()
	for _, m := range ms {
		if m.Version <= current {
			continue
		}
		if _, err := tx.ExecContext(ctx, m.SQL); err != nil {
			return 0, fmt.Errorf("migrate: apply %s: %w", m.Name, err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO schema_migrations (version, name, applied_at) VALUES ($1, $2, $3)`,
			m.Version, m.Name, now); err != nil {
			return 0, fmt.Errorf("migrate: record %s: %w", m.Name, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("migrate: commit: %w", err)
	}
	return latest, nil
}

// Info describes the store (store.Describer): the driver, the server's version, the schema
// version and where it is (the DSN without its password).
func (s *Store) Info(ctx context.Context) (store.Info, error) {
	var v string
	if err := s.db.QueryRowContext(ctx, `SHOW server_version`).Scan(&v); err != nil {
		return store.Info{}, fmt.Errorf("postgres: %s: server version: %w", s.where, err)
	}
	return store.Info{Driver: "postgres", Version: v, Schema: s.schema, Location: s.where}, nil
}

// SchemaVersion is the newest schema version this binary's migrations reach.
func SchemaVersion() int64 {
	ms, err := loadMigrations()
	if err != nil || len(ms) == 0 {
		return 0
	}
	return ms[len(ms)-1].Version
}

// Probe describes the database of dsn without migrating it (agentbox doctor): schema 0 when
// agentbox never opened it. Errors never hold the DSN's password.
func Probe(ctx context.Context, dsn string) (store.Info, error) {
	in := store.Info{Driver: "postgres", Location: Redact(dsn)}
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return in, fmt.Errorf("postgres: %s: the DSN does not parse", in.Location)
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return in, fmt.Errorf("postgres: connect to %s: %w", in.Location, err)
	}
	defer conn.Close(context.Background())
	if err := conn.QueryRow(ctx, `SHOW server_version`).Scan(&in.Version); err != nil {
		return in, fmt.Errorf("postgres: %s: server version: %w", in.Location, err)
	}
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT to_regclass('schema_migrations') IS NOT NULL`).Scan(&exists); err != nil {
		return in, fmt.Errorf("postgres: %s: schema version: %w", in.Location, err)
	}
	if exists {
		if err := conn.QueryRow(ctx, `SELECT COALESCE(MAX(version), 0) FROM schema_migrations`).Scan(&in.Schema); err != nil {
			return in, fmt.Errorf("postgres: %s: schema version: %w", in.Location, err)
		}
	}
	return in, nil
}
