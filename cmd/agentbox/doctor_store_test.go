//go:build linux

package main

import (
	"log/slog"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/config"
	"github.com/agentbox/agentbox/internal/store"
	"github.com/agentbox/agentbox/internal/store/postgres"
	"github.com/agentbox/agentbox/internal/store/sqlite"
	"github.com/agentbox/agentbox/internal/testenv/pglab"
)

// TestDoctorStoreCheck: doctor reports the SQLite store (not yet created, then its version and
// schema) without creating it, and a bad --store without repeating a password.
func TestDoctorStoreCheck(t *testing.T) {
	dir := t.TempDir()
	c := storeCheck("", dir)
	if !c.OK || !strings.Contains(c.Detail, "not created yet") {
		t.Fatalf("no database yet: %+v", c)
	}
	if _, err := filepath.Glob(filepath.Join(dir, "*")); err != nil {
		t.Fatal(err)
	}
	if m, _ := filepath.Glob(filepath.Join(dir, "*")); len(m) != 0 {
		t.Fatalf("doctor created %v", m)
	}
	path := filepath.Join(dir, "other.db")
	st, err := sqlite.Open(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	c = storeCheck("sqlite://"+path, dir)
	want := "schema " + itoa(sqlite.SchemaVersion()) + " (this agentbox: " + itoa(sqlite.SchemaVersion()) + ")"
	if !c.OK || !strings.Contains(c.Detail, "sqlite 3.") || !strings.Contains(c.Detail, want) {
		t.Fatalf("sqlite://%s: %+v; want ok, sqlite 3.x, %s", path, c, want)
	}
	c = storeCheck("mysql://u:hunter2@h/db", dir)
	if c.OK || strings.Contains(c.Detail, "hunter2") || c.Fix == "" {
		t.Fatalf("a bad --store: %+v", c)
	}
	c = storeCheck("postgres://u:hunter2@127.0.0.1:1/db?connect_timeout=2&sslmode=disable", dir)
	if c.OK || strings.Contains(c.Detail, "hunter2") || !strings.Contains(c.Detail, "xxxxx") {
		t.Fatalf("an unreachable Postgres: %+v; want a failure naming the DSN without its password", c)
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// TestOpenStorePostgres: --store postgres://… opens (and migrates) the Postgres store, and
// doctor then reports it at this binary's schema version.
func TestOpenStorePostgres(t *testing.T) {
	dsn := pglab.DSN(t)
	cfg := config.Default()
	cfg.StateDir, cfg.Store = t.TempDir(), dsn
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	st, _, err := openStore(t.Context(), cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	in, err := st.(store.Describer).Info(t.Context())
	if err != nil || in.Driver != "postgres" || in.Schema != postgres.SchemaVersion() {
		t.Fatalf("Info: %+v, %v", in, err)
	}
	c := storeCheck(dsn, cfg.StateDir)
	want := "schema " + itoa(postgres.SchemaVersion()) + " (this agentbox: " + itoa(postgres.SchemaVersion()) + ")"
	if !c.OK || !strings.Contains(c.Detail, "postgres 15") || !strings.Contains(c.Detail, want) {
		t.Fatalf("doctor: %+v; want ok, postgres 15, %s", c, want)
	}
}
