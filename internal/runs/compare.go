package runs

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/agentbox/agentbox/internal/errcode"
)

// Comparison bounds.
const (
	MaxTaskBytes = 64 << 10
	// SummaryBytes is the tail of output a repetition's Summary keeps.
	SummaryBytes = 2 << 10
)

// Side names.
const (
	SideBaseline  = "baseline"
	SideCandidate = "candidate"
)

// Labels each comparison run carries (run_list can filter on them).
const (
	LabelCompareSide       = "compare_side"
	LabelCompareRepetition = "compare_repetition"
)

// AgentCompare records a comparison batch: Repetitions runs of each side, interleaved
// (baseline 1, candidate 1, baseline 2, …) so both sides meet the same load; its Comparison is
// measured from the runs on every read and never names a winner. Bad input is
// INVALID_ARGUMENT naming the field, and nothing is recorded.
func (s *Service) AgentCompare(ctx context.Context, req CompareRequest) (Batch, error) {
	return s.startCompare(ctx, req, KindAgentCompare)
}

// AgentTest is the single-side form (Baseline nil; KeepSandbox allowed).
func (s *Service) AgentTest(ctx context.Context, req CompareRequest) (Batch, error) {
	return s.startCompare(ctx, req, KindAgentTest)
}

func (s *Service) startCompare(ctx context.Context, req CompareRequest, kind string) (Batch, error) {
	maxPar, err := checkBatchArgs(req.MaxParallel, req.IdempotencyKey, nil)
	if err != nil {
		return Batch{}, err
	}
	cmp, specs, err := compareSpecs(req, kind)
	if err != nil {
		return Batch{}, err
	}
	items := make([]batchItem, len(specs))
	for i, sp := range specs {
		it := s.checkItem(sp.Labels[LabelCompareSide], sp)
		if it.fail != nil {
			// Every repetition of a side has the same spec: refuse the request, record nothing.
			return Batch{}, errcode.New(errcode.Code(it.fail.Code), "%s", it.fail.Error)
		}
		items[i] = it
	}
	b := Batch{Kind: kind, MaxParallel: maxPar, Compare: &cmp, IdempotencyKey: req.IdempotencyKey}
	return s.createBatch(ctx, b, items)
}

// compareSpecs checks a comparison request and builds its runs' specs, interleaved: index
// i is repetition i/len(sides)+1 of side i%len(sides). The Comparison it returns has each
// side's repetitions in order (their run ids set when recorded).
func compareSpecs(req CompareRequest, kind string) (Comparison, []Spec, error) {
	bad := func(format string, args ...any) (Comparison, []Spec, error) {
		return Comparison{}, nil, errcode.New(errcode.InvalidArgument, format, args...)
	}
	type side struct {
		name string
		s    AgentSide
	}
	var sides []side
	switch kind {
	case KindAgentCompare:
		if req.Baseline == nil {
			return bad("baseline is required (the agent version to compare against: repo_url and ref)")
		}
		if req.KeepSandbox {
			return bad("keep_sandbox is for agent_test only")
		}
		sides = append(sides, side{SideBaseline, *req.Baseline})
	case KindAgentTest:
		if req.Baseline != nil {
			return bad("baseline: agent_test runs one side (candidate); use agent_compare for two")
		}
	default:
		return bad("unknown comparison kind %q", kind)
	}
	sides = append(sides, side{SideCandidate, req.Candidate})
	for _, sd := range sides {
		if strings.TrimSpace(sd.s.RepoURL) == "" {
			return bad("%s.repo_url is required", sd.name)
		}
	}
	if strings.TrimSpace(req.TargetRepoURL) == "" {
		return bad("target_repo_url is required")
	}
	if strings.TrimSpace(req.Task) == "" {
		return bad("task is required")
	}
	if len(req.Task) > MaxTaskBytes {
		return bad("task is %d bytes, at most %d", len(req.Task), MaxTaskBytes)
	}
	if !utf8.ValidString(req.Task) || strings.ContainsRune(req.Task, 0) {
		return bad("task must be UTF-8 text without NUL bytes")
	}
	reps := req.Repetitions
	if reps == 0 {
		reps = 1
	}
	if reps < 1 || reps > MaxRepetitions {
		return bad("repetitions is %d; it must be 1..%d", req.Repetitions, MaxRepetitions)
	}
	if req.KeepTTLSeconds != 0 && !req.KeepSandbox {
		return bad("keep_ttl_seconds needs keep_sandbox")
	}

	agentDir, build, invocation := GenericAgentDir, req.BuildCommand, req.AgentCommand
	var stdin string
	env := maps.Clone(req.Env)
	if req.Preset != "" {
		p, ok := presets[req.Preset]
		if !ok {
			return bad("preset is %q; known: %q, or \"\" (generic: agent_command and build_command required)", req.Preset, PresetOMP)
		}
		agentDir = p.AgentDir
		if len(build) == 0 {
			build = p.Build
		}
		if len(invocation) == 0 {
			invocation = p.Invocation(req.Task)
		}
	} else {
		if len(req.AgentCommand) == 0 {
			return bad("agent_command is required without a preset (the agent's invocation; it gets the task on stdin and in %s and %s)", EnvOMPTask, EnvAgentTask)
		}
		if len(req.BuildCommand) == 0 {
			return bad("build_command is required without a preset ([\"true\"] skips the build)")
		}
	}
	if len(req.AgentCommand) > 0 {
		// The override gets the task on stdin and in the environment, never in argv.
		stdin = req.Task
		if env == nil {
			env = map[string]string{}
		}
		env[EnvOMPTask] = req.Task
		env[EnvAgentTask] = req.Task
	}
	retention := ""
	if req.KeepSandbox {
		retention = RetentionKeep
	}

	cmp := Comparison{Task: req.Task, Invocation: slices.Clone(invocation)}
	for _, sd := range sides {
		cmp.Sides = append(cmp.Sides, SideSummary{Side: sd.name, RepoURL: sd.s.RepoURL, Ref: sd.s.Ref,
			Repetitions: make([]RepetitionSummary, reps)})
	}
	var specs []Spec
	for r := 0; r < reps; r++ {
		for _, sd := range sides {
			specs = append(specs, Spec{
				RepoURL: req.TargetRepoURL, Ref: req.TargetRef, RepoSecret: req.TargetRepoSecret,
				Dir: CompareTargetDir,
				Agent: &AgentCheckout{RepoURL: sd.s.RepoURL, Ref: sd.s.Ref, Dir: agentDir,
					BuildCommand: slices.Clone(build), RepoSecret: sd.s.RepoSecret},
				Setup:              slices.Clone(req.SetupCommand),
				Command:            slices.Clone(invocation),
				Stdin:              stdin,
				ValidationCommands: cloneArgvs(req.ValidationCommands),
				Env:                maps.Clone(env),
				Secrets:            maps.Clone(req.Secrets),
				Image:              req.Image, Runtime: req.Runtime, CPU: req.CPU,
				MemoryMB: req.MemoryMB, DiskMB: req.DiskMB, Network: req.Network,
				TimeoutSeconds: req.TimeoutSeconds,
				Retention:      retention, KeepTTLSeconds: req.KeepTTLSeconds,
				Labels: map[string]string{LabelCompareSide: sd.name, LabelCompareRepetition: strconv.Itoa(r + 1)},
			})
		}
	}
	return cmp, specs, nil
}

func cloneArgvs(a [][]string) [][]string {
	if a == nil {
		return nil
	}
	out := make([][]string, len(a))
	for i, v := range a {
		out[i] = slices.Clone(v)
	}
	return out
}

// setCompareRunID records run id of item i (interleaved order) in the comparison.
func setCompareRunID(c *Comparison, i int, id string) {
	if c == nil || len(c.Sides) == 0 {
		return
	}
	sd, rep := i%len(c.Sides), i/len(c.Sides)
	if rep < len(c.Sides[sd].Repetitions) {
		c.Sides[sd].Repetitions[rep].RunID = id
	}
}

// fillComparison measures each repetition from its run: per-phase outcomes, commits, diff
// stat, cleanup, a summary; per side the counts by state, Passed and MedianTaskMs.
func fillComparison(c *Comparison, runs map[string]Run) {
	for si := range c.Sides {
		sd := &c.Sides[si]
		sd.Counts = map[State]int{}
		sd.Passed = 0
		var taskMs []int64
		for ri := range sd.Repetitions {
			rep := &sd.Repetitions[ri]
			r, ok := runs[rep.RunID]
			if !ok {
				continue
			}
			*rep = summarizeRun(r)
			sd.Counts[r.State]++
			if passed(r) {
				sd.Passed++
			}
			if r.State.Settled() && rep.Task != nil && rep.Task.DurationMs != nil {
				taskMs = append(taskMs, *rep.Task.DurationMs)
			}
		}
		sd.MedianTaskMs = median(taskMs)
	}
}

// summarizeRun is one repetition's line.
func summarizeRun(r Run) RepetitionSummary {
	rs := RepetitionSummary{RunID: r.ID, State: r.State, AgentCommit: r.AgentCommit, TargetCommit: r.Commit,
		DiffStat: r.DiffStat, ChangedFiles: len(r.ChangedFiles), CleanupFailed: r.CleanupFailed,
		SandboxID: r.SandboxID, Validations: []PhaseOutcome{}}
	for i := range r.Phases {
		p := &r.Phases[i]
		o := &PhaseOutcome{State: p.State, ExitCode: p.ExitCode, DurationMs: p.DurationMs}
		switch {
		case p.Name == PhaseAgentBuild:
			rs.Build = o
		case p.Name == PhaseSetup:
			rs.Setup = o
		case p.Name == PhaseCommand:
			rs.Task = o
		case strings.HasPrefix(p.Name, PhaseValidation):
			rs.Validations = append(rs.Validations, *o)
		}
	}
	rs.Summary = runSummary(r)
	return rs
}

// runSummary: the tail of the task's output when the run succeeded; otherwise the first failing
// phase's stderr tail (or stdout, or its error), else the run's reason.
func runSummary(r Run) string {
	if !r.State.Settled() {
		return ""
	}
	if r.State == Succeeded {
		for _, p := range r.Phases {
			if p.Name == PhaseCommand {
				out := p.Stdout
				if strings.TrimSpace(out) == "" {
					out = p.Stderr
				}
				return tail(out, SummaryBytes)
			}
		}
		return ""
	}
	for _, p := range r.Phases {
		switch p.State {
		case PhaseFailed, PhaseTimedOut, PhaseInterrupted, PhaseCanceled:
		default:
			continue
		}
		head := p.Name + " " + string(p.State)
		if p.ExitCode != nil {
			head += fmt.Sprintf(" (exit %d)", *p.ExitCode)
		}
		detail := p.Stderr
		if strings.TrimSpace(detail) == "" {
			detail = p.Stdout
		}
		if strings.TrimSpace(detail) == "" {
			detail = p.Error
		}
		if strings.TrimSpace(detail) == "" {
			return head
		}
		return head + ": " + tail(detail, SummaryBytes)
	}
	return r.Reason
}

// passed: every validation ran and exited 0 (with no validations: the run succeeded).
func passed(r Run) bool {
	n := 0
	for _, p := range r.Phases {
		if !strings.HasPrefix(p.Name, PhaseValidation) {
			continue
		}
		n++
		if p.State != PhaseSucceeded || p.ExitCode == nil || *p.ExitCode != 0 {
			return false
		}
	}
	if n == 0 {
		return r.State == Succeeded
	}
	return r.State.Settled()
}

// median of xs (nil when empty; the mean of the middle two for an even count).
func median(xs []int64) *int64 {
	if len(xs) == 0 {
		return nil
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	m := s[len(s)/2]
	if len(s)%2 == 0 {
		m = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return &m
}

// tail returns the last n bytes of s, cut at a rune boundary.
func tail(s string, n int) string {
	s = strings.TrimRight(s, "\n")
	if len(s) <= n {
		return s
	}
	s = s[len(s)-n:]
	for len(s) > 0 && !utf8.RuneStart(s[0]) {
		s = s[1:]
	}
	return "…" + s
}
