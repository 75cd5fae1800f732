package sqlite

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/runs"
)

// Two stores on one file stand for two server processes: a claim's count and write, and a
// create's idempotency lookup and insert, must hold across them (SQLite's write lock, taken by
// BEGIN IMMEDIATE), not only inside one process's writer.
func TestRunsTwoStoresOneFile(t *testing.T) {
	a, path := openTemp(t)
	defer a.Close()
	b, err := Open(t.Context(), path)
	if err != nil {
		t.Fatalf("second Open: %v", err)
	}
	defer b.Close()
	stores := []*Store{a, b}
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
