package api_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/api"
	"github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/runs"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/fake"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/sandbox/jobs"
	"github.com/agentbox/agentbox/internal/store/sqlite"
	"github.com/agentbox/agentbox/internal/wire"
)

// runsEnv is the REST API over a real run service on the fake runtime (its commands run on the
// host in the runs' Dir) and the SQLite store.
type runsEnv struct {
	srv  *httptest.Server
	rs   *runs.Service
	c    *client.Client
	work string
}

const runsToken = "s3cret-token-for-runs"

func newRunsEnv(t *testing.T) *runsEnv {
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
	if err := sbs.Reconcile(t.Context()); err != nil {
		t.Fatal(err)
	}
	var base string
	sbj := jobs.With(sbs)
	rs, err := runs.New(runs.Config{Sandboxes: sbj, Store: st, Dir: filepath.Join(dir, "runs"), BaseURL: func() string { return base }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); rs.Run(ctx) }()
	h := api.New(sbs, api.Options{Token: runsToken, Runs: rs, SandboxJobs: sbj.Jobs()})
	srv := httptest.NewServer(h)
	base = srv.URL
	t.Cleanup(func() {
		h.Close()
		srv.Close()
		cancel()
		<-done
		rs.Close()
		sbs.Close()
		rt.Shutdown(context.Background())
		st.Close()
	})
	return &runsEnv{srv: srv, rs: rs, c: client.New(srv.URL, runsToken), work: filepath.Join(dir, "work")}
}

// call makes a request (token "" for none) and returns the status and body.
func call(t *testing.T, method, u, token, body string) (int, string, http.Header) {
	t.Helper()
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req, _ := http.NewRequest(method, u, r)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header
}

func errCode(body string) (errcode.Code, string) {
	var eb struct {
		Error struct {
			Code    errcode.Code `json:"code"`
			Message string       `json:"message"`
		} `json:"error"`
	}
	_ = json.Unmarshal([]byte(body), &eb)
	return eb.Error.Code, eb.Error.Message
}

// TestRunsWithoutService: a server built without a run service answers every run route
// UNSUPPORTED_OPERATION (after auth), never 404 or a panic.
func TestRunsWithoutService(t *testing.T) {
	srv := httptest.NewServer(api.New(nil, api.Options{Token: runsToken}))
	t.Cleanup(srv.Close)
	for _, rt := range []struct{ method, path, body string }{
		{"POST", "/v1/runs", `{"command":["true"]}`},
		{"GET", "/v1/runs", ""},
		{"GET", "/v1/runs/run-0123456789ab", ""},
		{"GET", "/v1/runs/run-0123456789ab/logs", ""},
		{"GET", "/v1/runs/run-0123456789ab/artifacts/a.txt", ""},
		{"POST", "/v1/batches", `{"runs":[]}`},
		{"POST", "/v1/batches/agent-compare", `{}`},
		{"GET", "/v1/batches", ""},
	} {
		st, body, _ := call(t, rt.method, srv.URL+rt.path, runsToken, rt.body)
		if code, _ := errCode(body); st != http.StatusNotImplemented || code != errcode.UnsupportedOp {
			t.Errorf("%s %s: %d %s", rt.method, rt.path, st, body)
		}
	}
}

// TestRunsValidation: bad input is 400 INVALID_ARGUMENT naming the field (nothing recorded);
// unknown ids are 404 RUN_NOT_FOUND.
func TestRunsValidation(t *testing.T) {
	e := newRunsEnv(t)
	u := e.srv.URL
	for _, tc := range []struct {
		method, path, body string
		status             int
		code               errcode.Code
		want               string
	}{
		{"POST", "/v1/runs", `{"command":["true"],"bogus":1}`, 400, errcode.InvalidArgument, `"bogus"`},
		{"POST", "/v1/runs", `{"command":"true"}`, 400, errcode.InvalidArgument, `"command"`},
		{"POST", "/v1/runs", `{"command":["true"],"wait_seconds":3601}`, 400, errcode.InvalidArgument, "wait_seconds must be between 0 and 3600"},
		{"POST", "/v1/runs", `{"command":["true"],"wait_seconds":-1}`, 400, errcode.InvalidArgument, "wait_seconds"},
		{"POST", "/v1/runs", `{"command":["true"]} {}`, 400, errcode.InvalidArgument, "after the JSON object"},
		{"POST", "/v1/runs", ``, 400, errcode.InvalidArgument, "empty"},
		{"POST", "/v1/runs", `{"command":["true"],"timeout_seconds":999999999}`, 400, errcode.InvalidArgument, "timeout_seconds"},
		{"POST", "/v1/runs", `{"command":["true"],"retention":"forever"}`, 400, errcode.InvalidArgument, "retention"},
		{"GET", "/v1/runs?limit=0", "", 400, errcode.InvalidArgument, "limit must be an integer between 1 and 1000"},
		{"GET", "/v1/runs?state=bogus", "", 400, errcode.InvalidArgument, `state "bogus"`},
		{"GET", "/v1/runs?label=nokey", "", 400, errcode.InvalidArgument, "label filter"},
		{"GET", "/v1/runs/run-000000000000", "", 404, errcode.RunNotFound, ""},
		{"POST", "/v1/runs/run-000000000000/cancel", "", 404, errcode.RunNotFound, ""},
		{"GET", "/v1/runs/run-000000000000/events", "", 404, errcode.RunNotFound, ""},
		{"GET", "/v1/runs/run-000000000000/events?limit=1001", "", 400, errcode.InvalidArgument, "limit must be an integer between 1 and 1000"},
		{"GET", "/v1/runs/run-000000000000/logs?stream=both", "", 400, errcode.InvalidArgument, "stream must be stdout or stderr"},
		{"GET", "/v1/runs/run-000000000000/logs?max_bytes=1048577", "", 400, errcode.InvalidArgument, "max_bytes must be an integer between 1 and 1048576"},
		{"GET", "/v1/runs/run-000000000000/logs", "", 404, errcode.RunNotFound, ""},
		{"GET", "/v1/runs/run-000000000000/artifacts/a.txt", "", 404, errcode.RunNotFound, ""},
		{"POST", "/v1/batches", `{"runs":[{"command":["true"]}],"nope":true}`, 400, errcode.InvalidArgument, `"nope"`},
		{"POST", "/v1/batches", `{"runs":[{"command":["true"]}],"max_parallel":65}`, 400, errcode.InvalidArgument, "max_parallel"},
		{"POST", "/v1/batches/matrix", `{"base":{"command":["true"]},"axes":{"env.A":["1"]},"wait_seconds":99999}`, 400, errcode.InvalidArgument, "wait_seconds"},
		{"POST", "/v1/batches/agent-compare", `{"candidate":{"repo_url":"x"},"extra":1}`, 400, errcode.InvalidArgument, `"extra"`},
		{"POST", "/v1/batches/agent-test", `{"candidate":{"repo_url":"https://example.com/a.git"}}`, 400, errcode.InvalidArgument, ""},
		{"GET", "/v1/batches?limit=5000", "", 400, errcode.InvalidArgument, "limit"},
		{"GET", "/v1/batches/batch-000000000000", "", 404, errcode.RunNotFound, ""},
		{"POST", "/v1/batches/batch-000000000000/cancel", "", 404, errcode.RunNotFound, ""},
	} {
		st, body, _ := call(t, tc.method, u+tc.path, runsToken, tc.body)
		code, msg := errCode(body)
		if st != tc.status || code != tc.code || !strings.Contains(msg, tc.want) {
			t.Errorf("%s %s %s: %d %s; want %d %s containing %q", tc.method, tc.path, tc.body, st, body, tc.status, tc.code, tc.want)
		}
	}
	// Nothing was recorded by the refused requests.
	l, err := e.c.ListRuns(t.Context(), wire.RunFilter{})
	if err != nil || len(l.Runs) != 0 {
		t.Fatalf("refused requests recorded runs: %+v %v", l, err)
	}
	bl, err := e.c.ListBatches(t.Context(), "", 0)
	if err != nil || len(bl.Batches) != 0 {
		t.Fatalf("refused requests recorded batches: %+v %v", bl, err)
	}
}

// TestRunOverREST: a run through the Go client with wait, its record, list, events, logs, and
// its artifact by token and by signed URL (refused when tampered with, expired, unsigned, or
// another method).
func TestRunOverREST(t *testing.T) {
	e := newRunsEnv(t)
	ctx := t.Context()
	dir := filepath.Join(e.work, "r1")
	r, err := e.c.WaitRun(ctx, wire.RunSpec{Dir: dir, Files: map[string]string{"in.txt": "hello\n"},
		Command:            []string{"sh", "-c", "mkdir -p out && tr a-z A-Z < in.txt > out/up.txt && echo done"},
		ValidationCommands: [][]string{{"test", "-s", "out/up.txt"}}, Artifacts: []string{"out/*.txt"},
		Labels: map[string]string{"suite": "rest"}}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if r.State != wire.RunSucceeded || len(r.Artifacts) != 1 || r.Artifacts[0].Path != "out/up.txt" {
		t.Fatalf("run %+v", r)
	}
	if got, err := e.c.GetRun(ctx, r.ID); err != nil || got.ID != r.ID || got.State != wire.RunSucceeded {
		t.Fatalf("get: %+v %v", got, err)
	}
	l, err := e.c.ListRuns(ctx, wire.RunFilter{States: []wire.RunState{wire.RunSucceeded}, Labels: map[string]string{"suite": "rest"}})
	if err != nil || len(l.Runs) != 1 || l.Runs[0].ID != r.ID {
		t.Fatalf("list: %+v %v", l, err)
	}
	if l, err := e.c.ListRuns(ctx, wire.RunFilter{States: []wire.RunState{wire.RunFailed}}); err != nil || len(l.Runs) != 0 {
		t.Fatalf("list failed: %+v %v", l, err)
	}
	// The server's token is the admin: its list shows every owner's runs (a key's shows its
	// own: TestOwnershipAcrossPrincipals).
	other, err := e.rs.Start(sandbox.WithOwner(ctx, "key:someone-else"), runs.Spec{Dir: filepath.Join(e.work, "other"), Command: []string{"true"}, Labels: map[string]string{"suite": "rest"}})
	if err != nil {
		t.Fatal(err)
	}
	if l, err := e.c.ListRuns(ctx, wire.RunFilter{Labels: map[string]string{"suite": "rest"}}); err != nil || len(l.Runs) != 2 {
		t.Fatalf("the admin's list misses another owner's run %s: %+v %v", other.ID, l, err)
	}
	evs, err := e.c.RunEvents(ctx, r.ID, 0, 0)
	if err != nil || len(evs.Events) < 3 || evs.Events[0].To != wire.RunQueued || evs.Events[len(evs.Events)-1].To != wire.RunSucceeded {
		t.Fatalf("events: %+v %v", evs, err)
	}
	page, err := e.c.RunEvents(ctx, r.ID, evs.Events[0].Seq, 1)
	if err != nil || len(page.Events) != 1 || page.Events[0].Seq != evs.Events[1].Seq {
		t.Fatalf("events after %d limit 1: %+v %v", evs.Events[0].Seq, page, err)
	}
	lg, err := e.c.RunLogs(ctx, r.ID, wire.RunLogsRequest{})
	if err != nil || string(lg.Data) != "done\n" || !lg.Complete || lg.Phase != runs.PhaseCommand {
		t.Fatalf("logs: %+v %v", lg, err)
	}
	rc, n, err := e.c.DownloadArtifact(ctx, r.ID, "out/up.txt")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if string(b) != "HELLO\n" || n != 6 {
		t.Fatalf("download with the token: %q (%d)", b, n)
	}

	// The signed URL, without the token.
	a := r.Artifacts[0]
	if !strings.HasPrefix(a.URL, e.srv.URL+"/v1/runs/"+r.ID+"/artifacts/out/up.txt?") {
		t.Fatalf("artifact URL %q", a.URL)
	}
	st, body, h := call(t, "GET", a.URL, "", "")
	if st != 200 || body != "HELLO\n" || h.Get("Content-Length") != "6" || h.Get("Content-Type") != "application/octet-stream" ||
		h.Get("Content-Disposition") != `attachment; filename=up.txt` {
		t.Fatalf("signed download: %d %q %v", st, body, h)
	}
	pu, _ := url.Parse(a.URL)
	q := pu.Query()
	bare := e.srv.URL + "/v1/runs/" + r.ID + "/artifacts/out/up.txt"
	with := func(exp, sig string) string {
		v := url.Values{}
		if exp != "" {
			v.Set("expires", exp)
		}
		if sig != "" {
			v.Set("sig", sig)
		}
		return bare + "?" + v.Encode()
	}
	sig := q.Get("sig")
	tampered := "0" + sig[1:]
	if sig[0] == '0' {
		tampered = "1" + sig[1:]
	}
	expired, _ := url.Parse(e.rs.ArtifactURL(r.ID, "out/up.txt", time.Now().Add(-time.Minute)))
	otherPath := e.srv.URL + "/v1/runs/" + r.ID + "/artifacts/out/other.txt?" + q.Encode()
	for _, tc := range []struct {
		name, method, url, token string
		status                   int
		code                     errcode.Code
	}{
		{"no token, no signature", "GET", bare, "", 401, errcode.AuthFailed},
		{"only expires", "GET", with(q.Get("expires"), ""), "", 401, errcode.AuthFailed},
		{"only sig", "GET", with("", sig), "", 401, errcode.AuthFailed},
		{"tampered sig", "GET", with(q.Get("expires"), tampered), "", 401, errcode.AuthFailed},
		{"tampered expires", "GET", with(strconv.FormatInt(mustInt(t, q.Get("expires"))+60, 10), sig), "", 401, errcode.AuthFailed},
		{"expires not a number", "GET", with("soon", sig), "", 401, errcode.AuthFailed},
		{"another path's signature", "GET", otherPath, "", 401, errcode.AuthFailed},
		{"expired", "GET", expired.String(), "", 410, errcode.LinkExpired},
		{"wrong token with a valid signature", "GET", a.URL, "wrong", 200, ""},
		{"POST with a signature, no token", "POST", a.URL, "", 401, errcode.AuthFailed},
		{"POST with the token", "POST", bare, runsToken, 405, errcode.InvalidArgument},
		{"DELETE with the token", "DELETE", bare, runsToken, 405, errcode.InvalidArgument},
		{"signature on another route", "GET", e.srv.URL + "/v1/runs/" + r.ID + "?" + q.Encode(), "", 401, errcode.AuthFailed},
		{"signature on the logs route", "GET", e.srv.URL + "/v1/runs/" + r.ID + "/logs?" + q.Encode(), "", 401, errcode.AuthFailed},
		{"token, no signature", "GET", bare, runsToken, 200, ""},
		{"token and an expired signature", "GET", expired.String(), runsToken, 200, ""},
		{"unknown artifact", "GET", e.srv.URL + "/v1/runs/" + r.ID + "/artifacts/nope.txt", runsToken, 404, ""},
	} {
		st, body, h := call(t, tc.method, tc.url, tc.token, "")
		code, _ := errCode(body)
		if st != tc.status || (tc.code != "" && code != tc.code) {
			t.Errorf("%s: %d %s; want %d %s", tc.name, st, body, tc.status, tc.code)
		}
		if st == 405 && h.Get("Allow") != "GET" {
			t.Errorf("%s: Allow %q", tc.name, h.Get("Allow"))
		}
		if st == 200 && body != "HELLO\n" {
			t.Errorf("%s: body %q", tc.name, body)
		}
	}

	// Idempotency over REST: the same key returns the same run.
	k := wire.RunSpec{Dir: filepath.Join(e.work, "r2"), Command: []string{"true"}, IdempotencyKey: "k-1"}
	r1, err := e.c.StartRun(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := e.c.StartRun(ctx, k)
	if err != nil || r2.ID != r1.ID {
		t.Fatalf("idempotent start: %s then %s (%v)", r1.ID, r2.ID, err)
	}
	if c, err := e.c.CancelRun(ctx, r1.ID); err != nil || c.ID != r1.ID {
		t.Fatalf("cancel: %+v %v", c, err)
	}
}

func mustInt(t *testing.T, s string) int64 {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestBatchOverREST: a batch with a refused spec (listed in submission_failures, never a run),
// waited for; then read back, listed and canceled through the client.
func TestBatchOverREST(t *testing.T) {
	e := newRunsEnv(t)
	ctx := t.Context()
	ok := func(name string) json.RawMessage {
		b, _ := json.Marshal(runs.Spec{Dir: filepath.Join(e.work, name), Command: []string{"sh", "-c", "echo " + name}})
		return b
	}
	b, err := e.c.StartBatch(ctx, wire.BatchRequest{Runs: []json.RawMessage{ok("a"), json.RawMessage(`{"command":["true"],"bogus":1}`), ok("b")},
		MaxParallel: 2}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if !b.Settled || len(b.Runs) != 2 || len(b.SubmissionFailures) != 1 || b.SubmissionFailures[0].Index != 1 || b.Counts[wire.RunSucceeded] != 2 {
		t.Fatalf("batch %+v", b)
	}
	if g, err := e.c.GetBatch(ctx, b.ID); err != nil || g.ID != b.ID || len(g.Runs) != 2 {
		t.Fatalf("get batch: %+v %v", g, err)
	}
	if l, err := e.c.ListBatches(ctx, "", 10); err != nil || len(l.Batches) != 1 {
		t.Fatalf("list batches: %+v %v", l, err)
	}
	if l, err := e.c.ListRuns(ctx, wire.RunFilter{BatchID: b.ID}); err != nil || len(l.Runs) != 2 {
		t.Fatalf("runs of the batch: %+v %v", l, err)
	}
	if c, err := e.c.CancelBatch(ctx, b.ID); err != nil || c.ID != b.ID {
		t.Fatalf("cancel batch: %+v %v", c, err)
	}
	m, err := e.c.StartMatrix(ctx, wire.MatrixRequest{Base: ok("m"), Axes: map[string][]json.RawMessage{"env.MODE": {json.RawMessage(`"x"`), json.RawMessage(`"y"`)}}}, time.Minute)
	if err != nil || len(m.Matrix) != 2 || !m.Settled || m.Kind != "matrix" {
		t.Fatalf("matrix: %+v %v", m, err)
	}
}

// TestRunWaitEndsAtClose: a start waiting for its run answers with the record as it is when the
// server closes (shutdown is never held up by a wait), and the run goes on.
func TestRunWaitEndsAtClose(t *testing.T) {
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
	if err := sbs.Reconcile(t.Context()); err != nil {
		t.Fatal(err)
	}
	rs, err := runs.New(runs.Config{Sandboxes: jobs.With(sbs), Store: st, Dir: filepath.Join(dir, "runs"), BaseURL: func() string { return "http://x" }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); rs.Run(ctx) }()
	h := api.New(sbs, api.Options{Runs: rs})
	srv := httptest.NewServer(h)
	t.Cleanup(func() {
		srv.Close()
		cancel()
		<-done
		rs.Close()
		sbs.Close()
		rt.Shutdown(context.Background())
		st.Close()
	})
	c := client.New(srv.URL, "")
	time.AfterFunc(500*time.Millisecond, h.Close)
	start := time.Now()
	r, err := c.WaitRun(t.Context(), wire.RunSpec{Dir: filepath.Join(dir, "w"), Command: []string{"sleep", "3"}}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 2*time.Second || r.State.Settled() {
		t.Fatalf("the wait answered after %s with %s; want the unsettled record at Close", d, r.State)
	}
	if got, err := rs.Wait(t.Context(), r.ID, 30*time.Second); err != nil || got.State != runs.Succeeded {
		t.Fatalf("the run after the wait ended: %s %v", got.State, err)
	}
}
