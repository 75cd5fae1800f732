package main

import (
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/config"
	"github.com/agentbox/agentbox/internal/runs"
	"github.com/agentbox/agentbox/internal/wire"
)

// parseRun parses `agentbox run`'s command line as cmdRun does, without a server.
func parseRun(t *testing.T, args ...string) (runArgs, error) {
	t.Helper()
	c, parse := newRunCmd()
	c.fs.SetOutput(new(strings.Builder))
	flags, command := splitCommand(args)
	pos, err := parseInterleaved(c.fs, flags)
	if err != nil {
		return runArgs{}, err
	}
	return parse(append(pos, command...))
}

// TestRunArgs: every flag lands in the spec; the command is what follows --; --validate takes
// a JSON argv or words; --file reads the local file; --allow-host gives a network policy.
func TestRunArgs(t *testing.T) {
	local := filepath.Join(t.TempDir(), "task.md")
	if err := os.WriteFile(local, []byte("do it\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ra, err := parseRun(t, "--repo", "https://example.com/r.git", "--ref", "v1", "--setup", `["sh", "-c", "make deps && make"]`,
		"--validate", "make test", "--validate", `["go", "vet", "./..."]`, "--artifact", "out/*.xml", "--artifact", "cov.txt",
		"--file", local+":docs/task.md", "--env", "A=1", "--image", "python:3.12", "--runtime", "gvisor", "--allow-host", "pypi.org",
		"--keep", "--keep-ttl", "600", "--timeout", "900", "--label", "k=v", "--idempotency-key", "key-1", "--json",
		"--", "pytest", "-q", "--maxfail=1")
	if err != nil {
		t.Fatal(err)
	}
	sp := ra.spec
	want := wire.RunSpec{RepoURL: "https://example.com/r.git", Ref: "v1", Setup: []string{"sh", "-c", "make deps && make"},
		Command: []string{"pytest", "-q", "--maxfail=1"}, ValidationCommands: [][]string{{"make", "test"}, {"go", "vet", "./..."}},
		Artifacts: []string{"out/*.xml", "cov.txt"}, Files: map[string]string{"docs/task.md": "do it\n"}, Env: map[string]string{"A": "1"},
		Image: "python:3.12", Runtime: "gvisor", Retention: runs.RetentionKeep, KeepTTLSeconds: 600, TimeoutSeconds: 900,
		Labels: map[string]string{"k": "v"}, IdempotencyKey: "key-1"}
	net := sp.Network
	sp.Network = nil
	if !reflect.DeepEqual(sp, want) {
		t.Fatalf("spec\n got %+v\nwant %+v", sp, want)
	}
	if net == nil || net.Policy == nil || !reflect.DeepEqual(net.Policy.Allow, []string{"pypi.org"}) {
		t.Fatalf("network %+v", net)
	}
	if !ra.json || ra.detach {
		t.Fatalf("json %v detach %v", ra.json, ra.detach)
	}
	// Defaults: no network, destroy, waiting.
	ra, err = parseRun(t, "--detach", "--", "true")
	if err != nil || ra.spec.Network != nil || ra.spec.Retention != "" || !ra.detach || !reflect.DeepEqual(ra.spec.Command, []string{"true"}) {
		t.Fatalf("minimal: %+v %v", ra, err)
	}
	// Validations alone are a run.
	if ra, err := parseRun(t, "--validate", "true"); err != nil || len(ra.spec.Command) != 0 {
		t.Fatalf("validations only: %+v %v", ra, err)
	}
	for _, tc := range []struct {
		args []string
		says string
	}{
		{nil, "nothing to run"},
		{[]string{"pytest"}, `unexpected argument "pytest": the command goes after --`},
		{[]string{"--validate", `["unterminated"`, "--", "true"}, "not a JSON array of strings"},
		{[]string{"--validate", `[]`, "--", "true"}, "empty argv"},
		{[]string{"--validate", `  `, "--", "true"}, "must not be empty"},
		{[]string{"--setup", "a", "--setup", "b", "--", "true"}, "--setup is one argv"},
		{[]string{"--keep-ttl", "60", "--", "true"}, "--keep-ttl needs --keep"},
		{[]string{"--file", "nocolon", "--", "true"}, "must be LOCAL:PATH"},
		{[]string{"--file", "/nonexistent/x:y", "--", "true"}, "no such file"},
		{[]string{"--env", "NOEQUALS", "--", "true"}, "KEY=VALUE"},
		{[]string{"--timeout", "soon", "--", "true"}, "invalid value"},
	} {
		_, err := parseRun(t, tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%q: %v, want an error saying %q", tc.args, err, tc.says)
		}
	}
	bin := filepath.Join(t.TempDir(), "bin")
	os.WriteFile(bin, []byte{0xff, 0xfe}, 0o644)
	if _, err := parseRun(t, "--file", bin+":b", "--", "true"); err == nil || !strings.Contains(err.Error(), "not UTF-8") {
		t.Errorf("binary --file: %v", err)
	}
}

// TestRunFlags: serve's run flags land in the config, which validates them.
func TestRunFlags(t *testing.T) {
	cfg := config.Default()
	cfg.StateDir = "/var/lib/agentbox-test"
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(new(strings.Builder))
	registerRunFlags(fs, &cfg)
	if err := fs.Parse([]string{"--run-workers", "3", "--checkout-dir", "/srv/a", "--checkout-dir", "/srv/b", "--artifact-mb", "512", "--run-retention", "48h"}); err != nil {
		t.Fatal(err)
	}
	if cfg.RunWorkers != 3 || !reflect.DeepEqual(cfg.CheckoutDirs, []string{"/srv/a", "/srv/b"}) || cfg.ArtifactMB != 512 || cfg.RunRetention != 48*time.Hour {
		t.Fatalf("config %+v", cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	cfg.CheckoutDirs = append(cfg.CheckoutDirs, "rel")
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), `--checkout-dir "rel" must be an absolute path`) {
		t.Fatalf("relative checkout dir: %v", err)
	}
}

// TestRunExitAndSummary: exit codes by state; the summary names the phases with exit codes and
// durations, changed files, artifacts with URLs, and a failing phase's output.
func TestRunExitAndSummary(t *testing.T) {
	for st, want := range map[wire.RunState]int{wire.RunSucceeded: 0, wire.RunFailed: 1, wire.RunErrored: 2, wire.RunTimedOut: 2, wire.RunCanceled: 2} {
		if got := runExit(wire.Run{State: st}); got != want {
			t.Errorf("runExit(%s) = %d, want %d", st, got, want)
		}
	}
	one, zero := 1, 0
	ms := int64(1500)
	r := wire.Run{ID: "run-0123456789ab", State: wire.RunFailed, Reason: "validation[0] exited 1", Commit: "abc123", DurationMs: &ms,
		Phases: []wire.RunPhase{{Name: "command", State: wire.PhaseSucceeded, ExitCode: &zero, DurationMs: &ms},
			{Name: "validation[0]", State: wire.PhaseFailed, ExitCode: &one, Stderr: "FAIL: test_x\n"}},
		ChangedFiles:  []wire.ChangedFile{{Path: "a.py", Status: "modified"}, {Path: "b.py", Status: "renamed", From: "c.py"}},
		Artifacts:     []wire.Artifact{{Path: "out/r.xml", Size: 10, URL: "http://127.0.0.1:8765/v1/runs/run-0123456789ab/artifacts/out/r.xml?expires=1&sig=ab"}},
		CleanupFailed: true, CleanupError: "busy", SandboxID: "sb-0123456789ab"}
	var b strings.Builder
	printRun(&b, r)
	out := b.String()
	for _, s := range []string{"run run-0123456789ab: failed (validation[0] exited 1), 1.5s", "commit abc123", "command", "validation[0]  failed",
		"modified a.py", "c.py -> b.py", "artifact out/r.xml (10 bytes): http://127.0.0.1:8765/v1/runs/", "CLEANUP FAILED for sandbox sb-0123456789ab: busy",
		"--- validation[0] output", "FAIL: test_x"} {
		if !strings.Contains(out, s) {
			t.Errorf("summary lacks %q:\n%s", s, out)
		}
	}
	if got := batchExit(wire.Batch{Runs: []wire.BatchRun{{State: wire.RunSucceeded}, {State: wire.RunFailed}}}); got != 1 {
		t.Errorf("batchExit with a failure = %d", got)
	}
	if got := batchExit(wire.Batch{Runs: []wire.BatchRun{{State: wire.RunSucceeded}, {State: wire.RunRunning}}}); got != 2 {
		t.Errorf("batchExit with an unsettled run = %d", got)
	}
	if got := batchExit(wire.Batch{Runs: []wire.BatchRun{{State: wire.RunSucceeded}}, SubmissionFailures: []wire.SubmissionFailure{{Index: 1}}}); got != 1 {
		t.Errorf("batchExit with a refused spec = %d", got)
	}
}

// TestReadRequest: batch, matrix and agent files are decoded strictly.
func TestReadRequest(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "b.json")
	os.WriteFile(good, []byte(`{"runs": [{"command": ["true"]}], "max_parallel": 2}`), 0o644)
	var req runs.BatchRequest
	if err := readRequest(good, &req); err != nil || len(req.Runs) != 1 || req.MaxParallel != 2 {
		t.Fatalf("%+v %v", req, err)
	}
	bad := filepath.Join(dir, "bad.json")
	os.WriteFile(bad, []byte(`{"runs": [], "max_paralel": 2}`), 0o644)
	if err := readRequest(bad, &req); err == nil || !strings.Contains(err.Error(), `unknown field "max_paralel"`) {
		t.Fatalf("unknown field: %v", err)
	}
	two := filepath.Join(dir, "two.json")
	os.WriteFile(two, []byte(`{"runs": []} {}`), 0o644)
	if err := readRequest(two, &req); err == nil || !strings.Contains(err.Error(), "data after the JSON object") {
		t.Fatalf("trailing data: %v", err)
	}
	var cr runs.CompareRequest
	if err := readRequest(filepath.Join(dir, "missing.json"), &cr); err == nil {
		t.Fatal("a missing file was read")
	}
}
