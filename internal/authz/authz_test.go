package authz_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/agentbox/agentbox/internal/auth"
	"github.com/agentbox/agentbox/internal/authz"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/gate"
	"github.com/agentbox/agentbox/internal/runs"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// fakeStore holds sandboxes, snapshots, runs and batches by id.
type fakeStore struct {
	sandboxes map[string]string // id → principal
	snapshots map[string]string
	runs      map[string]string // id → owner
}

func (f fakeStore) GetSandbox(_ context.Context, id string) (sandbox.Sandbox, error) {
	p, ok := f.sandboxes[id]
	if !ok {
		return sandbox.Sandbox{}, errcode.New(errcode.SandboxNotFound, "no sandbox %s", id)
	}
	return sandbox.Sandbox{ID: id, Principal: p}, nil
}

func (f fakeStore) GetSnapshot(_ context.Context, id string) (sandbox.Snapshot, error) {
	p, ok := f.snapshots[id]
	if !ok {
		return sandbox.Snapshot{}, errcode.New(errcode.SnapshotNotFound, "no snapshot %s", id)
	}
	return sandbox.Snapshot{ID: id, Principal: p}, nil
}

func (f fakeStore) GetRun(_ context.Context, id string) (runs.Run, error) {
	o, ok := f.runs[id]
	if !ok {
		return runs.Run{}, errcode.New(errcode.RunNotFound, "no run %s", id)
	}
	return runs.Run{ID: id, Owner: o}, nil
}

func (f fakeStore) GetBatch(_ context.Context, id string) (runs.Batch, error) {
	o, ok := f.runs[id]
	if !ok {
		return runs.Batch{}, errcode.New(errcode.RunNotFound, "no batch %s", id)
	}
	return runs.Batch{ID: id, Owner: o}, nil
}

// TestDecide: a key that is not admin acts only on its principal's objects; another's, and a
// missing one, are the same NotFound; an admin acts on all; a server-level object is the
// scope's business; a public route is not decided here.
func TestDecide(t *testing.T) {
	st := fakeStore{sandboxes: map[string]string{"sb-a": "key:a", "sb-old": ""}, snapshots: map[string]string{"snap-a": "key:a"},
		runs: map[string]string{"run-a": "key:a", "run-t": "token:0123"}}
	g := authz.Gate{Store: st, Runs: st}
	a := gate.Caller{ID: "a", Name: "a", Scope: auth.ScopeOperate, Principal: "key:a"}
	b := gate.Caller{ID: "b", Name: "b", Scope: auth.ScopeOperate, Principal: "key:b"}
	admin := gate.Caller{ID: "t", Name: "token", Scope: auth.ScopeAdmin, Principal: gate.AdminPrincipal}
	for _, c := range []struct {
		who  gate.Caller
		o    gate.Object
		want errcode.Code
	}{
		{a, gate.Object{Kind: gate.ObjectSandbox, ID: "sb-a"}, ""},
		{a, gate.Object{Kind: gate.ObjectJob, ID: "sb-a"}, ""},
		{b, gate.Object{Kind: gate.ObjectSandbox, ID: "sb-a"}, errcode.SandboxNotFound},
		{b, gate.Object{Kind: gate.ObjectExpose, ID: "sb-a"}, errcode.SandboxNotFound},
		{b, gate.Object{Kind: gate.ObjectSandbox, ID: "sb-missing"}, errcode.SandboxNotFound},
		{a, gate.Object{Kind: gate.ObjectSandbox, ID: "sb-old"}, errcode.SandboxNotFound}, // a record without one is the admin's
		{b, gate.Object{Kind: gate.ObjectSnapshot, ID: "snap-a"}, errcode.SnapshotNotFound},
		{a, gate.Object{Kind: gate.ObjectRun, ID: "run-a"}, ""},
		{b, gate.Object{Kind: gate.ObjectRun, ID: "run-a"}, errcode.RunNotFound},
		{a, gate.Object{Kind: gate.ObjectRun, ID: "run-t"}, errcode.RunNotFound}, // the token's run is the admin's
		{b, gate.Object{Kind: gate.ObjectBatch, ID: "run-a"}, errcode.RunNotFound},
		{admin, gate.Object{Kind: gate.ObjectSandbox, ID: "sb-a"}, ""},
		{admin, gate.Object{Kind: gate.ObjectRun, ID: "run-a"}, ""},
		{b, gate.Object{Kind: gate.ObjectMachine, ID: "m1"}, ""},
		{b, gate.Object{Kind: gate.ObjectSandbox}, ""}, // a list: filtered by its handler
	} {
		err := g.Decide(t.Context(), c.who, c.o)
		if errcode.Of(err) != c.want {
			t.Errorf("%s on %+v: %v, want %q", c.who.Name, c.o, err, c.want)
		}
	}
	// Another's and a missing object answer alike.
	e1 := g.Decide(t.Context(), b, gate.Object{Kind: gate.ObjectSandbox, ID: "sb-a"})
	e2 := authz.NotFound(gate.Object{Kind: gate.ObjectSandbox, ID: "sb-a"})
	if e1.Error() != e2.Error() {
		t.Errorf("another's: %v; missing: %v", e1, e2)
	}
	// Enter: the scope first, then every object named, in the path and in the arguments.
	call := func(surface string, obj gate.Object, args string) *gate.Call {
		return &gate.Call{Surface: surface, Tool: "x", Scope: auth.ScopeOperate, Caller: b, Object: obj, Args: json.RawMessage(args)}
	}
	for _, c := range []*gate.Call{
		call(gate.SurfaceREST, gate.Object{Kind: gate.ObjectSandbox, ID: "sb-a"}, `{}`),
		call(gate.SurfaceREST, gate.Object{}, `{"method":"POST","body":{"sandbox_id":"sb-a"}}`),
		call(gate.SurfaceREST, gate.Object{}, `{"method":"POST","body":{"Sandbox_Id":"sb-a"}}`),
		call(gate.SurfaceREST, gate.Object{}, `{"method":"POST","body":{"ſandbox_id":"sb-a"}}`),
		call(gate.SurfaceREST, gate.Object{}, `{"method":"POST","body":{"snapshot":"snap-a"}}`),
		call(gate.SurfaceMCP, gate.Object{}, `{"run_id":"run-a"}`),
		call(gate.SurfaceMCP, gate.Object{}, `{"sandbox_id":"sb-b","snapshot_id":"snap-a"}`),
		call(gate.SurfaceMCP, gate.Object{}, `{"sandbox_ids":["sb-b","sb-a"]}`), // watch_fleet
	} {
		if _, err := g.Enter(t.Context(), c); err == nil {
			t.Errorf("%s %s %s: let in", c.Surface, c.Object, c.Args)
		}
	}
	if _, err := g.Enter(t.Context(), call(gate.SurfaceMCP, gate.Object{}, `{"sandbox_id":"sb-a"}`)); !errcode.Is(err, errcode.SandboxNotFound) {
		t.Fatalf("b on a's over MCP: %v, want SANDBOX_NOT_FOUND", err)
	}
	aCall := call(gate.SurfaceMCP, gate.Object{}, `{"sandbox_id":"sb-a"}`)
	aCall.Caller = a
	if _, err := g.Enter(t.Context(), aCall); err != nil {
		t.Fatalf("a on its own: %v", err)
	}
	reader := call(gate.SurfaceREST, gate.Object{Kind: gate.ObjectSandbox, ID: "sb-a"}, `{}`)
	reader.Caller = gate.Caller{Name: "r", Scope: auth.ScopeRead, Principal: "key:a"}
	if _, err := g.Enter(t.Context(), reader); !errcode.Is(err, errcode.PermissionDenied) {
		t.Fatalf("read key on an operate route: %v", err)
	}
}

// TestSandboxPredicate: an admin's metrics are not filtered; another key sees exactly its
// principal's sandboxes, asked of the list by that principal.
func TestSandboxPredicate(t *testing.T) {
	list := func(_ context.Context, p string) ([]string, error) {
		return map[string][]string{"key:a": {"sb-a"}, "key:b": {"sb-b"}}[p], nil
	}
	admin := gate.WithCaller(context.Background(), gate.Caller{ID: "t", Scope: auth.ScopeAdmin, Principal: gate.AdminPrincipal})
	if f, err := authz.SandboxPredicate(admin, list); err != nil || f != nil {
		t.Fatalf("admin: filtered (%v)", err)
	}
	a := gate.WithCaller(context.Background(), gate.Caller{ID: "a", Scope: auth.ScopeRead, Principal: "key:a"})
	f, err := authz.SandboxPredicate(a, list)
	if err != nil || f == nil || !f("sb-a") || f("sb-b") || f("") {
		t.Fatalf("key a: predicate wrong (%v)", err)
	}
}
