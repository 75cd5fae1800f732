package sandbox_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/guest"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/fake"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/sandbox/jobs"
	"github.com/agentbox/agentbox/internal/sandbox/snapshots"
	"github.com/agentbox/agentbox/internal/store/sqlite"
)

// TestOneFeaturePerCore: a feature that registers hooks is built once per core however many
// surfaces ask for it (the REST API, the MCP server and the run workers each call jobs.New), so
// its hooks run once per event.
func TestOneFeaturePerCore(t *testing.T) {
	e := newFakeEnv(t, sandbox.Config{})
	core := e.svc.Core()
	type key struct{}
	built := 0
	build := func() any { built++; return &built }
	a, b := core.Feature(key{}, build), core.Feature(key{}, build)
	if built != 1 || a != b {
		t.Fatalf("built %d times; same value: %v", built, a == b)
	}
	if j1, j2 := jobs.New(core, e.st), jobs.New(e.svc.Core(), e.st); j1 != j2 || j1 != e.jobs {
		t.Fatalf("jobs.New on one core gave different features: %p %p %p", j1, j2, e.jobs)
	}
}

// TestCreateHooks: a create calls a feature's create hooks in their stages' order — Request
// (which may change the request), Prepare (the runtime picked, the record drafted), Spec, Up
// (the agent answering), then what Up left for once the record says running, and what was
// deferred when the create ends; a Prepare hook's answer ends the create with nothing recorded,
// and a failing Up hook fails the create and its record.
func TestCreateHooks(t *testing.T) {
	e := newFakeEnv(t, sandbox.Config{})
	var stages []string
	e.svc.Core().Register(sandbox.Hooks{Name: "probe",
		Request: func(_ context.Context, c *sandbox.Creation) error {
			if c.Runtime != nil || c.Sandbox != nil {
				t.Errorf("Request saw a runtime or a draft record")
			}
			stages = append(stages, "request")
			c.Defer(func() { stages = append(stages, "end") })
			c.Req.Labels = map[string]string{"probe": c.Req.Labels["probe"], "narrowed": "yes"}
			return nil
		},
		Prepare: func(_ context.Context, c *sandbox.Creation) error {
			stages = append(stages, "prepare")
			if c.Runtime == nil || c.Sandbox == nil || c.Sandbox.ID == "" || c.Sandbox.Labels["narrowed"] != "yes" {
				t.Errorf("Prepare: runtime %v, draft %+v; want both, with the narrowed request's labels", c.Runtime, c.Sandbox)
			}
			if c.Req.Labels["probe"] == "answer" {
				c.Answer(sandbox.Sandbox{ID: "sb-answered"}, nil)
			}
			return nil
		},
		Spec: func(sb sandbox.Sandbox, spec *runtime.Spec) {
			if spec.ID == sb.ID {
				stages = append(stages, "spec")
			}
		},
		Up: func(_ context.Context, c *sandbox.Creation, gc *guest.Client) error {
			stages = append(stages, "up")
			if gc == nil {
				t.Errorf("Up without the agent's client")
			}
			if c.Req.Labels["probe"] == "fail" {
				return errcode.New(errcode.RuntimeUnavailable, "probe refused")
			}
			c.OnStarted(func(sb sandbox.Sandbox, ok bool) {
				stages = append(stages, fmt.Sprintf("started %v %s", ok, sb.State))
			})
			return nil
		},
	})
	sb, err := e.svc.Create(t.Context(), sandbox.CreateRequest{Labels: map[string]string{"probe": "run"}})
	if err != nil {
		t.Fatal(err)
	}
	if want := "request prepare spec up started true running end"; strings.Join(stages, " ") != want {
		t.Fatalf("stages: %q; want %q", stages, want)
	}
	if sb.Labels["narrowed"] != "yes" {
		t.Fatalf("record's labels %v; want the request as the Request hook left it", sb.Labels)
	}

	stages = nil
	sb, err = e.svc.Create(t.Context(), sandbox.CreateRequest{Labels: map[string]string{"probe": "answer"}})
	if err != nil || sb.ID != "sb-answered" {
		t.Fatalf("answered create: %+v %v; want the hook's answer", sb, err)
	}
	if want := "request prepare end"; strings.Join(stages, " ") != want {
		t.Fatalf("answered create's stages: %q; want %q", stages, want)
	}

	stages = nil
	_, err = e.svc.Create(t.Context(), sandbox.CreateRequest{Labels: map[string]string{"probe": "fail"}})
	if errcode.Of(err) != errcode.RuntimeUnavailable {
		t.Fatalf("create whose Up hook failed: %v; want RUNTIME_UNAVAILABLE", err)
	}
	if want := "request prepare spec up end"; strings.Join(stages, " ") != want {
		t.Fatalf("failed create's stages: %q; want %q", stages, want)
	}
	all, err := e.svc.List(t.Context(), sandbox.ListFilter{})
	if err != nil {
		t.Fatal(err)
	}
	states := map[sandbox.State]int{}
	for _, sb := range all {
		states[sb.State]++
	}
	if states[sandbox.StateRunning] != 1 || states[sandbox.StateFailed] != 1 || len(all) != 2 {
		t.Fatalf("records: %v; want the first create running, the failed one failed, nothing of the answered one", states)
	}
}

// TestSnapshotsFeatureHooks: the core serves an exec's changes and checkpoint and a create from
// a snapshot only through the snapshots feature's hooks. Without the feature they are
// UNSUPPORTED_OPERATION (the exec's command not run); with it (built once per core) they work.
func TestSnapshotsFeatureHooks(t *testing.T) {
	dir := t.TempDir()
	st, err := sqlite.Open(t.Context(), filepath.Join(dir, "agentbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	rt, err := fake.New(fake.Config{Name: "runc"})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := sandbox.NewService(st, []runtime.Runtime{rt}, sandbox.Config{SnapshotDir: filepath.Join(dir, "snapshots")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Close(); rt.Shutdown(context.Background()); st.Close() })
	sb, err := svc.Create(t.Context(), sandbox.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, req := range []sandbox.ExecRequest{
		{Argv: []string{"touch", "ran"}, Changes: true},
		{Argv: []string{"touch", "ran"}, Checkpoint: true},
	} {
		if _, err := svc.Exec(t.Context(), sb.ID, req, nil); !errcode.Is(err, errcode.UnsupportedOp) {
			t.Errorf("exec %+v without the snapshots feature: %v, want UNSUPPORTED_OPERATION", req, err)
		}
	}
	if res, err := svc.Exec(t.Context(), sb.ID, sandbox.ExecRequest{Argv: []string{"ls", "ran"}}, nil); err != nil || res.ExitCode == 0 {
		t.Errorf("the command of a refused exec ran: %v %+v", err, res)
	}
	if _, err := svc.Create(t.Context(), sandbox.CreateRequest{Snapshot: "snap-0123456789ab"}); !errcode.Is(err, errcode.UnsupportedOp) {
		t.Errorf("create from a snapshot without the snapshots feature: %v, want UNSUPPORTED_OPERATION", err)
	}

	snaps := snapshots.New(svc.Core(), st)
	if again := snapshots.New(svc.Core(), st); again != snaps {
		t.Fatalf("snapshots.New on one core gave different features: %p %p", snaps, again)
	}
	res, err := svc.Exec(t.Context(), sb.ID, sandbox.ExecRequest{Argv: []string{"touch", "made"}, Changes: true, Checkpoint: true}, nil)
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("exec with changes and checkpoint: %+v %v", res, err)
	}
	if len(res.Changes) != 1 || !strings.HasSuffix(res.Changes[0].Path, "/made") || res.Changes[0].Change != sandbox.ChangeAdded || res.SnapshotID == "" {
		t.Fatalf("exec's changes %+v, snapshot %q (%s); want made added and a checkpoint", res.Changes, res.SnapshotID, res.CheckpointError)
	}
	made, err := svc.Create(t.Context(), sandbox.CreateRequest{Snapshot: res.SnapshotID})
	if err != nil || made.FromSnapshot != res.SnapshotID {
		t.Fatalf("create from the checkpoint: %+v %v", made, err)
	}
}
