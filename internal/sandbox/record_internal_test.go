package sandbox

import "testing"

// TestWithRecord: an exec takes the record its caller just read only for that sandbox and only
// while it is running; any other (another id, a sleeping sandbox that may need waking, a
// context without one) is read from the store afresh.
func TestWithRecord(t *testing.T) {
	ctx := t.Context()
	if _, ok := justRead(ctx, "sb-1"); ok {
		t.Fatal("a context without a record gave one")
	}
	run := Sandbox{ID: "sb-1", State: StateRunning, Runtime: "runc"}
	if sb, ok := justRead(WithRecord(ctx, run), "sb-1"); !ok || sb.Runtime != "runc" {
		t.Fatalf("the running record was not taken: %+v %v", sb, ok)
	}
	if _, ok := justRead(WithRecord(ctx, run), "sb-2"); ok {
		t.Fatal("another sandbox's record was taken")
	}
	for _, st := range []State{StateSleeping, StateCreating, StateStopping, StateDestroyed} {
		if _, ok := justRead(WithRecord(ctx, Sandbox{ID: "sb-1", State: st}), "sb-1"); ok {
			t.Fatalf("a %s record was taken; it must be read afresh", st)
		}
	}
}
