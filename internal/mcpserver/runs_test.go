package mcpserver_test

import (
	"context"
	"encoding/base64"
	"net/http/httptest"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentbox/agentbox/internal/egress"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/mcpserver"
	"github.com/agentbox/agentbox/internal/runs"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/fake"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/sandbox/jobs"
	"github.com/agentbox/agentbox/internal/store/sqlite"
)

// The run service the MCP server drives.
var _ mcpserver.RunsBackend = (*runs.Service)(nil)

// runService is a real run service on the fake runtime (commands run on the host in the runs'
// Dir) and the SQLite store; base is the address its artifact URLs name.
func runService(t *testing.T, base *string) (jobs.Sandboxes, *runs.Service, string) {
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
	sbs, err := sandbox.NewService(st, []runtime.Runtime{rt}, sandbox.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	sbj := jobs.With(sbs)
	if err := sbs.Reconcile(t.Context()); err != nil {
		t.Fatal(err)
	}
	rs, err := runs.New(runs.Config{Sandboxes: sbj, Store: st, Dir: filepath.Join(dir, "runs"), BaseURL: func() string { return *base }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); rs.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
		rs.Close()
		sbs.Close()
		rt.Shutdown(context.Background())
		st.Close()
	})
	return sbj, rs, filepath.Join(dir, "work")
}

// TestRunToolsRefuse: malformed calls are INVALID_ARGUMENT naming the argument (checked against
// the published schema before the service is called); unknown ids are RUN_NOT_FOUND; a server
// without a run service says UNSUPPORTED_OPERATION.
func TestRunToolsRefuse(t *testing.T) {
	base := "http://agentbox.test"
	sbs, rs, _ := runService(t, &base)
	bare := mcpserver.New(sbs, mcpserver.Options{})
	t.Cleanup(bare.Close)
	c0 := connect(t, bare, protocolVersions[0])
	for _, tool := range []string{"run", "run_list"} {
		if msg := c0.fails(tool, obj{}, "UNSUPPORTED_OPERATION"); !strings.Contains(msg, "no run service") {
			t.Errorf("%s without runs: %q", tool, msg)
		}
	}

	srv := mcpserver.New(sbs, mcpserver.Options{Runs: rs})
	t.Cleanup(srv.Close)
	c := connect(t, srv, protocolVersions[0])
	for _, tc := range []struct {
		tool string
		args obj
		code string
		want string
	}{
		{"run", obj{"command": "make test"}, "INVALID_ARGUMENT", `"command" must be an array`},
		{"run", obj{"command": []string{"true"}, "bogus": 1}, "INVALID_ARGUMENT", `unknown argument "bogus"`},
		{"run", obj{"command": []string{"true"}, "wait_seconds": 0}, "INVALID_ARGUMENT", "wait_seconds"},
		{"run", obj{"command": []string{"true"}, "wait_seconds": 3601}, "INVALID_ARGUMENT", "wait_seconds"},
		{"run", obj{"command": []string{"true"}, "retention": "forever"}, "INVALID_ARGUMENT", `"retention" must be one of "destroy", "keep"`},
		{"run", obj{"command": []string{"true"}, "timeout_seconds": 999999}, "INVALID_ARGUMENT", "timeout_seconds"},
		{"run", obj{"command": []string{"true"}, "network": "all"}, "INVALID_ARGUMENT", "network"},
		{"run", obj{"command": []string{"true"}, "validation_commands": []any{"true"}}, "INVALID_ARGUMENT", "validation_commands[0]"},
		{"run", obj{"command": []string{"true"}, "dir": "relative"}, "INVALID_ARGUMENT", "dir"},
		{"run_get", obj{}, "INVALID_ARGUMENT", `missing required argument "run_id"`},
		{"run_get", obj{"run_id": "run-000000000000"}, "RUN_NOT_FOUND", ""},
		{"run_cancel", obj{"run_id": "run-000000000000"}, "RUN_NOT_FOUND", ""},
		{"run_events", obj{"run_id": "run-000000000000", "limit": 0}, "INVALID_ARGUMENT", "limit"},
		{"run_events", obj{"run_id": "run-000000000000"}, "RUN_NOT_FOUND", ""},
		{"run_logs", obj{"run_id": "run-000000000000", "stream": "both"}, "INVALID_ARGUMENT", `"stream" must be one of "stdout", "stderr"`},
		{"run_logs", obj{"run_id": "run-000000000000", "max_bytes": 1048577}, "INVALID_ARGUMENT", "max_bytes"},
		{"run_list", obj{"limit": 0}, "INVALID_ARGUMENT", "limit"},
		{"run_list", obj{"state": []string{"finished"}}, "INVALID_ARGUMENT", "state[0]"},
		{"run_artifact", obj{"run_id": "run-000000000000", "path": ""}, "INVALID_ARGUMENT", "path"},
		{"run_artifact", obj{"run_id": "run-000000000000", "path": "a.txt"}, "RUN_NOT_FOUND", ""},
		{"run_batch", obj{"runs": []any{}}, "INVALID_ARGUMENT", `"runs" must not be empty`},
		{"run_batch", obj{"runs": []any{"x"}}, "INVALID_ARGUMENT", "runs[0]"},
		{"run_batch", obj{"runs": []any{obj{"command": []string{"true"}}}, "max_parallel": 65}, "INVALID_ARGUMENT", "max_parallel"},
		{"run_matrix", obj{"base": obj{"command": []string{"true"}}}, "INVALID_ARGUMENT", `missing required argument "axes"`},
		{"agent_compare", obj{"candidate": obj{"repo_url": "https://example.com/a.git"}, "target_repo_url": "https://example.com/t.git", "task": "x"}, "INVALID_ARGUMENT", `missing required argument "baseline"`},
		{"agent_test", obj{"candidate": obj{"repo_url": "https://example.com/a.git"}, "target_repo_url": "https://example.com/t.git", "task": "x", "preset": "other"}, "INVALID_ARGUMENT", "preset"},
		{"agent_test", obj{"candidate": obj{"repo_url": "https://example.com/a.git"}, "target_repo_url": "https://example.com/t.git", "task": "x", "baseline": obj{"repo_url": "y"}}, "INVALID_ARGUMENT", `unknown argument "baseline"`},
		{"batch_get", obj{"batch_id": "batch-000000000000"}, "RUN_NOT_FOUND", ""},
	} {
		if msg := c.fails(tc.tool, tc.args, tc.code); !strings.Contains(msg, tc.want) {
			t.Errorf("%s(%v): %q; want it to contain %q", tc.tool, tc.args, msg, tc.want)
		}
	}
	l, err := rs.List(t.Context(), runs.Filter{})
	if err != nil || len(l.Runs) != 0 {
		t.Fatalf("refused calls recorded runs: %+v %v", l, err)
	}
}

// TestRunTools: run with wait reports its transitions as progress; the record, list, events,
// logs and artifacts (inline up to 1 MiB, else only the URL) read back; batches and matrices
// with their failures and tables.
func TestRunTools(t *testing.T) {
	for _, over := range []string{"in-process"} {
		t.Run(over, func(t *testing.T) {
			base := "http://agentbox.test"
			sbs, rs, work := runService(t, &base)
			var rb mcpserver.RunsBackend = rs
			srv := mcpserver.New(sbs, mcpserver.Options{Runs: rb})
			t.Cleanup(srv.Close)
			c := connect(t, srv, protocolVersions[1])

			res := c.callCtx(t.Context(), "run", obj{"dir": filepath.Join(work, "one"), "files": obj{"in.txt": "hi\n"},
				"command":             []string{"sh", "-c", "mkdir -p out && cat in.txt > out/small.txt && head -c 1100000 /dev/zero > out/big.bin && echo done"},
				"validation_commands": [][]string{{"test", "-s", "out/small.txt"}}, "artifacts": []string{"out/*"},
				"labels": obj{"t": "mcp"}, "wait": true, "wait_seconds": 60}, "tok-run")
			var r mcpserver.RunOut
			decode(t, res, &r)
			if res.IsError || r.State != runs.Succeeded || !r.Success || len(r.Artifacts) != 2 {
				t.Fatalf("run: %s", text(res))
			}
			if !strings.Contains(text(res), "run "+r.ID+": succeeded") || !strings.Contains(text(res), "artifact out/small.txt") {
				t.Errorf("run text: %q", text(res))
			}
			eventually(t, 2*time.Second, "progress for the run's transitions", func() bool {
				c.mu.Lock()
				defer c.mu.Unlock()
				var all []string
				for _, p := range c.progress {
					all = append(all, p.Message)
				}
				j := strings.Join(all, "\n")
				return strings.Contains(j, "queued") && strings.Contains(j, "→ running") && strings.Contains(j, "→ succeeded")
			})

			var got mcpserver.RunOut
			c.ok("run_get", obj{"run_id": r.ID}, &got)
			if got.ID != r.ID || got.State != runs.Succeeded {
				t.Fatalf("run_get: %+v", got)
			}
			var l mcpserver.RunListOut
			c.ok("run_list", obj{"labels": obj{"t": "mcp"}, "state": []string{"succeeded"}}, &l)
			if len(l.Runs) != 1 || l.Runs[0].ID != r.ID {
				t.Fatalf("run_list: %+v", l)
			}
			var evs mcpserver.RunEventsOut
			c.ok("run_events", obj{"run_id": r.ID, "limit": 2}, &evs)
			if len(evs.Events) != 2 || evs.Events[0].To != runs.Queued || evs.Next != evs.Events[1].Seq {
				t.Fatalf("run_events: %+v", evs)
			}
			var lg mcpserver.RunLogsOut
			c.ok("run_logs", obj{"run_id": r.ID}, &lg)
			if lg.Data != "done\n" || !lg.Complete || lg.Phase != runs.PhaseCommand {
				t.Fatalf("run_logs: %+v", lg)
			}
			var small, big mcpserver.RunArtifactOut
			c.ok("run_artifact", obj{"run_id": r.ID, "path": "out/small.txt"}, &small)
			if b, _ := base64.StdEncoding.DecodeString(small.ContentBase64); !small.Inline || string(b) != "hi\n" || small.Size != 3 {
				t.Fatalf("small artifact: %+v", small)
			}
			c.ok("run_artifact", obj{"run_id": r.ID, "path": "out/big.bin"}, &big)
			if big.Inline || big.ContentBase64 != "" || big.Size != 1100000 || !strings.HasPrefix(big.URL, base+"/v1/runs/"+r.ID+"/artifacts/out/big.bin?") {
				t.Fatalf("big artifact: %+v", big)
			}
			if msg := c.fails("run_artifact", obj{"run_id": r.ID, "path": "nope"}, "FILE_NOT_FOUND"); !strings.Contains(msg, "out/small.txt") {
				t.Errorf("unknown artifact: %q", msg)
			}
			c.ok("run_cancel", obj{"run_id": r.ID}, &got)
			if got.State != runs.Succeeded {
				t.Fatalf("cancel of a settled run: %+v", got)
			}

			// idempotency_key holds across sessions (two streamable-HTTP sessions, each its own
			// sandbox owner): runs belong to the principal, not the session.
			hs := httptest.NewServer(srv.StreamableHTTPHandler(mcpserver.HTTPOptions{}))
			t.Cleanup(func() { hs.CloseClientConnections(); hs.Close() })
			c1 := connectOver(t, &mcp.StreamableClientTransport{Endpoint: hs.URL}, "2025-11-25")
			c2 := connectOver(t, &mcp.StreamableClientTransport{Endpoint: hs.URL}, "2025-11-25")
			var k1, k2 mcpserver.RunOut
			c1.ok("run", obj{"dir": filepath.Join(work, "k"), "command": []string{"true"}, "idempotency_key": "key-1"}, &k1)
			c2.ok("run", obj{"dir": filepath.Join(work, "k"), "command": []string{"true"}, "idempotency_key": "key-1"}, &k2)
			if k1.ID == "" || k2.ID != k1.ID {
				t.Fatalf("idempotency_key across sessions: %s then %s", k1.ID, k2.ID)
			}

			// Without wait: queued at once.
			c.ok("run", obj{"dir": filepath.Join(work, "two"), "command": []string{"true"}}, &got)
			if got.State.Settled() || got.ID == r.ID {
				t.Fatalf("run without wait: %+v", got)
			}

			var b mcpserver.BatchOut
			txt := c.ok("run_batch", obj{"runs": []any{obj{"dir": filepath.Join(work, "b1"), "command": []string{"true"}},
				obj{"command": []string{"true"}, "bogus": 1},
				obj{"dir": filepath.Join(work, "b2"), "command": []string{"false"}}}, "max_parallel": 2, "wait": true}, &b)
			if !b.Settled || len(b.Runs) != 2 || len(b.SubmissionFailures) != 1 || b.SubmissionFailures[0].Index != 1 ||
				b.Counts[runs.Succeeded] != 1 || b.Counts[runs.Failed] != 1 || !strings.Contains(txt, "submission failure [1]") {
				t.Fatalf("run_batch: %+v\n%s", b, txt)
			}
			var g mcpserver.BatchOut
			c.ok("batch_get", obj{"batch_id": b.ID}, &g)
			if g.ID != b.ID || len(g.Runs) != 2 {
				t.Fatalf("batch_get: %+v", g)
			}
			c.ok("run_list", obj{"batch_id": b.ID}, &l)
			if len(l.Runs) != 2 {
				t.Fatalf("run_list batch_id: %+v", l)
			}
			var m mcpserver.BatchOut
			c.ok("run_matrix", obj{"base": obj{"dir": filepath.Join(work, "m"), "command": []string{"sh", "-c", `test "$MODE" = a`}},
				"axes": obj{"env.MODE": []string{"a", "b"}}, "wait_seconds": 60}, &m)
			if !m.Settled || len(m.Matrix) != 2 || len(m.Axes) != 1 || m.Counts[runs.Succeeded] != 1 || m.Counts[runs.Failed] != 1 {
				t.Fatalf("run_matrix: %+v", m)
			}
		})
	}
}

// recRuns is the run service, recording what the tools hand it (and refusing, so that nothing
// runs): the argument mapping of run, agent_compare and agent_test, field by field.
type recRuns struct {
	*runs.Service
	spec runs.Spec
	cmp  runs.CompareRequest
}

var errRecorded = errcode.New(errcode.UnsupportedOp, "recorded")

func (r *recRuns) Start(_ context.Context, spec runs.Spec) (runs.Run, error) {
	r.spec = spec
	return runs.Run{}, errRecorded
}

func (r *recRuns) AgentCompare(_ context.Context, req runs.CompareRequest) (runs.Batch, error) {
	r.cmp = req
	return runs.Batch{}, errRecorded
}

func (r *recRuns) AgentTest(_ context.Context, req runs.CompareRequest) (runs.Batch, error) {
	r.cmp = req
	return runs.Batch{}, errRecorded
}

// TestRunToolArguments: every argument of run, agent_compare and agent_test reaches the service.
func TestRunToolArguments(t *testing.T) {
	base := "http://agentbox.test"
	sbs, rs, _ := runService(t, &base)
	rec := &recRuns{Service: rs}
	srv := mcpserver.New(sbs, mcpserver.Options{Runs: rec})
	t.Cleanup(srv.Close)
	c := connect(t, srv, protocolVersions[0])
	secrets := obj{"TOK": obj{"from": "env:TOK", "hosts": []string{"git.example.com"}}}
	c.fails("run", obj{"repo_url": "https://git.example.com/r.git", "ref": "v1", "repo_secret": "TOK", "dir": "/workspace/r",
		"files": obj{"a.txt": "A"}, "setup": []string{"make", "deps"}, "command": []string{"make"}, "validation_commands": [][]string{{"make", "test"}},
		"stdin": "in", "artifacts": []string{"out/*"}, "env": obj{"E": "1"}, "secrets": secrets, "image": "python:3.12", "runtime": "gvisor",
		"cpu": 2, "memory_mb": 1024, "disk_mb": 2048, "network": obj{"allow": []string{"pypi.org"}}, "requirements": obj{"isolation": "kernel"},
		"timeout_seconds": 600, "phase_timeout_seconds": obj{"setup": 60}, "retention": "keep", "keep_ttl_seconds": 300,
		"labels": obj{"l": "v"}, "idempotency_key": "k"}, "UNSUPPORTED_OPERATION")
	nw := &sandbox.Network{Policy: &egress.Policy{Allow: []string{"pypi.org"}, Deny: []string{}}}
	sec := map[string]sandbox.SecretSpec{"TOK": {From: "env:TOK", Hosts: []string{"git.example.com"}}}
	want := runs.Spec{RepoURL: "https://git.example.com/r.git", Ref: "v1", RepoSecret: "TOK", Dir: "/workspace/r", Files: map[string]string{"a.txt": "A"},
		Setup: []string{"make", "deps"}, Command: []string{"make"}, ValidationCommands: [][]string{{"make", "test"}}, Stdin: "in",
		Artifacts: []string{"out/*"}, Env: map[string]string{"E": "1"}, Secrets: sec, Image: "python:3.12", Runtime: "gvisor",
		CPU: 2, MemoryMB: 1024, DiskMB: 2048, Network: nw, Requirements: sandbox.Requirements{Isolation: "kernel"},
		TimeoutSeconds: 600, PhaseTimeouts: map[string]int64{"setup": 60}, Retention: "keep", KeepTTLSeconds: 300,
		Labels: map[string]string{"l": "v"}, IdempotencyKey: "k"}
	if !reflect.DeepEqual(rec.spec, want) {
		t.Errorf("run's spec\n got %+v\nwant %+v", rec.spec, want)
	}

	shape := obj{"target_repo_url": "https://git.example.com/t.git", "target_ref": "main", "target_repo_secret": "TOK", "task": "fix it",
		"preset": "omp", "build_command": []string{"true"}, "setup_command": []string{"npm", "ci"}, "agent_command": []string{"agent"},
		"validation_commands": [][]string{{"npm", "test"}}, "max_parallel": 2, "image": "node:22", "runtime": "runc", "cpu": 1.5,
		"memory_mb": 2048, "disk_mb": 4096, "network": obj{"allow": []string{"pypi.org"}}, "env": obj{"E": "1"}, "secrets": secrets,
		"timeout_seconds": 900, "idempotency_key": "k2"}
	cmp := obj{"baseline": obj{"repo_url": "https://git.example.com/a.git", "ref": "v1"}, "candidate": obj{"repo_url": "https://git.example.com/a.git", "ref": "v2", "repo_secret": "TOK"},
		"repetitions": 3}
	for k, v := range shape {
		cmp[k] = v
	}
	c.fails("agent_compare", cmp, "UNSUPPORTED_OPERATION")
	wantCmp := runs.CompareRequest{Baseline: &runs.AgentSide{RepoURL: "https://git.example.com/a.git", Ref: "v1"},
		Candidate: runs.AgentSide{RepoURL: "https://git.example.com/a.git", Ref: "v2", RepoSecret: "TOK"}, Preset: "omp",
		TargetRepoURL: "https://git.example.com/t.git", TargetRef: "main", TargetRepoSecret: "TOK", Task: "fix it",
		BuildCommand: []string{"true"}, SetupCommand: []string{"npm", "ci"}, AgentCommand: []string{"agent"},
		ValidationCommands: [][]string{{"npm", "test"}}, Repetitions: 3, MaxParallel: 2, Image: "node:22", Runtime: "runc", CPU: 1.5,
		MemoryMB: 2048, DiskMB: 4096, Network: nw, Env: map[string]string{"E": "1"}, Secrets: sec, TimeoutSeconds: 900, IdempotencyKey: "k2"}
	if !reflect.DeepEqual(rec.cmp, wantCmp) {
		t.Errorf("agent_compare's request\n got %+v\nwant %+v", rec.cmp, wantCmp)
	}
	test := obj{"candidate": obj{"repo_url": "https://git.example.com/a.git"}, "keep_sandbox": true, "keep_ttl_seconds": 120}
	for k, v := range shape {
		test[k] = v
	}
	c.fails("agent_test", test, "UNSUPPORTED_OPERATION")
	wantTest := wantCmp
	wantTest.Baseline, wantTest.Candidate, wantTest.Repetitions = nil, runs.AgentSide{RepoURL: "https://git.example.com/a.git"}, 0
	wantTest.KeepSandbox, wantTest.KeepTTLSeconds = true, 120
	if !reflect.DeepEqual(rec.cmp, wantTest) {
		t.Errorf("agent_test's request\n got %+v\nwant %+v", rec.cmp, wantTest)
	}
}

// eventsThenSettle is a runs backend whose event reads return what was recorded and then
// wait until the run has settled: the settling transition always lands between a read of the
// events and the next read of the record.
type eventsThenSettle struct{ mcpserver.RunsBackend }

func (b eventsThenSettle) Events(ctx context.Context, id string, after int64, limit int) (runs.EventList, error) {
	l, err := b.RunsBackend.Events(ctx, id, after, limit)
	for deadline := time.Now().Add(time.Minute); err == nil && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if r, gerr := b.RunsBackend.Get(ctx, id); gerr != nil || r.State.Settled() {
			break
		}
	}
	return l, err
}

// TestRunProgressReportsTheLastTransition: a run that settles while its waiter reads the events
// is still reported through its last transition before the reply.
func TestRunProgressReportsTheLastTransition(t *testing.T) {
	base := "http://agentbox.test"
	sbs, rs, work := runService(t, &base)
	srv := mcpserver.New(sbs, mcpserver.Options{Runs: eventsThenSettle{rs}})
	t.Cleanup(srv.Close)
	c := connect(t, srv, protocolVersions[1])
	res := c.callCtx(t.Context(), "run", obj{"dir": filepath.Join(work, "last"), "command": []string{"true"}, "wait": true, "wait_seconds": 60}, "tok-last")
	var r mcpserver.RunOut
	decode(t, res, &r)
	if res.IsError || r.State != runs.Succeeded {
		t.Fatalf("run: %s", text(res))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var all []string
	for _, p := range c.progress {
		all = append(all, p.Message)
	}
	if j := strings.Join(all, "\n"); !strings.Contains(j, "→ succeeded") {
		t.Fatalf("progress before the reply: %q; want the run's last transition", all)
	}
}
