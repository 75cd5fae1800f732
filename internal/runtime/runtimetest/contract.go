package runtimetest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/guest"
	"github.com/agentbox/agentbox/internal/runtime"
)

// deathTimeout bounds how long a stopped or killed sandbox's Wait may take to return.
const deathTimeout = 15 * time.Second

// testHostname (host): the sandbox's hostname is its id.
func testHostname(t *testing.T, rt runtime.Runtime) {
	id := NewID()
	c := Start(t, rt, DefaultSpec(id))
	if res := Exec(t, c, "uname", "-n"); strings.TrimSpace(res.Stdout) != id {
		t.Fatalf("hostname %q, want %q (%+v)", res.Stdout, id, res)
	}
}

// testAgent: Agent's dialer reaches the agent (health, then a command over a fresh client, many
// dials in a row); an unknown id is SANDBOX_NOT_FOUND.
func testAgent(t *testing.T, rt runtime.Runtime) {
	ctx := context.Background()
	id := NewID()
	Start(t, rt, DefaultSpec(id))
	dial, err := rt.Agent(ctx, id)
	if err != nil {
		t.Fatalf("agent: %v", err)
	}
	conn, err := dial(ctx)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	conn.Close()
	for range 3 {
		c := guest.NewClient(guest.Dialer(dial))
		h, err := c.Health(ctx)
		if err != nil || !h.OK {
			t.Fatalf("health over the dialer: %+v %v", h, err)
		}
		if res := Exec(t, c, "echo", "over", "agent"); res.Stdout != "over agent\n" {
			t.Fatalf("exec over the dialer: %+v", res)
		}
		c.Close()
	}
	if _, err := rt.Agent(ctx, NewID()); !errcode.Is(err, errcode.SandboxNotFound) {
		t.Fatalf("agent of an unknown sandbox: %v, want SANDBOX_NOT_FOUND", err)
	}
}

// waitAsync calls Wait in a goroutine and returns its result channel.
func waitAsync(ctx context.Context, w runtime.Waiter, id string) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- w.Wait(ctx, id) }()
	return ch
}

// waiter returns rt as a runtime.Waiter or fails the test: every runtime agentbox has waits.
func waiter(t testing.TB, rt runtime.Runtime) runtime.Waiter {
	t.Helper()
	w, ok := rt.(runtime.Waiter)
	if !ok {
		t.Fatalf("runtime %s is not a runtime.Waiter", rt.Name())
	}
	return w
}

// wantNoReturn checks that ch stays empty for d.
func wantNoReturn(t testing.TB, ch <-chan error, d time.Duration, what string) {
	t.Helper()
	select {
	case err := <-ch:
		t.Fatalf("Wait returned %v %s", err, what)
	case <-time.After(d):
	}
}

// wantReturn waits for ch's value and checks it.
func wantReturn(t testing.TB, ch <-chan error, want error, what string) {
	t.Helper()
	select {
	case err := <-ch:
		if !errors.Is(err, want) && !(want == nil && err == nil) {
			t.Fatalf("Wait %s returned %v, want %v", what, err, want)
		}
	case <-time.After(deathTimeout):
		t.Fatalf("Wait did not return within %s %s", deathTimeout, what)
	}
}

// testWaitStop: Wait blocks while the sandbox runs and returns nil once Stop killed it; Wait on
// a stopped, a deleted and a never-created sandbox returns nil at once.
func testWaitStop(t *testing.T, rt runtime.Runtime) {
	w := waiter(t, rt)
	ctx := context.Background()
	id := NewID()
	Start(t, rt, DefaultSpec(id))
	ch := waitAsync(ctx, w, id)
	wantNoReturn(t, ch, 300*time.Millisecond, "while the sandbox runs")
	if err := rt.Stop(ctx, id); err != nil {
		t.Fatalf("stop: %v", err)
	}
	wantReturn(t, ch, nil, "after Stop")
	wantReturn(t, waitAsync(ctx, w, id), nil, "on a stopped sandbox")
	if err := rt.Delete(ctx, id); err != nil {
		t.Fatalf("delete: %v", err)
	}
	wantReturn(t, waitAsync(ctx, w, id), nil, "on a deleted sandbox")
	wantReturn(t, waitAsync(ctx, w, NewID()), nil, "on a never-created sandbox")
}

// testWaitKilled: when the sandbox's init dies behind the runtime's back, Wait returns, State
// says stopped, and the agent does not answer.
func testWaitKilled(t *testing.T, rt runtime.Runtime, kill Killer) {
	w := waiter(t, rt)
	ctx := context.Background()
	id := NewID()
	c := Start(t, rt, DefaultSpec(id))
	ch := waitAsync(ctx, w, id)
	wantNoReturn(t, ch, 200*time.Millisecond, "while the sandbox runs")
	kill(t, id)
	wantReturn(t, ch, nil, "after the init was killed")
	wantState(t, rt, id, runtime.StatusStopped)
	hctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, err := c.Health(hctx); err == nil {
		t.Fatal("the agent still answers after its init was killed")
	}
	if !listed(t, rt, id) {
		t.Fatal("a killed sandbox's resources must stay listed until Delete")
	}
}

// testWaitCancelled: Wait returns ctx.Err() when its context ends, and the sandbox runs on.
func testWaitCancelled(t *testing.T, rt runtime.Runtime) {
	w := waiter(t, rt)
	id := NewID()
	c := Start(t, rt, DefaultSpec(id))
	ctx, cancel := context.WithCancel(context.Background())
	ch := waitAsync(ctx, w, id)
	wantNoReturn(t, ch, 200*time.Millisecond, "before its context was cancelled")
	cancel()
	wantReturn(t, ch, context.Canceled, "after its context was cancelled")

	dctx, dcancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
	defer dcancel()
	wantReturn(t, waitAsync(dctx, w, id), context.DeadlineExceeded, "with a deadline")
	wantState(t, rt, id, runtime.StatusRunning)
	if res := Exec(t, c, "true"); res.ExitCode != 0 {
		t.Fatalf("the sandbox does not run on after its waits ended: %+v", res)
	}
}

// adopter returns rt as a runtime.Adopter or fails the test.
func adopter(t testing.TB, rt runtime.Runtime) runtime.Adopter {
	t.Helper()
	a, ok := rt.(runtime.Adopter)
	if !ok {
		t.Fatalf("runtime %s is not a runtime.Adopter", rt.Name())
	}
	return a
}

// testAdopt: a running sandbox adopts with its handle (twice: idempotent) and with ""; the
// sandbox still works afterwards; an unknown one is SANDBOX_NOT_FOUND and one whose init died
// is SANDBOX_NOT_RUNNING.
func testAdopt(t *testing.T, rt runtime.Runtime, kill Killer) {
	a := adopter(t, rt)
	ctx := context.Background()
	id := NewID()
	c, h := StartHandle(t, rt, DefaultSpec(id))
	for _, hh := range []runtime.Handle{h, h, ""} {
		if err := a.Adopt(ctx, id, hh); err != nil {
			t.Fatalf("adopt %s with handle %q: %v", id, hh, err)
		}
	}
	if res := Exec(t, c, "echo", "adopted"); res.Stdout != "adopted\n" {
		t.Fatalf("exec after adopt: %+v", res)
	}
	if err := a.Adopt(ctx, NewID(), h); !errcode.Is(err, errcode.SandboxNotFound) {
		t.Fatalf("adopt of an unknown sandbox: %v, want SANDBOX_NOT_FOUND", err)
	}
	kill(t, id)
	if err := waiter(t, rt).Wait(ctx, id); err != nil {
		t.Fatalf("wait: %v", err)
	}
	if err := a.Adopt(ctx, id, h); !errcode.Is(err, errcode.SandboxNotRunning) {
		t.Fatalf("adopt of a sandbox whose init died: %v, want SANDBOX_NOT_RUNNING", err)
	}
}

// testHandle: Create and Run (CreateAndStart) return handles that Adopt accepts for their own
// sandbox; handles of two sandboxes, or of one deleted and re-created under the same id, are
// either both "" or distinct, and Adopt refuses the other one's.
func testHandle(t *testing.T, rt runtime.Runtime) {
	a := adopter(t, rt)
	ctx := context.Background()
	idA, idB := NewID(), NewID()
	_, hA := StartHandle(t, rt, DefaultSpec(idA))
	t.Cleanup(func() { _ = rt.Delete(context.Background(), idB) })
	hB, err := rt.Create(ctx, DefaultSpec(idB))
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	if err := rt.Start(ctx, idB); err != nil {
		t.Fatalf("start: %v", err)
	}
	rctx, cancel := context.WithTimeout(ctx, ReadyTimeout)
	defer cancel()
	if err := Client(t, rt, idB).WaitReady(rctx); err != nil {
		t.Fatal(err)
	}
	if err := a.Adopt(ctx, idB, hB); err != nil {
		t.Fatalf("adopt with Create's handle %q: %v", hB, err)
	}
	if err := a.Adopt(ctx, idA, hA); err != nil {
		t.Fatalf("adopt with CreateAndStart's handle %q: %v", hA, err)
	}
	if hA == "" && hB == "" {
		return // the runtime needs no handle: nothing more to tell apart
	}
	if hA == hB {
		t.Fatalf("two sandboxes have the same handle %q", hA)
	}
	if err := a.Adopt(ctx, idA, hB); err == nil {
		t.Fatalf("adopt of %s with %s's handle succeeded", idA, idB)
	}
	// The same id again: a new sandbox, so a new handle, and the old one is refused.
	if err := rt.Delete(ctx, idB); err != nil {
		t.Fatalf("delete: %v", err)
	}
	_, hB2 := StartHandle(t, rt, DefaultSpec(idB))
	if hB2 == hB {
		t.Fatalf("a re-created sandbox has its predecessor's handle %q", hB)
	}
	if err := a.Adopt(ctx, idB, hB); err == nil {
		t.Fatalf("adopt of the re-created %s with its predecessor's handle succeeded", idB)
	}
	if err := a.Adopt(ctx, idB, hB2); err != nil {
		t.Fatalf("adopt of the re-created %s with its own handle: %v", idB, err)
	}
}

// testNetworkModes: network "" and "none" are accepted; any other mode is INVALID_ARGUMENT
// naming the supported modes, and leaves nothing behind.
func testNetworkModes(t *testing.T, rt runtime.Runtime) {
	ctx := context.Background()
	spec := DefaultSpec(NewID())
	spec.Network = runtime.NetworkNone
	c := Start(t, rt, spec)
	if res := Exec(t, c, "true"); res.ExitCode != 0 {
		t.Fatalf("exec in a network none sandbox: %+v", res)
	}
	for _, mode := range []string{"host", "bridge", "None"} {
		spec := DefaultSpec(NewID())
		spec.Network = mode
		t.Cleanup(func() { _ = rt.Delete(context.Background(), spec.ID) })
		_, err := runtime.CreateAndStart(ctx, rt, spec)
		if !errcode.Is(err, errcode.InvalidArgument) || !strings.Contains(errcode.Message(err), runtime.NetworkNone) {
			t.Errorf("network %q: %v, want INVALID_ARGUMENT naming %q", mode, err, runtime.NetworkNone)
		}
		if _, err := rt.Create(ctx, spec); !errcode.Is(err, errcode.InvalidArgument) {
			t.Errorf("create with network %q: %v, want INVALID_ARGUMENT", mode, err)
		}
		if listed(t, rt, spec.ID) {
			t.Errorf("a refused network %q left %s behind", mode, spec.ID)
		}
	}
}

// testDisksMiB: a runtime.DiskAccounter answers without error and never negative.
func testDisksMiB(t *testing.T, rt runtime.Runtime) {
	d, ok := rt.(runtime.DiskAccounter)
	if !ok {
		t.Skipf("runtime %s does not account disks", rt.Name())
	}
	n, err := d.DisksMiB(context.Background())
	if err != nil || n < 0 {
		t.Fatalf("DisksMiB: %d %v", n, err)
	}
}
