package sqlite

import (
	"database/sql"
	"path/filepath"
	"testing"
)

// TestPrincipalsMigration: the migration that adds principals gives existing sandboxes their
// owner's key when a key made them, their run's key when a key's run did, and the admin
// principal otherwise (the server's token, an MCP session, a pool, a run without a key); a
// snapshot gets its sandbox's.
func TestPrincipalsMigration(t *testing.T) {
	db, err := sql.Open("sqlite", dsn(filepath.Join(t.TempDir(), "p.db"), false))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	ms, err := embeddedMigrations()
	if err != nil {
		t.Fatal(err)
	}
	at := -1
	for i, m := range ms {
		if m.Name == "0019_principals" {
			at = i
		}
	}
	if at < 0 {
		t.Fatal("no 0019_principals migration")
	}
	ctx := t.Context()
	if err := migrate(ctx, db, ms[:at]); err != nil {
		t.Fatal(err)
	}
	for id, owner := range map[string]string{"sb-key": "key:k1", "sb-token": "token:0123456789ab", "sb-mcp": "mcp-session:s1",
		"sb-keyrun": "run:run-1", "sb-tokenrun": "run:run-2", "sb-pool": "pool:p", "sb-none": ""} {
		if _, err := db.ExecContext(ctx, `INSERT INTO sandboxes (id, state, image, runtime, isolation, cpu, memory_mb, disk_mb,
			pids_limit, env, labels, created_at, updated_at, expires_at, error_msg, version, owner)
			VALUES (?, 'running', '', 'runc', 'process', 1, 512, 1024, 100, '{}', '{}', 0, 0, 0, '', 1, ?)`, id, owner); err != nil {
			t.Fatal(err)
		}
	}
	for id, owner := range map[string]string{"run-1": "key:k2", "run-2": "token:0123456789ab"} {
		if _, err := db.ExecContext(ctx, `INSERT INTO runs (id, owner, idempotency_key, batch_id, state, created_at, updated_at, version, doc)
			VALUES (?, ?, '', '', 'running', 0, 0, 1, '{}')`, id, owner); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO snapshots (id, sandbox_id, state, kind, purpose, size_bytes, runtime, image,
		image_digest, cpu, memory_mb, disk_mb, network, secrets, id_base, labels, node, created_at, error_msg, version)
		VALUES ('snap-1', 'sb-keyrun', 'ready', 'files', 'user', 0, 'runc', '', '', 1, 512, 1024, '', '', 0, '{}', '', 0, '', 1)`); err != nil {
		t.Fatal(err)
	}
	if err := migrate(ctx, db, ms); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]string{"sb-key": "key:k1", "sb-token": "admin", "sb-mcp": "admin", "sb-keyrun": "key:k2",
		"sb-tokenrun": "admin", "sb-pool": "admin", "sb-none": "admin"} {
		var got string
		if err := db.QueryRowContext(ctx, `SELECT principal FROM sandboxes WHERE id = ?`, id).Scan(&got); err != nil || got != want {
			t.Errorf("%s: principal %q (%v), want %q", id, got, err, want)
		}
	}
	var got string
	if err := db.QueryRowContext(ctx, `SELECT principal FROM snapshots WHERE id = 'snap-1'`).Scan(&got); err != nil || got != "key:k2" {
		t.Errorf("snapshot: principal %q (%v), want its sandbox's key:k2", got, err)
	}
}

// TestApprovalPrincipalsMigration: the migration that gives approvals a principal gives an
// existing one its key's when an API key asked for it, and the admin's otherwise (the
// server's token, the stdio session).
func TestApprovalPrincipalsMigration(t *testing.T) {
	db, err := sql.Open("sqlite", dsn(filepath.Join(t.TempDir(), "p.db"), false))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	ms, err := embeddedMigrations()
	if err != nil {
		t.Fatal(err)
	}
	at := -1
	for i, m := range ms {
		if m.Name == "0020_approval_principals" {
			at = i
		}
	}
	if at < 0 {
		t.Fatal("no 0020_approval_principals migration")
	}
	ctx := t.Context()
	if err := migrate(ctx, db, ms[:at]); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO api_keys (id, name, scope, prefix, hash, created_at) VALUES ('k1', 'alice', 'operate', 'abk_x', x'00', 0)`); err != nil {
		t.Fatal(err)
	}
	for id, caller := range map[string]string{"ap-key": "k1", "ap-token": "token:0123456789ab", "ap-stdio": "mcp-process:1"} {
		if _, err := db.ExecContext(ctx, `INSERT INTO approvals (id, state, tool, action, surface, sandbox_id, digest, summary,
			caller_id, caller_name, created_at, expires_at, decider, reason, outcome, bound)
			VALUES (?, 'pending', 'exec', 'exec', 'mcp', '', 'd', '{}', ?, '', 0, 0, '', '', '', 0)`, id, caller); err != nil {
			t.Fatal(err)
		}
	}
	if err := migrate(ctx, db, ms); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]string{"ap-key": "key:k1", "ap-token": "admin", "ap-stdio": "admin"} {
		var got string
		if err := db.QueryRowContext(ctx, `SELECT principal FROM approvals WHERE id = ?`, id).Scan(&got); err != nil || got != want {
			t.Errorf("approval %s: principal %q %v, want %q", id, got, err, want)
		}
	}
}
