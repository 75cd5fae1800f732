package main

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/testenv"
	"github.com/agentbox/agentbox/internal/wire"
)

func TestRenderTop(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	pct, mem, jobs := 42.5, 25.0, 3
	sbs := []wire.Sandbox{
		{ID: "sb-bbbbbbbbbbbb", State: wire.StateFailed, Runtime: "runc", ExpiresAt: now.Add(time.Hour)},
		{ID: "sb-aaaaaaaaaaaa", State: wire.StateRunning, Runtime: "gvisor", ExpiresAt: now.Add(90*time.Minute + 5*time.Second)},
	}
	fleet := wire.FleetMetrics{TookSeconds: 0.012, Sandboxes: []wire.SandboxMetrics{{
		SandboxID: "sb-aaaaaaaaaaaa", CPUPercent: &pct, MemoryPercent: &mem, RunningJobs: &jobs,
		Metrics: wire.Metrics{Memory: &wire.MemoryMetrics{UsedBytes: 64 << 20, LimitBytes: 256 << 20},
			Pids: &wire.PidsMetrics{Current: 7}, Disk: &wire.DiskMetrics{UsedBytes: 3 << 30, TotalBytes: 0}},
	}}}
	var b bytes.Buffer
	renderTop(&b, sbs, fleet, now)
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 4 || lines[0] != "2 sandboxes, 1 running; sampled in 12 ms" {
		t.Fatalf("table:\n%s", b.String())
	}
	if f := strings.Fields(lines[1]); f[0] != "SANDBOX" || f[len(f)-1] != "LEFT" {
		t.Errorf("header %q", lines[1])
	}
	want := []string{"sb-aaaaaaaaaaaa", "running", "gvisor", "42.5%", "64.0MiB", "/", "256.0MiB", "25.0%", "7", "3", "3.00GiB", "/", "unlimited", "1h30m05s"}
	if f := strings.Fields(lines[2]); strings.Join(f, " ") != strings.Join(want, " ") {
		t.Errorf("running row %q, want %q", f, want)
	}
	if f := strings.Fields(lines[3]); f[0] != "sb-bbbbbbbbbbbb" || f[1] != "failed" || f[3] != "-" || f[len(f)-1] != "-" {
		t.Errorf("failed row %q", lines[3])
	}
}

// TestTopAndMetricsOnServe runs `agentbox top` against a real `agentbox serve` with runc
// sandboxes: stdout a pipe prints one table and exits; the busy sandbox's CPU % is high and
// the idle one's low; a bad interval is refused; GET /metrics needs the token.
func TestTopAndMetricsOnServe(t *testing.T) {
	testenv.RequireRoot(t)
	stateDir := testenv.ShortTempDir(t, "abtop")
	srv := testenv.StartServer(t, stateDir, testToken, "--runtime", "runc")
	cl := srv.Client()
	ctx := context.Background()
	busy, err := cl.Create(ctx, wire.CreateRequest{CPU: 1})
	if err != nil {
		t.Fatal(err)
	}
	idle, err := cl.Create(ctx, wire.CreateRequest{CPU: 1})
	if err != nil {
		t.Fatal(err)
	}
	execDone := make(chan error, 1)
	go func() {
		_, err := cl.Exec(ctx, busy.ID, wire.ExecRequest{Command: []string{"python3", "-c", "import time\ne = time.time() + 6\nwhile time.time() < e: pass"}}, nil)
		execDone <- err
	}()
	time.Sleep(500 * time.Millisecond)
	top := func(args ...string) (string, string, int) {
		cmd := exec.Command(srv.Bin, append([]string{"top"}, args...)...)
		cmd.Env = append(os.Environ(), "AGENTBOX_URL="+srv.URL, "AGENTBOX_TOKEN="+testToken)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return out.String(), errb.String(), code
	}
	began := time.Now()
	out, errs, code := top() // not a terminal: one table
	if code != 0 || time.Since(began) > 5*time.Second {
		t.Fatalf("top: exit %d after %v\n%s%s", code, time.Since(began), out, errs)
	}
	rows := map[string][]string{}
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) > 0 && sandbox.ValidID(f[0]) {
			rows[f[0]] = f
		}
	}
	cpuOf := func(id string) float64 {
		f := rows[id]
		if len(f) < 9 || f[1] != "running" || f[2] != "runc" {
			t.Fatalf("row of %s: %q\n%s", id, f, out)
		}
		v, err := strconv.ParseFloat(strings.TrimSuffix(f[3], "%"), 64)
		if err != nil {
			t.Fatalf("cpu of %s: %q", id, f[3])
		}
		return v
	}
	// The busy loop would take a whole core on an idle host; this host's other work shares it.
	if b, i := cpuOf(busy.ID), cpuOf(idle.ID); b < 15 || b > 110 || i > 5 || b < 5*i {
		t.Errorf("cpu %%: busy %.1f, idle %.1f\n%s", b, i, out)
	}
	if !strings.HasPrefix(out, "2 sandboxes, 2 running") {
		t.Errorf("top's summary:\n%s", out)
	}
	if _, errs, code := top("--interval", "0.1"); code == 0 || !strings.Contains(errs, "INVALID_ARGUMENT") || !strings.Contains(errs, "--interval") {
		t.Errorf("bad interval: exit %d %s", code, errs)
	}
	if err := <-execDone; err != nil {
		t.Fatal(err)
	}

	// On a terminal (script(1) gives it one) top redraws until interrupted.
	if script, err := exec.LookPath("script"); err == nil {
		sctx, cancel := context.WithTimeout(ctx, 4*time.Second)
		defer cancel()
		cmd := exec.CommandContext(sctx, script, "-qfec", srv.Bin+" top --interval 0.5", "/dev/null")
		cmd.Env = append(os.Environ(), "AGENTBOX_URL="+srv.URL, "AGENTBOX_TOKEN="+testToken)
		cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
		var out bytes.Buffer
		cmd.Stdout = &out
		cmd.Run()
		if n := strings.Count(out.String(), "\x1b[H\x1b[2J"); n < 3 || !strings.Contains(out.String(), idle.ID) {
			t.Errorf("top on a terminal redrew %d times in 4 s at 0.5 s:\n%q", n, out.String())
		}
	} else {
		t.Errorf("script(1) (util-linux) is needed to run top on a terminal: %v", err)
	}

	for tok, want := range map[string]int{"": http.StatusUnauthorized, testToken: http.StatusOK} {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+"/metrics", nil)
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var body bytes.Buffer
		body.ReadFrom(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want || (want == http.StatusOK && !strings.Contains(body.String(), `agentbox_sandbox_pids{runtime="runc",sandbox_id="`+busy.ID+`"}`)) {
			t.Errorf("/metrics with token %q: %s\n%.2000s", tok, resp.Status, body.String())
		}
	}
}
