package sqlite

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/sandbox"
)

// Two stores on one file stand for two server processes on one database: admission's count of
// the node's live sandboxes and the insert are one transaction under SQLite's write lock, so
// creates from both never overshoot the live bound or a budget, however they interleave.
func TestAdmitTwoStoresOneFile(t *testing.T) {
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
