package sqlite

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// migration is one schema step: migrations/NNNN_name.sql holds version NNNN.
type migration struct {
	version int64
	name    string
	sql     string
}

// embeddedMigrations returns the migrations compiled into the binary.
func embeddedMigrations() ([]migration, error) {
	sub, err := fs.Sub(migrationFiles, "migrations")
	if err != nil {
		return nil, fmt.Errorf("load migrations: %w", err)
	}
	return loadMigrations(sub)
}

// loadMigrations reads every *.sql file at the root of fsys, named NNNN_name.sql, and returns
// them by version. Versions must run 1, 2, 3, ... without gaps or duplicates.
func loadMigrations(fsys fs.FS) ([]migration, error) {
	names, err := fs.Glob(fsys, "*.sql")
	if err != nil {
		return nil, fmt.Errorf("load migrations: %w", err)
	}
	ms := make([]migration, 0, len(names))
	for _, file := range names {
		base := strings.TrimSuffix(path.Base(file), ".sql")
		num, _, ok := strings.Cut(base, "_")
		v, err := strconv.ParseInt(num, 10, 64)
		if !ok || err != nil || v <= 0 {
			return nil, fmt.Errorf("load migration %s: name must be NNNN_description.sql with NNNN > 0", file)
		}
		body, err := fs.ReadFile(fsys, file)
		if err != nil {
			return nil, fmt.Errorf("load migration %s: %w", file, err)
		}
		ms = append(ms, migration{version: v, name: base, sql: string(body)})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].version < ms[j].version })
	for i, m := range ms {
		if m.version != int64(i+1) {
			return nil, fmt.Errorf("load migration %s: expected version %d (versions must run 1, 2, 3, ... with no gaps or duplicates)", m.name, i+1)
		}
	}
	return ms, nil
}

// migrate brings db's schema to the newest of ms in one transaction: either every pending
// migration is applied and recorded in schema_migrations, or none is. A database already at the
// newest version is left as it is; one newer than ms knows is refused.
func migrate(ctx context.Context, db *sql.DB, ms []migration) (err error) {
	var latest int64
	if len(ms) > 0 {
		latest = ms[len(ms)-1].version
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
		if m.version <= current {
			continue
		}
		if _, err := tx.ExecContext(ctx, m.sql); err != nil {
			return fmt.Errorf("migrate: apply %s: %w", m.name, err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)`,
			m.version, m.name, now); err != nil {
			return fmt.Errorf("migrate: record %s: %w", m.name, err)
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
