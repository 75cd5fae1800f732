package config

import (
	"fmt"
	"path/filepath"
	"strings"
)

// Store drivers --store selects.
const (
	StoreSQLite   = "sqlite"
	StorePostgres = "postgres"
)

// StoreSpec is a parsed --store: the driver and where its database is.
type StoreSpec struct {
	Driver string // StoreSQLite or StorePostgres
	Path   string // SQLite: the database file (absolute)
	DSN    string // Postgres: the DSN as given (it may hold a password: never log it)
}

// ParseStore reads a --store value: "" (the default: SQLite's agentbox.db in stateDir),
// sqlite://PATH (an absolute path: sqlite:///var/lib/x.db), or a Postgres URL
// (postgres://… or postgresql://…). A refusal never repeats the value (it may hold a password).
func ParseStore(value, stateDir string) (StoreSpec, error) {
	switch {
	case value == "":
		return StoreSpec{Driver: StoreSQLite, Path: filepath.Join(stateDir, "agentbox.db")}, nil
	case strings.HasPrefix(value, "sqlite://"):
		p := strings.TrimPrefix(value, "sqlite://")
		if p == "" || !filepath.IsAbs(p) {
			return StoreSpec{}, fmt.Errorf("--store sqlite://PATH needs an absolute path (sqlite:///var/lib/agentbox/agentbox.db); got %q", p)
		}
		if strings.ContainsAny(p, "?#") {
			return StoreSpec{}, fmt.Errorf("--store sqlite://PATH takes a plain file path, without ?parameters or #fragments; got %q", p)
		}
		return StoreSpec{Driver: StoreSQLite, Path: filepath.Clean(p)}, nil
	case strings.HasPrefix(value, "postgres://"), strings.HasPrefix(value, "postgresql://"):
		if strings.TrimPrefix(strings.TrimPrefix(value, "postgres://"), "postgresql://") == "" {
			return StoreSpec{}, fmt.Errorf("--store postgres:// needs a host and database: postgres://user:password@host:5432/agentbox?sslmode=require")
		}
		return StoreSpec{Driver: StorePostgres, DSN: value}, nil
	}
	scheme, _, ok := strings.Cut(value, "://")
	if !ok {
		scheme = "(no scheme)"
	}
	return StoreSpec{}, fmt.Errorf("--store: unknown store %s; want sqlite://PATH, postgres://user:password@host/db or postgresql://…, or leave it unset for the SQLite file in the state dir", scheme)
}
