package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/agentbox/agentbox/internal/store"
)

var _ store.Describer = (*Store)(nil)

// SchemaVersion is the newest schema version this binary's migrations reach.
func SchemaVersion() int64 {
	ms, err := embeddedMigrations()
	if err != nil || len(ms) == 0 {
		return 0
	}
	return ms[len(ms)-1].Version
}

// Info describes the store (store.Describer).
func (s *Store) Info(ctx context.Context) (store.Info, error) {
	return info(ctx, s.read, s.path)
}

func info(ctx context.Context, db *sql.DB, path string) (store.Info, error) {
	in := store.Info{Driver: "sqlite", Location: path}
	if err := db.QueryRowContext(ctx, `SELECT sqlite_version()`).Scan(&in.Version); err != nil {
		return in, fmt.Errorf("sqlite: %s: version: %w", path, err)
	}
	if err := db.QueryRowContext(ctx, `SELECT COALESCE(MAX(version), 0) FROM schema_migrations`).Scan(&in.Schema); err != nil {
		return in, fmt.Errorf("sqlite: %s: schema version: %w", path, err)
	}
	return in, nil
}

// Probe describes the database at path without creating or migrating it (agentbox doctor).
// A file that does not exist yet is an error wrapping fs.ErrNotExist.
func Probe(ctx context.Context, path string) (store.Info, error) {
	if _, err := os.Stat(path); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return store.Info{Driver: "sqlite", Location: path}, fmt.Errorf("sqlite: %s does not exist yet (agentbox serve creates it): %w", path, fs.ErrNotExist)
		}
		return store.Info{}, fmt.Errorf("sqlite: %w", err)
	}
	db, err := sql.Open("sqlite", dsn(path, true)+"&mode=ro")
	if err != nil {
		return store.Info{}, fmt.Errorf("sqlite: open %s: %w", path, err)
	}
	defer db.Close()
	return info(ctx, db, path)
}
