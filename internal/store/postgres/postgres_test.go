package postgres

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/store"
	"github.com/agentbox/agentbox/internal/store/storetest"
	"github.com/agentbox/agentbox/internal/testenv/pglab"
)

func TestMain(m *testing.M) { os.Exit(pglab.Main(m)) }

func open(t *testing.T) *Store {
	t.Helper()
	s, err := Open(t.Context(), pglab.DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestStoreConformance runs the shared store suite on Postgres, a fresh database per subtest.
func TestStoreConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store { return open(t) })
}

// TestStoreConformanceShared runs the suite's two-store cases on two stores on one database
// (two replicas).
func TestStoreConformanceShared(t *testing.T) {
	storetest.RunShared(t, func(t *testing.T) (store.Store, store.Store) {
		dsn := pglab.DSN(t)
		a, err := Open(t.Context(), dsn)
		if err != nil {
			t.Fatal(err)
		}
		b, err := Open(t.Context(), dsn)
		if err != nil {
			a.Close()
			t.Fatalf("second Open: %v", err)
		}
		return a, b
	})
}

// TestMigrationsMatchSQLite: the Postgres migrations carry SQLite's numbers and names, one for
// one (a schema version means the same on both).
func TestMigrationsMatchSQLite(t *testing.T) {
	ms, err := loadMigrations()
	if err != nil {
		t.Fatal(err)
	}
	lite, err := filepath.Glob("../sqlite/migrations/*.sql")
	if err != nil || len(lite) == 0 {
		t.Fatalf("SQLite's migrations: %v, %v", lite, err)
	}
	if len(ms) != len(lite) {
		t.Fatalf("%d Postgres migrations, %d SQLite ones", len(ms), len(lite))
	}
	for i, m := range ms {
		if want := strings.TrimSuffix(filepath.Base(lite[i]), ".sql"); m.Name != want {
			t.Errorf("migration %d is %s on Postgres, %s on SQLite", i+1, m.Name, want)
		}
	}
}

// TestConcurrentOpenMigratesOnce: two processes opening a new database at once both succeed
// and the migrations are applied once; reopening applies nothing.
func TestConcurrentOpenMigratesOnce(t *testing.T) {
	dsn := pglab.DSN(t)
	var wg sync.WaitGroup
	stores := make([]*Store, 4)
	errs := make([]error, 4)
	for i := range stores {
		wg.Add(1)
		go func() {
			defer wg.Done()
			stores[i], errs[i] = Open(t.Context(), dsn)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("Open %d: %v", i, err)
		}
		defer stores[i].Close()
	}
	ms, _ := loadMigrations()
	var n, max int64
	if err := stores[0].db.QueryRowContext(t.Context(), `SELECT count(*), max(version) FROM schema_migrations`).Scan(&n, &max); err != nil {
		t.Fatal(err)
	}
	if n != int64(len(ms)) || max != ms[len(ms)-1].Version {
		t.Fatalf("schema_migrations: %d rows, newest %d; want %d, %d", n, max, len(ms), ms[len(ms)-1].Version)
	}
	info, err := stores[1].Info(t.Context())
	if err != nil || info.Driver != "postgres" || info.Schema != max || !strings.HasPrefix(info.Version, "15") {
		t.Fatalf("Info: %+v, %v", info, err)
	}
}

// TestRefusesNewerSchema: a database migrated by a newer agentbox is refused, saying so.
func TestRefusesNewerSchema(t *testing.T) {
	dsn := pglab.DSN(t)
	s := open2(t, dsn)
	ms, _ := loadMigrations()
	if _, err := s.db.ExecContext(t.Context(), `INSERT INTO schema_migrations (version, name, applied_at) VALUES ($1, 'from_the_future', 0)`, ms[len(ms)-1].Version+1); err != nil {
		t.Fatal(err)
	}
	s.Close()
	_, err := Open(t.Context(), dsn)
	if err == nil || !strings.Contains(err.Error(), "newer than") {
		t.Fatalf("Open of a newer schema: %v, want refused", err)
	}
}

func open2(t *testing.T, dsn string) *Store {
	t.Helper()
	s, err := Open(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestOpenErrorsHideThePassword: a DSN's password never appears in an error.
func TestOpenErrorsHideThePassword(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for _, dsn := range []string{
		"postgres://u:hunter2secret@127.0.0.1:1/db?sslmode=disable&connect_timeout=2",
		"host=127.0.0.1 port=1 user=u password=hunter2secret dbname=db sslmode=disable connect_timeout=2",
		"postgres://u:hunter2secret@[::1",
		"postgres://u@127.0.0.1:1/db?password=hunter2secret&sslmode=disable&connect_timeout=2",
	} {
		_, err := Open(ctx, dsn)
		if err == nil {
			t.Fatalf("Open(%s) = nil error", Redact(dsn))
		}
		if strings.Contains(err.Error(), "hunter2secret") {
			t.Errorf("the error shows the password: %v", err)
		}
	}
	if got := Redact("postgres://u:pw@h/db"); got != "postgres://u:xxxxx@h/db" {
		t.Errorf("Redact = %s", got)
	}
}

// TestProbe: doctor's probe reads the server's version and the schema version without
// migrating (0 before the first Open).
func TestProbe(t *testing.T) {
	dsn := pglab.DSN(t)
	in, err := Probe(t.Context(), dsn)
	if err != nil || in.Driver != "postgres" || in.Schema != 0 || !strings.HasPrefix(in.Version, "15") {
		t.Fatalf("Probe of an empty database: %+v, %v", in, err)
	}
	s := open2(t, dsn)
	defer s.Close()
	in, err = Probe(t.Context(), dsn)
	if err != nil || in.Schema != SchemaVersion() || SchemaVersion() < 17 {
		t.Fatalf("Probe after Open: %+v, %v; want schema %d", in, err, SchemaVersion())
	}
}
