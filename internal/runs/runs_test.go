package runs_test

import (
	"context"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/egress"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/runs"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/fake"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/sandbox/jobs"
	"github.com/agentbox/agentbox/internal/store/sqlite"
)

// The runner's control-plane logic on the fake runtime (its sandboxes run real in-process
// agents; commands run on the host in the test's directories) and the real SQLite store.

type env struct {
	st   *sqlite.Store
	rt   *fake.Runtime
	sbs  *sandbox.Service
	svc  *runs.Service
	cfg  runs.Config
	stop context.CancelFunc
	work string // a directory the runs' Dir lives under
}

func newEnv(t *testing.T, cfg runs.Config) *env {
	t.Helper()
	return newEnvSB(t, cfg, sandbox.Config{})
}

func newEnvSB(t *testing.T, cfg runs.Config, sbcfg sandbox.Config) *env {
	t.Helper()
	dir := t.TempDir()
	st, err := sqlite.Open(t.Context(), filepath.Join(dir, "agentbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	rt, err := fake.New(fake.Config{Name: "runc"})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := sandbox.NewService(st, []runtime.Runtime{rt}, sbcfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	sbs := jobs.With(svc)
	if err := sbs.Reconcile(t.Context()); err != nil {
		t.Fatal(err)
	}
	cfg.Sandboxes, cfg.Store, cfg.Dir = sbs, st, filepath.Join(dir, "runs")
	cfg.BaseURL = func() string { return "http://agentbox.test" }
	e := &env{st: st, rt: rt, sbs: sbs.Service, cfg: cfg, work: filepath.Join(dir, "work")}
	e.start(t)
	t.Cleanup(func() {
		e.stopSvc()
		sbs.Close()
		rt.Shutdown(context.Background())
		st.Close()
	})
	return e
}

// start makes a new run service over the same store and sandboxes, as a restarted server.
func (e *env) start(t *testing.T) {
	t.Helper()
	svc, err := runs.New(e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	e.svc, e.stop = svc, cancel
	go svc.Run(ctx)
}

func (e *env) stopSvc() {
	e.stop()
	e.svc.Close()
}

// dir returns a fresh working directory for a run (the fake runtime's commands see the host).
func (e *env) dir(t *testing.T, name string) string {
	d := filepath.Join(e.work, name)
	return d
}

func (e *env) wait(t *testing.T, id string) runs.Run {
	t.Helper()
	r, err := e.svc.Wait(t.Context(), id, 60*time.Second)
	if err != nil {
		t.Fatalf("Wait %s: %v", id, err)
	}
	if !r.State.Settled() {
		t.Fatalf("run %s not settled after 60s: %s (%s) phases %+v", id, r.State, r.Reason, r.Phases)
	}
	return r
}

func phase(t *testing.T, r runs.Run, name string) runs.Phase {
	t.Helper()
	for _, p := range r.Phases {
		if p.Name == name {
			return p
		}
	}
	t.Fatalf("run %s has no phase %s: %+v", r.ID, name, r.Phases)
	return runs.Phase{}
}

func exitOf(p runs.Phase) int {
	if p.ExitCode == nil {
		return -1
	}
	return *p.ExitCode
}

func sbState(t *testing.T, e *env, id string) sandbox.State {
	t.Helper()
	sb, err := e.sbs.Get(t.Context(), id)
	if err != nil {
		t.Fatalf("Get sandbox %s: %v", id, err)
	}
	return sb.State
}

func TestRunFromFiles(t *testing.T) {
	e := newEnv(t, runs.Config{})
	d := e.dir(t, "files")
	r, err := e.svc.Start(sandbox.WithOwner(t.Context(), "alice"), runs.Spec{
		Dir:     d,
		Files:   map[string]string{"in.txt": "hello\n", "sub/x.txt": "x"},
		Setup:   []string{"sh", "-c", "echo setup >> log.txt"},
		Command: []string{"sh", "-c", "cat in.txt > out.txt; echo done; echo warn >&2"},
		ValidationCommands: [][]string{
			{"test", "-s", "out.txt"},
			{"sh", "-c", "echo nope >&2; exit 1"},
		},
		Labels: map[string]string{"k": "v"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if r.State != runs.Queued || !strings.HasPrefix(r.ID, "run-") || len(r.ID) != 16 || r.Spec.TimeoutSeconds != int64(runs.DefaultTimeout/time.Second) || r.Spec.Retention != runs.RetentionDestroy {
		t.Fatalf("Start = %+v", r)
	}
	r = e.wait(t, r.ID)
	if r.State != runs.Failed || r.Success || !strings.Contains(r.Reason, "validation[1] exited 1") {
		t.Fatalf("run = %s (%s), want failed by validation[1]", r.State, r.Reason)
	}
	cmd := phase(t, r, runs.PhaseCommand)
	if cmd.State != runs.PhaseSucceeded || exitOf(cmd) != 0 || cmd.Stdout != "done\n" || cmd.Stderr != "warn\n" || cmd.JobID == "" || cmd.DurationMs == nil {
		t.Errorf("command phase = %+v", cmd)
	}
	if p := phase(t, r, "validation[0]"); p.State != runs.PhaseSucceeded || exitOf(p) != 0 {
		t.Errorf("validation[0] = %+v", p)
	}
	if p := phase(t, r, "validation[1]"); p.State != runs.PhaseFailed || exitOf(p) != 1 || p.Stderr != "nope\n" {
		t.Errorf("validation[1] = %+v", p)
	}
	if p := phase(t, r, runs.PhaseSetup); p.State != runs.PhaseSucceeded {
		t.Errorf("setup = %+v", p)
	}
	if b, err := os.ReadFile(filepath.Join(d, "out.txt")); err != nil || string(b) != "hello\n" {
		t.Errorf("out.txt = %q, %v", b, err)
	}
	if p := phase(t, r, runs.PhaseCleanup); p.State != runs.PhaseSucceeded || r.CleanupFailed {
		t.Errorf("cleanup = %+v", p)
	}
	if st := sbState(t, e, r.SandboxID); st != sandbox.StateDestroyed {
		t.Errorf("sandbox %s is %s after the run, want destroyed", r.SandboxID, st)
	}
	if r.FinishedAt == nil || r.StartedAt == nil || r.DurationMs == nil {
		t.Errorf("times: %+v %+v %+v", r.StartedAt, r.FinishedAt, r.DurationMs)
	}
	evs, err := e.svc.Events(t.Context(), r.ID, 0, 0)
	if err != nil || len(evs.Events) < 5 || evs.Events[0].To != runs.Queued || evs.Events[len(evs.Events)-1].To != runs.Failed {
		t.Errorf("events = %+v, %v", evs, err)
	}
	// The sandbox was its own owner's, labeled with the run.
	sb, _ := e.sbs.Get(t.Context(), r.SandboxID)
	if sb.Owner != "run:"+r.ID || sb.Labels["agentbox.run"] != r.ID {
		t.Errorf("sandbox owner %q labels %v", sb.Owner, sb.Labels)
	}
	if lg, err := e.svc.Logs(t.Context(), r.ID, runs.LogsRequest{Phase: runs.PhaseSandbox}); err != nil || len(lg.Data) != 0 || !lg.Complete {
		t.Errorf("logs of the sandbox phase = %+v, %v", lg, err)
	}
	if _, err := e.svc.Logs(t.Context(), r.ID, runs.LogsRequest{Phase: "nope"}); !errcode.Is(err, errcode.InvalidArgument) {
		t.Errorf("logs of an unknown phase: %v", err)
	}
	if _, err := e.svc.Get(t.Context(), "run-000000000000"); !errcode.Is(err, errcode.RunNotFound) {
		t.Errorf("Get of an unknown run: %v", err)
	}
	l, err := e.svc.List(t.Context(), runs.Filter{Owner: "alice"})
	if err != nil || len(l.Runs) != 1 || l.Runs[0].ID != r.ID {
		t.Errorf("List = %+v, %v", l, err)
	}
}

func TestValidation(t *testing.T) {
	e := newEnv(t, runs.Config{})
	cases := []struct {
		field string
		spec  runs.Spec
	}{
		{"spec.command", runs.Spec{}},
		{"spec.dir", runs.Spec{Command: []string{"true"}, Dir: "rel"}},
		{"spec.files", runs.Spec{Command: []string{"true"}, Files: map[string]string{"../x": "a"}}},
		{"spec.timeout_seconds", runs.Spec{Command: []string{"true"}, TimeoutSeconds: 100000}},
		{"spec.phase_timeout_seconds", runs.Spec{Command: []string{"true"}, PhaseTimeouts: map[string]int64{"nope": 1}}},
		{"spec.retention", runs.Spec{Command: []string{"true"}, Retention: "forever"}},
		{"spec.repo_url", runs.Spec{Command: []string{"true"}, RepoURL: "ftp://x/y"}},
		{"spec.repo_url", runs.Spec{Command: []string{"true"}, RepoURL: "file:///etc"}},
		{"spec.ref", runs.Spec{Command: []string{"true"}, RepoURL: "https://example.com/r.git", Ref: "--upload-pack=x"}},
		{"spec.validation_commands[0]", runs.Spec{Command: []string{"true"}, ValidationCommands: [][]string{{}}}},
		{"spec.artifacts[0]", runs.Spec{Command: []string{"true"}, Artifacts: []string{"/etc/passwd"}}},
		{"spec.network", runs.Spec{Command: []string{"true"}, Network: &sandbox.Network{Policy: &egress.Policy{Allow: []string{"bad host!"}}}}},
		{"spec.env", runs.Spec{Command: []string{"true"}, Env: map[string]string{"1BAD": "1"}}},
		{"spec.repo_secret", runs.Spec{Command: []string{"true"}, RepoURL: "https://example.com/r.git", RepoSecret: "TOKEN"}},
	}
	for _, c := range cases {
		_, err := e.svc.Start(t.Context(), c.spec)
		var ee *errcode.Error
		if !errcode.Is(err, errcode.InvalidArgument) || !strings.Contains(err.Error(), c.field) {
			t.Errorf("%s: %v, want INVALID_ARGUMENT naming it", c.field, err)
			continue
		}
		_ = ee
	}
	if l, err := e.svc.List(t.Context(), runs.Filter{}); err != nil || len(l.Runs) != 0 {
		t.Errorf("refused specs recorded runs: %+v, %v", l, err)
	}
}

func TestArtifactsAndLogs(t *testing.T) {
	e := newEnv(t, runs.Config{})
	d := e.dir(t, "arts")
	big := runs.PhaseOutputBytes*3 + 123
	r, err := e.svc.Start(t.Context(), runs.Spec{
		Dir: d,
		Command: []string{"sh", "-c", "mkdir -p out/a/b && echo one > out/a/one.txt && echo two > out/a/b/two.txt && echo top > report.json && " +
			"head -c " + strconv.Itoa(big) + " /dev/zero | tr '\\0' x"},
		Artifacts: []string{"out/**/*.txt", "report.json", "missing/*.bin"},
	})
	if err != nil {
		t.Fatal(err)
	}
	r = e.wait(t, r.ID)
	if r.State != runs.Succeeded || !r.Success {
		t.Fatalf("run = %s (%s)", r.State, r.Reason)
	}
	got := map[string]runs.Artifact{}
	for _, a := range r.Artifacts {
		got[a.Path] = a
	}
	if len(r.Artifacts) != 3 || got["out/a/one.txt"].Size != 4 || got["out/a/b/two.txt"].Size != 4 || got["report.json"].Size != 4 {
		t.Fatalf("artifacts = %+v", r.Artifacts)
	}
	if len(r.ArtifactErrors) != 1 || !strings.Contains(r.ArtifactErrors[0], "missing/*.bin") {
		t.Errorf("artifact_errors = %q", r.ArtifactErrors)
	}
	rc, a, err := e.svc.OpenArtifact(t.Context(), r.ID, "out/a/b/two.txt")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if string(b) != "two\n" || a.SHA256 != got["out/a/b/two.txt"].SHA256 || len(a.SHA256) != 64 {
		t.Errorf("artifact = %q %+v", b, a)
	}
	// The record keeps the last PhaseOutputBytes; Logs has it all.
	cmd := phase(t, r, runs.PhaseCommand)
	if len(cmd.Stdout) != runs.PhaseOutputBytes || cmd.StdoutBytes != int64(big) {
		t.Errorf("record stdout %d bytes, stdout_bytes %d; want %d and %d", len(cmd.Stdout), cmd.StdoutBytes, runs.PhaseOutputBytes, big)
	}
	var all []byte
	var off int64
	for i := 0; i < 10; i++ {
		lg, err := e.svc.Logs(t.Context(), r.ID, runs.LogsRequest{Offset: off, MaxBytes: 20000})
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, lg.Data...)
		off = lg.NextOffset
		if !lg.Complete || lg.TotalBytes != int64(big) {
			t.Fatalf("Logs = %+v", lg)
		}
		if off >= lg.TotalBytes {
			break
		}
	}
	if len(all) != big || strings.Trim(string(all), "x") != "" {
		t.Errorf("Logs gave %d bytes, want %d x's", len(all), big)
	}
	if _, err := e.svc.Logs(t.Context(), r.ID, runs.LogsRequest{MaxBytes: runs.MaxLogPage + 1}); !errcode.Is(err, errcode.InvalidArgument) {
		t.Errorf("max_bytes over the bound: %v", err)
	}
	// Signed URLs.
	u, err := url.Parse(got["report.json"].URL)
	if err != nil || !strings.HasPrefix(got["report.json"].URL, "http://agentbox.test/v1/runs/"+r.ID+"/artifacts/report.json?") {
		t.Fatalf("url %q", got["report.json"].URL)
	}
	exp, _ := strconv.ParseInt(u.Query().Get("expires"), 10, 64)
	sig := u.Query().Get("sig")
	if err := e.svc.VerifyArtifact(r.ID, "report.json", exp, sig); err != nil {
		t.Errorf("valid URL: %v", err)
	}
	if err := e.svc.VerifyArtifact(r.ID, "out/a/one.txt", exp, sig); !errcode.Is(err, errcode.AuthFailed) {
		t.Errorf("another path with that signature: %v", err)
	}
	if err := e.svc.VerifyArtifact(r.ID, "report.json", exp+1, sig); !errcode.Is(err, errcode.AuthFailed) {
		t.Errorf("tampered expiry: %v", err)
	}
	past := time.Now().Add(-time.Minute)
	pu, _ := url.Parse(e.svc.ArtifactURL(r.ID, "report.json", past))
	if err := e.svc.VerifyArtifact(r.ID, "report.json", past.Unix(), pu.Query().Get("sig")); !errcode.Is(err, errcode.LinkExpired) {
		t.Errorf("expired URL: %v", err)
	}
}

func TestIdempotencyKey(t *testing.T) {
	e := newEnv(t, runs.Config{})
	ctx := sandbox.WithOwner(t.Context(), "bob")
	spec := runs.Spec{Dir: e.dir(t, "idem"), Command: []string{"true"}, IdempotencyKey: "k1"}
	a, err := e.svc.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	b, err := e.svc.Start(ctx, spec)
	if err != nil || b.ID != a.ID {
		t.Fatalf("second Start = %s, %v; want %s", b.ID, err, a.ID)
	}
	spec.Command = []string{"false"}
	if _, err := e.svc.Start(ctx, spec); !errcode.Is(err, errcode.Conflict) {
		t.Errorf("another spec under the key: %v", err)
	}
	c, err := e.svc.Start(sandbox.WithOwner(t.Context(), "carol"), runs.Spec{Dir: spec.Dir, Command: []string{"true"}, IdempotencyKey: "k1"})
	if err != nil || c.ID == a.ID {
		t.Errorf("another owner's key: %s, %v", c.ID, err)
	}
	e.wait(t, a.ID)
	e.wait(t, c.ID)
}

func TestCancelRunning(t *testing.T) {
	e := newEnv(t, runs.Config{})
	r, err := e.svc.Start(t.Context(), runs.Spec{Dir: e.dir(t, "cancel"), Command: []string{"sh", "-c", "echo live; exec sleep 60"}, ValidationCommands: [][]string{{"true"}}})
	if err != nil {
		t.Fatal(err)
	}
	waitPhase(t, e, r.ID, runs.PhaseCommand)
	// The running phase's logs are the job's, live.
	var lg runs.Logs
	for i := 0; i < 100; i++ {
		if lg, err = e.svc.Logs(t.Context(), r.ID, runs.LogsRequest{}); err != nil || len(lg.Data) > 0 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil || string(lg.Data) != "live\n" || lg.Complete {
		t.Errorf("live logs = %+v, %v", lg, err)
	}
	c, err := e.svc.Cancel(t.Context(), r.ID)
	if err != nil || !c.CancelRequested {
		t.Fatalf("Cancel = %+v, %v", c, err)
	}
	start := time.Now()
	r = e.wait(t, r.ID)
	if r.State != runs.Canceled || time.Since(start) > 20*time.Second {
		t.Fatalf("run = %s (%s) after %s", r.State, r.Reason, time.Since(start))
	}
	if p := phase(t, r, runs.PhaseCommand); p.State != runs.PhaseCanceled {
		t.Errorf("command = %+v", p)
	}
	if p := phase(t, r, "validation[0]"); p.State != runs.PhaseSkipped {
		t.Errorf("validation = %+v", p)
	}
	if st := sbState(t, e, r.SandboxID); st != sandbox.StateDestroyed {
		t.Errorf("sandbox %s", st)
	}
	// A queued run is canceled at once.
	e.stopSvc()
	q, err := e.svc.Start(t.Context(), runs.Spec{Dir: e.dir(t, "cancel"), Command: []string{"true"}})
	if err != nil {
		t.Fatal(err)
	}
	q, err = e.svc.Cancel(t.Context(), q.ID)
	if err != nil || q.State != runs.Canceled || q.SandboxID != "" {
		t.Errorf("Cancel queued = %+v, %v", q, err)
	}
	e.start(t)
}

// waitPhase waits until the run's phase has its job.
func waitPhase(t *testing.T, e *env, id, name string) runs.Run {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		r, err := e.svc.Get(t.Context(), id)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range r.Phases {
			if p.Name == name && p.State == runs.PhaseRunning && p.JobID != "" {
				return r
			}
		}
		if r.State.Settled() {
			t.Fatalf("run settled %s (%s) before phase %s ran", r.State, r.Reason, name)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("phase %s of %s never ran", name, id)
	return runs.Run{}
}

func TestPhaseTimeout(t *testing.T) {
	e := newEnv(t, runs.Config{})
	r, err := e.svc.Start(t.Context(), runs.Spec{Dir: e.dir(t, "timeout"), Command: []string{"sh", "-c", "echo started; sleep 60"},
		PhaseTimeouts: map[string]int64{"command": 1}})
	if err != nil {
		t.Fatal(err)
	}
	r = e.wait(t, r.ID)
	if r.State != runs.TimedOut || !strings.Contains(r.Reason, "command") {
		t.Fatalf("run = %s (%s)", r.State, r.Reason)
	}
	p := phase(t, r, runs.PhaseCommand)
	if p.State != runs.PhaseTimedOut || p.Stdout != "started\n" || p.DurationMs == nil || *p.DurationMs > 45000 { // well under the 60 s sleep; loaded CI took 13 s
		t.Errorf("command = %+v", p)
	}
}

func TestRetentionKeep(t *testing.T) {
	e := newEnv(t, runs.Config{})
	r, err := e.svc.Start(t.Context(), runs.Spec{Dir: e.dir(t, "keep"), Command: []string{"true"}, Retention: runs.RetentionKeep, KeepTTLSeconds: 600})
	if err != nil {
		t.Fatal(err)
	}
	r = e.wait(t, r.ID)
	if r.State != runs.Succeeded || !r.SandboxKept || r.KeptUntil == nil || time.Until(*r.KeptUntil) < 590*time.Second {
		t.Fatalf("run = %s kept %v until %v", r.State, r.SandboxKept, r.KeptUntil)
	}
	sb, err := e.sbs.Get(t.Context(), r.SandboxID)
	if err != nil || sb.State != sandbox.StateRunning || !sb.ExpiresAt.Equal(*r.KeptUntil) {
		t.Errorf("kept sandbox = %s until %s, %v; run says until %s", sb.State, sb.ExpiresAt, err, r.KeptUntil)
	}
	// A keep longer than the sandbox's TTL extends it.
	r, err = e.svc.Start(t.Context(), runs.Spec{Dir: e.dir(t, "keep"), Command: []string{"true"}, Retention: runs.RetentionKeep, KeepTTLSeconds: 20 * 3600})
	if err != nil {
		t.Fatal(err)
	}
	r = e.wait(t, r.ID)
	if r.KeptUntil == nil || time.Until(*r.KeptUntil) < 20*time.Hour-time.Minute {
		t.Errorf("keep 20h: kept until %v", r.KeptUntil)
	}
}

func gitRun(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", append([]string{"-C", dir}, args...)...)
	cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@t", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@t", "GIT_CONFIG_NOSYSTEM=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v: %s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}

func TestFileCheckout(t *testing.T) {
	repos := t.TempDir()
	repo := filepath.Join(repos, "repo")
	os.MkdirAll(repo, 0o755)
	gitRun(t, repo, "init", "-q", "-b", "main")
	os.WriteFile(filepath.Join(repo, "keep.txt"), []byte("keep\n"), 0o644)
	os.WriteFile(filepath.Join(repo, "edit.txt"), []byte("old\n"), 0o644)
	os.WriteFile(filepath.Join(repo, "gone.txt"), []byte("gone\n"), 0o644)
	gitRun(t, repo, "add", ".")
	gitRun(t, repo, "commit", "-qm", "one")
	first := gitRun(t, repo, "rev-parse", "HEAD")
	os.WriteFile(filepath.Join(repo, "later.txt"), []byte("later\n"), 0o644)
	gitRun(t, repo, "add", ".")
	gitRun(t, repo, "commit", "-qm", "two")
	gitRun(t, repo, "tag", "v2")
	head := gitRun(t, repo, "rev-parse", "HEAD")

	e := newEnv(t, runs.Config{CheckoutDirs: []string{repos}})
	d := e.dir(t, "checkout")
	r, err := e.svc.Start(t.Context(), runs.Spec{RepoURL: "file://" + repo, Dir: d,
		Command: []string{"sh", "-c", "echo new > edit.txt && echo add > added.txt && rm gone.txt && test -f later.txt"}})
	if err != nil {
		t.Fatal(err)
	}
	r = e.wait(t, r.ID)
	if r.State != runs.Succeeded || r.Commit != head {
		t.Fatalf("run = %s (%s) commit %q, want succeeded at %s; phases %+v", r.State, r.Reason, r.Commit, head, r.Phases)
	}
	want := map[string]string{"edit.txt": "modified", "added.txt": "added", "gone.txt": "deleted"}
	if len(r.ChangedFiles) != 3 {
		t.Errorf("changed files = %+v", r.ChangedFiles)
	}
	for _, c := range r.ChangedFiles {
		if want[c.Path] != c.Status {
			t.Errorf("changed %+v, want %s", c, want[c.Path])
		}
	}
	if !strings.Contains(r.Diff, "-old\n+new\n") || !strings.Contains(r.DiffStat, "3 files changed") {
		t.Errorf("diff %q stat %q", r.Diff, r.DiffStat)
	}
	// A commit that is no branch tip: the fallback fetches everything.
	r2, err := e.svc.Start(t.Context(), runs.Spec{RepoURL: "file://" + repo, Ref: first, Dir: e.dir(t, "checkout2"), Command: []string{"sh", "-c", "! test -f later.txt"}})
	if err != nil {
		t.Fatal(err)
	}
	if r2 = e.wait(t, r2.ID); r2.State != runs.Succeeded || r2.Commit != first {
		t.Errorf("run at %s = %s (%s) commit %s; checkout %+v", first, r2.State, r2.Reason, r2.Commit, phase(t, r2, runs.PhaseCheckout))
	}
	// Outside CheckoutDirs: refused at Start, including through a symlink.
	other := t.TempDir()
	if _, err := e.svc.Start(t.Context(), runs.Spec{RepoURL: "file://" + other, Command: []string{"true"}}); !errcode.Is(err, errcode.InvalidArgument) || !strings.Contains(err.Error(), "spec.repo_url") {
		t.Errorf("file:// outside: %v", err)
	}
	link := filepath.Join(repos, "link")
	os.Symlink(other, link)
	if _, err := e.svc.Start(t.Context(), runs.Spec{RepoURL: "file://" + link, Command: []string{"true"}}); !errcode.Is(err, errcode.InvalidArgument) {
		t.Errorf("file:// through a symlink out: %v", err)
	}
}

// A restarted server waits for the same job and records its real exit code.
func TestResume(t *testing.T) {
	e := newEnv(t, runs.Config{})
	d := e.dir(t, "resume")
	r, err := e.svc.Start(t.Context(), runs.Spec{Dir: d, Command: []string{"sh", "-c", "sleep 5; echo finished; exit 7"}})
	if err != nil {
		t.Fatal(err)
	}
	r = waitPhase(t, e, r.ID, runs.PhaseCommand)
	job := phase(t, r, runs.PhaseCommand).JobID
	e.stopSvc() // the server stops; the job keeps running in the sandbox
	mid, err := e.st.GetRun(t.Context(), r.ID)
	if err != nil || mid.State != runs.Running {
		t.Fatalf("record after the stop: %s, %v", mid.State, err)
	}
	e.start(t)
	r = e.wait(t, r.ID)
	p := phase(t, r, runs.PhaseCommand)
	if r.State != runs.Failed || p.JobID != job || exitOf(p) != 7 || p.Stdout != "finished\n" {
		t.Fatalf("resumed run = %s (%s), command %+v; want failed, job %s exit 7", r.State, r.Reason, p, job)
	}
	// A phase cut before its job was recorded is interrupted, never re-run.
	r2, err := e.svc.Start(t.Context(), runs.Spec{Dir: d, Command: []string{"true"}})
	if err != nil {
		t.Fatal(err)
	}
	e.wait(t, r2.ID)
}

// A phase cut before its job id was recorded is interrupted and the run errored (never re-run);
// a sandbox phase cut mid-create is redone (the create is idempotent by the run's id).
func TestResumeFromRecord(t *testing.T) {
	e := newEnv(t, runs.Config{})
	e.stopSvc()
	ctx := t.Context()
	mark := filepath.Join(t.TempDir(), "ran")
	a, err := e.svc.Start(ctx, runs.Spec{Dir: e.dir(t, "cut"), Command: []string{"touch", mark}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := e.svc.Start(ctx, runs.Spec{Dir: e.dir(t, "cut2"), Command: []string{"true"}})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC().Truncate(time.Millisecond)
	// a: claimed, its sandbox phase done without a sandbox (as if none was needed), and its
	// command recorded running with no job.
	ra, ok, err := e.st.ClaimRun(ctx, a.ID, 0, now, runs.Event{RunID: a.ID, Time: now, From: runs.Queued, To: runs.Preparing, Reason: "test"})
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	for i := range ra.Phases {
		switch ra.Phases[i].Name {
		case runs.PhaseSandbox:
			ra.Phases[i].State = runs.PhaseSucceeded
		case runs.PhaseCommand:
			ra.Phases[i].State, ra.Phases[i].StartedAt = runs.PhaseRunning, &now
		}
	}
	ra.State = runs.Running
	ra.Version++
	if err := e.st.UpdateRun(ctx, ra); err != nil {
		t.Fatal(err)
	}
	// b: its sandbox phase running (the server stopped inside Create).
	rb, ok, err := e.st.ClaimRun(ctx, b.ID, 0, now, runs.Event{RunID: b.ID, Time: now, From: runs.Queued, To: runs.Preparing, Reason: "test"})
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	rb.Phases[0].State, rb.Phases[0].StartedAt = runs.PhaseRunning, &now
	rb.Version++
	if err := e.st.UpdateRun(ctx, rb); err != nil {
		t.Fatal(err)
	}
	e.start(t)
	ra = e.wait(t, a.ID)
	if p := phase(t, ra, runs.PhaseCommand); ra.State != runs.Errored || p.State != runs.PhaseInterrupted || !strings.Contains(ra.Reason, "interrupted") {
		t.Errorf("cut run = %s (%s), command %+v", ra.State, ra.Reason, p)
	}
	if _, err := os.Stat(mark); err == nil {
		t.Errorf("the interrupted command was run again")
	}
	if rb = e.wait(t, b.ID); rb.State != runs.Succeeded || rb.SandboxID == "" {
		t.Errorf("run resumed in its sandbox phase = %s (%s)", rb.State, rb.Reason)
	}
}

// The run's sandbox gone while a phase runs: the run is errored, never succeeded.
func TestSandboxLost(t *testing.T) {
	e := newEnv(t, runs.Config{})
	r, err := e.svc.Start(t.Context(), runs.Spec{Dir: e.dir(t, "lost"), Command: []string{"sleep", "60"}})
	if err != nil {
		t.Fatal(err)
	}
	r = waitPhase(t, e, r.ID, runs.PhaseCommand)
	if _, err := e.sbs.Destroy(t.Context(), r.SandboxID); err != nil {
		t.Fatal(err)
	}
	r = e.wait(t, r.ID)
	if r.State != runs.Errored || r.Success {
		t.Errorf("run whose sandbox went = %s (%s) %+v", r.State, r.Reason, phase(t, r, runs.PhaseCommand))
	}
}

// A sandbox refused for capacity leaves the run queued (retried with backoff) until a place
// frees up.
func TestCapacityRetry(t *testing.T) {
	e := newEnvSB(t, runs.Config{}, sandbox.Config{MaxSandboxes: 1})
	a, err := e.svc.Start(t.Context(), runs.Spec{Dir: e.dir(t, "capa"), Command: []string{"sleep", "3"}})
	if err != nil {
		t.Fatal(err)
	}
	waitPhase(t, e, a.ID, runs.PhaseCommand)
	b, err := e.svc.Start(t.Context(), runs.Spec{Dir: e.dir(t, "capb"), Command: []string{"true"}})
	if err != nil {
		t.Fatal(err)
	}
	sawRetry := false
	for i := 0; i < 40 && !sawRetry; i++ {
		evs, _ := e.svc.Events(t.Context(), b.ID, 0, 0)
		for _, ev := range evs.Events {
			sawRetry = sawRetry || (ev.To == runs.Queued && strings.Contains(ev.Reason, "no capacity"))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !sawRetry {
		t.Errorf("no capacity retry recorded for the second run")
	}
	if r := e.wait(t, a.ID); r.State != runs.Succeeded {
		t.Errorf("first run %s (%s)", r.State, r.Reason)
	}
	if r := e.wait(t, b.ID); r.State != runs.Succeeded {
		t.Errorf("second run %s (%s)", r.State, r.Reason)
	}
}

// A run's blobs removed (retention, the budget): its artifact is LINK_EXPIRED.
func TestArtifactGone(t *testing.T) {
	e := newEnv(t, runs.Config{})
	r, err := e.svc.Start(t.Context(), runs.Spec{Dir: e.dir(t, "gone"), Command: []string{"sh", "-c", "echo a > a.txt"}, Artifacts: []string{"a.txt"}})
	if err != nil {
		t.Fatal(err)
	}
	r = e.wait(t, r.ID)
	if len(r.Artifacts) != 1 {
		t.Fatalf("artifacts %+v %q", r.Artifacts, r.ArtifactErrors)
	}
	if err := os.RemoveAll(filepath.Join(e.cfg.Dir, "blobs", r.ID)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.svc.OpenArtifact(t.Context(), r.ID, "a.txt"); !errcode.Is(err, errcode.LinkExpired) {
		t.Errorf("OpenArtifact of a removed blob: %v", err)
	}
	if _, err := e.svc.Logs(t.Context(), r.ID, runs.LogsRequest{}); !errcode.Is(err, errcode.LinkExpired) {
		t.Errorf("Logs of removed blobs: %v", err)
	}
}

// Over the blob budget the oldest settled runs' blobs go first (their artifacts LINK_EXPIRED).
func TestBlobBudget(t *testing.T) {
	e := newEnv(t, runs.Config{ArtifactBudgetBytes: 30000})
	spec := runs.Spec{Command: []string{"sh", "-c", "head -c 20000 /dev/zero > a.bin"}, Artifacts: []string{"a.bin"}}
	spec.Dir = e.dir(t, "budget1")
	a, err := e.svc.Start(t.Context(), spec)
	if err != nil {
		t.Fatal(err)
	}
	e.wait(t, a.ID)
	if _, _, err := e.svc.OpenArtifact(t.Context(), a.ID, "a.bin"); err != nil {
		t.Fatalf("first run's artifact within the budget: %v", err)
	}
	spec.Dir = e.dir(t, "budget2")
	b, err := e.svc.Start(t.Context(), spec)
	if err != nil {
		t.Fatal(err)
	}
	e.wait(t, b.ID)
	var gerr error
	for i := 0; i < 50; i++ { // the trim follows the settle
		if _, _, gerr = e.svc.OpenArtifact(t.Context(), a.ID, "a.bin"); errcode.Is(gerr, errcode.LinkExpired) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !errcode.Is(gerr, errcode.LinkExpired) {
		t.Errorf("oldest run's artifact over the budget: %v", gerr)
	}
	rc, _, err := e.svc.OpenArtifact(t.Context(), b.ID, "a.bin")
	if err != nil {
		t.Fatalf("newest run's artifact: %v", err)
	}
	rc.Close()
}

// Settled runs past Retention go with their blobs (at start, then hourly); a run's whole
// timeout of 24 h still gets a sandbox (its TTL capped at the server's maximum).
func TestRetentionPrune(t *testing.T) {
	e := newEnv(t, runs.Config{Retention: 50 * time.Millisecond})
	r, err := e.svc.Start(t.Context(), runs.Spec{Dir: e.dir(t, "prune"), Command: []string{"echo", "hi"}, TimeoutSeconds: 24 * 3600})
	if err != nil {
		t.Fatal(err)
	}
	if r = e.wait(t, r.ID); r.State != runs.Succeeded {
		t.Fatalf("run %s (%s)", r.State, r.Reason)
	}
	if _, err := os.Stat(filepath.Join(e.cfg.Dir, "blobs", r.ID)); err != nil {
		t.Fatalf("blobs before the prune: %v", err)
	}
	time.Sleep(100 * time.Millisecond)
	e.stopSvc()
	e.start(t) // prunes at start
	var gerr error
	for i := 0; i < 50; i++ {
		if _, gerr = e.svc.Get(t.Context(), r.ID); errcode.Is(gerr, errcode.RunNotFound) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !errcode.Is(gerr, errcode.RunNotFound) {
		t.Fatalf("run past retention: %v", gerr)
	}
	// The record goes first, then its blobs.
	var serr error
	for i := 0; i < 50; i++ {
		if _, serr = os.Stat(filepath.Join(e.cfg.Dir, "blobs", r.ID)); serr != nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if serr == nil {
		t.Errorf("its blobs are still there")
	}
}

// Spec.Agent: the agent's repository checked out beside the target and built in its dir; the
// task gets stdin.
func TestAgentCheckout(t *testing.T) {
	repos := t.TempDir()
	agent := filepath.Join(repos, "agent")
	os.MkdirAll(agent, 0o755)
	gitRun(t, agent, "init", "-q", "-b", "main")
	os.WriteFile(filepath.Join(agent, "agent.sh"), []byte("#!/bin/sh\ncat > task.seen\necho agent ran\n"), 0o755)
	gitRun(t, agent, "add", ".")
	gitRun(t, agent, "commit", "-qm", "agent")
	gitRun(t, agent, "checkout", "-q", "-b", "feature")
	os.WriteFile(filepath.Join(agent, "FEATURE"), []byte("1\n"), 0o644)
	gitRun(t, agent, "add", ".")
	gitRun(t, agent, "commit", "-qm", "feature")
	feature := gitRun(t, agent, "rev-parse", "HEAD")
	gitRun(t, agent, "checkout", "-q", "main")

	e := newEnv(t, runs.Config{CheckoutDirs: []string{repos}})
	ad := e.dir(t, "agentdir")
	d := e.dir(t, "target")
	r, err := e.svc.Start(t.Context(), runs.Spec{Dir: d,
		Agent:   &runs.AgentCheckout{RepoURL: "file://" + agent, Ref: "feature", Dir: ad, BuildCommand: []string{"sh", "-c", "test -f FEATURE && echo built > built"}},
		Command: []string{"sh", ad + "/agent.sh"}, Stdin: "fix the bug\n",
		ValidationCommands: [][]string{{"grep", "-q", "fix the bug", "task.seen"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	r = e.wait(t, r.ID)
	if r.State != runs.Succeeded || r.AgentCommit != feature || r.Commit != "" {
		t.Fatalf("run = %s (%s) agent commit %q want %s; phases %+v", r.State, r.Reason, r.AgentCommit, feature, r.Phases)
	}
	if p := phase(t, r, runs.PhaseAgentBuild); p.State != runs.PhaseSucceeded {
		t.Errorf("agent_build = %+v", p)
	}
	if b, err := os.ReadFile(filepath.Join(ad, "built")); err != nil || string(b) != "built\n" {
		t.Errorf("built in the agent's dir: %q, %v", b, err)
	}
	if p := phase(t, r, runs.PhaseCommand); p.Stdout != "agent ran\n" {
		t.Errorf("command = %+v", p)
	}
	// A failing build skips the rest: failed, the command never ran.
	r, err = e.svc.Start(t.Context(), runs.Spec{Dir: e.dir(t, "target2"),
		Agent:   &runs.AgentCheckout{RepoURL: "file://" + agent, Dir: e.dir(t, "agentdir2"), BuildCommand: []string{"false"}},
		Command: []string{"true"}})
	if err != nil {
		t.Fatal(err)
	}
	r = e.wait(t, r.ID)
	if p := phase(t, r, runs.PhaseCommand); r.State != runs.Failed || p.State != runs.PhaseSkipped {
		t.Errorf("failing build: run %s (%s), command %+v", r.State, r.Reason, p)
	}
}

// The run's own timeout ends it timed_out.
func TestRunTimeout(t *testing.T) {
	e := newEnv(t, runs.Config{})
	r, err := e.svc.Start(t.Context(), runs.Spec{Dir: e.dir(t, "rto"), Command: []string{"sleep", "60"}, ValidationCommands: [][]string{{"true"}}, TimeoutSeconds: 2})
	if err != nil {
		t.Fatal(err)
	}
	r = e.wait(t, r.ID)
	if r.State != runs.TimedOut || phase(t, r, runs.PhaseCommand).State != runs.PhaseTimedOut || phase(t, r, "validation[0]").State != runs.PhaseSkipped {
		t.Errorf("run = %s (%s) %+v", r.State, r.Reason, r.Phases)
	}
	if r.DurationMs == nil || *r.DurationMs > 15000 {
		t.Errorf("duration %v", r.DurationMs)
	}
}
