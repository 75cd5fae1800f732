package sqlstore

import (
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
)

// Migration is one schema step of a driver: migrations/NNNN_name.sql holds version NNNN. Both
// drivers number theirs alike (a schema version means the same on SQLite and Postgres).
type Migration struct {
	Version int64
	Name    string
	SQL     string
}

// LoadMigrations reads every *.sql file at the root of fsys, named NNNN_name.sql, and returns
// them by version. Versions must run 1, 2, 3, ... without gaps or duplicates.
func LoadMigrations(fsys fs.FS) ([]Migration, error) {
	names, err := fs.Glob(fsys, "*.sql")
	if err != nil {
		return nil, fmt.Errorf("load migrations: %w", err)
	}
	ms := make([]Migration, 0, len(names))
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
		ms = append(ms, Migration{Version: v, Name: base, SQL: string(body)})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].Version < ms[j].Version })
	for i, m := range ms {
		if m.Version != int64(i+1) {
			return nil, fmt.Errorf("load migration %s: expected version %d (versions must run 1, 2, 3, ... with no gaps or duplicates)", m.Name, i+1)
		}
	}
	return ms, nil
}
