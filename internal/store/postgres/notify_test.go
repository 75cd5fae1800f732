package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/testenv/pglab"
)

func newSandbox(now time.Time) sandbox.Sandbox {
	return sandbox.Sandbox{ID: sandbox.NewID(), State: sandbox.StateCreating, Image: "host", Runtime: "runc",
		Isolation: "container", CPU: 1, MemoryMB: 256, DiskMB: 1024, Node: "n",
		CreatedAt: now, UpdatedAt: now, ExpiresAt: now.Add(time.Hour), Version: 1}
}

func wantWake(t *testing.T, ch <-chan struct{}, why string) {
	t.Helper()
	select {
	case _, ok := <-ch:
		if !ok {
			t.Fatalf("%s: the channel closed", why)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: no wake in 10 s", why)
	}
}

func wantQuiet(t *testing.T, ch <-chan struct{}, why string) {
	t.Helper()
	select {
	case <-ch:
		t.Fatalf("%s: woke", why)
	case <-time.After(300 * time.Millisecond):
	}
}

// TestChangesAcrossStores: a watcher on one store (replica) wakes when another appends events,
// not on a write without events, and again after its connection is cut (it reconnects); its
// channel closes with its context.
func TestChangesAcrossStores(t *testing.T) {
	dsn := pglab.DSN(t)
	a, b := open2(t, dsn), open2(t, dsn)
	defer a.Close()
	defer b.Close()
	ctx, cancel := context.WithCancel(t.Context())
	ch, err := a.Changes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC().Truncate(time.Millisecond)
	sb := newSandbox(now)
	if err := b.CreateSandbox(t.Context(), sb, sandbox.Event{SandboxID: sb.ID, To: sb.State, At: now}); err != nil {
		t.Fatal(err)
	}
	wantWake(t, ch, "another store created a sandbox with its event")
	if _, _, err := b.AcquireLease(t.Context(), "x", "b", time.Minute); err != nil {
		t.Fatal(err)
	}
	wantQuiet(t, ch, "a write without events")
	sb.State, sb.Version = sandbox.StateRunning, 2
	if err := b.UpdateSandbox(t.Context(), sb, sandbox.Event{SandboxID: sb.ID, From: sandbox.StateCreating, To: sandbox.StateRunning, At: now}); err != nil {
		t.Fatal(err)
	}
	wantWake(t, ch, "another store's state change")

	// Cut the listener's connection behind its back: it reconnects, wakes, and hears more.
	admin, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(t.Context())
	var killed int
	if err := admin.QueryRow(t.Context(), `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE datname = current_database() AND query ILIKE 'LISTEN%'`).Scan(&killed); err != nil || killed != 1 {
		t.Fatalf("terminate the listener: %d, %v", killed, err)
	}
	wantWake(t, ch, "the reconnect")
	sb.State, sb.Version = sandbox.StateStopping, 3
	if err := b.UpdateSandbox(t.Context(), sb, sandbox.Event{SandboxID: sb.ID, From: sandbox.StateRunning, To: sandbox.StateStopping, At: now}); err != nil {
		t.Fatal(err)
	}
	wantWake(t, ch, "a change after the reconnect")

	cancel()
	select {
	case _, ok := <-ch:
		for ok {
			_, ok = <-ch
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the channel did not close with its context")
	}
}
