package pglab

import (
	"os"
	"testing"

	"github.com/jackc/pgx/v5"
)

func TestMain(m *testing.M) { os.Exit(Main(m)) }

// TestFreshDatabases: each DSN is its own empty database on a server that answers.
func TestFreshDatabases(t *testing.T) {
	a, b := DSN(t), DSN(t)
	if a == b {
		t.Fatalf("two calls gave the same database %s", a)
	}
	ctx := t.Context()
	ca, err := pgx.Connect(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	defer ca.Close(ctx)
	if _, err := ca.Exec(ctx, "CREATE TABLE t (x int)"); err != nil {
		t.Fatal(err)
	}
	cb, err := pgx.Connect(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	defer cb.Close(ctx)
	var n int
	if err := cb.QueryRow(ctx, "SELECT count(*) FROM pg_tables WHERE tablename = 't'").Scan(&n); err != nil || n != 0 {
		t.Fatalf("the second database sees the first's table: %d, %v", n, err)
	}
	var v string
	if err := cb.QueryRow(ctx, "SHOW server_version").Scan(&v); err != nil || v == "" {
		t.Fatalf("server_version: %q, %v", v, err)
	}
	t.Logf("Postgres %s", v)
}
