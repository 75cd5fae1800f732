package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/config"
	"github.com/agentbox/agentbox/internal/runs"
	"github.com/agentbox/agentbox/internal/wire"
)

// The durable runs' figures, measured against a real `agentbox serve` (a process of its own, so its
// CPU is its own): the overhead of a run over the same steps done by hand through the API
// (create, exec the command, destroy), and a batch of trivial runs under a parallelism bound
// (runs/s and the server's CPU seconds).

type runsFlags struct {
	only     *bool
	out      *string
	overhead *int
	batch    *int
	parallel *int
}

func runsBenchFlags() runsFlags {
	return runsFlags{
		only:     flag.Bool("runs-only", false, "measure only the durable-run figures"),
		out:      flag.String("runs-out", "bench/results-runs.json", "where the durable-run figures are written (also with the whole bench)"),
		overhead: flag.Int("run-overheads", 30, "runs of `true`, each beside the same steps by hand (create, exec, destroy), in turns (0 skips the run figures)"),
		batch:    flag.Int("run-batch", 100, "trivial runs in the timed batch"),
		parallel: flag.Int("run-batch-parallel", 10, "the timed batch's max_parallel"),
	}
}

// RunsBench is bench/results-runs.json.
type RunsBench struct {
	Host  string    `json:"host"`
	CPUs  int       `json:"cpus"`
	When  time.Time `json:"when"`
	Stats []Stat    `json:"stats"`
	// OverheadP50Ms is the run's p50 minus the by-hand p50 (target ≤ 50 ms).
	OverheadP50Ms float64          `json:"overhead_p50_ms"`
	OverheadP99Ms float64          `json:"overhead_p99_ms"`
	Batch         *RunsBatchFigure `json:"batch,omitempty"`
}

// RunsBatchFigure is the timed batch.
type RunsBatchFigure struct {
	Runs        int     `json:"runs"`
	MaxParallel int     `json:"max_parallel"`
	Succeeded   int     `json:"succeeded"`
	Seconds     float64 `json:"seconds"`
	RunsPerSec  float64 `json:"runs_per_second"`
	// ServerCPUSeconds is the server process's user+system time over the batch (from
	// /proc/<pid>/stat); WithChildren adds its waited-for children (runc, git on the host…).
	ServerCPUSeconds             float64 `json:"server_cpu_seconds"`
	ServerCPUSecondsWithChildren float64 `json:"server_cpu_seconds_with_children"`
	// MaxActive is the most runs of the batch active at once, from their events' times.
	MaxActive int `json:"max_active"`
	// OverBound are the claims (at most 10) whose event time falls while MaxParallel others
	// were active by their events' times, and by how much the first of those settled later.
	OverBound []string `json:"over_bound,omitempty"`
}

// benchServer is a running `agentbox serve`.
type benchServer struct {
	cmd  *exec.Cmd
	dir  string
	url  string
	logs *os.File
}

func startBenchServer(bin, token string) *benchServer {
	return startBenchServerAt(bin, token, "abbench-runs")
}

// startBenchServerAt is startBenchServer with a cgroup parent of the caller's.
func startBenchServerAt(bin, token, cgroupParent string) *benchServer {
	dir, err := os.MkdirTemp("", "abbenchruns")
	if err != nil {
		log.Fatal(err)
	}
	os.Chmod(dir, 0o711)
	logs, err := os.CreateTemp("", "abbenchruns-log")
	if err != nil {
		log.Fatal(err)
	}
	s := &benchServer{dir: dir, logs: logs}
	s.cmd = exec.Command(bin, "serve", "--listen", "127.0.0.1:0", "--state-dir", dir, "--cgroup-parent", cgroupParent)
	s.cmd.Env = append(os.Environ(), "AGENTBOX_TOKEN="+token)
	s.cmd.Stderr = logs
	if err := s.cmd.Start(); err != nil {
		log.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if info, err := config.ReadServerInfo(dir); err == nil && info.PID == s.cmd.Process.Pid {
			s.url = info.URL
			return s
		}
		if time.Now().After(deadline) {
			s.cmd.Process.Kill()
			b, _ := os.ReadFile(logs.Name())
			log.Fatalf("agentbox serve did not start:\n%s", b)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (s *benchServer) stop() {
	s.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { s.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		s.cmd.Process.Kill()
		<-done
	}
	s.logs.Close()
	os.Remove(s.logs.Name())
	os.RemoveAll(s.dir)
}

// cpuSeconds is the process's user+system time and that with its waited-for children.
func cpuSeconds(pid int) (self, withChildren float64) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		log.Fatal(err)
	}
	// the fields after the command name, which is in parentheses and may hold spaces
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	// utime, stime, cutime, cstime are fields 14–17 of stat (1-based); f[0] is field 3
	v := func(i int) float64 { x, _ := strconv.ParseFloat(f[i-3], 64); return x / clockTicks }
	return v(14) + v(15), v(14) + v(15) + v(16) + v(17)
}

// clockTicks is USER_HZ, which Linux fixes at 100 for /proc.
const clockTicks = 100

func runRuns(ctx context.Context, bin string, f runsFlags) *RunsBench {
	if *f.overhead <= 0 {
		return nil
	}
	const token = "bench-runs-token-0123456789abcdef"
	s := startBenchServer(bin, token)
	defer s.stop()
	c := client.New(s.url, token)
	res := &RunsBench{When: time.Now().UTC()}
	res.Host, _ = os.Hostname()
	res.CPUs = goruntime.NumCPU()

	// warm up: the runtime's shared rootfs, the first run
	if r, err := c.WaitRun(ctx, wire.RunSpec{Command: []string{"true"}}, 5*time.Minute); err != nil || r.State != wire.RunSucceeded {
		b, _ := os.ReadFile(s.logs.Name())
		log.Fatalf("warm-up run: %v %s %s\n%s", err, r.State, r.Reason, tailBytes(b, 8<<10))
	}
	var byRun, byHand []float64
	phases := map[string][]float64{} // where a run's time goes, from its record
	for i := 0; i < *f.overhead; i++ {
		t0 := time.Now()
		r, err := c.WaitRun(ctx, wire.RunSpec{Command: []string{"true"}}, 5*time.Minute)
		if err != nil || r.State != wire.RunSucceeded {
			log.Fatalf("run: %v %s %s", err, r.State, r.Reason)
		}
		byRun = append(byRun, ms(time.Since(t0)))
		if r.StartedAt != nil {
			phases["queued (created → claimed)"] = append(phases["queued (created → claimed)"], ms(r.StartedAt.Sub(r.CreatedAt)))
		}
		if r.FinishedAt != nil {
			phases["settled → reply"] = append(phases["settled → reply"], ms(time.Since(*r.FinishedAt)))
		}
		for _, p := range r.Phases {
			if p.DurationMs != nil {
				phases["phase "+p.Name] = append(phases["phase "+p.Name], float64(*p.DurationMs))
			}
		}

		t0 = time.Now()
		sb, err := c.Create(ctx, wire.CreateRequest{})
		if err != nil {
			log.Fatal(err)
		}
		if x, err := c.Exec(ctx, sb.ID, wire.ExecRequest{Command: []string{"true"}}, nil); err != nil || x.ExitCode != 0 {
			log.Fatalf("exec: %v %+v", err, x)
		}
		if _, err := c.Destroy(ctx, sb.ID); err != nil {
			log.Fatal(err)
		}
		byHand = append(byHand, ms(time.Since(t0)))
	}
	run := summarize("run of `true` (POST /v1/runs wait → settled)", "ms", byRun)
	hand := summarize("the same by hand (create, exec `true`, destroy)", "ms", byHand)
	res.OverheadP50Ms, res.OverheadP99Ms = run.P50-hand.P50, run.P99-hand.P99
	run.Floor = fmt.Sprintf("by hand p50 %.1f ms: overhead p50 %+.1f ms (target ≤ 50)", hand.P50, res.OverheadP50Ms)
	res.Stats = append(res.Stats, run, hand)
	names := make([]string, 0, len(phases))
	for n := range phases {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		res.Stats = append(res.Stats, summarize("run of `true`: "+n, "ms", phases[n]))
	}

	// a batch of trivial runs
	if *f.batch > 0 {
		var specs []json.RawMessage
		for i := 0; i < *f.batch; i++ {
			specs = append(specs, json.RawMessage(`{"command": ["true"]}`))
		}
		pid := s.cmd.Process.Pid
		cpu0, cpuC0 := cpuSeconds(pid)
		t0 := time.Now()
		b, err := c.StartBatch(ctx, wire.BatchRequest{Runs: specs, MaxParallel: *f.parallel}, 0)
		if err != nil {
			log.Fatal(err)
		}
		for !b.Settled {
			time.Sleep(100 * time.Millisecond)
			if b, err = c.GetBatch(ctx, b.ID); err != nil {
				log.Fatal(err)
			}
			if time.Since(t0) > 30*time.Minute {
				log.Fatalf("the batch did not settle in 30 min: %v", b.Counts)
			}
		}
		el := time.Since(t0).Seconds()
		cpu1, cpuC1 := cpuSeconds(pid)
		fig := &RunsBatchFigure{Runs: len(b.Runs), MaxParallel: b.MaxParallel, Succeeded: b.Counts[wire.RunSucceeded], Seconds: el,
			RunsPerSec: float64(len(b.Runs)) / el, ServerCPUSeconds: cpu1 - cpu0, ServerCPUSecondsWithChildren: cpuC1 - cpuC0}
		// the bound, from the events
		type span struct{ from, to time.Time }
		var spans []span
		for _, br := range b.Runs {
			evs, err := c.RunEvents(ctx, br.RunID, 0, runs.MaxEventsPage)
			if err != nil {
				log.Fatal(err)
			}
			var sp span
			for _, ev := range evs.Events {
				if ev.To == wire.RunPreparing && sp.from.IsZero() {
					sp.from = ev.Time
				}
				if ev.To.Settled() {
					sp.to = ev.Time
				}
			}
			spans = append(spans, sp)
		}
		for ai, a := range spans {
			n, earliestEnd := 0, time.Time{}
			for _, o := range spans {
				if !o.from.After(a.from) && o.to.After(a.from) {
					n++
					if earliestEnd.IsZero() || o.to.Before(earliestEnd) {
						earliestEnd = o.to
					}
				}
			}
			fig.MaxActive = max(fig.MaxActive, n)
			if n > fig.MaxParallel && len(fig.OverBound) < 10 {
				fig.OverBound = append(fig.OverBound, fmt.Sprintf("%s claimed at %s with %d active; the first of them settled %s later",
					b.Runs[ai].RunID, a.from.UTC().Format("15:04:05.000"), n-1, earliestEnd.Sub(a.from)))
			}
		}
		res.Batch = fig
		res.Stats = append(res.Stats, Stat{Name: fmt.Sprintf("batch of %d trivial runs, max_parallel %d", fig.Runs, fig.MaxParallel),
			Unit: "runs/s", N: fig.Runs, P50: fig.RunsPerSec, P99: fig.RunsPerSec, Mean: fig.RunsPerSec,
			Floor: fmt.Sprintf("%.1f s; server CPU %.2f s (%.2f s with children); at most %d active", el, fig.ServerCPUSeconds,
				fig.ServerCPUSecondsWithChildren, fig.MaxActive)})
		for _, o := range fig.OverBound {
			fmt.Println("over the bound by the events' times:", o)
		}
		if fig.Succeeded != fig.Runs {
			log.Fatalf("the batch: %v", b.Counts)
		}
	}
	return res
}

func writeRunsResults(res *RunsBench, out string) {
	if res == nil {
		return
	}
	b, _ := json.MarshalIndent(res, "", "  ")
	if err := os.WriteFile(out, append(b, '\n'), 0o644); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("\nwrote %s\n", out)
}

func tailBytes(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// absBin is the agentbox binary's absolute path.
func absBin(bin string) string {
	p, err := filepath.Abs(bin)
	if err != nil {
		log.Fatal(err)
	}
	return p
}
