package api_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentbox/agentbox/internal/api"
	"github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/approval"
	"github.com/agentbox/agentbox/internal/auth"
	"github.com/agentbox/agentbox/internal/authz"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/gate"
	"github.com/agentbox/agentbox/internal/mcpserver"
	"github.com/agentbox/agentbox/internal/metricsnap"
	"github.com/agentbox/agentbox/internal/runs"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/fake"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/sandbox/jobs"
	"github.com/agentbox/agentbox/internal/store/sqlite"
	"github.com/agentbox/agentbox/internal/wire"
)

const authzToken = "authz-admin-token"

// authzEnv is the REST API (and /mcp) over the fake runtime, a real run service and the SQLite
// store, with API keys and the server's chain: the authorization gate.
type authzEnv struct {
	url   string
	sbs   *sandbox.Service
	rs    *runs.Service
	admin *client.Client
	work  string
}

func newAuthzEnv(t *testing.T) *authzEnv { return newAuthzEnvGated(t, nil) }

// newAuthzEnvGated is newAuthzEnv with approvals asked for the tools gated (nil: none, no
// approval queue).
func newAuthzEnvGated(t *testing.T, gated []string) *authzEnv {
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
	sbs, err := sandbox.NewService(st, []runtime.Runtime{rt}, sandbox.Config{SnapshotDir: filepath.Join(dir, "snapshots")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	sbj := jobs.With(sbs)
	var base string
	rs, err := runs.New(runs.Config{Sandboxes: sbj, Store: st, Dir: filepath.Join(dir, "runs"), BaseURL: func() string { return base }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); rs.Run(ctx) }()
	chain := gate.Chain{authz.Gate{Store: st, Runs: st, Approvals: st, Conversations: st}}
	var aps api.Approvals
	if gated != nil {
		ap, err := approval.New(st, approval.Config{Tools: gated, Timeout: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		chain, aps = append(chain, ap), ap
	}
	var mcpH http.Handler
	var once sync.Once
	ready := make(chan struct{})
	mount := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-ready; mcpH.ServeHTTP(w, r) })
	prom := api.NewPrometheus()
	h := api.New(sbs, api.Options{Token: authzToken, Runs: rs, SandboxJobs: sbj.Jobs(), Keys: auth.NewKeys(st, nil), Gate: chain, Conversations: st,
		Mount: map[string]http.Handler{"/mcp": mount}, Prometheus: prom, Approvals: aps})
	msrv := mcpserver.New(sbj, mcpserver.Options{Gate: chain, Runs: rs,
		Metrics: metricsnap.New(func(context.Context) ([]*metricsnap.MetricFamily, error) { return prom.Gatherer().Gather() })})
	mcpH = msrv.StreamableHTTPHandler(mcpserver.HTTPOptions{})
	once.Do(func() { close(ready) })
	srv := httptest.NewServer(h)
	base = srv.URL
	t.Cleanup(func() {
		msrv.Close()
		h.Close()
		srv.Close()
		cancel()
		<-done
		rs.Close()
		sbs.Close()
		rt.Shutdown(context.Background())
		st.Close()
	})
	return &authzEnv{url: srv.URL, sbs: sbs, rs: rs, admin: client.New(srv.URL, authzToken), work: filepath.Join(dir, "work")}
}

func (e *authzEnv) key(t *testing.T, name, scope string) (*client.Client, string) {
	t.Helper()
	k, err := e.admin.CreateKey(t.Context(), wire.KeyCreateRequest{Name: name, Scope: scope})
	if err != nil {
		t.Fatal(err)
	}
	return client.New(e.url, k.Secret), k.Secret
}

// rest makes one request with cred and returns its status and body.
func (e *authzEnv) rest(t *testing.T, cred, method, path, body string) (int, string) {
	t.Helper()
	st, b, _ := call(t, method, e.url+path, cred, body)
	return st, b
}

// TestOwnershipAcrossPrincipals: every API key is a principal. A read or operate key gets the
// same 404 as for a missing object on another principal's sandbox (and its files, exec,
// terminal, jobs, exposed ports, snapshots), run and batch — whether the object is named in the
// path or in the body — and nothing changes; lists show only its own; over MCP the same; runs'
// env values never come back; an admin sees and acts on everything.
func TestOwnershipAcrossPrincipals(t *testing.T) {
	e := newAuthzEnv(t)
	ctx := t.Context()
	alice, aliceKey := e.key(t, "alice", auth.ScopeOperate)
	_, bobKey := e.key(t, "bob", auth.ScopeOperate)
	_, readerKey := e.key(t, "reader", auth.ScopeRead)

	// Alice's sandbox, job, snapshot and run; the admin's sandbox.
	sbA, err := alice.Create(ctx, wire.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	job, err := alice.StartJob(ctx, sbA.ID, wire.ExecRequest{Command: []string{"sleep", "30"}})
	if err != nil {
		t.Fatal(err)
	}
	snap, err := alice.Snapshot(ctx, sbA.ID, wire.SnapshotRequest{})
	if err != nil {
		t.Fatal(err)
	}
	run, err := alice.WaitRun(ctx, wire.RunSpec{Dir: e.work, Command: []string{"true"}, Env: map[string]string{"API_TOKEN": "sk-live-0123456789"}}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	sbAdmin, err := e.admin.Create(ctx, wire.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}

	// The reply for an object that does not exist is the yardstick.
	missing := map[string]string{}
	for kind, path := range map[string]string{"sandbox": "/v1/sandboxes/sb-00000000abcd", "run": "/v1/runs/run-00000000abcd", "snapshot": "/v1/snapshots/snap-00000000abcd"} {
		st, body := e.rest(t, bobKey, http.MethodGet, path, "")
		if st != http.StatusNotFound {
			t.Fatalf("missing %s: %d %s", kind, st, body)
		}
		missing[kind] = errcodeOf(t, body)
	}
	foreign := []struct{ method, path, body, kind string }{
		{"GET", "/v1/sandboxes/" + sbA.ID, "", "sandbox"},
		{"DELETE", "/v1/sandboxes/" + sbA.ID, "", "sandbox"},
		{"POST", "/v1/sandboxes/" + sbA.ID + "/exec", `{"command":["true"]}`, "sandbox"},
		{"GET", "/v1/sandboxes/" + sbA.ID + "/files?path=/etc/hostname", "", "sandbox"},
		{"PUT", "/v1/sandboxes/" + sbA.ID + "/files?path=/tmp/x", "", "sandbox"},
		{"GET", "/v1/sandboxes/" + sbA.ID + "/pty", "", "sandbox"},
		{"GET", "/v1/sandboxes/" + sbA.ID + "/jobs", "", "sandbox"},
		{"GET", "/v1/sandboxes/" + sbA.ID + "/jobs/" + job.ID + "/logs", "", "sandbox"},
		{"POST", "/v1/sandboxes/" + sbA.ID + "/jobs/" + job.ID + "/cancel", "", "sandbox"},
		{"POST", "/v1/sandboxes/" + sbA.ID + "/expose", `{"port":8080}`, "sandbox"},
		{"DELETE", "/v1/sandboxes/" + sbA.ID + "/expose/8080", "", "sandbox"},
		{"POST", "/v1/sandboxes/" + sbA.ID + "/snapshots", "", "sandbox"},
		{"GET", "/v1/snapshots/" + snap.ID, "", "snapshot"},
		{"DELETE", "/v1/snapshots/" + snap.ID, "", "snapshot"},
		{"POST", "/v1/sandboxes", `{"snapshot":"` + snap.ID + `"}`, "snapshot"},
		{"POST", "/v1/run_shell", `{"code":"true","SANDBOX_ID":"` + sbA.ID + `"}`, "sandbox"}, // any case, as the decoder matches it
		{"GET", "/v1/events?sandbox_id=" + sbA.ID, "", "sandbox"},
		{"GET", "/v1/sandboxes/" + sbA.ID + "/events", "", "sandbox"},
		{"GET", "/v1/runs/" + run.ID, "", "run"},
		{"GET", "/v1/runs/" + run.ID + "/logs", "", "run"},
		{"POST", "/v1/runs/" + run.ID + "/cancel", "", "run"},
		{"DELETE", "/v1/sandboxes/" + sbAdmin.ID, "", "sandbox"},
	}
	for _, key := range []string{bobKey, readerKey} {
		for _, f := range foreign {
			st, body := e.rest(t, key, f.method, f.path, f.body)
			if key == readerKey && st == http.StatusForbidden {
				continue // a read key is refused an operate route by its scope first
			}
			if st != http.StatusNotFound || errcodeOf(t, body) != missing[f.kind] {
				t.Errorf("%s %s by another principal: %d %s, want 404 %s as for a missing %s", f.method, f.path, st, body, missing[f.kind], f.kind)
			}
		}
	}
	// Nothing changed.
	if sb, err := e.sbs.Get(ctx, sbA.ID); err != nil || sb.State != sandbox.StateRunning {
		t.Fatalf("alice's sandbox after the attempts: %s %v", sb.State, err)
	}
	if sb, err := e.sbs.Get(ctx, sbAdmin.ID); err != nil || sb.State != sandbox.StateRunning {
		t.Fatalf("the admin's sandbox after the attempts: %s %v", sb.State, err)
	}
	if j, err := alice.JobStatus(ctx, sbA.ID, job.ID); err != nil || j.State != wire.JobRunning {
		t.Fatalf("alice's job after the attempts: %+v %v", j, err)
	}
	if _, err := alice.GetSnapshot(ctx, snap.ID); err != nil {
		t.Fatalf("alice's snapshot after the attempts: %v", err)
	}
	// Lists: bob sees none of alice's; alice sees hers, not the admin's; the admin sees all.
	for _, c := range []struct {
		key       string
		want, not []string
	}{
		{bobKey, nil, []string{sbA.ID, sbAdmin.ID, run.ID, snap.ID}},
		{aliceKey, []string{sbA.ID, run.ID, snap.ID}, []string{sbAdmin.ID}},
		{authzToken, []string{sbA.ID, sbAdmin.ID, run.ID, snap.ID}, nil},
	} {
		var all strings.Builder
		for _, p := range []string{"/v1/sandboxes", "/v1/runs", "/v1/snapshots", "/v1/events", "/v1/fleet/metrics"} {
			st, body := e.rest(t, c.key, http.MethodGet, p, "")
			if st != http.StatusOK {
				t.Fatalf("list %s: %d %s", p, st, body)
			}
			all.WriteString(body)
		}
		for _, id := range c.want {
			if !strings.Contains(all.String(), id) {
				t.Errorf("lists miss %s of the caller's (or, for the admin, anyone's)", id)
			}
		}
		for _, id := range c.not {
			if strings.Contains(all.String(), id) {
				t.Errorf("lists show %s of another principal", id)
			}
		}
	}
	// Env values never come back, to the run's own key or the admin; names do.
	for _, key := range []string{aliceKey, authzToken} {
		for _, p := range []string{"/v1/runs/" + run.ID, "/v1/runs"} {
			st, body := e.rest(t, key, http.MethodGet, p, "")
			if st != http.StatusOK || strings.Contains(body, "sk-live-0123456789") || !strings.Contains(body, `"API_TOKEN"`) {
				t.Errorf("GET %s: %d %s: want the env's names, never its values", p, st, body)
			}
		}
	}
	// The admin acts on anyone's: reads alice's sandbox and cancels her job.
	if st, body := e.rest(t, authzToken, http.MethodGet, "/v1/sandboxes/"+sbA.ID, ""); st != http.StatusOK {
		t.Fatalf("admin get of alice's sandbox: %d %s", st, body)
	}
	if st, body := e.rest(t, authzToken, http.MethodPost, "/v1/sandboxes/"+sbA.ID+"/jobs/"+job.ID+"/cancel", ""); st != http.StatusOK {
		t.Fatalf("admin cancel of alice's job: %d %s", st, body)
	}

	// MCP sessions act as the key they authenticated with.
	mcpCall := func(key, tool string, args map[string]any) (bool, string) {
		t.Helper()
		hc := &http.Client{Transport: headerRT{key}}
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "t", Version: "1"}, nil).Connect(ctx, &mcp.StreamableClientTransport{Endpoint: e.url + "/mcp", HTTPClient: hc}, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer cs.Close()
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
		if err != nil {
			t.Fatal(err)
		}
		var txt strings.Builder
		for _, c := range res.Content {
			if tc, ok := c.(*mcp.TextContent); ok {
				txt.WriteString(tc.Text)
			}
		}
		return res.IsError, txt.String()
	}
	for _, c := range []struct {
		tool string
		args map[string]any
		code errcode.Code
	}{
		{"sandbox_get", map[string]any{"sandbox_id": sbA.ID}, errcode.SandboxNotFound},
		{"exec", map[string]any{"sandbox_id": sbA.ID, "command": []string{"true"}}, errcode.SandboxNotFound},
		{"sandbox_destroy", map[string]any{"sandbox_id": sbA.ID}, errcode.SandboxNotFound},
		{"run_get", map[string]any{"run_id": run.ID}, errcode.RunNotFound},
	} {
		isErr, txt := mcpCall(bobKey, c.tool, c.args)
		if !isErr || !strings.Contains(txt, string(c.code)) {
			t.Errorf("bob's %s on alice's over MCP: error %v %s, want %s", c.tool, isErr, txt, c.code)
		}
	}
	if isErr, txt := mcpCall(aliceKey, "sandbox_get", map[string]any{"sandbox_id": sbA.ID}); isErr {
		t.Errorf("alice's sandbox_get of her own over MCP: %s", txt)
	}
	if isErr, txt := mcpCall(aliceKey, "run_get", map[string]any{"run_id": run.ID}); isErr || strings.Contains(txt, "sk-live-0123456789") {
		t.Errorf("alice's run_get over MCP: error %v, or it shows the env value: %s", isErr, txt)
	}
	// A sandbox made over MCP with a key is the key's, whatever the session.
	isErr, txt := mcpCall(aliceKey, "sandbox_create", map[string]any{})
	if isErr {
		t.Fatalf("alice's sandbox_create over MCP: %s", txt)
	}
	var made struct{ ID string }
	if made.ID = regexp.MustCompile(`sb-[0-9a-f]{12}`).FindString(txt); made.ID == "" {
		t.Fatalf("no sandbox id in %s", txt)
	}
	if st, body := e.rest(t, aliceKey, http.MethodGet, "/v1/sandboxes/"+made.ID, ""); st != http.StatusOK {
		t.Errorf("alice's REST get of the sandbox her MCP session made: %d %s", st, body)
	}
	if st, _ := e.rest(t, bobKey, http.MethodGet, "/v1/sandboxes/"+made.ID, ""); st != http.StatusNotFound {
		t.Errorf("bob's get of alice's MCP sandbox: %d", st)
	}
}

// errcodeOf is the code of a REST error body.
func errcodeOf(t *testing.T, body string) string {
	t.Helper()
	var e struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	_ = json.Unmarshal([]byte(body), &e)
	return e.Error.Code
}

// mcpText calls tool over /mcp with key and returns whether it failed and its text.
func (e *authzEnv) mcpText(t *testing.T, key, tool string, args map[string]any) (bool, string) {
	t.Helper()
	hc := &http.Client{Transport: headerRT{key}}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "t", Version: "1"}, nil).Connect(t.Context(), &mcp.StreamableClientTransport{Endpoint: e.url + "/mcp", HTTPClient: hc}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatal(err)
	}
	var txt strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			txt.WriteString(tc.Text)
		}
	}
	return res.IsError, txt.String()
}

// TestMetricsAcrossPrincipals: GET /metrics (read scope) and fetch_metrics show a key the
// per-sandbox series of its own principal's sandboxes only, with the host's series; the
// admin sees every sandbox's.
func TestMetricsAcrossPrincipals(t *testing.T) {
	e := newAuthzEnv(t)
	ctx := t.Context()
	_, aliceKey := e.key(t, "reader", auth.ScopeRead)
	bob, bobKey := e.key(t, "bob", auth.ScopeOperate)
	aliceOp, aliceOpKey := e.key(t, "alice", auth.ScopeOperate)
	sbA, err := aliceOp.Create(ctx, wire.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	sbB, err := bob.Create(ctx, wire.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	const perSandbox = "agentbox_sandbox_disk_used_bytes" // (the fake runtime measures the disk only)
	const host = "agentbox_capacity_sandboxes_used"
	for _, c := range []struct {
		who       string
		key       string
		want, not []string
	}{
		{"alice", aliceOpKey, []string{sbA.ID}, []string{sbB.ID}},
		{"bob", bobKey, []string{sbB.ID}, []string{sbA.ID}},
		{"admin", authzToken, []string{sbA.ID, sbB.ID}, nil},
	} {
		st, prom := e.rest(t, c.key, http.MethodGet, "/metrics", "")
		if st != http.StatusOK || !strings.Contains(prom, host) || !strings.Contains(prom, perSandbox) {
			t.Fatalf("%s: GET /metrics: %d, want 200 with %s and %s:\n%.2000s", c.who, st, host, perSandbox, prom)
		}
		isErr, mcpTxt := e.mcpText(t, c.key, "fetch_metrics", map[string]any{"prefix": "agentbox_"})
		if isErr || !strings.Contains(mcpTxt, host) || !strings.Contains(mcpTxt, perSandbox) {
			t.Fatalf("%s: fetch_metrics: error %v:\n%.2000s", c.who, isErr, mcpTxt)
		}
		for surface, got := range map[string]string{"GET /metrics": prom, "fetch_metrics": mcpTxt} {
			for _, id := range c.want {
				if !strings.Contains(got, id) {
					t.Errorf("%s: %s misses the series of %s", c.who, surface, id)
				}
			}
			for _, id := range c.not {
				if strings.Contains(got, id) {
					t.Errorf("%s: %s shows the series of another principal's %s", c.who, surface, id)
				}
			}
		}
	}
	// Asking for the other's sandbox by name is the missing sandbox's answer.
	if isErr, txt := e.mcpText(t, bobKey, "fetch_metrics", map[string]any{"sandbox_id": sbA.ID}); !isErr || !strings.Contains(txt, string(errcode.SandboxNotFound)) {
		t.Errorf("bob's fetch_metrics of alice's sandbox: error %v %s, want %s", isErr, txt, errcode.SandboxNotFound)
	}
	// A read key scrapes too: its principal has no sandbox, so no sandbox's series.
	if st, prom := e.rest(t, aliceKey, http.MethodGet, "/metrics", ""); st != http.StatusOK || strings.Contains(prom, sbA.ID) || strings.Contains(prom, sbB.ID) || !strings.Contains(prom, host) {
		t.Errorf("read key's GET /metrics: %d, shows another principal's series or no host series", st)
	}
}

// TestRunListsAcrossPrincipals: the batch list and MCP run_list show a key its principal's
// only and the admin (the server's token) every principal's, as the run list does.
func TestRunListsAcrossPrincipals(t *testing.T) {
	e := newAuthzEnv(t)
	ctx := t.Context()
	alice, aliceKey := e.key(t, "alice", auth.ScopeOperate)
	_, bobKey := e.key(t, "bob", auth.ScopeOperate)
	spec, _ := json.Marshal(wire.RunSpec{Dir: e.work, Command: []string{"true"}})
	b, err := alice.StartBatch(ctx, wire.BatchRequest{Runs: []json.RawMessage{spec}}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	run, err := alice.WaitRun(ctx, wire.RunSpec{Dir: e.work, Command: []string{"true"}}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		who, key string
		sees     bool
	}{{"alice", aliceKey, true}, {"bob", bobKey, false}, {"admin", authzToken, true}} {
		st, body := e.rest(t, c.key, http.MethodGet, "/v1/batches", "")
		if st != http.StatusOK || strings.Contains(body, b.ID) != c.sees {
			t.Errorf("%s: GET /v1/batches: %d, shows alice's batch %v, want %v: %s", c.who, st, !c.sees, c.sees, body)
		}
		isErr, txt := e.mcpText(t, c.key, "run_list", map[string]any{})
		if isErr || strings.Contains(txt, run.ID) != c.sees {
			t.Errorf("%s: run_list: error %v, shows alice's run %v, want %v: %s", c.who, isErr, !c.sees, c.sees, txt)
		}
	}
}

// TestApprovalsAcrossPrincipals: an approval records the requesting key's principal; a key
// that is not admin lists and reads its own principal's approvals only (another's is the
// missing approval's 404) and decides none, its own included; the admin sees and decides all.
func TestApprovalsAcrossPrincipals(t *testing.T) {
	e := newAuthzEnvGated(t, []string{"exec"})
	ctx := t.Context()
	alice, aliceKey := e.key(t, "alice", auth.ScopeOperate)
	bob, bobKey := e.key(t, "bob", auth.ScopeOperate)
	sbA, err := alice.Create(ctx, wire.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	sbB, err := bob.Create(ctx, wire.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		st   int
		body string
	}
	execs := map[string]chan result{}
	for who, c := range map[string]struct{ key, sb string }{"alice": {aliceKey, sbA.ID}, "bob": {bobKey, sbB.ID}} {
		ch := make(chan result, 1)
		execs[who] = ch
		go func() {
			st, body, _ := call(t, http.MethodPost, e.url+"/v1/sandboxes/"+c.sb+"/exec", c.key, `{"command":["true"]}`)
			ch <- result{st, body}
		}()
	}
	// Both wait for a decision: the admin sees both, each with its principal.
	byPrincipal := map[string]wire.Approval{}
	deadline := time.Now().Add(30 * time.Second)
	for len(byPrincipal) < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("the admin sees %d pending approvals, want 2", len(byPrincipal))
		}
		l, err := e.admin.ListApprovals(ctx, wire.ApprovalPending, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range l {
			byPrincipal[a.Principal] = a
		}
		time.Sleep(20 * time.Millisecond)
	}
	var apA, apB wire.Approval
	for p, a := range byPrincipal {
		switch a.CallerName {
		case "alice":
			apA = a
		case "bob":
			apB = a
		}
		if !strings.HasPrefix(p, "key:") || p != "key:"+a.CallerID {
			t.Errorf("approval %s of %s has principal %q", a.ID, a.CallerName, p)
		}
	}
	if apA.ID == "" || apB.ID == "" {
		t.Fatalf("approvals %+v", byPrincipal)
	}
	// Alice lists and reads hers, not bob's.
	st, body := e.rest(t, aliceKey, http.MethodGet, "/v1/approvals", "")
	if st != http.StatusOK || !strings.Contains(body, apA.ID) || strings.Contains(body, apB.ID) {
		t.Errorf("alice's approval list: %d %s; want hers (%s) only", st, body, apA.ID)
	}
	if st, body := e.rest(t, aliceKey, http.MethodGet, "/v1/approvals/"+apA.ID, ""); st != http.StatusOK {
		t.Errorf("alice's get of her approval: %d %s", st, body)
	}
	stMissing, bodyMissing := e.rest(t, aliceKey, http.MethodGet, "/v1/approvals/ap-000000000000", "")
	if st, body := e.rest(t, aliceKey, http.MethodGet, "/v1/approvals/"+apB.ID, ""); st != http.StatusNotFound || st != stMissing || errcodeOf(t, body) != errcodeOf(t, bodyMissing) {
		t.Errorf("alice's get of bob's approval: %d %s; want %d %s as for a missing one", st, body, stMissing, bodyMissing)
	}
	// Neither decides, its own included.
	for _, id := range []string{apA.ID, apB.ID} {
		if st, body := e.rest(t, aliceKey, http.MethodPost, "/v1/approvals/"+id+"/approve", ""); st != http.StatusForbidden {
			t.Errorf("alice's approve of %s: %d %s, want 403", id, st, body)
		}
	}
	// The admin decides both.
	if _, err := e.admin.DecideApproval(ctx, apA.ID, true, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := e.admin.DecideApproval(ctx, apB.ID, false, "no"); err != nil {
		t.Fatal(err)
	}
	if r := <-execs["alice"]; r.st != http.StatusOK {
		t.Errorf("alice's approved exec: %d %s", r.st, r.body)
	}
	if r := <-execs["bob"]; r.st == http.StatusOK {
		t.Errorf("bob's denied exec ran: %s", r.body)
	}
}
