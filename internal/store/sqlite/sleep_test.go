package sqlite

import (
	"errors"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// A sleeping sandbox counts against the live bound and disk, not cpu and memory; AdmitWake
// checks only cpu and memory, against the other live sandboxes, and writes the wake's state
// with its event in one transaction behind the version check.
func TestSleepingUsageAndAdmitWake(t *testing.T) {
	st, _ := openTemp(t)
	defer st.Close()
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
		sandbox.Event{}, sandbox.Admission{MaxLive: 2}); !isOver(err, "sandboxes") {
		t.Fatalf("create past the live bound with a sleeping sandbox = %v; want over sandboxes", err)
	}
	wake := func(a sandbox.Admission, version int64) error {
		sb := asleep
		sb.State, sb.Version, sb.UpdatedAt = sandbox.StateCreating, version, now.Add(time.Second)
		return st.AdmitWake(ctx, sb, sandbox.Event{SandboxID: sb.ID, Type: "state", From: sandbox.StateSleeping, To: sandbox.StateCreating, At: sb.UpdatedAt}, a)
	}
	if err := wake(sandbox.Admission{MemoryMB: 1000}, 2); !isOver(err, "memory_mb") {
		t.Fatalf("wake past the memory budget = %v; want over memory_mb", err)
	}
	if err := wake(sandbox.Admission{CPU: 1.5}, 2); !isOver(err, "cpu") {
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

func isOver(err error, resource string) bool {
	var over *sandbox.OverCapacityError
	return errors.As(err, &over) && over.Resource == resource
}
