package sandbox_test

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/fake"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/sandbox/snapshots"
	"github.com/agentbox/agentbox/internal/store/sqlite"
)

func changeMap(cs []sandbox.DiffChange) map[string]string {
	m := map[string]string{}
	for _, c := range cs {
		m[c.Path] = c.Change + " " + c.Type + " " + c.Mode
	}
	return m
}

func sh(t *testing.T, e *fakeEnv, id, script string) {
	t.Helper()
	res, err := e.svc.Exec(t.Context(), id, sandbox.ExecRequest{Argv: []string{"sh", "-c", script}}, nil)
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("sh %q: %v %+v", script, err, res)
	}
}

// TestServiceDiffValidation: every bad argument is INVALID_ARGUMENT naming it.
func TestServiceDiffValidation(t *testing.T) {
	e := newFakeEnv(t, sandbox.Config{})
	sb := e.create(t, sandbox.CreateRequest{})
	for _, c := range []struct {
		req sandbox.DiffRequest
		arg string
	}{
		{sandbox.DiffRequest{OtherSandboxID: sb.ID, SnapshotID: "snap-1"}, "snapshot_id"},
		{sandbox.DiffRequest{OtherSandboxID: "../x"}, "other_sandbox_id"},
		{sandbox.DiffRequest{SnapshotID: "a/b"}, "snapshot_id"},
		{sandbox.DiffRequest{Limit: -1}, "limit"},
		{sandbox.DiffRequest{Limit: snapshots.MaxDiffLimit + 1}, "limit"},
		{sandbox.DiffRequest{MaxDiffBytes: snapshots.MaxMaxDiffBytes + 1}, "max_diff_bytes"},
		{sandbox.DiffRequest{MaxDiffBytes: -1}, "max_diff_bytes"},
		{sandbox.DiffRequest{Cursor: "relative"}, "cursor"},
	} {
		_, err := e.snaps.Diff(t.Context(), sb.ID, c.req)
		ee, ok := errcode.As(err)
		if !ok || ee.Code != errcode.InvalidArgument || ee.Details["argument"] != c.arg {
			t.Errorf("%+v: got %v (details %v), want INVALID_ARGUMENT naming %s", c.req, err, detailsOf(err), c.arg)
		}
	}
}

func detailsOf(err error) map[string]any {
	if ee, ok := errcode.As(err); ok {
		return ee.Details
	}
	return nil
}

// TestServiceDiff: a sandbox against its image (everything it wrote), against another sandbox
// (added, modified, deleted; a unified diff), paged; a stopped sandbox is SANDBOX_NOT_RUNNING.
func TestServiceDiff(t *testing.T) {
	e := newFakeEnv(t, sandbox.Config{})
	a := e.create(t, sandbox.CreateRequest{})
	b := e.create(t, sandbox.CreateRequest{})
	sh(t, e, a.ID, "mkdir -p src/pkg && printf 'one\\ntwo\\n' > src/pkg/main.txt && printf 'same\\n' > same && printf 'only a\\n' > gone && ln -s /etc/passwd link && printf '\\0\\1' > bin && chmod 4755 bin")
	sh(t, e, b.ID, "mkdir -p src/pkg && printf 'one\\n2\\n' > src/pkg/main.txt && printf 'same\\n' > same && printf 'only b\\n' > new && ln -s /etc/passwd link && printf '\\0\\2' > bin && chmod 755 bin")

	res, err := e.snaps.Diff(t.Context(), a.ID, sandbox.DiffRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Against != "image:"+a.Image || res.SandboxID != a.ID {
		t.Errorf("against %q, sandbox %q", res.Against, res.SandboxID)
	}
	want := map[string]string{"/workspace/bin": "added file 4755", "/workspace/gone": "added file 0644", "/workspace/link": "added symlink 0777",
		"/workspace/same": "added file 0644", "/workspace/src": "added dir 0755", "/workspace/src/pkg": "added dir 0755",
		"/workspace/src/pkg/main.txt": "added file 0644"}
	for p, w := range want {
		if got := changeMap(res.Changes)[p]; got != w {
			t.Errorf("against the image, %s: %q, want %q", p, got, w)
		}
	}
	if len(res.Changes) != len(want) {
		t.Errorf("against the image: %d changes, want %d: %+v", len(res.Changes), len(want), res.Changes)
	}

	// b against a: what b has that a has not.
	res, err = e.snaps.Diff(t.Context(), b.ID, sandbox.DiffRequest{OtherSandboxID: a.ID})
	if err != nil {
		t.Fatal(err)
	}
	want = map[string]string{"/workspace/bin": "modified file 0755", "/workspace/gone": "deleted file 0644",
		"/workspace/new": "added file 0644", "/workspace/src/pkg/main.txt": "modified file 0644"}
	if got := changeMap(res.Changes); len(got) != len(want) {
		t.Errorf("b against a: %v, want %v", got, want)
	}
	for p, w := range want {
		if got := changeMap(res.Changes)[p]; got != w {
			t.Errorf("b against a, %s: %q, want %q", p, got, w)
		}
	}
	if res.Against != "sandbox:"+a.ID {
		t.Errorf("against %q", res.Against)
	}
	for _, s := range []string{"--- a/workspace/src/pkg/main.txt", "-two\n", "+2\n", "+only b\n", "-only a\n"} {
		if !strings.Contains(res.Diff, s) {
			t.Errorf("unified diff lacks %q:\n%s", s, res.Diff)
		}
	}
	if !slices.Contains(res.Skipped, "/workspace/bin") {
		t.Errorf("binary not skipped: %q", res.Skipped)
	}
	noUni, err := e.snaps.Diff(t.Context(), b.ID, sandbox.DiffRequest{OtherSandboxID: a.ID, NoUnified: true})
	if err != nil || noUni.Diff != "" {
		t.Errorf("no_unified: diff %q, err %v", noUni.Diff, err)
	}

	// Pages of 1 give the same changes.
	var paged []string
	cur := ""
	for range 10 {
		p, err := e.snaps.Diff(t.Context(), b.ID, sandbox.DiffRequest{OtherSandboxID: a.ID, Limit: 1, Cursor: cur})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range p.Changes {
			paged = append(paged, c.Path)
		}
		if cur = p.NextCursor; cur == "" {
			break
		}
	}
	var all []string
	for _, c := range res.Changes {
		all = append(all, c.Path)
	}
	if !slices.Equal(paged, all) {
		t.Errorf("pages of 1: %q, want %q", paged, all)
	}

	if _, err := e.svc.Destroy(t.Context(), a.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := e.snaps.Diff(t.Context(), b.ID, sandbox.DiffRequest{OtherSandboxID: a.ID}); !errcode.Is(err, errcode.SandboxNotRunning) &&
		!errcode.Is(err, errcode.SandboxNotFound) {
		t.Errorf("against a destroyed sandbox: %v", err)
	}
}

// plainRuntime hides every optional interface of the runtime it wraps (no FilesReader).
type plainRuntime struct{ runtime.Runtime }

// TestServiceDiffUnsupported: a runtime that is no FilesReader is UNSUPPORTED_OPERATION, for
// a diff and for exec's changes (and the command is not run).
func TestServiceDiffUnsupported(t *testing.T) {
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "agentbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	rt, err := fake.New(fake.Config{Name: "runc"})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := sandbox.NewService(st, []runtime.Runtime{plainRuntime{rt}}, sandbox.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Close(); rt.Shutdown(context.Background()); st.Close() })
	snaps := snapshots.New(svc.Core(), st)
	sb, err := svc.Create(t.Context(), sandbox.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := snaps.Diff(t.Context(), sb.ID, sandbox.DiffRequest{}); !errcode.Is(err, errcode.UnsupportedOp) {
		t.Errorf("diff: %v, want UNSUPPORTED_OPERATION", err)
	}
	_, err = svc.Exec(t.Context(), sb.ID, sandbox.ExecRequest{Argv: []string{"touch", "ran"}, Changes: true}, nil)
	if !errcode.Is(err, errcode.UnsupportedOp) {
		t.Errorf("exec changes: %v, want UNSUPPORTED_OPERATION", err)
	}
	res, err := svc.Exec(t.Context(), sb.ID, sandbox.ExecRequest{Argv: []string{"ls", "ran"}}, nil)
	if err != nil || res.ExitCode == 0 {
		t.Errorf("the command of a refused exec ran: %v %+v", err, res)
	}
}

// TestExecChanges: exec with changes lists what the command added, modified and deleted, and
// nothing it did not touch; checkpoint says why no snapshot was taken where none can be.
func TestExecChanges(t *testing.T) {
	e := newFakeEnv(t, sandbox.Config{})
	sb := e.create(t, sandbox.CreateRequest{})
	sh(t, e, sb.ID, "printf keep > keep && printf old > edit && printf x > rm && mkdir d")
	res, err := e.svc.Exec(t.Context(), sb.ID, sandbox.ExecRequest{Argv: []string{"sh", "-c",
		"printf newer > edit && rm rm && printf n > d/new && chmod 700 d"}, Changes: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"/workspace/edit": "modified file 0644", "/workspace/rm": "deleted file 0644",
		"/workspace/d": "modified dir 0700", "/workspace/d/new": "added file 0644"}
	got := changeMap(res.Changes)
	if len(got) != len(want) || res.ChangesTruncated {
		t.Errorf("changes %v (truncated %v), want %v", got, res.ChangesTruncated, want)
	}
	for p, w := range want {
		if got[p] != w {
			t.Errorf("%s: %q, want %q", p, got[p], w)
		}
	}
	// Bounded: more than MaxExecChanges changes are cut and flagged.
	res, err = e.svc.Exec(t.Context(), sb.ID, sandbox.ExecRequest{Argv: []string{"sh", "-c",
		"mkdir many && cd many && i=0; while [ $i -lt 1005 ]; do : > f$i; i=$((i+1)); done"}, Changes: true}, nil)
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("%v %+v", err, res)
	}
	if len(res.Changes) != snapshots.MaxExecChanges || !res.ChangesTruncated {
		t.Errorf("%d changes, truncated %v; want %d and truncated", len(res.Changes), res.ChangesTruncated, snapshots.MaxExecChanges)
	}
	// Without changes, none are reported.
	res, err = e.svc.Exec(t.Context(), sb.ID, sandbox.ExecRequest{Argv: []string{"touch", "x"}}, nil)
	if err != nil || res.Changes != nil {
		t.Errorf("changes without asking: %v %v", res.Changes, err)
	}
	// checkpoint: the snapshot is Service.Snapshot's; where it fails the command's outcome is
	// kept and the reason given.
	res, err = e.svc.Exec(t.Context(), sb.ID, sandbox.ExecRequest{Argv: []string{"sh", "-c", "echo out"}, Checkpoint: true}, nil)
	if err != nil || res.Stdout != "out\n" {
		t.Fatalf("checkpoint exec: %v %+v", err, res)
	}
	if res.SnapshotID == "" && res.CheckpointError == "" {
		t.Errorf("checkpoint: neither a snapshot_id nor a checkpoint_error")
	}
}

// TestServiceDiffSnapshot: a sandbox against its own snapshot lists exactly what changed since,
// another sandbox can be compared with it too, an unknown snapshot is SNAPSHOT_NOT_FOUND, and
// exec's checkpoint takes a snapshot that the sandbox then equals.
func TestServiceDiffSnapshot(t *testing.T) {
	e := newSnapEnv(t, sandbox.Config{})
	a := e.create(t, sandbox.CreateRequest{})
	sh(t, e, a.ID, "printf 'v1\\n' > f && printf x > rm && mkdir d && printf k > d/keep")
	snap, err := e.snaps.Snapshot(t.Context(), a.ID, sandbox.SnapshotRequest{})
	if err != nil {
		t.Fatal(err)
	}
	sh(t, e, a.ID, "printf 'v2\\n' > f && rm rm && printf n > d/new")
	res, err := e.snaps.Diff(t.Context(), a.ID, sandbox.DiffRequest{SnapshotID: snap.ID})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"/workspace/f": "modified file 0644", "/workspace/rm": "deleted file 0644", "/workspace/d/new": "added file 0644"}
	got := changeMap(res.Changes)
	if len(got) != len(want) || res.Against != "snapshot:"+snap.ID {
		t.Errorf("against %s: %v, want %v", res.Against, got, want)
	}
	for p, w := range want {
		if got[p] != w {
			t.Errorf("%s: %q, want %q", p, got[p], w)
		}
	}
	if !strings.Contains(res.Diff, "-v1\n+v2\n") {
		t.Errorf("unified diff:\n%s", res.Diff)
	}
	// Another sandbox against a's snapshot: everything of a's is deleted, b's file added.
	b := e.create(t, sandbox.CreateRequest{})
	sh(t, e, b.ID, "printf b > only-b")
	res, err = e.snaps.Diff(t.Context(), b.ID, sandbox.DiffRequest{SnapshotID: snap.ID})
	if err != nil {
		t.Fatal(err)
	}
	got = changeMap(res.Changes)
	if got["/workspace/only-b"] != "added file 0644" || got["/workspace/d/keep"] != "deleted file 0644" || len(got) != 5 {
		t.Errorf("b against a's snapshot: %v", got)
	}
	if _, err := e.snaps.Diff(t.Context(), a.ID, sandbox.DiffRequest{SnapshotID: "snap-000000000000"}); !errcode.Is(err, errcode.SnapshotNotFound) {
		t.Errorf("unknown snapshot: %v, want SNAPSHOT_NOT_FOUND", err)
	}

	ex, err := e.svc.Exec(t.Context(), a.ID, sandbox.ExecRequest{Argv: []string{"sh", "-c", "printf v3 > f"}, Checkpoint: true, Changes: true}, nil)
	if err != nil || ex.SnapshotID == "" || ex.CheckpointError != "" {
		t.Fatalf("checkpoint: %v %+v", err, ex)
	}
	if c := changeMap(ex.Changes); len(c) != 1 || c["/workspace/f"] != "modified file 0644" {
		t.Errorf("changes with checkpoint: %v", c)
	}
	res, err = e.snaps.Diff(t.Context(), a.ID, sandbox.DiffRequest{SnapshotID: ex.SnapshotID})
	if err != nil || len(res.Changes) != 0 {
		t.Errorf("against the checkpoint just taken: %v %+v", err, res.Changes)
	}
}

// TestServiceDiffSleeping: a sleeping sandbox is compared through its sleep snapshot (the
// record's sleep_snapshot), with no wake.
func TestServiceDiffSleeping(t *testing.T) {
	e := newSnapEnv(t, sandbox.Config{})
	a := e.create(t, sandbox.CreateRequest{})
	b := e.create(t, sandbox.CreateRequest{})
	sh(t, e, a.ID, "printf saved > kept && mkdir d && printf x > d/x")
	sh(t, e, b.ID, "printf saved > kept")
	slept, err := e.svc.Sleep(t.Context(), a.ID)
	if err != nil {
		t.Fatal(err)
	}
	if slept.State != sandbox.StateSleeping || slept.SleepSnapshot == "" {
		t.Fatalf("after sleep: %s, sleep snapshot %q", slept.State, slept.SleepSnapshot)
	}
	res, err := e.snaps.Diff(t.Context(), a.ID, sandbox.DiffRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if got := changeMap(res.Changes); len(got) != 3 || got["/workspace/kept"] != "added file 0644" || got["/workspace/d/x"] != "added file 0644" {
		t.Errorf("sleeping sandbox against its image: %v", got)
	}
	// A live sandbox against the sleeping one.
	res, err = e.snaps.Diff(t.Context(), b.ID, sandbox.DiffRequest{OtherSandboxID: a.ID})
	if err != nil {
		t.Fatal(err)
	}
	if got := changeMap(res.Changes); len(got) != 2 || got["/workspace/d"] != "deleted dir 0755" || got["/workspace/d/x"] != "deleted file 0644" {
		t.Errorf("b against sleeping a: %v", got)
	}
	if st := e.state(t, a.ID); st != sandbox.StateSleeping {
		t.Errorf("a diff woke the sandbox: %s", st)
	}
}
