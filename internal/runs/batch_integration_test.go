package runs_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/runs"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/fake"
	"github.com/agentbox/agentbox/internal/runtime/oci"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/sandbox/jobs"
	"github.com/agentbox/agentbox/internal/store/sqlite"
	"github.com/agentbox/agentbox/internal/testenv"
)

// runEnv is a run service over real SQLite and a sandbox service on rt, its workers running.
type runEnv struct {
	svc *runs.Service
	sb  *sandbox.Service
	st  *sqlite.Store
}

func newRunEnv(t *testing.T, rt runtime.Runtime, dir string, checkoutDirs ...string) *runEnv {
	t.Helper()
	st, err := sqlite.Open(t.Context(), filepath.Join(dir, "agentbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	sb, err := sandbox.NewService(st, []runtime.Runtime{rt}, sandbox.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	svc, err := runs.New(runs.Config{Sandboxes: jobs.With(sb), Store: st, Dir: filepath.Join(dir, "runs"),
		BaseURL: func() string { return "http://127.0.0.1:1" }, CheckoutDirs: checkoutDirs})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); svc.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
		svc.Close()
		list, _ := sb.List(context.Background(), sandbox.ListFilter{})
		for _, s := range list {
			t.Errorf("sandbox %s left behind by the runs (state %s)", s.ID, s.State)
			sb.Destroy(context.Background(), s.ID)
		}
		sb.Close()
		st.Close()
	})
	return &runEnv{svc: svc, sb: sb, st: st}
}

func newFakeRunEnv(t *testing.T) *runEnv {
	t.Helper()
	rt, err := fake.New(fake.Config{Name: "runc"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Shutdown(context.Background()) })
	return newRunEnv(t, rt, t.TempDir())
}

func mustJSON(t *testing.T, v any) json.RawMessage {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func waitBatch(t *testing.T, e *runEnv, id string) runs.Batch {
	t.Helper()
	b, err := e.svc.WaitBatch(t.Context(), id, 3*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if !b.Settled {
		t.Fatalf("batch %s not settled after 3 minutes: %+v", id, b.Counts)
	}
	return b
}

// TestBatchParallelBound: 12 runs under max_parallel 3 never run more than 3 at once (from
// the runs' events: each run's claim (preparing) to its settling), and the invalid spec is a
// submission failure, not a run.
func TestBatchParallelBound(t *testing.T) {
	e := newFakeRunEnv(t)
	var specs []json.RawMessage
	for i := 0; i < 12; i++ {
		if i == 5 {
			specs = append(specs, json.RawMessage(`{"command":["true"],"retention":"forever"}`))
		}
		specs = append(specs, mustJSON(t, runs.Spec{Command: []string{"sh", "-c", "sleep 0.3"}, Dir: t.TempDir(),
			Labels: map[string]string{"n": fmt.Sprint(i)}}))
	}
	b, err := e.svc.StartBatch(t.Context(), runs.BatchRequest{Runs: specs, MaxParallel: 3})
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Runs) != 12 || len(b.SubmissionFailures) != 1 || b.MaxParallel != 3 || b.Kind != runs.KindBatch {
		t.Fatalf("batch %+v", b)
	}
	f := b.SubmissionFailures[0]
	if f.Index != 5 || f.Code != string(errcode.InvalidArgument) || !strings.Contains(f.Error, "runs[5]") || !strings.Contains(f.Error, "retention") {
		t.Fatalf("submission failure %+v", f)
	}
	for i, br := range b.Runs {
		want := i
		if i >= 5 {
			want = i + 1 // the failure kept its index; the runs keep theirs
		}
		if br.Index != want || br.RunID == "" {
			t.Fatalf("run line %d: %+v", i, br)
		}
	}

	// The hook the runner calls on each settle records the batch settled (read from the store,
	// not through GetBatch, which would derive it itself).
	deadline := time.Now().Add(3 * time.Minute)
	for {
		sb, err := e.st.GetBatch(t.Context(), b.ID)
		if err != nil {
			t.Fatal(err)
		}
		if sb.Settled {
			if sb.SettledAt == nil || sb.Counts[runs.Succeeded] != 12 {
				t.Fatalf("stored settled batch: counts %v settled_at %v", sb.Counts, sb.SettledAt)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the stored batch never settled: %v", sb.Counts)
		}
		time.Sleep(50 * time.Millisecond)
	}
	b = waitBatch(t, e, b.ID)
	if b.Counts[runs.Succeeded] != 12 || len(b.Counts) != 1 {
		t.Fatalf("counts %v", b.Counts)
	}

	type edge struct {
		at    time.Time
		delta int
	}
	var edges []edge
	for _, br := range b.Runs {
		if br.State != runs.Succeeded {
			t.Fatalf("run %s: %s", br.RunID, br.State)
		}
		evs, err := e.svc.Events(t.Context(), br.RunID, 0, runs.MaxEventsPage)
		if err != nil {
			t.Fatal(err)
		}
		var start, end time.Time
		for _, ev := range evs.Events {
			if ev.To == runs.Preparing && start.IsZero() {
				start = ev.Time
			}
			if ev.To.Settled() {
				end = ev.Time
			}
		}
		if start.IsZero() || end.IsZero() || end.Before(start) {
			t.Fatalf("run %s events: %+v", br.RunID, evs.Events)
		}
		edges = append(edges, edge{start, +1}, edge{end, -1})
	}
	// At equal times an end counts before a start (a settle frees the slot the next claim takes).
	sort.Slice(edges, func(i, j int) bool {
		if !edges[i].at.Equal(edges[j].at) {
			return edges[i].at.Before(edges[j].at)
		}
		return edges[i].delta < edges[j].delta
	})
	cur, peak := 0, 0
	for _, ed := range edges {
		cur += ed.delta
		peak = max(peak, cur)
	}
	t.Logf("peak concurrency %d of max_parallel 3", peak)
	if peak > 3 {
		t.Fatalf("%d runs of the batch ran at once; max_parallel is 3", peak)
	}
	if peak < 2 {
		t.Fatalf("peak %d: the batch never ran in parallel", peak)
	}

	// Listing shows it; canceling a settled batch changes nothing.
	l, err := e.svc.ListBatches(t.Context(), "", 10)
	if err != nil || len(l.Batches) != 1 || l.Batches[0].ID != b.ID || !l.Batches[0].Settled {
		t.Fatalf("list %+v %v", l, err)
	}
	c, err := e.svc.CancelBatch(t.Context(), b.ID)
	if err != nil || c.Counts[runs.Succeeded] != 12 {
		t.Fatalf("cancel of a settled batch: %v %v", c.Counts, err)
	}
}

// TestBatchRefusals: bad batch arguments are INVALID_ARGUMENT with nothing recorded; a batch
// whose every spec is bad is a settled record listing the failures.
func TestBatchRefusals(t *testing.T) {
	e := newFakeRunEnv(t)
	ok := json.RawMessage(`{"command":["true"]}`)
	for _, tc := range []struct {
		req  runs.BatchRequest
		want string
	}{
		{runs.BatchRequest{Runs: []json.RawMessage{ok}, MaxParallel: 65}, "max_parallel is 65; it must be 1..64"},
		{runs.BatchRequest{Runs: []json.RawMessage{ok}, MaxParallel: -1}, "max_parallel is -1"},
		{runs.BatchRequest{}, "runs: give 1..256"},
		{runs.BatchRequest{Runs: slices.Repeat([]json.RawMessage{ok}, 257)}, "runs: 257 specs, at most 256"},
	} {
		_, err := e.svc.StartBatch(t.Context(), tc.req)
		if !errcode.Is(err, errcode.InvalidArgument) || !strings.Contains(errcode.Message(err), tc.want) {
			t.Fatalf("err %v, want %q", err, tc.want)
		}
	}
	_, err := e.svc.StartMatrix(t.Context(), runs.MatrixRequest{Base: ok, Axes: map[string][]json.RawMessage{
		"image": slices.Repeat([]json.RawMessage{json.RawMessage(`"a"`)}, 17), "env.A": slices.Repeat([]json.RawMessage{json.RawMessage(`"b"`)}, 16)}})
	if !errcode.Is(err, errcode.InvalidArgument) || !strings.Contains(errcode.Message(err), "exceeds 256 cells") {
		t.Fatalf("matrix of 272: %v", err)
	}
	l, _ := e.svc.ListBatches(t.Context(), "", 10)
	rl, _ := e.st.ListRuns(t.Context(), runs.Filter{Limit: 10})
	if len(l.Batches) != 0 || len(rl.Runs) != 0 {
		t.Fatalf("refused requests recorded %d batches, %d runs", len(l.Batches), len(rl.Runs))
	}

	b, err := e.svc.StartBatch(t.Context(), runs.BatchRequest{Runs: []json.RawMessage{
		json.RawMessage(`{"command":["true"],"bogus":1}`), json.RawMessage(`"x"`), json.RawMessage(`null`),
		json.RawMessage(`{"command":["true"],"idempotency_key":"k"}`)}})
	if err != nil {
		t.Fatal(err)
	}
	if !b.Settled || b.SettledAt == nil || len(b.Runs) != 0 || len(b.SubmissionFailures) != 4 ||
		!strings.Contains(b.SubmissionFailures[0].Error, `unknown field "bogus"`) || b.SubmissionFailures[2].Index != 2 ||
		!strings.Contains(b.SubmissionFailures[3].Error, "spec.idempotency_key: not allowed in a batch's run") {
		t.Fatalf("all-bad batch %+v", b)
	}
	if _, err := e.svc.GetBatch(t.Context(), "batch-000000000000"); !errcode.Is(err, errcode.RunNotFound) {
		t.Fatalf("unknown batch: %v", err)
	}
	if _, err := e.svc.GetBatch(t.Context(), "../x"); !errcode.Is(err, errcode.InvalidArgument) {
		t.Fatalf("unknown batch: %v", err)
	}
}

// TestMatrix2x2: a 2×2 matrix runs its four cells and reports them as a table by axis values.
func TestMatrix2x2(t *testing.T) {
	e := newFakeRunEnv(t)
	base := mustJSON(t, map[string]any{"command": []string{"sh", "-c", `echo "mode=$MODE"; exit $CODE`}, "dir": t.TempDir(),
		"env": map[string]string{"CODE": "9"}})
	b, err := e.svc.StartMatrix(t.Context(), runs.MatrixRequest{Base: base, MaxParallel: 2, Axes: map[string][]json.RawMessage{
		"env.MODE": {json.RawMessage(`"a"`), json.RawMessage(`"b"`)},
		"env.CODE": {json.RawMessage(`"0"`), json.RawMessage(`"3"`)},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if b.Kind != runs.KindMatrix || len(b.Matrix) != 4 || strings.Join(b.Axes, ",") != "env.CODE,env.MODE" {
		t.Fatalf("matrix %+v", b)
	}
	b = waitBatch(t, e, b.ID)
	want := []struct {
		code, mode string
		state      runs.State
		exit       int
	}{{"0", "a", runs.Succeeded, 0}, {"0", "b", runs.Succeeded, 0}, {"3", "a", runs.Failed, 3}, {"3", "b", runs.Failed, 3}}
	for i, c := range b.Matrix {
		w := want[i]
		if string(c.Values["env.CODE"]) != `"`+w.code+`"` || string(c.Values["env.MODE"]) != `"`+w.mode+`"` {
			t.Fatalf("cell %d values %s", i, c.Values)
		}
		if c.State != w.state || c.ExitCodes[runs.PhaseCommand] == nil || *c.ExitCodes[runs.PhaseCommand] != w.exit {
			t.Fatalf("cell %d (%s,%s): state %s exit codes %v", i, w.code, w.mode, c.State, c.ExitCodes)
		}
		r, err := e.svc.Get(t.Context(), c.RunID)
		if err != nil {
			t.Fatal(err)
		}
		if r.BatchID != b.ID || r.Spec.Env["MODE"] != w.mode || !strings.Contains(r.Phases[slices.IndexFunc(r.Phases, func(p runs.Phase) bool { return p.Name == runs.PhaseCommand })].Stdout, "mode="+w.mode) {
			t.Fatalf("cell %d run %+v", i, r)
		}
	}
	if b.Counts[runs.Succeeded] != 2 || b.Counts[runs.Failed] != 2 {
		t.Fatalf("counts %v", b.Counts)
	}
}

// git runs git in dir with a fixed identity and no system or user config.
func git(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "HOME="+dir, "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com",
		"GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.com", "GIT_AUTHOR_DATE=2026-01-01T00:00:00Z", "GIT_COMMITTER_DATE=2026-01-01T00:00:00Z")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}

func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for p, c := range files {
		full := filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(c), 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

// ompLauncher is the fixture agent's packages/coding-agent/scripts/omp: it checks the preset's
// arguments and its build, then edits the target deterministically.
const ompLauncher = `set -e
[ "$1" = --print ] && [ "$2" = -- ] && [ $# -eq 3 ] || { echo "bad arguments: $*" >&2; exit 64; }
test -f /workspace/omp/built || { echo "the agent was not built" >&2; exit 65; }
printf 'agent did: %s\n' "$3" >> NOTES.md
echo hello > added.txt
echo "edited NOTES.md, added added.txt"
`

// TestAgentCompare: the omp preset against a fixture agent repository (file:// under a
// checkout dir) in real runc sandboxes: ref "good" builds and edits the target, ref "broken"
// fails its build; two repetitions per side, interleaved.
func TestAgentCompare(t *testing.T) {
	testenv.RequireRoot(t)
	dir := testenv.ShortTempDir(t, "abrun")
	repos := filepath.Join(dir, "repos")
	agent, target := filepath.Join(repos, "agent"), filepath.Join(repos, "target")
	for _, d := range []string{agent, target} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		git(t, d, "init", "-q", "-b", "main")
	}
	writeFiles(t, target, map[string]string{"NOTES.md": "# notes\n"})
	git(t, target, "add", "-A")
	git(t, target, "commit", "-qm", "target")
	targetCommit := git(t, target, "rev-parse", "HEAD")

	writeFiles(t, agent, map[string]string{"build.sh": "touch built\necho built\n",
		"packages/coding-agent/scripts/omp": ompLauncher})
	git(t, agent, "add", "-A")
	git(t, agent, "commit", "-qm", "good agent")
	git(t, agent, "branch", "good")
	writeFiles(t, agent, map[string]string{"build.sh": "echo 'build broken: missing dependency' >&2\nexit 2\n"})
	git(t, agent, "commit", "-qam", "broken build")
	git(t, agent, "branch", "broken")
	goodCommit, brokenCommit := git(t, agent, "rev-parse", "good"), git(t, agent, "rev-parse", "broken")

	rt, err := oci.New(t.Context(), oci.Config{Name: "runc", Binary: "runc", Root: filepath.Join(dir, "rt"), GuestBinary: testenv.GuestBinary(t),
		CgroupParent: "abt-" + filepath.Base(dir), Subreaper: true})
	if err != nil {
		t.Fatal(err)
	}
	e := newRunEnv(t, rt, dir, repos)

	task := `note "this"; $(rm -rf /) stays literal`
	b, err := e.svc.AgentCompare(t.Context(), runs.CompareRequest{
		Baseline:           &runs.AgentSide{RepoURL: "file://" + agent, Ref: "good"},
		Candidate:          runs.AgentSide{RepoURL: "file://" + agent, Ref: "broken"},
		Preset:             runs.PresetOMP,
		TargetRepoURL:      "file://" + target,
		Task:               task,
		BuildCommand:       []string{"sh", "build.sh"},
		SetupCommand:       []string{"sh", "-c", "test -f NOTES.md"},
		ValidationCommands: [][]string{{"grep", "-qF", "agent did: " + task, "NOTES.md"}},
		Repetitions:        2,
		MaxParallel:        2,
		TimeoutSeconds:     300,
	})
	if err != nil {
		t.Fatal(err)
	}
	if b.Kind != runs.KindAgentCompare || len(b.Runs) != 4 || b.Compare == nil {
		t.Fatalf("compare batch %+v", b)
	}
	b = waitBatch(t, e, b.ID)
	cmp := b.Compare
	wantInv := []string{"/bin/sh", "/workspace/omp/packages/coding-agent/scripts/omp", "--print", "--", task}
	if !slices.Equal(cmp.Invocation, wantInv) || cmp.Task != task || len(cmp.Sides) != 2 {
		t.Fatalf("comparison %+v", cmp)
	}
	// Interleaved submission: baseline 1, candidate 1, baseline 2, candidate 2.
	order := []string{cmp.Sides[0].Repetitions[0].RunID, cmp.Sides[1].Repetitions[0].RunID, cmp.Sides[0].Repetitions[1].RunID, cmp.Sides[1].Repetitions[1].RunID}
	for i, br := range b.Runs {
		if br.RunID != order[i] || br.Index != i {
			t.Fatalf("run %d is %s, want %s (interleaved)", i, br.RunID, order[i])
		}
	}
	base, cand := cmp.Sides[0], cmp.Sides[1]
	if base.Side != runs.SideBaseline || base.Ref != "good" || cand.Side != runs.SideCandidate || cand.Ref != "broken" {
		t.Fatalf("sides %+v %+v", base, cand)
	}
	if base.Counts[runs.Succeeded] != 2 || base.Passed != 2 || base.MedianTaskMs == nil {
		t.Fatalf("baseline: %+v", base)
	}
	for _, rep := range base.Repetitions {
		r, err := e.svc.Get(t.Context(), rep.RunID)
		if err != nil || r.ID != rep.RunID {
			t.Fatalf("baseline run %s: %v", rep.RunID, err)
		}
		if rep.State != runs.Succeeded || rep.AgentCommit != goodCommit || rep.TargetCommit != targetCommit {
			t.Fatalf("baseline rep %+v (agent %s, target %s)", rep, goodCommit, targetCommit)
		}
		if !strings.Contains(rep.DiffStat, "NOTES.md") || !strings.Contains(rep.DiffStat, "added.txt") || rep.ChangedFiles != 2 {
			t.Fatalf("baseline diff: %q, %d files", rep.DiffStat, rep.ChangedFiles)
		}
		if rep.Build == nil || *rep.Build.ExitCode != 0 || rep.Task == nil || *rep.Task.ExitCode != 0 || rep.Task.DurationMs == nil ||
			rep.Setup == nil || *rep.Setup.ExitCode != 0 || len(rep.Validations) != 1 || *rep.Validations[0].ExitCode != 0 {
			t.Fatalf("baseline outcomes %+v", rep)
		}
		if !strings.Contains(rep.Summary, "edited NOTES.md, added added.txt") || rep.CleanupFailed {
			t.Fatalf("baseline summary %q cleanup_failed %v", rep.Summary, rep.CleanupFailed)
		}
	}
	if cand.Counts[runs.Failed] != 2 || cand.Passed != 0 || cand.MedianTaskMs != nil {
		t.Fatalf("candidate: %+v", cand)
	}
	for _, rep := range cand.Repetitions {
		if _, err := e.svc.Get(t.Context(), rep.RunID); err != nil {
			t.Fatal(err)
		}
		if rep.State != runs.Failed || rep.AgentCommit != brokenCommit || rep.TargetCommit != targetCommit {
			t.Fatalf("candidate rep %+v", rep)
		}
		if rep.Build == nil || rep.Build.ExitCode == nil || *rep.Build.ExitCode != 2 || rep.Task == nil || rep.Task.State != runs.PhaseSkipped ||
			rep.Task.ExitCode != nil || rep.ChangedFiles != 0 || rep.CleanupFailed {
			t.Fatalf("candidate outcomes %+v (build %+v task %+v)", rep, rep.Build, rep.Task)
		}
		if !strings.Contains(rep.Summary, "agent_build failed (exit 2)") || !strings.Contains(rep.Summary, "build broken: missing dependency") {
			t.Fatalf("candidate summary %q", rep.Summary)
		}
	}
	// Never a winner: nothing in the reply names one.
	raw, _ := json.Marshal(b)
	if strings.Contains(strings.ToLower(string(raw)), "winner") {
		t.Fatal("the comparison names a winner")
	}

	// agent_test: one side, an agent_command override (the task on stdin and in OMP_TASK and
	// AGENT_TASK, not in argv), the build skipped with ["true"] (still recorded), the sandbox kept.
	override := []string{"sh", "-c", `printf '%s|%s|' "$OMP_TASK" "$AGENT_TASK"; cat`}
	tb, err := e.svc.AgentTest(t.Context(), runs.CompareRequest{
		Candidate: runs.AgentSide{RepoURL: "file://" + agent, Ref: "good"}, Preset: runs.PresetOMP,
		TargetRepoURL: "file://" + target, Task: task, AgentCommand: override, BuildCommand: []string{"true"},
		KeepSandbox: true, KeepTTLSeconds: 600, TimeoutSeconds: 300,
	})
	if err != nil {
		t.Fatal(err)
	}
	tb = waitBatch(t, e, tb.ID)
	if tb.Kind != runs.KindAgentTest || len(tb.Compare.Sides) != 1 || !slices.Equal(tb.Compare.Invocation, override) {
		t.Fatalf("agent_test %+v", tb.Compare)
	}
	rep := tb.Compare.Sides[0].Repetitions[0]
	if rep.State != runs.Succeeded || rep.Build == nil || *rep.Build.ExitCode != 0 || rep.Summary != task+"|"+task+"|"+task || rep.AgentCommit != goodCommit {
		t.Fatalf("agent_test rep %+v (build %+v)", rep, rep.Build)
	}
	r, err := e.svc.Get(t.Context(), rep.RunID)
	if err != nil || !r.SandboxKept || rep.SandboxID == "" || slices.Contains(r.Phases[slices.IndexFunc(r.Phases, func(p runs.Phase) bool { return p.Name == runs.PhaseCommand })].Argv, task) {
		t.Fatalf("kept run %+v %v", r, err)
	}
	if sb, err := e.sb.Get(t.Context(), rep.SandboxID); err != nil || sb.State != sandbox.StateRunning {
		t.Fatalf("kept sandbox %s: %+v %v", rep.SandboxID, sb.State, err)
	}
	if _, err := e.sb.Destroy(t.Context(), rep.SandboxID); err != nil {
		t.Fatal(err)
	}
}

// TestCancelBatch: canceling a batch cancels its running and queued runs; it settles canceled.
func TestCancelBatch(t *testing.T) {
	e := newFakeRunEnv(t)
	spec := mustJSON(t, runs.Spec{Command: []string{"sleep", "30"}, Dir: t.TempDir()})
	b, err := e.svc.StartBatch(t.Context(), runs.BatchRequest{Runs: []json.RawMessage{spec, spec, spec}, MaxParallel: 1,
		Labels: map[string]string{"suite": "cancel"}})
	if err != nil {
		t.Fatal(err)
	}
	// Wait for the first run to hold its slot (running its command).
	deadline := time.Now().Add(time.Minute)
	for {
		g, err := e.svc.GetBatch(t.Context(), b.ID)
		if err != nil {
			t.Fatal(err)
		}
		if g.Counts[runs.Running] == 1 {
			if g.Counts[runs.Queued] != 2 {
				t.Fatalf("max_parallel 1: %v", g.Counts)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no run started: %v", g.Counts)
		}
		time.Sleep(20 * time.Millisecond)
	}
	start := time.Now()
	if _, err := e.svc.CancelBatch(t.Context(), b.ID); err != nil {
		t.Fatal(err)
	}
	b = waitBatch(t, e, b.ID)
	if b.Counts[runs.Canceled] != 3 || time.Since(start) > 20*time.Second || b.Labels["suite"] != "cancel" {
		t.Fatalf("after cancel: %v in %v, labels %v", b.Counts, time.Since(start), b.Labels)
	}
	if _, err := e.svc.WaitBatch(t.Context(), b.ID, 2*runs.MaxWait); !errcode.Is(err, errcode.InvalidArgument) {
		t.Fatalf("wait past the bound: %v", err)
	}
}

// TestBatchIdempotent: a batch resubmitted with its idempotency key is the same batch, with no
// second set of runs.
func TestBatchIdempotent(t *testing.T) {
	e := newFakeRunEnv(t)
	req := runs.BatchRequest{Runs: []json.RawMessage{mustJSON(t, runs.Spec{Command: []string{"true"}, Dir: t.TempDir()})}, IdempotencyKey: "k1"}
	a, err := e.svc.StartBatch(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	b, err := e.svc.StartBatch(t.Context(), req)
	if err != nil || b.ID != a.ID || len(b.Runs) != 1 || b.Runs[0].RunID != a.Runs[0].RunID {
		t.Fatalf("resubmitted: %+v %v (first %s)", b, err, a.ID)
	}
	rl, err := e.st.ListRuns(t.Context(), runs.Filter{Limit: 10})
	if err != nil || len(rl.Runs) != 1 {
		t.Fatalf("%d runs recorded, want 1 (%v)", len(rl.Runs), err)
	}
	waitBatch(t, e, a.ID)
}
