package api_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/agentbox/agentbox/internal/api"
	"github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/oci"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/sandbox/jobs"
	"github.com/agentbox/agentbox/internal/store/sqlite"
	"github.com/agentbox/agentbox/internal/testenv"
	"github.com/agentbox/agentbox/internal/wire"
)

// runcService is a real control plane: SQLite, runc, the agentbox binary as the agent.
func runcService(t *testing.T, cfg sandbox.Config) *sandbox.Service {
	t.Helper()
	testenv.RequireRoot(t)
	dir := testenv.ShortTempDir(t, "abapi")
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(dir, "agentbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(dir, "rt")
	rt, err := oci.New(ctx, oci.Config{Name: "runc", Binary: "runc", Root: root, GuestBinary: testenv.GuestBinary(t),
		CgroupParent: "abapi-" + filepath.Base(dir), Subreaper: true})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := sandbox.NewService(st, []runtime.Runtime{rt}, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		list, _ := svc.List(ctx, sandbox.ListFilter{})
		var ids []string
		for _, sb := range list {
			ids = append(ids, sb.ID)
			if _, err := svc.Destroy(ctx, sb.ID); err != nil {
				t.Errorf("cleanup: destroy %s: %v", sb.ID, err)
			}
		}
		if out, _ := exec.Command("runc", "--root", filepath.Join(root, "state"), "list", "-q").CombinedOutput(); strings.TrimSpace(string(out)) != "" {
			t.Errorf("leaked containers: %s", out)
		}
		if len(ids) > 0 {
			if leaks := testenv.Leaks(ids...); len(leaks) > 0 {
				t.Errorf("leaked host resources:\n%s", strings.Join(leaks, "\n"))
			}
		}
		svc.Close()
		st.Close()
	})
	return svc
}

// scrape GETs /metrics with token and parses it with the client library's text parser.
func scrape(t *testing.T, url, token string) map[string]*dto.MetricFamily {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain") {
		t.Fatalf("scrape: %s %s", resp.Status, resp.Header.Get("Content-Type"))
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	return fams
}

func labelsOf(m *dto.Metric) map[string]string {
	out := map[string]string{}
	for _, l := range m.GetLabel() {
		out[l.GetName()] = l.GetValue()
	}
	return out
}

// series returns the value of family name's series whose labels include want (a gauge's or
// counter's value, a histogram's count), and whether there is one.
func series(fams map[string]*dto.MetricFamily, name string, want map[string]string) (float64, bool) {
	f := fams[name]
	if f == nil {
		return 0, false
	}
next:
	for _, m := range f.GetMetric() {
		l := labelsOf(m)
		for k, v := range want {
			if l[k] != v {
				continue next
			}
		}
		switch {
		case m.Gauge != nil:
			return m.Gauge.GetValue(), true
		case m.Counter != nil:
			return m.Counter.GetValue(), true
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount()), true
		}
	}
	return 0, false
}

var perSandbox = []string{"agentbox_sandbox_cpu_seconds_total", "agentbox_sandbox_cpu_limit_cores", "agentbox_sandbox_memory_used_bytes",
	"agentbox_sandbox_memory_limit_bytes", "agentbox_sandbox_memory_cache_bytes", "agentbox_sandbox_oom_kills_total",
	"agentbox_sandbox_pids", "agentbox_sandbox_pids_limit", "agentbox_sandbox_disk_used_bytes", "agentbox_sandbox_disk_total_bytes"}

// TestPrometheus: GET /metrics needs the token; the listed series are there, parsed by expfmt;
// routes are ServeMux patterns, never raw paths; per-sandbox series come from real runc
// sandboxes' cgroups and a destroyed sandbox's are gone at the next scrape.
func TestPrometheus(t *testing.T) {
	prom := api.NewPrometheus()
	svc := runcService(t, sandbox.Config{Observer: prom, MaxSandboxes: 10, CPUBudget: 8, MemoryBudgetMB: 8192})
	const token = "prom-test-token"
	sj := jobs.New(svc.Core(), svc.Core().Store())
	h := api.New(svc, api.Options{Token: token, Prometheus: prom, Jobs: sj, SandboxJobs: sj})
	srv := httptest.NewServer(h)
	defer srv.Close()
	defer h.Close()
	ctx := context.Background()

	for _, auth := range []string{"", "Bearer wrong"} {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+"/metrics", nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var body [4096]byte
		n, _ := resp.Body.Read(body[:])
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized || strings.Contains(string(body[:n]), "agentbox_") {
			t.Fatalf("/metrics with %q: %s %s", auth, resp.Status, body[:n])
		}
	}

	c := client.New(srv.URL, token)
	a, err := c.Create(ctx, wire.CreateRequest{CPU: 0.5, MemoryMB: 128})
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.Create(ctx, wire.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{a.ID, b.ID} {
		if _, err := c.Exec(ctx, id, wire.ExecRequest{Command: []string{"true"}}, nil); err != nil {
			t.Fatal(err)
		}
		m, err := c.Metrics(ctx, id)
		if err != nil || m.SandboxID != id || m.CPU == nil || m.Memory == nil || m.Pids == nil || m.Disk == nil {
			t.Fatalf("REST metrics of %s: %+v %v", id, m, err)
		}
	}
	job, err := c.StartJob(ctx, b.ID, wire.ExecRequest{Command: []string{"true"}})
	if err != nil {
		t.Fatal(err)
	}
	if j, err := c.WaitJob(ctx, b.ID, job.ID, 30*time.Second); err != nil || j.State != wire.JobExited {
		t.Fatalf("job: %+v %v", j, err)
	}
	if _, err := c.Metrics(ctx, "sb-000000000000"); !errcode.Is(err, errcode.SandboxNotFound) {
		t.Errorf("metrics of an unknown sandbox: %v", err)
	}
	if _, err := c.Get(ctx, "sb-111111111111"); err == nil {
		t.Error("get of an unknown sandbox")
	}

	fams := scrape(t, srv.URL, token)
	for _, name := range []string{"agentbox_http_requests_total", "agentbox_http_request_duration_seconds",
		"agentbox_sandbox_create_duration_seconds", "agentbox_exec_duration_seconds", "agentbox_sandboxes",
		"agentbox_capacity_sandboxes_used", "agentbox_capacity_sandboxes_limit", "agentbox_capacity_cpu_cores_used",
		"agentbox_capacity_cpu_cores_limit", "agentbox_capacity_memory_bytes_used", "agentbox_capacity_memory_bytes_limit",
		"agentbox_capacity_disk_bytes_used", "agentbox_capacity_disk_bytes_limit", "agentbox_sandbox_metrics_collect_duration_seconds"} {
		if fams[name] == nil {
			t.Errorf("no %s", name)
		}
	}
	check := func(name string, labels map[string]string, ok func(float64) bool) {
		t.Helper()
		v, found := series(fams, name, labels)
		if !found || !ok(v) {
			t.Errorf("%s%v = %g (found %v)", name, labels, v, found)
		}
	}
	atLeast := func(n float64) func(float64) bool { return func(v float64) bool { return v >= n } }
	is := func(n float64) func(float64) bool { return func(v float64) bool { return v == n } }
	check("agentbox_http_requests_total", map[string]string{"route": "POST /v1/sandboxes", "code": "201"}, is(2))
	check("agentbox_http_requests_total", map[string]string{"route": "GET /v1/sandboxes/{id}/metrics", "code": "200"}, is(2))
	check("agentbox_http_requests_total", map[string]string{"route": "GET /v1/sandboxes/{id}/metrics", "code": "404"}, is(1))
	check("agentbox_http_requests_total", map[string]string{"route": "GET /v1/sandboxes/{id}", "code": "404"}, is(1))
	check("agentbox_http_requests_total", map[string]string{"route": "GET /metrics", "code": "401"}, is(2))
	check("agentbox_http_request_duration_seconds", map[string]string{"route": "POST /v1/sandboxes/{id}/exec", "code": "200"}, is(2))
	for _, m := range fams["agentbox_http_requests_total"].GetMetric() {
		if r := labelsOf(m)["route"]; strings.Contains(r, "sb-") {
			t.Errorf("route label is a raw path: %q", r)
		}
	}
	check("agentbox_sandbox_create_duration_seconds", map[string]string{"runtime": "runc", "outcome": "ok"}, is(2))
	check("agentbox_exec_duration_seconds", map[string]string{"runtime": "runc", "outcome": "ok"}, is(2))
	check("agentbox_sandboxes", map[string]string{"state": "running", "runtime": "runc"}, is(2))
	check("agentbox_jobs", map[string]string{"state": "exited"}, is(1))
	check("agentbox_capacity_sandboxes_used", nil, is(2))
	check("agentbox_capacity_sandboxes_limit", nil, is(10))
	check("agentbox_capacity_cpu_cores_limit", nil, is(8))
	check("agentbox_capacity_memory_bytes_limit", nil, is(8192<<20))
	for _, id := range []string{a.ID, b.ID} {
		for _, name := range perSandbox {
			if _, ok := series(fams, name, map[string]string{"sandbox_id": id, "runtime": "runc"}); !ok {
				t.Errorf("no %s for %s", name, id)
			}
		}
	}
	check("agentbox_sandbox_cpu_limit_cores", map[string]string{"sandbox_id": a.ID}, is(0.5))
	check("agentbox_sandbox_memory_limit_bytes", map[string]string{"sandbox_id": a.ID}, is(128<<20))
	check("agentbox_sandbox_memory_used_bytes", map[string]string{"sandbox_id": a.ID}, atLeast(1))
	check("agentbox_sandbox_pids", map[string]string{"sandbox_id": a.ID}, atLeast(1))
	check("agentbox_sandbox_cpu_seconds_total", map[string]string{"sandbox_id": a.ID}, atLeast(1e-6))

	if _, err := c.Destroy(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	fams = scrape(t, srv.URL, token)
	for _, name := range perSandbox {
		if _, ok := series(fams, name, map[string]string{"sandbox_id": a.ID}); ok {
			t.Errorf("%s of destroyed %s still exported", name, a.ID)
		}
		if _, ok := series(fams, name, map[string]string{"sandbox_id": b.ID}); !ok {
			t.Errorf("%s of live %s gone", name, b.ID)
		}
	}
	check("agentbox_sandboxes", map[string]string{"state": "running", "runtime": "runc"}, is(1))
	check("agentbox_http_requests_total", map[string]string{"route": "DELETE /v1/sandboxes/{id}", "code": "200"}, is(1))
}
