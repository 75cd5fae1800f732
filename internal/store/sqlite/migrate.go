package sqlite

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"time"

	"github.com/agentbox/agentbox/internal/store/sqlstore"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// migration is one schema step (sqlstore.Migration, shared with the Postgres driver).
type migration = sqlstore.Migration

// embeddedMigrations returns the migrations compiled into the binary.
func embeddedMigrations() ([]migration, error) {
	sub, err := fs.Sub(migrationFiles, "migrations")
	if err != nil {
		return nil, fmt.Errorf("load migrations: %w", err)
	}
	return loadMigrations(sub)
}

// loadMigrations reads the migrations in fsys (sqlstore.LoadMigrations).
func loadMigrations(fsys fs.FS) ([]migration, error) { return sqlstore.LoadMigrations(fsys) }

// migrate brings db's schema to the newest of ms in one transaction: either every pending
// migration is applied and recorded in schema_migrations, or none is. A database already at the
// newest version is left as it is; one newer than ms knows is refused.
func migrate(ctx context.Context, db *sql.DB, ms []migration) (err error) {
	var latest int64
	if len(ms) > 0 {
		latest = ms[len(ms)-1].Version
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("migrate: begin: %w", err)
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, rollback(tx))
		}
	}()

	if _, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
    version    BIGINT PRIMARY KEY,
    name       TEXT NOT NULL,
    applied_at BIGINT NOT NULL
)`); err != nil {
		return fmt.Errorf("migrate: create schema_migrations: %w", err)
	}
	var current int64
	if err := tx.QueryRowContext(ctx, `SELECT COALESCE(MAX(version), 0) FROM schema_migrations`).Scan(&current); err != nil {
		return fmt.Errorf("migrate: read schema version: %w", err)
	}
	if current > latest {
		return fmt.Errorf("migrate: database schema version %d is newer than the newest this agentbox binary knows (%d); upgrade agentbox, or point it at another database file", current, latest)
	}
	now := time.Now().UnixMilli()
	for _, m := range ms {
		if m.Version <= current {
			continue
		}
		if _, err := tx.ExecContext(ctx, m.SQL); err != nil {
			return fmt.Errorf("migrate: apply %s: %w", m.Name, err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)`,
			m.Version, m.Name, now); err != nil {
			return fmt.Errorf("migrate: record %s: %w", m.Name, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("migrate: commit: %w", err)
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
