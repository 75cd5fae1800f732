package main

import (
	"context"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/lease"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/fake"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/statedir"
	"github.com/agentbox/agentbox/internal/store/postgres"
	"github.com/agentbox/agentbox/internal/testenv/pglab"
)

// leaseProbe stands for the work serve adds with underLease (the remote-job checks): it counts
// its terms and says whether one is running.
type leaseProbe struct {
	terms   atomic.Int64
	running atomic.Bool
}

func (p *leaseProbe) work(ctx context.Context) {
	p.terms.Add(1)
	p.running.Store(true)
	defer p.running.Store(false)
	<-ctx.Done()
}

// startLeaseReplica wires a replica as buildControlPlane does on a shared (Postgres) store: its
// own state dir, store handle and Owner of the node's lifecycle lease, with probe under the
// lease, and starts its lifecycle work.
func startLeaseReplica(t *testing.T, name, dsn string, rt runtime.Runtime, probe *leaseProbe) (cp *controlPlane, closeCP func()) {
	t.Helper()
	dir := t.TempDir()
	lock, err := statedir.Acquire(dir)
	if err != nil {
		t.Fatal(err)
	}
	st, err := postgres.Open(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	svc, err := sandbox.NewService(st, []runtime.Runtime{rt}, sandbox.Config{Shared: true, SnapshotDir: filepath.Join(dir, "snapshots")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	owner := lease.New(lease.Config{Leases: st, Name: lease.Lifecycle(svc.Config().Node), Holder: name, TTL: time.Second})
	if _, err := owner.TryAcquire(t.Context()); err != nil {
		t.Fatal(err)
	}
	cp = &controlPlane{svc: svc, store: st, lock: lock, replica: name, owner: owner}
	cp.underLease(probe.work)
	cp.startLoop(context.Background())
	var once sync.Once
	closeCP = func() { once.Do(cp.Close) }
	t.Cleanup(closeCP)
	return cp, closeCP
}

// The work serve runs under the lifecycle lease (the remote-job checks) runs on the replica
// that holds it and not on the other; Close stops it and waits for it, and releases the lease,
// so the other replica's runs from then on.
func TestLeaseWorkRunsOnTheHolderOnly(t *testing.T) {
	dsn := pglab.DSN(t)
	rt, err := fake.New(fake.Config{Name: "runc"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Shutdown(context.Background()) })
	var pa, pb leaseProbe
	a, closeA := startLeaseReplica(t, "a", dsn, rt, &pa)
	b, closeB := startLeaseReplica(t, "b", dsn, rt, &pb)
	if !a.owner.Held() || b.owner.Held() {
		t.Fatalf("held: a %v, b %v; want a only", a.owner.Held(), b.owner.Held())
	}
	waitFor(t, "a's lease work to start", func() bool { return pa.running.Load() })
	// b looks for the lease every third of its TTL: over two TTLs it has asked several times.
	time.Sleep(2 * time.Second)
	if n := pb.terms.Load(); n != 0 || b.owner.Held() {
		t.Fatalf("b, not holding the lease, ran its lease work %d times (held %v)", n, b.owner.Held())
	}
	if n := pa.terms.Load(); n != 1 || !pa.running.Load() {
		t.Fatalf("a, holding the lease: %d terms, running %v; want one, running", n, pa.running.Load())
	}

	closeA()
	if pa.running.Load() {
		t.Fatal("a's lease work still runs after Close returned")
	}
	waitFor(t, "b to take the lease over and start its lease work", func() bool { return pb.running.Load() })
	if !b.owner.Held() {
		t.Fatal("b runs its lease work without holding the lease")
	}
	closeB()
	if pb.running.Load() {
		t.Fatal("b's lease work still runs after Close returned")
	}
}

// waitFor polls cond until it holds, failing t after 20 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}
