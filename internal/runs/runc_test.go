package runs_test

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/runs"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/oci"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/sandbox/jobs"
	"github.com/agentbox/agentbox/internal/store/sqlite"
	"github.com/agentbox/agentbox/internal/testenv"
)

// A run end to end in a real runc sandbox: a file:// checkout (bundle made on the host, cloned
// inside), files, setup, the command with stdin, a failing validation, changed files and diff,
// an artifact, logs, cleanup with nothing left on the host.
func TestRunOnRunc(t *testing.T) {
	testenv.RequireRoot(t)
	dir := testenv.ShortTempDir(t, "abrun")
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(dir, "agentbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	root := filepath.Join(dir, "rt")
	rt, err := oci.New(ctx, oci.Config{Name: "runc", Binary: "runc", Root: root, GuestBinary: testenv.GuestBinary(t),
		CgroupParent: "abt-" + filepath.Base(dir), Subreaper: true})
	if err != nil {
		t.Fatal(err)
	}
	sbs, err := sandbox.NewService(st, []runtime.Runtime{rt}, sandbox.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sbs.Close()

	repos := filepath.Join(dir, "repos")
	repo := filepath.Join(repos, "repo")
	os.MkdirAll(repo, 0o755)
	gitRun(t, repo, "init", "-q", "-b", "main")
	os.WriteFile(filepath.Join(repo, "README"), []byte("hello\n"), 0o644)
	gitRun(t, repo, "add", ".")
	gitRun(t, repo, "commit", "-qm", "one")
	head := gitRun(t, repo, "rev-parse", "HEAD")

	svc, err := runs.New(runs.Config{Sandboxes: jobs.With(sbs), Store: st, Dir: filepath.Join(dir, "runs"), CheckoutDirs: []string{repos},
		BaseURL: func() string { return "http://x" }})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	go svc.Run(rctx)
	defer func() { stop(); svc.Close() }()

	r, err := svc.Start(ctx, runs.Spec{
		RepoURL: "file://" + repo,
		Files:   map[string]string{"notes/task.txt": "do it\n"},
		Setup:   []string{"sh", "-c", "echo set > setup.out"},
		Command: []string{"sh", "-c", "cat > from-stdin.txt; echo changed >> README; mkdir -p dist; echo bin > dist/app.bin; echo ok"},
		Stdin:   "the task\n",
		ValidationCommands: [][]string{
			{"grep", "-q", "the task", "from-stdin.txt"},
			{"sh", "-c", "echo bad >&2; exit 2"},
		},
		Artifacts: []string{"dist/*.bin"},
	})
	if err != nil {
		t.Fatal(err)
	}
	r, err = svc.Wait(ctx, r.ID, 3*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if r.State != runs.Failed || r.Commit != head {
		t.Fatalf("run = %s (%s) commit %q want %s; phases %+v", r.State, r.Reason, r.Commit, head, r.Phases)
	}
	for _, want := range []struct {
		name  string
		state runs.PhaseState
		exit  int
	}{{runs.PhaseCheckout, runs.PhaseSucceeded, 0}, {runs.PhaseSetup, runs.PhaseSucceeded, 0}, {runs.PhaseCommand, runs.PhaseSucceeded, 0},
		{"validation[0]", runs.PhaseSucceeded, 0}, {"validation[1]", runs.PhaseFailed, 2}} {
		if p := phase(t, r, want.name); p.State != want.state || exitOf(p) != want.exit {
			t.Errorf("phase %s = %s exit %d (%s), want %s %d", want.name, p.State, exitOf(p), p.Error+p.Stderr, want.state, want.exit)
		}
	}
	if p := phase(t, r, runs.PhaseCommand); p.Stdout != "ok\n" {
		t.Errorf("command stdout %q", p.Stdout)
	}
	changed := map[string]string{}
	for _, c := range r.ChangedFiles {
		changed[c.Path] = c.Status
	}
	for path, st := range map[string]string{"README": "modified", "from-stdin.txt": "added", "notes/task.txt": "added", "setup.out": "added", "dist/app.bin": "added"} {
		if changed[path] != st {
			t.Errorf("changed %s = %q, want %s (all: %+v)", path, changed[path], st, r.ChangedFiles)
		}
	}
	if !strings.Contains(r.Diff, "+changed") {
		t.Errorf("diff %q", r.Diff)
	}
	if len(r.Artifacts) != 1 || r.Artifacts[0].Path != "dist/app.bin" || r.Artifacts[0].Size != 4 {
		t.Fatalf("artifacts %+v errors %q", r.Artifacts, r.ArtifactErrors)
	}
	rc, _, err := svc.OpenArtifact(ctx, r.ID, "dist/app.bin")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if string(b) != "bin\n" {
		t.Errorf("artifact %q", b)
	}
	lg, err := svc.Logs(ctx, r.ID, runs.LogsRequest{Phase: "validation[1]", Stream: "stderr"})
	if err != nil || string(lg.Data) != "bad\n" || !lg.Complete {
		t.Errorf("logs = %+v, %v", lg, err)
	}
	sb, err := sbs.Get(ctx, r.SandboxID)
	if err != nil || sb.State != sandbox.StateDestroyed {
		t.Errorf("sandbox after the run: %s, %v", sb.State, err)
	}
	if leaks := testenv.LeaksAfter(5*time.Second, r.SandboxID); len(leaks) > 0 {
		t.Errorf("leaked: %v", leaks)
	}
}

// A restarted server (a new sandbox service adopting the runc sandbox, a new run service) waits
// for the same job in the same sandbox and records its real exit code.
func TestResumeOnRunc(t *testing.T) {
	testenv.RequireRoot(t)
	dir := testenv.ShortTempDir(t, "abres")
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(dir, "agentbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	root := filepath.Join(dir, "rt")
	newSandboxes := func() jobs.Sandboxes {
		rt, err := oci.New(ctx, oci.Config{Name: "runc", Binary: "runc", Root: root, GuestBinary: testenv.GuestBinary(t),
			CgroupParent: "abt-" + filepath.Base(dir), Subreaper: true})
		if err != nil {
			t.Fatal(err)
		}
		svc, err := sandbox.NewService(st, []runtime.Runtime{rt}, sandbox.Config{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		sbs := jobs.With(svc) // before Reconcile: its adopt hook re-arms the jobs' watches
		if err := sbs.Reconcile(ctx); err != nil {
			t.Fatal(err)
		}
		return sbs
	}
	newRuns := func(sbs jobs.Sandboxes) (*runs.Service, func()) {
		svc, err := runs.New(runs.Config{Sandboxes: sbs, Store: st, Dir: filepath.Join(dir, "runs")})
		if err != nil {
			t.Fatal(err)
		}
		rctx, stop := context.WithCancel(ctx)
		go svc.Run(rctx)
		return svc, func() { stop(); svc.Close() }
	}
	sbs := newSandboxes()
	svc, stop := newRuns(sbs)
	r, err := svc.Start(ctx, runs.Spec{Command: []string{"sh", "-c", "sleep 4; echo survived; exit 5"}})
	if err != nil {
		t.Fatal(err)
	}
	var job string
	for i := 0; i < 600 && job == ""; i++ {
		cur, _ := svc.Get(ctx, r.ID)
		for _, p := range cur.Phases {
			if p.Name == runs.PhaseCommand && p.JobID != "" {
				job = p.JobID
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	if job == "" {
		t.Fatal("the command never started")
	}
	stop()
	sbs.Close()
	if mid, err := st.GetRun(ctx, r.ID); err != nil || mid.State != runs.Running {
		t.Fatalf("record after the stop: %s, %v; want running (the restart must come mid-command)", mid.State, err)
	}
	sbs = newSandboxes()
	defer sbs.Close()
	svc, stop = newRuns(sbs)
	defer stop()
	r, err = svc.Wait(ctx, r.ID, 2*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	p := phase(t, r, runs.PhaseCommand)
	if r.State != runs.Failed || p.JobID != job || exitOf(p) != 5 || p.Stdout != "survived\n" {
		t.Fatalf("resumed run = %s (%s), command %+v; want failed with job %s exit 5", r.State, r.Reason, p, job)
	}
	if sb, err := sbs.Get(ctx, r.SandboxID); err != nil || sb.State != sandbox.StateDestroyed {
		t.Errorf("sandbox after the run: %s, %v", sb.State, err)
	}
	if leaks := testenv.LeaksAfter(5*time.Second, r.SandboxID); len(leaks) > 0 {
		t.Errorf("leaked: %v", leaks)
	}
}
