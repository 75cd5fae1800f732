package main

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/fake"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/statedir"
	"github.com/agentbox/agentbox/internal/store/sqlite"
)

// controlPlane.Close, which `agentbox serve` and `agentbox mcp` defer, waits for a destroy the
// control loop is doing before it closes the store and releases the state-dir lock.
func TestCloseWaitsForTheControlLoop(t *testing.T) {
	dir := t.TempDir()
	lock, err := statedir.Acquire(dir)
	if err != nil {
		t.Fatal(err)
	}
	st, err := sqlite.Open(t.Context(), filepath.Join(dir, "agentbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	rt, err := fake.New(fake.Config{Name: "runc"})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Shutdown(context.Background())
	var mu sync.Mutex
	now := time.Now()
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	svc, err := sandbox.NewService(st, []runtime.Runtime{rt}, sandbox.Config{Now: clock, SweepInterval: 10 * time.Millisecond}, nil)
	if err != nil {
		t.Fatal(err)
	}
	sb, err := svc.Create(t.Context(), sandbox.CreateRequest{TTLSeconds: 60})
	if err != nil {
		t.Fatal(err)
	}
	deleting, release, storeErr := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	var once sync.Once
	rt.SetFault(func(_ context.Context, op fake.Op, id string) error {
		if op == fake.OpDelete && id == sb.ID {
			once.Do(func() {
				close(deleting)
				<-release
				_, err := st.GetSandbox(context.Background(), id) // the loop's next write needs the store
				storeErr <- err
			})
		}
		return nil
	})
	cp := &controlPlane{svc: svc, store: st, lock: lock}
	cp.startLoop(t.Context())
	mu.Lock()
	now = now.Add(time.Hour) // expired: the loop destroys it
	mu.Unlock()
	select {
	case <-deleting:
	case <-time.After(10 * time.Second):
		t.Fatal("the control loop did not start the expired sandbox's destroy")
	}
	closed := make(chan struct{})
	go func() { cp.Close(); close(closed) }()
	select {
	case <-closed:
		t.Fatal("Close returned while the control loop's delete was in flight")
	case <-time.After(300 * time.Millisecond):
	}
	if l, err := statedir.Acquire(dir); err == nil {
		l.Release()
		t.Fatal("the state-dir lock was released while the control loop's delete was in flight")
	}
	close(release)
	if err := <-storeErr; err != nil {
		t.Fatalf("the store, read after the delete: %v (closed under the control loop)", err)
	}
	<-closed
}
