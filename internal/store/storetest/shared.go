package storetest

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/runs"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/store"
)

// RunShared runs the cases that need two stores on one database (two server processes, or two
// replicas): open returns two stores on the same new, empty database. Run closes both when the
// case ends.
func RunShared(t *testing.T, open func(t *testing.T) (a, b store.Store)) {
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, a, b store.Store)
	}{
		{"AdmitTwoStores", testAdmitTwoStores},
		{"RunsTwoStores", testRunsTwoStores},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := open(t)
			defer a.Close()
			defer b.Close()
			tc.run(t, a, b)
		})
	}
}

// Two stores on one database stand for two server processes or replicas: admission's count of
// the node's live sandboxes and the insert are one transaction under the database's write lock (SQLite's, or Postgres's advisory one), so
// creates from both never overshoot the live bound or a budget, however they interleave.
func testAdmitTwoStores(t *testing.T, a, b store.Store) {
	stores := []store.Store{a, b}
	ctx := t.Context()
	now := time.Now().UTC().Truncate(time.Millisecond)
	mk := func(mem int64) sandbox.Sandbox {
		return sandbox.Sandbox{ID: sandbox.NewID(), State: sandbox.StateCreating, Image: "host", Runtime: "runc",
			Isolation: "container", CPU: 1, MemoryMB: mem, DiskMB: 1024, Node: "n",
			CreatedAt: now, UpdatedAt: now, ExpiresAt: now.Add(time.Hour), Version: 1}
	}
	// admitAll admits 40 sandboxes of mem MiB, 20 per store at once, and returns the ids made.
	admitAll := func(lim sandbox.Admission, mem int64) []string {
		var wg sync.WaitGroup
		var mu sync.Mutex
		var made []string
		var refused atomic.Int32
		for i := range 40 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				sb := mk(mem)
				_, created, err := stores[i%2].AdmitSandbox(ctx, sb, sandbox.Event{SandboxID: sb.ID, To: sb.State, At: now}, lim)
				var over *sandbox.OverCapacityError
				switch {
				case errors.As(err, &over):
					refused.Add(1)
				case err != nil:
					t.Errorf("admit %d: %v", i, err)
				case created:
					mu.Lock()
					made = append(made, sb.ID)
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		if int(refused.Load())+len(made) != 40 {
			t.Fatalf("%d admitted and %d refused of 40", len(made), refused.Load())
		}
		return made
	}
	live := func() int {
		u, err := b.CountLive(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return u.Live
	}

	const bound = 7
	made := admitAll(sandbox.Admission{MaxLive: bound}, 256)
	if len(made) != bound || live() != bound {
		t.Fatalf("live bound %d over two stores: admitted %d, live %d", bound, len(made), live())
	}
	// Three leave live (failed): exactly three more fit, whichever store admits them.
	for _, id := range made[:3] {
		sb, err := a.GetSandbox(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		sb.State, sb.Version = sandbox.StateFailed, sb.Version+1
		if err := b.UpdateSandbox(ctx, sb, sandbox.Event{SandboxID: id, From: sandbox.StateCreating, To: sandbox.StateFailed, At: now}); err != nil {
			t.Fatal(err)
		}
	}
	if more := admitAll(sandbox.Admission{MaxLive: bound}, 256); len(more) != 3 || live() != bound {
		t.Fatalf("after 3 left: admitted %d more, live %d; want 3 and %d", len(more), live(), bound)
	}
	// A memory budget holds across the stores too: 7 × 256 live, 1000 MiB sandboxes, 4000 over.
	const budget = bound*256 + 4000
	if more := admitAll(sandbox.Admission{MemoryMB: budget}, 1000); len(more) != 4 || live() != bound+4 {
		t.Fatalf("memory budget %d MiB over two stores: admitted %d, live %d; want 4 and %d", budget, len(more), live(), bound+4)
	}
}

// Two stores on one database stand for two server processes or replicas: a claim's count and write, and a
// create's idempotency lookup and insert, must hold across them (the database's write lock), not only inside one process's writer.
func testRunsTwoStores(t *testing.T, a, b store.Store) {
	stores := []store.Store{a, b}
	ctx := t.Context()
	now := time.Now().UTC().Truncate(time.Millisecond)

	// Idempotent creates: 10 per store, one key.
	var created atomic.Int32
	ids := make(chan string, 20)
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := runs.Run{ID: fmt.Sprintf("run_key_%02d", i), Owner: "alice", State: runs.Queued, CreatedAt: now, UpdatedAt: now, Version: 1}
			r.Spec.IdempotencyKey = "one"
			got, ok, err := stores[i%2].CreateRun(ctx, r, runs.Event{To: runs.Queued})
			if err != nil {
				t.Errorf("CreateRun %d: %v", i, err)
				return
			}
			if ok {
				created.Add(1)
			}
			ids <- got.ID
		}()
	}
	wg.Wait()
	close(ids)
	first := ""
	for id := range ids {
		if first == "" {
			first = id
		}
		if id != first {
			t.Errorf("creates with one key returned runs %s and %s", first, id)
		}
	}
	if created.Load() != 1 {
		t.Errorf("20 creates with one key over two stores inserted %d runs, want 1", created.Load())
	}

	// Claims: a batch of 12 under max_parallel 3, 15 claimers per store.
	const total, bound = 12, 3
	batch := runs.Batch{ID: "bat_two", Owner: "alice", Kind: "batch", MaxParallel: bound, CreatedAt: now, Version: 1}
	var rs []runs.Run
	var evs []runs.Event
	for i := range total {
		rs = append(rs, runs.Run{ID: fmt.Sprintf("run_b_%02d", i), Owner: "alice", State: runs.Queued, CreatedAt: now, UpdatedAt: now, Version: 1})
		evs = append(evs, runs.Event{To: runs.Queued})
	}
	if _, _, err := a.CreateBatch(ctx, batch, rs, evs); err != nil {
		t.Fatal(err)
	}
	var claims, settled atomic.Int32
	for w := range 30 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := stores[w%2]
			deadline := time.Now().Add(30 * time.Second)
			for i := w; settled.Load() < total && time.Now().Before(deadline); i++ {
				r, ok, err := s.ClaimRun(ctx, rs[i%total].ID, bound, time.Now(), runs.Event{})
				if err != nil {
					t.Errorf("ClaimRun: %v", err)
					return
				}
				if !ok {
					time.Sleep(100 * time.Microsecond)
					continue
				}
				claims.Add(1)
				counts, err := s.BatchCounts(ctx, batch.ID)
				if err != nil {
					t.Errorf("BatchCounts: %v", err)
					return
				}
				active := 0
				for _, st := range runs.ActiveStates {
					active += counts[st]
				}
				if active > bound {
					t.Errorf("after a claim: %d of the batch's runs active, the bound is %d", active, bound)
				}
				time.Sleep(time.Millisecond)
				r.State, r.Version = runs.Succeeded, r.Version+1
				if err := s.UpdateRun(ctx, r, runs.Event{From: runs.Preparing}); err != nil {
					t.Errorf("UpdateRun: %v", err)
					return
				}
				settled.Add(1)
			}
		}()
	}
	wg.Wait()
	if claims.Load() != total || settled.Load() != total {
		t.Errorf("%d claims, %d settled; want %d each", claims.Load(), settled.Load(), total)
	}
}

// A sleeping sandbox counts against the live bound and disk, not cpu and memory; AdmitWake
// checks only cpu and memory, against the other live sandboxes, and writes the wake's state
// with its event in one transaction behind the version check.
func testSleepingUsageAndAdmitWake(t *testing.T, st store.Store) {
	ctx := t.Context()
	now := time.Now().UTC().Truncate(time.Millisecond)
	mk := func(state sandbox.State) sandbox.Sandbox {
		sb := sandbox.Sandbox{ID: sandbox.NewID(), State: state, Image: "host", Runtime: "runc",
			Isolation: "container", CPU: 1, MemoryMB: 512, DiskMB: 1024, Node: "n",
			CreatedAt: now, UpdatedAt: now, ExpiresAt: now.Add(time.Hour), Version: 1}
		if err := st.CreateSandbox(ctx, sb, sandbox.Event{SandboxID: sb.ID, To: state, At: now}); err != nil {
			t.Fatal(err)
		}
		return sb
	}
	asleep := mk(sandbox.StateSleeping)
	mk(sandbox.StateRunning)
	u, err := st.CountLive(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if u != (sandbox.Usage{Live: 2, CPU: 1, MemoryMB: 512, DiskMB: 2048, Sleeping: 1}) {
		t.Fatalf("usage with one running and one sleeping = %+v", u)
	}
	// Admission of a create counts the sleeping one in the live bound and disk only.
	if _, _, err := st.AdmitSandbox(ctx, sandbox.Sandbox{ID: sandbox.NewID(), State: sandbox.StateCreating, Image: "host", Runtime: "runc",
		CPU: 1, MemoryMB: 512, DiskMB: 1024, Node: "n", CreatedAt: now, UpdatedAt: now, ExpiresAt: now.Add(time.Hour), Version: 1},
		sandbox.Event{}, sandbox.Admission{MaxLive: 2}); !isOverResource(err, "sandboxes") {
		t.Fatalf("create past the live bound with a sleeping sandbox = %v; want over sandboxes", err)
	}
	wake := func(a sandbox.Admission, version int64) error {
		sb := asleep
		sb.State, sb.Version, sb.UpdatedAt = sandbox.StateCreating, version, now.Add(time.Second)
		return st.AdmitWake(ctx, sb, sandbox.Event{SandboxID: sb.ID, Type: "state", From: sandbox.StateSleeping, To: sandbox.StateCreating, At: sb.UpdatedAt}, a)
	}
	if err := wake(sandbox.Admission{MemoryMB: 1000}, 2); !isOverResource(err, "memory_mb") {
		t.Fatalf("wake past the memory budget = %v; want over memory_mb", err)
	}
	if err := wake(sandbox.Admission{CPU: 1.5}, 2); !isOverResource(err, "cpu") {
		t.Fatalf("wake past the cpu budget = %v; want over cpu", err)
	}
	if got, _ := st.GetSandbox(ctx, asleep.ID); got.State != sandbox.StateSleeping || got.Version != 1 {
		t.Fatalf("a refused wake wrote %s v%d", got.State, got.Version)
	}
	if err := wake(sandbox.Admission{MaxLive: 2, DiskMB: 2048, MemoryMB: 1024, CPU: 2}, 5); !errcode.Is(err, errcode.Conflict) {
		t.Fatalf("wake with a stale version = %v; want CONFLICT", err)
	}
	if err := wake(sandbox.Admission{MaxLive: 2, DiskMB: 2048, MemoryMB: 1024, CPU: 2}, 2); err != nil {
		t.Fatalf("wake within the budgets (the live bound and disk are full, and already count it) = %v", err)
	}
	got, _ := st.GetSandbox(ctx, asleep.ID)
	if got.State != sandbox.StateCreating || got.Version != 2 {
		t.Fatalf("after the wake's admission: %s v%d", got.State, got.Version)
	}
	evs, _ := st.ListEvents(ctx, sandbox.EventFilter{SandboxID: asleep.ID})
	if len(evs) != 2 || evs[1].To != sandbox.StateCreating {
		t.Fatalf("events %+v; want the wake's appended", evs)
	}
}

func isOverResource(err error, resource string) bool {
	var over *sandbox.OverCapacityError
	return errors.As(err, &over) && over.Resource == resource
}
