package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/createtrace"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/kubernetes"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/wire"
)

// coldCreate is how every create figure of the bench is measured, whatever the section: POST
// /v1/sandboxes, then the first exec of `true` (REST), timed from the call to the exec's
// result; then the sandbox is destroyed (timed apart: the destroy figure) and the destroy has
// finished (the runtime let go of its disk, mounts and cgroup) before coldCreate returns. So
// no destroy competes with the next create, and every sample is taken beside the same live
// sandboxes (the section's warm ones): before this, one section kept its 150 sandboxes alive
// until the end (each create slower than the last), others destroyed each at once, and the
// figures of one run disagreed by 2× (docs/PERFORMANCE.md). It fails on an error, or when the
// sandbox came from a warm pool: a cold create was asked for.
func coldCreate(ctx context.Context, c *client.Client, req wire.CreateRequest) (id string, create, destroy float64, err error) {
	t0 := time.Now()
	sb, err := c.Create(ctx, req)
	if err != nil {
		return "", 0, 0, fmt.Errorf("create (runtime %s, image %s): %w", req.Runtime, req.Image, err)
	}
	r, err := c.Exec(ctx, sb.ID, wire.ExecRequest{Command: []string{"true"}}, nil)
	create = ms(time.Since(t0))
	t1 := time.Now()
	if _, derr := c.Destroy(ctx, sb.ID); derr != nil && err == nil {
		err = fmt.Errorf("destroy: %w", derr)
	}
	destroy = ms(time.Since(t1))
	if err == nil && r.ExitCode != 0 {
		err = fmt.Errorf("true exited %d: %s", r.ExitCode, r.Stderr)
	}
	if err == nil && sb.FromPool {
		err = fmt.Errorf("sandbox %s came from a warm pool; a cold create was asked for", sb.ID)
	}
	if err != nil {
		return "", 0, 0, fmt.Errorf("first exec (runtime %s, image %s): %w", req.Runtime, req.Image, err)
	}
	return sb.ID, create, destroy, nil
}

// mustColdCreate is coldCreate that ends the bench on an error.
func mustColdCreate(ctx context.Context, c *client.Client, req wire.CreateRequest) (id string, create, destroy float64) {
	id, create, destroy, err := coldCreate(ctx, c, req)
	if err != nil {
		log.Fatal(err)
	}
	return id, create, destroy
}

// floorNote is a create figure's floor column: `runc run` of the same bundle in the same run,
// and the ratio to it.
func floorNote(p50, floor float64) string {
	return fmt.Sprintf("runc run p50 %.1f ms (%.2f×)", floor, p50/floor)
}

// uptimeLoad returns the host's load averages (/proc/loadavg's first three fields).
func uptimeLoad() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// benchCLICreate times create → first exec through the CLI (`agentbox sandbox create`, then
// `agentbox exec ID -- true`, two processes as a user runs them) against the bench's server,
// the runtimes in turns, each sandbox destroyed (REST, untimed) before the next.
func benchCLICreate(ctx context.Context, bin, url, token string, names []string, n int, floor float64) []Stat {
	c := client.New(url, token)
	env := append(os.Environ(), "AGENTBOX_URL="+url, "AGENTBOX_TOKEN="+token)
	run := func(args ...string) string {
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Env = env
		out, err := cmd.Output()
		if err != nil {
			var stderr []byte
			if ee, ok := err.(*exec.ExitError); ok {
				stderr = ee.Stderr
			}
			log.Fatalf("agentbox %s: %v: %s", strings.Join(args, " "), err, stderr)
		}
		return strings.TrimSpace(string(out))
	}
	times := map[string][]float64{}
	for range n {
		for _, name := range names {
			t0 := time.Now()
			id := run("sandbox", "create", "--runtime", name)
			run("exec", id, "--", "true")
			times[name] = append(times[name], ms(time.Since(t0)))
			if _, err := c.Destroy(ctx, id); err != nil {
				log.Fatalf("destroy %s: %v", id, err)
			}
		}
	}
	var out []Stat
	for _, name := range names {
		s := summarize("create → first exec result (CLI)", "ms", times[name])
		s.Runtime, s.Floor = name, floorNote(s.P50, floor)
		out = append(out, s)
	}
	return out
}

// traceSteps are the create trace's steps in the table's order: the control plane's, the
// runtime's under create.runtime, then the first request and what REST and the client add.
var traceSteps = []string{
	sandbox.SpanCreateAdmission, sandbox.SpanCreateImage, sandbox.SpanCreateRecord, sandbox.SpanCreateRuntime,
	runtime.StepLayout, runtime.StepDir, runtime.StepDisk, runtime.StepDiskCopy, runtime.StepDiskMount, runtime.StepNetwork, runtime.StepBundle, runtime.StepMounts,
	runtime.StepCreate, runtime.StepStart, runtime.StepAfter,
	sandbox.SpanCreateAgent, kubernetes.StepPodSchedule, kubernetes.StepPodSandbox, kubernetes.StepPodContainer, kubernetes.StepTunnel,
	sandbox.SpanCreateUp, sandbox.SpanCreateRunning,
}

const (
	stepTotal   = "create (server)"
	stepFirst   = "first request (server)"
	stepREST    = "REST and client"
	stepMeasure = "create → first exec (measured)"
)

// TraceTable is the create trace's per-step p50 for one runtime (bench/results.json).
type TraceTable struct {
	Runtime string `json:"runtime"`
	N       int    `json:"n"`
	// Steps maps a step to its p50 in milliseconds (a step absent from every create is left
	// out).
	Steps map[string]float64 `json:"steps_p50_ms"`
}

// traceTables joins the recorder's traces to the measured creates (sandbox id → wall time)
// and returns each runtime's per-step p50: the server's steps, the first request, and what is
// left of the measured figure (REST, JSON, the client).
func traceTables(rec *createtrace.Recorder, measured map[string]float64, runtimes []string) []TraceTable {
	per := map[string]map[string][]float64{}
	for _, t := range rec.Traces() {
		wall, ok := measured[t.SandboxID]
		if !ok || t.Failed || t.Pooled {
			continue
		}
		m := per[t.Runtime]
		if m == nil {
			m = map[string][]float64{}
			per[t.Runtime] = m
		}
		for _, name := range traceSteps {
			if d, ok := t.Step(name); ok {
				m[name] = append(m[name], ms(d))
			}
		}
		m[stepTotal] = append(m[stepTotal], ms(t.Total))
		m[stepFirst] = append(m[stepFirst], ms(t.FirstRequest))
		m[stepREST] = append(m[stepREST], wall-ms(t.Total)-ms(t.FirstRequest))
		m[stepMeasure] = append(m[stepMeasure], wall)
	}
	var out []TraceTable
	for _, rt := range runtimes {
		m := per[rt]
		if m == nil {
			continue
		}
		tt := TraceTable{Runtime: rt, N: len(m[stepTotal]), Steps: map[string]float64{}}
		for k, xs := range m {
			tt.Steps[k] = p50(xs)
		}
		out = append(out, tt)
	}
	return out
}

func p50(xs []float64) float64 {
	s := slices.Clone(xs)
	sort.Float64s(s)
	return s[max(0, (len(s)+1)/2-1)]
}

// printTraceTables prints the per-step p50 table, a column per runtime.
func printTraceTables(tabs []TraceTable) {
	if len(tabs) == 0 {
		return
	}
	fmt.Printf("\ncreate trace, p50 per step (ms)\n%-34s", "step")
	for _, t := range tabs {
		fmt.Printf(" %10s", t.Runtime)
	}
	fmt.Println()
	for _, name := range append(slices.Clone(traceSteps), stepTotal, stepFirst, stepREST, stepMeasure) {
		any := false
		for _, t := range tabs {
			_, ok := t.Steps[name]
			any = any || ok
		}
		if !any {
			continue
		}
		label := name
		switch {
		case strings.HasPrefix(name, "runtime.pod."): // the pod's start, under create.agent_ready
			label = "  " + name
		case strings.HasPrefix(name, "runtime."):
			label = strings.Repeat("  ", strings.Count(name, ".")) + name
		}
		fmt.Printf("%-34s", label)
		for _, t := range tabs {
			if v, ok := t.Steps[name]; ok {
				fmt.Printf(" %10.2f", v)
			} else {
				fmt.Printf(" %10s", "-")
			}
		}
		fmt.Println()
	}
	fmt.Printf("%-34s", "n")
	for _, t := range tabs {
		fmt.Printf(" %10d", t.N)
	}
	fmt.Println()
}
