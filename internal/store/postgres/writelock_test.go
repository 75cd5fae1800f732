package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/agentbox/agentbox/internal/testenv/pglab"
)

// TestWritesWaitForTheWriteLock: while another session holds the advisory write lock, every
// kind of write (a transaction, a single statement) waits for it and reads do not — the lock a
// replica's writes take.
func TestWritesWaitForTheWriteLock(t *testing.T) {
	dsn := pglab.DSN(t)
	s := open2(t, dsn)
	defer s.Close()
	ctx := t.Context()
	other, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(context.Background())
	tx, err := other.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, writeLock); err != nil {
		t.Fatal(err)
	}
	writes := map[string]func() error{
		"a write transaction": func() error {
			_, _, err := s.AcquireLease(ctx, "x", "a", time.Minute)
			return err
		},
		"a single statement": func() error { return s.TouchAPIKey(ctx, "nope", time.Now()) },
	}
	done := map[string]chan error{}
	for name, w := range writes {
		ch := make(chan error, 1)
		done[name] = ch
		go func() { ch <- w() }()
	}
	if _, err := s.CountLive(ctx); err != nil {
		t.Fatalf("a read while the lock is held: %v", err)
	}
	time.Sleep(500 * time.Millisecond)
	for name, ch := range done {
		select {
		case err := <-ch:
			t.Fatalf("%s finished while another session held the write lock: %v", name, err)
		default:
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	for name, ch := range done {
		select {
		case err := <-ch:
			if err != nil {
				t.Errorf("%s: %v", name, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s still waits after the lock was released", name)
		}
	}
}

// TestLeaseAcrossStores: two stores (replicas) on one database: one holds a lease, the other
// is refused until the holder stops renewing, then takes it over.
func TestLeaseAcrossStores(t *testing.T) {
	dsn := pglab.DSN(t)
	a, b := open2(t, dsn), open2(t, dsn)
	defer a.Close()
	defer b.Close()
	ctx := t.Context()
	if held, _, err := a.AcquireLease(ctx, "sandbox/sb-1", "replica-a", 400*time.Millisecond); err != nil || !held {
		t.Fatalf("a: %v, %v", held, err)
	}
	held, exp, err := b.AcquireLease(ctx, "sandbox/sb-1", "replica-b", time.Minute)
	if err != nil || held {
		t.Fatalf("b while a holds it: %v, %v", held, err)
	}
	time.Sleep(time.Until(exp) + 100*time.Millisecond)
	if held, _, err := b.AcquireLease(ctx, "sandbox/sb-1", "replica-b", time.Minute); err != nil || !held {
		t.Fatalf("b after a's lease expired: %v, %v", held, err)
	}
	if l, _, err := a.GetLease(ctx, "sandbox/sb-1"); err != nil || l.Holder != "replica-b" || !l.Live {
		t.Fatalf("a sees %+v, %v", l, err)
	}
}
