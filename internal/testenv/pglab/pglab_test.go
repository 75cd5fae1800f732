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

// TestRestart: a restarted server keeps what was committed and accepts connections again.
func TestRestart(t *testing.T) {
	dsn := DSN(t)
	if os.Getenv(EnvDSN) != "" {
		t.Skip("the Postgres of " + EnvDSN + " is not restarted by tests")
	}
	ctx := t.Context()
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, "CREATE TABLE t (x int); INSERT INTO t VALUES (42)"); err != nil {
		t.Fatal(err)
	}
	if err := Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Ping(ctx); err == nil {
		t.Error("a connection from before the restart still answers")
	}
	c.Close(ctx)
	c, err = pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var x int
	if err := c.QueryRow(ctx, "SELECT x FROM t").Scan(&x); err != nil || x != 42 {
		t.Fatalf("after the restart: %d, %v", x, err)
	}
}
