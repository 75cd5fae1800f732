package mcpserver_test

import (
	"bytes"
	"context"
	"image/png"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentbox/agentbox/internal/api"
	"github.com/agentbox/agentbox/internal/mcpserver"
	"github.com/agentbox/agentbox/internal/metricsnap"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/sandbox/metrics"
)

// gone checks that the sandbox a run made is destroyed.
func gone(t *testing.T, svc *sandbox.Service, id string) {
	t.Helper()
	sb, err := svc.Get(context.Background(), id)
	if err != nil {
		t.Fatalf("get %s: %v", id, err)
	}
	if sb.State != sandbox.StateDestroyed {
		t.Fatalf("sandbox %s is %s after the run; want destroyed", id, sb.State)
	}
}

func live(t *testing.T, svc *sandbox.Service) int {
	t.Helper()
	l, err := svc.List(context.Background(), sandbox.ListFilter{States: []sandbox.State{sandbox.StateRunning, sandbox.StateCreating}})
	if err != nil {
		t.Fatal(err)
	}
	return len(l)
}

// pngSnippet writes a 2×2 red PNG with nothing but zlib and struct.
const pngSnippet = `import zlib, struct
def chunk(t, d):
    return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xffffffff)
raw = b"".join(b"\x00" + b"\xff\x00\x00" * 2 for _ in range(2))
data = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 2, 2, 8, 2, 0, 0, 0)) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")
with open("/workspace/out/dot.png", "wb") as f:
    f.write(data)
with open("/workspace/out/notes.txt", "w") as f:
    f.write("not an image")
len(data)`

// TestRunPython: run_python in fresh runc sandboxes — the last expression's value, print
// output, an exception as data, a timeout, the output bound, an inline PNG, no network, each
// sandbox destroyed afterwards; keep, then a given sandbox_id (never destroyed); bad arguments
// create nothing.
func TestRunPython(t *testing.T) {
	svc := service(t, sandbox.Config{})
	srv := mcpserver.New(svc, mcpserver.Options{ControlPlane: "test", Samples: metrics.New(svc.Core(), svc.Core().Store())})
	defer srv.Close()
	c := connect(t, srv, protocolVersions[0])

	var out mcpserver.RunCodeOut
	txt := c.ok("run_python", obj{"code": "x = 20\nprint('hello', x)\n1+1"}, &out)
	if out.Value == nil || out.Value.JSON != float64(2) || out.Value.Repr != "2" || out.Value.Type != "int" {
		t.Fatalf("value: %+v", out.Value)
	}
	if out.Stdout != "hello 20\n" || out.ExitCode != 0 || out.Exception != nil || out.Kept || out.TimedOut {
		t.Fatalf("result: %+v", out)
	}
	if !strings.Contains(txt, "Value (int): 2") || !strings.Contains(txt, "hello 20") {
		t.Errorf("text: %q", txt)
	}
	gone(t, svc.Service, out.SandboxID)

	// An expression statement that is not last, and a None value, give no value.
	out = mcpserver.RunCodeOut{}
	c.ok("run_python", obj{"code": "3\nprint('x')"}, &out)
	if out.Value != nil || out.Stdout != "x\n" {
		t.Fatalf("no last expression: %+v", out)
	}

	out = mcpserver.RunCodeOut{}
	c.ok("run_python", obj{"code": "def f(n):\n    return 10 / n\n\nf(0)"}, &out)
	if e := out.Exception; e == nil || e.Type != "ZeroDivisionError" || e.Message != "division by zero" ||
		!strings.Contains(e.Traceback, `File "<snippet>", line 4`) || !strings.Contains(e.Traceback, `line 2, in f`) ||
		!strings.Contains(e.Traceback, "return 10 / n") || strings.Contains(e.Traceback, "driver") {
		t.Fatalf("exception: %+v", out.Exception)
	}
	if out.Value != nil {
		t.Errorf("a value after an exception: %+v", out.Value)
	}
	gone(t, svc.Service, out.SandboxID)

	start := time.Now()
	out = mcpserver.RunCodeOut{}
	c.ok("run_python", obj{"code": "import time\nprint('before', flush=True)\ntime.sleep(60)\n'never'", "timeout_seconds": 1}, &out)
	if !out.TimedOut || out.Value != nil || out.Stdout != "before\n" {
		t.Fatalf("timeout: %+v", out)
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("a 1 s timeout took %s", d)
	}
	gone(t, svc.Service, out.SandboxID)

	out = mcpserver.RunCodeOut{}
	txt = c.ok("run_python", obj{"code": "import sys\nsys.stdout.write('x' * 3000000)\nsys.stderr.write('e' * 10)\n'done'", "max_output_bytes": 1000}, &out)
	if !out.Truncated || len(out.Stdout) != 1000 || out.StdoutBytes != 3000000 || out.Stderr != "eeeeeeeeee" || out.Value == nil || out.Value.JSON != "done" {
		t.Fatalf("output bound: truncated %v, %d bytes kept of %d, stderr %q, value %+v", out.Truncated, len(out.Stdout), out.StdoutBytes, out.Stderr, out.Value)
	}
	if !strings.Contains(txt, "truncated") {
		t.Errorf("text does not say truncated: %q", txt)
	}

	res := c.call("run_python", obj{"code": pngSnippet})
	out = mcpserver.RunCodeOut{}
	decode(t, res, &out)
	if res.IsError || out.Exception != nil {
		t.Fatalf("png: %s", text(res))
	}
	if len(out.Artifacts) != 2 {
		t.Fatalf("artifacts: %+v", out.Artifacts)
	}
	slices.SortFunc(out.Artifacts, func(a, b mcpserver.RunArtifact) int { return strings.Compare(a.Path, b.Path) })
	if a := out.Artifacts[0]; a.Path != "/workspace/out/dot.png" || !a.Inline || a.MimeType != "image/png" || a.Size != int64(out.Value.JSON.(float64)) {
		t.Fatalf("png artifact: %+v (value %+v)", a, out.Value)
	}
	if a := out.Artifacts[1]; a.Path != "/workspace/out/notes.txt" || a.Inline || a.Size != 12 {
		t.Fatalf("text artifact: %+v", a)
	}
	var imgs []*mcp.ImageContent
	for _, ct := range res.Content {
		if im, ok := ct.(*mcp.ImageContent); ok {
			imgs = append(imgs, im)
		}
	}
	if len(imgs) != 1 || imgs[0].MIMEType != "image/png" {
		t.Fatalf("image content: %d blocks", len(imgs))
	}
	img, err := png.Decode(bytes.NewReader(imgs[0].Data))
	if err != nil {
		t.Fatalf("inline image is not a PNG: %v", err)
	}
	if b := img.Bounds(); b.Dx() != 2 || b.Dy() != 2 {
		t.Fatalf("image %v", b)
	}
	if r, g, _, _ := img.At(0, 0).RGBA(); r>>8 != 0xff || g != 0 {
		t.Errorf("pixel %v", img.At(0, 0))
	}
	gone(t, svc.Service, out.SandboxID)

	// No network: a connect fails inside the sandbox.
	out = mcpserver.RunCodeOut{}
	c.ok("run_python", obj{"code": "import socket\ns = socket.socket()\ns.settimeout(5)\ns.connect(('1.1.1.1', 80))\n'connected'"}, &out)
	if out.Exception == nil || out.Value != nil {
		t.Fatalf("network none, yet: value %+v exception %+v", out.Value, out.Exception)
	}
	if !strings.Contains(out.Exception.Type, "Error") {
		t.Errorf("exception %+v", out.Exception)
	}

	// keep: the sandbox stays, its files readable; then run in it by id.
	out = mcpserver.RunCodeOut{}
	c.ok("run_python", obj{"code": "open('/workspace/out/data.csv', 'w').write('a,b\\n1,2\\n')\nimport os\nos.getuid()", "keep": true}, &out)
	if !out.Kept || len(out.Artifacts) != 1 || out.Artifacts[0].Path != "/workspace/out/data.csv" || out.Value == nil || out.Value.JSON == float64(0) {
		t.Fatalf("keep: %+v", out)
	}
	kept := out.SandboxID
	if sb, err := svc.Get(context.Background(), kept); err != nil || sb.State != sandbox.StateRunning {
		t.Fatalf("kept sandbox: %+v %v", sb, err)
	}
	var fr struct {
		Content string `json:"content"`
	}
	c.ok("file_read", obj{"sandbox_id": kept, "path": "/workspace/out/data.csv"}, &fr)
	if fr.Content != "a,b\n1,2\n" {
		t.Fatalf("file_read: %q", fr.Content)
	}
	var l mcpserver.SandboxList
	c.ok("sandbox_list", obj{}, &l)
	if !slices.ContainsFunc(l.Sandboxes, func(s mcpserver.SandboxInfo) bool { return s.SandboxID == kept }) {
		t.Errorf("sandbox_list does not show the kept sandbox: %+v", l)
	}
	out = mcpserver.RunCodeOut{}
	c.ok("run_python", obj{"code": "import os\nopen('/workspace/out/more.txt', 'w').write('x')\nsorted(os.listdir('/workspace/out'))", "sandbox_id": kept}, &out)
	if out.SandboxID != kept || !out.Kept || out.Value == nil {
		t.Fatalf("given sandbox: %+v", out)
	}
	if got, _ := out.Value.JSON.([]any); len(got) != 2 || got[0] != "data.csv" || got[1] != "more.txt" {
		t.Fatalf("files in the given sandbox: %+v", out.Value)
	}
	if !slices.ContainsFunc(out.Artifacts, func(a mcpserver.RunArtifact) bool { return a.Path == "/workspace/out/more.txt" }) {
		t.Fatalf("artifacts: %+v", out.Artifacts)
	}
	if sb, err := svc.Get(context.Background(), kept); err != nil || sb.State != sandbox.StateRunning {
		t.Fatalf("the given sandbox after the run: %+v %v", sb, err)
	}
	var dl struct {
		Entries []struct {
			Name string `json:"name"`
		} `json:"entries"`
	}
	c.ok("file_list", obj{"sandbox_id": kept, "path": "/tmp"}, &dl)
	for _, e := range dl.Entries {
		if strings.HasPrefix(e.Name, ".agentbox-snippet") {
			t.Errorf("the run left %s in the kept sandbox", e.Name)
		}
	}

	// Bad arguments: typed errors naming the argument, nothing created.
	before := live(t, svc.Service)
	if msg := c.fails("run_python", obj{"code": "1", "timeout_seconds": 601}, "INVALID_ARGUMENT"); !strings.Contains(msg, "timeout_seconds") {
		t.Errorf("message: %s", msg)
	}
	if msg := c.fails("run_python", obj{"code": ""}, "INVALID_ARGUMENT"); !strings.Contains(msg, "code") {
		t.Errorf("message: %s", msg)
	}
	if msg := c.fails("run_python", obj{"code": "1", "sandbox_id": kept, "network": obj{"allow": []string{"pypi.org"}}}, "INVALID_ARGUMENT"); !strings.Contains(msg, "network") {
		t.Errorf("message: %s", msg)
	}
	c.fails("run_python", obj{"code": "1", "sandbox_id": "sb-000000000000"}, "SANDBOX_NOT_FOUND")
	if n := live(t, svc.Service); n != before {
		t.Fatalf("bad calls left %d live sandboxes, want %d", n, before)
	}
	c.ok("sandbox_destroy", obj{"sandbox_id": kept}, nil)
	c.fails("run_python", obj{"code": "1", "sandbox_id": kept}, "SANDBOX_NOT_RUNNING")

	// A sandbox where no python3 can be found: a clear error, and the sandbox left alone.
	var nopy mcpserver.SandboxInfo
	c.ok("sandbox_create", obj{"env": obj{"PATH": "/nonexistent"}}, &nopy)
	if msg := c.fails("run_python", obj{"code": "1", "sandbox_id": nopy.SandboxID}, "UNSUPPORTED_OPERATION"); !strings.Contains(msg, "no python3") {
		t.Errorf("message: %s", msg)
	}
	if sb, err := svc.Get(context.Background(), nopy.SandboxID); err != nil || sb.State != sandbox.StateRunning {
		t.Fatalf("the given sandbox after the error: %+v %v", sb, err)
	}
}

// TestRunShell: run_shell's output, exit code and artifacts; the sandbox is destroyed.
func TestRunShell(t *testing.T) {
	svc := service(t, sandbox.Config{})
	srv := mcpserver.New(svc, mcpserver.Options{ControlPlane: "test", Samples: metrics.New(svc.Core(), svc.Core().Store())})
	defer srv.Close()
	c := connect(t, srv, protocolVersions[0])
	var out mcpserver.RunCodeOut
	c.ok("run_shell", obj{"code": "echo hi; echo err >&2; pwd; echo data > out/a.txt; exit 3"}, &out)
	if out.ExitCode != 3 || out.Stdout != "hi\n/workspace\n" || out.Stderr != "err\n" || out.Value != nil || out.Kept {
		t.Fatalf("run_shell: %+v", out)
	}
	if len(out.Artifacts) != 1 || out.Artifacts[0].Path != "/workspace/out/a.txt" || out.Artifacts[0].Size != 5 {
		t.Fatalf("artifacts: %+v", out.Artifacts)
	}
	gone(t, svc.Service, out.SandboxID)
	out = mcpserver.RunCodeOut{}
	c.ok("run_shell", obj{"code": "sleep 30", "timeout_seconds": 0.5}, &out)
	if !out.TimedOut {
		t.Fatalf("timeout: %+v", out)
	}

	// A cancelled call still destroys its fresh sandbox.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		_, err := c.cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_shell", Arguments: obj{"code": "sleep 120", "timeout_seconds": 300}})
		errc <- err
	}()
	eventually(t, 60*time.Second, "the run's sandbox", func() bool { return live(t, svc.Service) == 1 })
	time.Sleep(500 * time.Millisecond) // into the exec
	cancel()
	if err := <-errc; err == nil {
		t.Fatal("a cancelled call returned no error")
	}
	eventually(t, 60*time.Second, "the cancelled run's sandbox destroyed", func() bool { return live(t, svc.Service) == 0 })
}

// TestFetchMetrics: fetch_metrics over the server's real registry by exact name, by prefix, for
// one sandbox (its sample and only its series), and a window: none before sampling, then what
// the ring holds.
func TestFetchMetrics(t *testing.T) {
	svc := service(t, sandbox.Config{})
	prom := api.NewPrometheus()
	api.New(svc.Service, api.Options{Prometheus: prom}) // attaches the collector of the service's state
	src := metricsnap.New(func(context.Context) ([]*metricsnap.MetricFamily, error) { return prom.Gatherer().Gather() }).
		SampleFrom(func(context.Context) ([]*metricsnap.MetricFamily, error) { return prom.HistoryGatherer().Gather() }) // as wire.go
	srv := mcpserver.New(svc, mcpserver.Options{ControlPlane: "test", Metrics: src, Samples: metrics.New(svc.Core(), svc.Core().Store())})
	defer srv.Close()
	c := connect(t, srv, protocolVersions[0])

	var a, b mcpserver.SandboxInfo
	c.ok("sandbox_create", obj{"memory_mb": 256}, &a)
	c.ok("sandbox_create", obj{}, &b)

	var fm mcpserver.FetchMetricsOut
	txt := c.ok("fetch_metrics", obj{"name": "agentbox_capacity_sandboxes_used"}, &fm)
	if len(fm.Metrics) != 1 || fm.Metrics[0].Type != "gauge" || fm.Metrics[0].Help == "" || len(fm.Metrics[0].Samples) != 1 || fm.Metrics[0].Samples[0].Value != 2 {
		t.Fatalf("by name: %+v", fm.Metrics)
	}
	if !strings.Contains(txt, "agentbox_capacity_sandboxes_used 2") {
		t.Errorf("text: %q", txt)
	}

	fm = mcpserver.FetchMetricsOut{}
	c.ok("fetch_metrics", obj{"prefix": "agentbox_capacity_"}, &fm)
	if len(fm.Metrics) < 4 {
		t.Fatalf("by prefix: %d families", len(fm.Metrics))
	}
	for _, f := range fm.Metrics {
		if !strings.HasPrefix(f.Name, "agentbox_capacity_") {
			t.Fatalf("by prefix: %s", f.Name)
		}
	}

	fm = mcpserver.FetchMetricsOut{}
	c.ok("fetch_metrics", obj{"prefix": "agentbox_sandbox_", "sandbox_id": a.SandboxID}, &fm)
	if fm.Sandbox == nil || fm.Sandbox.SandboxID != a.SandboxID || fm.Sandbox.Memory == nil || fm.Sandbox.Memory.LimitBytes != 256<<20 {
		t.Fatalf("sandbox sample: %+v", fm.Sandbox)
	}
	memLimit := false
	for _, f := range fm.Metrics {
		for _, s := range f.Samples {
			if s.Labels["sandbox_id"] != a.SandboxID {
				t.Fatalf("a series of another sandbox: %s %v", f.Name, s.Labels)
			}
			memLimit = memLimit || (f.Name == "agentbox_sandbox_memory_limit_bytes" && s.Value == 256<<20)
		}
	}
	if !memLimit {
		t.Errorf("no agentbox_sandbox_memory_limit_bytes for %s: %+v", a.SandboxID, fm.Metrics)
	}

	// No history yet: said so, not an empty success.
	fm = mcpserver.FetchMetricsOut{}
	txt = c.ok("fetch_metrics", obj{"name": "agentbox_capacity_sandboxes_used", "window_seconds": 600}, &fm)
	if fm.History == nil || fm.History.Available || !strings.Contains(fm.History.Note, "no history") || !strings.Contains(txt, "no history") {
		t.Fatalf("window without history: %+v", fm.History)
	}
	// Two samples 10 s apart, one sandbox gone between them.
	now := time.Now()
	src.Sample(context.Background(), now.Add(-20*time.Second))
	c.ok("sandbox_destroy", obj{"sandbox_id": b.SandboxID}, nil)
	src.Sample(context.Background(), now.Add(-10*time.Second))
	fm = mcpserver.FetchMetricsOut{}
	c.ok("fetch_metrics", obj{"name": "agentbox_capacity_sandboxes_used", "window_seconds": 600}, &fm)
	h := fm.History
	// It covers from the first sample (20 s before now) to when it was asked, however long the
	// calls in between took on a loaded host.
	maxCovered := 21 + int64(time.Since(now).Seconds())
	if h == nil || !h.Available || len(h.Series) != 1 || h.CoveredSeconds < 19 || h.CoveredSeconds > maxCovered || !strings.Contains(h.Note, "covers only") {
		t.Fatalf("window: %+v", h)
	}
	if s := h.Series[0]; s.First != 2 || s.Last != 1 || s.Min != 1 || s.Max != 2 || s.Delta != -1 || len(s.Points) != 2 {
		t.Fatalf("series: %+v", s)
	}
	// Per-sandbox series are not sampled into the history (they would move cpu_percent's
	// window): said so, with the current values.
	fm = mcpserver.FetchMetricsOut{}
	c.ok("fetch_metrics", obj{"prefix": "agentbox_sandbox_", "sandbox_id": a.SandboxID, "window_seconds": 60}, &fm)
	if fm.History == nil || fm.History.Available || len(fm.History.Series) != 0 || !strings.Contains(fm.History.Note, "no history") || len(fm.Metrics) == 0 || fm.Sandbox == nil {
		t.Fatalf("sandbox window: %+v", fm)
	}
	c.fails("fetch_metrics", obj{"window_seconds": 3601}, "INVALID_ARGUMENT")
	c.fails("fetch_metrics", obj{"name": "a", "prefix": "b"}, "INVALID_ARGUMENT")
	c.fails("fetch_metrics", obj{"sandbox_id": "sb-000000000000"}, "SANDBOX_NOT_FOUND")
}
