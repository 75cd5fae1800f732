package sqlite

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/store"
	"github.com/agentbox/agentbox/internal/store/storetest"
)

func openTemp(t *testing.T) (*Store, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "agentbox.db")
	s, err := Open(t.Context(), path)
	if err != nil {
		t.Fatalf("Open(%s): %v", path, err)
	}
	return s, path
}

func TestStoreConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		s, _ := openTemp(t)
		return s
	})
}

// TestStoreConformanceShared runs the suite's two-store cases on two stores on one file (two
// server processes on one database).
func TestStoreConformanceShared(t *testing.T) {
	storetest.RunShared(t, func(t *testing.T) (store.Store, store.Store) {
		a, path := openTemp(t)
		b, err := Open(t.Context(), path)
		if err != nil {
			a.Close()
			t.Fatalf("second Open: %v", err)
		}
		return a, b
	})
}

func TestStoreConformanceInMemory(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		s, err := Open(t.Context(), ":memory:")
		if err != nil {
			t.Fatalf("Open(:memory:): %v", err)
		}
		return s
	})
}

type migrationRow struct {
	version   int64
	name      string
	appliedAt int64
}

func migrationRows(t *testing.T, db *sql.DB) []migrationRow {
	t.Helper()
	rows, err := db.QueryContext(t.Context(), `SELECT version, name, applied_at FROM schema_migrations ORDER BY version`)
	if err != nil {
		t.Fatalf("read schema_migrations: %v", err)
	}
	defer rows.Close()
	var out []migrationRow
	for rows.Next() {
		var r migrationRow
		if err := rows.Scan(&r.version, &r.name, &r.appliedAt); err != nil {
			t.Fatalf("scan schema_migrations: %v", err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("read schema_migrations: %v", err)
	}
	return out
}

func TestReopenKeepsDataAndMigratesOnce(t *testing.T) {
	ms, err := embeddedMigrations()
	if err != nil {
		t.Fatal(err)
	}
	s, path := openTemp(t)
	now := time.Date(2025, 1, 2, 3, 4, 5, 6_000_000, time.UTC)
	sb := sandbox.Sandbox{ID: sandbox.NewID(), State: sandbox.StateCreating, Image: "alpine", CPU: 0.5,
		MemoryMB: 128, Labels: map[string]string{"team": "a"}, CreatedAt: now, UpdatedAt: now, Version: 1}
	if err := s.CreateSandbox(t.Context(), sb, sandbox.Event{SandboxID: sb.ID, To: sb.State, At: now}); err != nil {
		t.Fatal(err)
	}
	sb.State, sb.Version = sandbox.StateRunning, 2
	if err := s.UpdateSandbox(t.Context(), sb, sandbox.Event{SandboxID: sb.ID, From: sandbox.StateCreating, To: sb.State, At: now}); err != nil {
		t.Fatal(err)
	}
	first := migrationRows(t, s.write)
	if len(first) != len(ms) {
		t.Fatalf("schema_migrations has %d rows after first open, want %d", len(first), len(ms))
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}

	for i := 0; i < 2; i++ {
		time.Sleep(2 * time.Millisecond) // a re-applied migration would get a later applied_at
		s, err := Open(t.Context(), path)
		if err != nil {
			t.Fatalf("reopen %d: %v", i, err)
		}
		got, err := s.GetSandbox(t.Context(), sb.ID)
		if err != nil {
			t.Fatalf("reopen %d: GetSandbox: %v", i, err)
		}
		if got.State != sandbox.StateRunning || got.Version != 2 || got.CPU != 0.5 || got.Labels["team"] != "a" || !got.CreatedAt.Equal(now) {
			t.Errorf("reopen %d: got %+v, want the record written before closing", i, got)
		}
		if evs, err := s.ListEvents(t.Context(), sandbox.EventFilter{SandboxID: sb.ID}); err != nil || len(evs) != 2 {
			t.Errorf("reopen %d: ListEvents = %d events, %v; want 2", i, len(evs), err)
		}
		if l, err := s.ListSandboxes(t.Context(), sandbox.ListFilter{Labels: map[string]string{"team": "a"}}); err != nil || len(l) != 1 {
			t.Errorf("reopen %d: label filter = %d sandboxes, %v; want 1", i, len(l), err)
		}
		again := migrationRows(t, s.write)
		if len(again) != len(first) {
			t.Fatalf("reopen %d: schema_migrations has %d rows, want %d", i, len(again), len(first))
		}
		for j := range first {
			if again[j] != first[j] {
				t.Errorf("reopen %d: migration row %+v changed to %+v: a migration ran again", i, first[j], again[j])
			}
		}
		if err := s.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
	}
}

func TestRefusesNewerSchema(t *testing.T) {
	ms, err := embeddedMigrations()
	if err != nil {
		t.Fatal(err)
	}
	latest := ms[len(ms)-1].Version
	s, path := openTemp(t)
	if _, err := s.write.ExecContext(t.Context(), `INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, 'from_the_future', 0)`, latest+1); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	_, err = Open(t.Context(), path)
	if err == nil {
		t.Fatal("Open of a database with a newer schema succeeded, want an error")
	}
	for _, want := range []string{path, "newer", "upgrade agentbox"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

func TestMigrateIsAtomic(t *testing.T) {
	db, err := sql.Open("sqlite", dsn(filepath.Join(t.TempDir(), "m.db"), false))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	ms, err := loadMigrations(fstest.MapFS{
		"0001_one.sql": {Data: []byte("CREATE TABLE one (id BIGINT PRIMARY KEY);")},
		"0002_two.sql": {Data: []byte("CREATE TABLE two (id BIGINT PRIMARY KEY);\nTHIS IS NOT SQL;")},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := migrate(t.Context(), db, ms); err == nil || !strings.Contains(err.Error(), "0002_two") {
		t.Fatalf("migrate with a broken migration: error = %v, want one naming 0002_two", err)
	}
	var n int
	if err := db.QueryRowContext(t.Context(), `SELECT COUNT(*) FROM sqlite_master WHERE name IN ('one', 'two', 'schema_migrations')`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("%d tables left behind by a failed migration, want 0 (all rolled back)", n)
	}
	// With the broken one fixed, both apply, once.
	ms[1].SQL = "CREATE TABLE two (id BIGINT PRIMARY KEY);"
	for i := 0; i < 2; i++ {
		if err := migrate(t.Context(), db, ms); err != nil {
			t.Fatalf("migrate %d: %v", i, err)
		}
	}
	if rows := migrationRows(t, db); len(rows) != 2 || rows[0].name != "0001_one" || rows[1].name != "0002_two" {
		t.Errorf("schema_migrations = %+v, want 0001_one and 0002_two", rows)
	}
}

func TestLoadMigrations(t *testing.T) {
	ms, err := embeddedMigrations()
	if err != nil {
		t.Fatalf("embedded migrations: %v", err)
	}
	if len(ms) == 0 || ms[0].Name != "0001_init" {
		t.Fatalf("embedded migrations = %+v, want 0001_init first", ms)
	}
	for _, c := range []struct {
		name string
		fs   fstest.MapFS
		ok   bool
	}{
		{"ordered", fstest.MapFS{"0002_b.sql": {}, "0001_a.sql": {}, "README.md": {}}, true},
		{"gap", fstest.MapFS{"0001_a.sql": {}, "0003_c.sql": {}}, false},
		{"duplicate", fstest.MapFS{"0001_a.sql": {}, "1_b.sql": {}}, false},
		{"no number", fstest.MapFS{"init.sql": {}}, false},
		{"zero", fstest.MapFS{"0000_a.sql": {}}, false},
	} {
		ms, err := loadMigrations(c.fs)
		if (err == nil) != c.ok {
			t.Errorf("%s: loadMigrations error = %v, want ok=%v", c.name, err, c.ok)
		}
		if c.ok && (len(ms) != 2 || ms[0].Version != 1 || ms[1].Version != 2) {
			t.Errorf("%s: migrations = %+v, want versions 1, 2", c.name, ms)
		}
	}
}

func TestPragmas(t *testing.T) {
	s, _ := openTemp(t)
	defer s.Close()
	for _, c := range []struct {
		db     *sql.DB
		pragma string
		want   string
	}{
		{s.write, "journal_mode", "wal"},
		{s.write, "foreign_keys", "1"},
		{s.write, "busy_timeout", "10000"},
		{s.write, "synchronous", "1"}, // NORMAL
		{s.read, "journal_mode", "wal"},
		{s.read, "foreign_keys", "1"},
		{s.read, "busy_timeout", "10000"},
		{s.read, "query_only", "1"},
	} {
		var got string
		if err := c.db.QueryRowContext(t.Context(), "PRAGMA "+c.pragma).Scan(&got); err != nil {
			t.Fatalf("PRAGMA %s: %v", c.pragma, err)
		}
		if !strings.EqualFold(got, c.want) {
			t.Errorf("PRAGMA %s = %q, want %q", c.pragma, got, c.want)
		}
	}
	if _, err := s.read.ExecContext(t.Context(), `DELETE FROM sandboxes`); err == nil {
		t.Error("a write through the read pool succeeded, want it refused")
	}
}

func TestForeignKeysEnforced(t *testing.T) {
	s, _ := openTemp(t)
	defer s.Close()
	_, err := s.write.ExecContext(t.Context(), `INSERT INTO events (sandbox_id, type, from_state, to_state, reason, at) VALUES ('sb-nope', 'state', '', 'running', '', 0)`)
	if err == nil {
		t.Fatal("an event for an unknown sandbox was inserted, want a foreign key error")
	}
}

func TestOpenErrors(t *testing.T) {
	if _, err := Open(context.Background(), ""); err == nil {
		t.Error("Open(\"\") succeeded")
	}
	missing := filepath.Join(t.TempDir(), "no", "such", "dir", "a.db")
	_, err := Open(context.Background(), missing)
	if err == nil || !strings.Contains(err.Error(), missing) {
		t.Errorf("Open(%s) error = %v, want one naming the path", missing, err)
	}
}

func TestPathWithURICharacters(t *testing.T) {
	path := filepath.Join(t.TempDir(), "we?ird#na%20me.db")
	s, err := Open(t.Context(), path)
	if err != nil {
		t.Fatalf("Open(%s): %v", path, err)
	}
	now := time.Now()
	sb := sandbox.Sandbox{ID: sandbox.NewID(), State: sandbox.StateRunning, CreatedAt: now, UpdatedAt: now, Version: 1}
	if err := s.CreateSandbox(t.Context(), sb, sandbox.Event{}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	matches, err := filepath.Glob(filepath.Join(filepath.Dir(path), "*"))
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, m := range matches {
		found = found || m == path
	}
	if !found {
		t.Fatalf("database not created at %s; directory holds %v", path, matches)
	}
	s, err = Open(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.GetSandbox(t.Context(), sb.ID); err != nil {
		t.Errorf("GetSandbox after reopen: %v", err)
	}
}

func TestErrorsNameOperationAndID(t *testing.T) {
	s, _ := openTemp(t)
	defer s.Close()
	id := sandbox.NewID()
	_, err := s.GetSandbox(t.Context(), id)
	if !errcode.Is(err, errcode.SandboxNotFound) || !strings.Contains(err.Error(), "get sandbox "+id) {
		t.Errorf("GetSandbox error = %v, want SANDBOX_NOT_FOUND naming the operation and %s", err, id)
	}
	sb := sandbox.Sandbox{ID: id, State: "bogus", Version: 1}
	err = s.CreateSandbox(t.Context(), sb, sandbox.Event{})
	if !errcode.Is(err, errcode.InvalidArgument) || !strings.Contains(err.Error(), "create sandbox "+id) {
		t.Errorf("CreateSandbox(bad state) error = %v, want INVALID_ARGUMENT naming the operation and %s", err, id)
	}
}

// Two stores on one file stand for two processes: their writers contend for SQLite's lock, which
// the busy timeout and BEGIN IMMEDIATE must absorb without an error reaching the caller.
func TestTwoStoresOneFile(t *testing.T) {
	a, path := openTemp(t)
	defer a.Close()
	b, err := Open(t.Context(), path)
	if err != nil {
		t.Fatalf("second Open: %v", err)
	}
	defer b.Close()

	const perStore, goroutines = 20, 4
	errc := make(chan error, 2*goroutines)
	var wg sync.WaitGroup
	for _, s := range []*Store{a, b} {
		for g := 0; g < goroutines; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < perStore; i++ {
					now := time.Now()
					sb := sandbox.Sandbox{ID: sandbox.NewID(), State: sandbox.StateCreating, CPU: 1, CreatedAt: now, UpdatedAt: now, Version: 1}
					if err := s.CreateSandbox(t.Context(), sb, sandbox.Event{SandboxID: sb.ID, To: sb.State, At: now}); err != nil {
						errc <- err
						return
					}
					sb.State, sb.Version = sandbox.StateRunning, 2
					if err := s.UpdateSandbox(t.Context(), sb, sandbox.Event{SandboxID: sb.ID, From: sandbox.StateCreating, To: sb.State, At: now}); err != nil {
						errc <- err
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
	for name, s := range map[string]*Store{"a": a, "b": b} {
		u, err := s.CountLive(t.Context())
		if want := 2 * goroutines * perStore; err != nil || u.Live != want || u.CPU != float64(want) {
			t.Errorf("store %s: CountLive = %+v, %v; want %d live, %d cpu, nil", name, u, err, want, want)
		}
	}
}

// TestFilesPrivate: the database and its WAL files are readable by their owner only, whatever
// the umask and the mode of a database an older version created.
func TestFilesPrivate(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "agentbox.db")
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := Open(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.ListIDRanges(t.Context()); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s has mode %v, want 0600", p, fi.Mode().Perm())
		}
	}
}
