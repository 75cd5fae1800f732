package runs

import (
	"slices"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/sandbox"
)

func TestCompareSpecsOMPPreset(t *testing.T) {
	task := `fix the "bug"; rm -rf / && echo $HOME`
	req := CompareRequest{
		Baseline:      &AgentSide{RepoURL: "https://git.example/omp.git", Ref: "v1"},
		Candidate:     AgentSide{RepoURL: "https://git.example/omp.git", Ref: "v2", RepoSecret: "GH"},
		Preset:        PresetOMP,
		TargetRepoURL: "https://git.example/target.git", TargetRef: "main",
		Task:               task,
		SetupCommand:       []string{"make", "deps"},
		ValidationCommands: [][]string{{"make", "test"}, {"make", "lint"}},
		Repetitions:        2,
		Image:              "node:22", CPU: 2, MemoryMB: 2048,
		Env:     map[string]string{"A": "1"},
		Secrets: map[string]sandbox.SecretSpec{"GH": {From: "env:GH", Hosts: []string{"git.example"}}},
	}
	cmp, specs, err := compareSpecs(req, KindAgentCompare)
	if err != nil {
		t.Fatal(err)
	}
	wantInv := []string{"/bin/sh", "/workspace/omp/packages/coding-agent/scripts/omp", "--print", "--", task}
	if !slices.Equal(cmp.Invocation, wantInv) || cmp.Task != task {
		t.Fatalf("invocation %q", cmp.Invocation)
	}
	if len(specs) != 4 || len(cmp.Sides) != 2 || cmp.Sides[0].Side != SideBaseline || cmp.Sides[1].Side != SideCandidate ||
		len(cmp.Sides[0].Repetitions) != 2 || cmp.Sides[1].Ref != "v2" {
		t.Fatalf("sides %+v, %d specs", cmp.Sides, len(specs))
	}
	// Interleaved: baseline 1, candidate 1, baseline 2, candidate 2.
	var order []string
	for _, sp := range specs {
		order = append(order, sp.Labels[LabelCompareSide]+sp.Labels[LabelCompareRepetition]+"@"+sp.Agent.Ref)
	}
	if strings.Join(order, ",") != "baseline1@v1,candidate1@v2,baseline2@v1,candidate2@v2" {
		t.Fatalf("order %v", order)
	}
	for _, sp := range specs {
		if !slices.Equal(sp.Command, wantInv) || sp.Stdin != "" {
			t.Fatalf("command %q stdin %q", sp.Command, sp.Stdin)
		}
		if sp.Dir != "/workspace/target" || sp.RepoURL != req.TargetRepoURL || sp.Ref != "main" {
			t.Fatalf("target %+v", sp)
		}
		if sp.Agent.Dir != "/workspace/omp" || !slices.Equal(sp.Agent.BuildCommand, []string{"sh", "-c", "bun install && bun run build"}) {
			t.Fatalf("agent %+v", sp.Agent)
		}
		if _, ok := sp.Env[EnvOMPTask]; ok || sp.Env["A"] != "1" {
			t.Fatalf("env %v (the preset's task is an argument only)", sp.Env)
		}
		if sp.Image != "node:22" || sp.CPU != 2 || sp.MemoryMB != 2048 || sp.Secrets["GH"].From != "env:GH" {
			t.Fatalf("shape %+v", sp)
		}
		if !slices.Equal(sp.Setup, []string{"make", "deps"}) || len(sp.ValidationCommands) != 2 || sp.Retention != "" {
			t.Fatalf("phases %+v", sp)
		}
	}
	if specs[1].Agent.RepoSecret != "GH" || specs[0].Agent.RepoSecret != "" {
		t.Fatal("side repo secret")
	}
	// Specs share no slices or maps (a change to one run's spec leaves the others).
	specs[0].Env["A"] = "changed"
	specs[0].Command[0] = "x"
	specs[0].ValidationCommands[0][0] = "x"
	if specs[1].Env["A"] != "1" || specs[1].Command[0] != "/bin/sh" || specs[1].ValidationCommands[0][0] != "make" || req.Env["A"] != "1" || cmp.Invocation[0] != "/bin/sh" {
		t.Fatal("specs share memory")
	}
	// Run ids land by interleaved index.
	for i, id := range []string{"r0", "r1", "r2", "r3"} {
		setCompareRunID(&cmp, i, id)
	}
	if cmp.Sides[0].Repetitions[0].RunID != "r0" || cmp.Sides[1].Repetitions[0].RunID != "r1" || cmp.Sides[0].Repetitions[1].RunID != "r2" || cmp.Sides[1].Repetitions[1].RunID != "r3" {
		t.Fatalf("run ids %+v", cmp.Sides)
	}
}

func TestCompareSpecsAgentCommandAndSkipBuild(t *testing.T) {
	req := CompareRequest{
		Candidate:     AgentSide{RepoURL: "file:///srv/agent", Ref: "good"},
		Preset:        PresetOMP,
		TargetRepoURL: "file:///srv/target",
		Task:          "add a line",
		AgentCommand:  []string{"/workspace/omp/run.sh", "--fast"},
		BuildCommand:  []string{"true"},
		KeepSandbox:   true, KeepTTLSeconds: 600,
	}
	cmp, specs, err := compareSpecs(req, KindAgentTest)
	if err != nil {
		t.Fatal(err)
	}
	if len(specs) != 1 || len(cmp.Sides) != 1 || cmp.Sides[0].Side != SideCandidate {
		t.Fatalf("%d specs, sides %+v", len(specs), cmp.Sides)
	}
	sp := specs[0]
	if !slices.Equal(sp.Command, req.AgentCommand) || !slices.Equal(cmp.Invocation, req.AgentCommand) {
		t.Fatalf("command %q invocation %q", sp.Command, cmp.Invocation)
	}
	if sp.Stdin != "add a line" || sp.Env[EnvOMPTask] != "add a line" || sp.Env[EnvAgentTask] != "add a line" {
		t.Fatalf("task delivery: stdin %q env %v", sp.Stdin, sp.Env)
	}
	if !slices.Equal(sp.Agent.BuildCommand, []string{"true"}) || sp.Agent.Dir != "/workspace/omp" {
		t.Fatalf("agent %+v", sp.Agent)
	}
	if sp.Retention != RetentionKeep || sp.KeepTTLSeconds != 600 {
		t.Fatalf("retention %q %d", sp.Retention, sp.KeepTTLSeconds)
	}
	if req.Env != nil {
		t.Fatal("the request's env was written to")
	}

	// Generic: the agent's own dir, no preset defaults.
	req = CompareRequest{Baseline: &AgentSide{RepoURL: "file:///a"}, Candidate: AgentSide{RepoURL: "file:///a", Ref: "b"},
		TargetRepoURL: "file:///t", Task: "t", AgentCommand: []string{"./agent"}, BuildCommand: []string{"make"}}
	_, specs, err = compareSpecs(req, KindAgentCompare)
	if err != nil || len(specs) != 2 || specs[0].Agent.Dir != GenericAgentDir || !slices.Equal(specs[0].Agent.BuildCommand, []string{"make"}) || specs[1].Stdin != "t" {
		t.Fatalf("generic: %v %+v", err, specs)
	}
}

func TestCompareSpecsRefuses(t *testing.T) {
	good := func() CompareRequest {
		return CompareRequest{Baseline: &AgentSide{RepoURL: "file:///a"}, Candidate: AgentSide{RepoURL: "file:///a"},
			Preset: PresetOMP, TargetRepoURL: "file:///t", Task: "t"}
	}
	if _, _, err := compareSpecs(good(), KindAgentCompare); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		kind string
		mod  func(*CompareRequest)
		want string
	}{
		{"no baseline", KindAgentCompare, func(r *CompareRequest) { r.Baseline = nil }, "baseline is required"},
		{"baseline in test", KindAgentTest, func(r *CompareRequest) {}, "baseline: agent_test runs one side"},
		{"keep in compare", KindAgentCompare, func(r *CompareRequest) { r.KeepSandbox = true }, "keep_sandbox is for agent_test only"},
		{"no candidate repo", KindAgentCompare, func(r *CompareRequest) { r.Candidate.RepoURL = " " }, "candidate.repo_url is required"},
		{"no baseline repo", KindAgentCompare, func(r *CompareRequest) { r.Baseline.RepoURL = "" }, "baseline.repo_url is required"},
		{"no target", KindAgentCompare, func(r *CompareRequest) { r.TargetRepoURL = "" }, "target_repo_url is required"},
		{"no task", KindAgentCompare, func(r *CompareRequest) { r.Task = "  " }, "task is required"},
		{"task too long", KindAgentCompare, func(r *CompareRequest) { r.Task = strings.Repeat("x", MaxTaskBytes+1) }, "task is 65537 bytes, at most 65536"},
		{"task NUL", KindAgentCompare, func(r *CompareRequest) { r.Task = "a\x00b" }, "without NUL"},
		{"reps high", KindAgentCompare, func(r *CompareRequest) { r.Repetitions = 17 }, "repetitions is 17; it must be 1..16"},
		{"reps negative", KindAgentCompare, func(r *CompareRequest) { r.Repetitions = -1 }, "repetitions is -1"},
		{"unknown preset", KindAgentCompare, func(r *CompareRequest) { r.Preset = "aider" }, `preset is "aider"`},
		{"generic without command", KindAgentCompare, func(r *CompareRequest) { r.Preset = ""; r.BuildCommand = []string{"true"} }, "agent_command is required without a preset"},
		{"generic without build", KindAgentCompare, func(r *CompareRequest) { r.Preset = ""; r.AgentCommand = []string{"x"} }, "build_command is required without a preset"},
		{"ttl without keep", KindAgentCompare, func(r *CompareRequest) { r.KeepTTLSeconds = 5 }, "keep_ttl_seconds needs keep_sandbox"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := good()
			tc.mod(&r)
			_, specs, err := compareSpecs(r, tc.kind)
			if !errcode.Is(err, errcode.InvalidArgument) || !strings.Contains(errcode.Message(err), tc.want) || specs != nil {
				t.Fatalf("err %v, want INVALID_ARGUMENT containing %q", err, tc.want)
			}
		})
	}
}

func ip(v int) *int      { return &v }
func i64(v int64) *int64 { return &v }

func TestFillComparison(t *testing.T) {
	ok := func(name string, ms int64, out string) Phase {
		return Phase{Name: name, State: PhaseSucceeded, ExitCode: ip(0), DurationMs: i64(ms), Stdout: out}
	}
	runs := map[string]Run{
		"b1": {ID: "b1", State: Succeeded, Commit: "t1", AgentCommit: "a1", DiffStat: " f | 1 +", ChangedFiles: []ChangedFile{{Path: "f", Status: "modified"}},
			Phases: []Phase{ok(PhaseAgentBuild, 5, ""), ok(PhaseSetup, 1, ""), ok(PhaseCommand, 100, "line1\nedited f\n"), ok("validation[0]", 2, "")}},
		"b2": {ID: "b2", State: Failed, Commit: "t1", AgentCommit: "a1", CleanupFailed: true,
			Phases: []Phase{ok(PhaseAgentBuild, 5, ""), ok(PhaseSetup, 1, ""), ok(PhaseCommand, 300, ""),
				{Name: "validation[0]", State: PhaseFailed, ExitCode: ip(1), DurationMs: i64(3), Stdout: "FAIL: TestX", Stderr: ""}}},
		"c1": {ID: "c1", State: Failed, Commit: "t1", AgentCommit: "a2",
			Phases: []Phase{{Name: PhaseAgentBuild, State: PhaseFailed, ExitCode: ip(2), DurationMs: i64(7), Stderr: "make: *** no rule\n"},
				{Name: PhaseSetup, State: PhaseSkipped}, {Name: PhaseCommand, State: PhaseSkipped}, {Name: "validation[0]", State: PhaseSkipped}}},
	}
	c := &Comparison{Sides: []SideSummary{
		{Side: SideBaseline, Repetitions: []RepetitionSummary{{RunID: "b1"}, {RunID: "b2"}, {RunID: "gone"}}},
		{Side: SideCandidate, Repetitions: []RepetitionSummary{{RunID: "c1"}}},
	}}
	fillComparison(c, runs)
	b, cd := c.Sides[0], c.Sides[1]
	if b.Counts[Succeeded] != 1 || b.Counts[Failed] != 1 || b.Passed != 1 || b.MedianTaskMs == nil || *b.MedianTaskMs != 200 {
		t.Fatalf("baseline %+v median %v", b, b.MedianTaskMs)
	}
	r := b.Repetitions[0]
	if r.State != Succeeded || r.AgentCommit != "a1" || r.TargetCommit != "t1" || r.DiffStat != " f | 1 +" || r.ChangedFiles != 1 ||
		r.Task == nil || *r.Task.ExitCode != 0 || *r.Task.DurationMs != 100 || r.Build == nil || r.Setup == nil || len(r.Validations) != 1 ||
		r.Summary != "line1\nedited f" {
		t.Fatalf("rep %+v", r)
	}
	if r := b.Repetitions[1]; r.Summary != "validation[0] failed (exit 1): FAIL: TestX" || !r.CleanupFailed {
		t.Fatalf("failed rep summary %q", r.Summary)
	}
	if r := b.Repetitions[2]; r.RunID != "gone" || r.State != "" {
		t.Fatalf("a pruned run: %+v", r)
	}
	if cd.Counts[Failed] != 1 || cd.Passed != 0 || cd.MedianTaskMs != nil {
		t.Fatalf("candidate %+v", cd)
	}
	if r := cd.Repetitions[0]; r.Summary != "agent_build failed (exit 2): make: *** no rule" || *r.Build.ExitCode != 2 || r.Task.State != PhaseSkipped || r.Task.ExitCode != nil {
		t.Fatalf("candidate rep %+v", r)
	}
	// Filling again (every read) gives the same, not doubled, counts.
	fillComparison(c, runs)
	if c.Sides[0].Counts[Failed] != 1 || c.Sides[0].Passed != 1 {
		t.Fatal("counts accumulate across reads")
	}
}

func TestTailAndMedian(t *testing.T) {
	if s := tail(strings.Repeat("é", 2000), 11); !strings.HasPrefix(s, "…") || strings.ContainsRune(s, '\uFFFD') {
		t.Fatalf("tail %q", s)
	}
	if m := median([]int64{5, 1, 3}); *m != 3 {
		t.Fatal(*m)
	}
	if m := median(nil); m != nil {
		t.Fatal("median of nothing")
	}
}
