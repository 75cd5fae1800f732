package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"os/exec"
	goruntime "runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/watch"
	"github.com/agentbox/agentbox/internal/wire"
)

// benchJobStart times n job_start calls (POST /v1/sandboxes/{id}/jobs, the job `true`) from the
// call to its reply on a warm sandbox, alternating with the floor: the exec round trip of `true`
// on the same sandbox. Each started job is waited for (untimed) so the sandbox runs none when
// the next start is timed.
func benchJobStart(ctx context.Context, c *client.Client, id string, n int) []Stat {
	trueCmd := wire.ExecRequest{Command: []string{"true"}}
	var starts, execs []float64
	states := map[wire.JobState]int{}
	for i := 0; i < n; i++ {
		t0 := time.Now()
		j, err := c.StartJob(ctx, id, trueCmd)
		if err != nil {
			log.Fatalf("job bench: start: %v", err)
		}
		starts = append(starts, ms(time.Since(t0)))
		states[j.State]++
		if j.State != wire.JobRunning && j.State != wire.JobExited {
			log.Fatalf("job bench: job_start replied %q: %+v", j.State, j)
		}
		if _, err := c.WaitJob(ctx, id, j.ID, 30*time.Second); err != nil {
			log.Fatalf("job bench: wait: %v", err)
		}
		t0 = time.Now()
		if r, err := c.Exec(ctx, id, trueCmd, nil); err != nil || r.ExitCode != 0 {
			log.Fatalf("job bench: exec: %v %+v", err, r)
		}
		execs = append(execs, ms(time.Since(t0)))
	}
	floor := summarize("floor: exec round trip of `true`, same sandbox (REST)", "ms", execs)
	s := summarize("job_start → reply (`true`, REST)", "ms", starts)
	s.Floor = fmt.Sprintf("exec p50 %.2f ms; replies %s; target p50 ≤ 5 ms", floor.P50, stateCounts(states))
	return []Stat{s, floor}
}

func stateCounts(m map[wire.JobState]int) string {
	var parts []string
	for _, st := range []wire.JobState{wire.JobRunning, wire.JobExited} {
		if m[st] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", m[st], st))
		}
	}
	return strings.Join(parts, ", ")
}

// FleetWatcher is one watcher's tally in the fleet run.
type FleetWatcher struct {
	Sandboxes  int `json:"sandboxes"`
	Expected   int `json:"lines_expected"`
	Received   int `json:"lines_received"`
	Missing    int `json:"lines_missing"`
	Duplicates int `json:"lines_duplicated"`
	// OffsetGaps counts logs chunks whose offset was not where the previous one ended.
	OffsetGaps int `json:"offset_gaps"`
	// Errors are streams that did not end with their end message.
	Errors []string `json:"errors,omitempty"`
}

// Fleet is the fleet run's detail in bench/results.json.
type Fleet struct {
	Sandboxes     int     `json:"sandboxes"`
	Watchers      int     `json:"watchers"`
	Seconds       int     `json:"seconds"`
	CPU           float64 `json:"sandbox_cpu"`
	MemoryMB      int64   `json:"sandbox_memory_mb"`
	WindowSeconds float64 `json:"window_seconds"`
	// StartSeconds is how long into the window the last job_start returned.
	StartSeconds   float64 `json:"start_seconds"`
	LinesExpected  int     `json:"lines_expected"`
	LinesReceived  int     `json:"lines_received"`
	LinesMissing   int     `json:"lines_missing"`
	LinesDuplicate int     `json:"lines_duplicated"`
	OffsetGaps     int     `json:"offset_gaps"`
	// ServerCPUPercent is utime+stime of the process serving the API over the window, as a
	// percent of one core: the bench process, which serves in-process and, during the window,
	// does nothing else (the watchers and the job starts run in a child process).
	ServerCPUPercent float64 `json:"server_cpu_percent_of_one_core"`
	// ClientCPUPercent is the child process's: the watchers' SSE clients and the job starts.
	ClientCPUPercent float64 `json:"client_cpu_percent_of_one_core"`
	ServerCPUNote    string  `json:"server_cpu_note"`
	// HostBusyPercent is the host's busy CPU over the window (/proc/stat), of all cores.
	HostBusyPercent float64        `json:"host_busy_percent"`
	LoadBefore      string         `json:"loadavg_before"`
	LoadAfter       string         `json:"loadavg_after"`
	PerWatcher      []FleetWatcher `json:"per_watcher"`
	CreateSeconds   float64        `json:"create_seconds"`
	DestroySeconds  float64        `json:"destroy_seconds"`
}

// benchFleet creates sandboxes small runc sandboxes (parallel creates bounded by par), starts in
// each a job that prints "<n> <unix time>" every 100 ms for seconds s, and has watchers watchers
// each follow the logs streams of its share of the jobs over SSE, from a child process
// (fleetClientMain). It counts lines by their numbers (missing, duplicated) and times each line
// from the time the job printed to its receipt. Every sandbox it creates is destroyed before it
// returns.
func benchFleet(ctx context.Context, c *client.Client, token string, sandboxes, watchers, seconds, par int) (*Fleet, []Stat) {
	f := &Fleet{Sandboxes: sandboxes, Watchers: watchers, Seconds: seconds, CPU: 0.1, MemoryMB: 64}
	var mu sync.Mutex
	ids := make([]string, sandboxes)
	t0 := time.Now()
	var wg sync.WaitGroup
	sem := make(chan struct{}, par)
	var createErr error
	for i := range ids {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			sb, err := c.Create(ctx, wire.CreateRequest{Runtime: "runc", CPU: f.CPU, MemoryMB: f.MemoryMB, TTLSeconds: 3600})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				createErr = err
				return
			}
			ids[i] = sb.ID
		}()
	}
	wg.Wait()
	f.CreateSeconds = time.Since(t0).Seconds()
	defer func() {
		t0 := time.Now()
		var wg sync.WaitGroup
		for _, id := range ids {
			if id == "" {
				continue
			}
			sem <- struct{}{}
			wg.Add(1)
			go func() {
				defer func() { <-sem; wg.Done() }()
				if _, err := c.Destroy(ctx, id); err != nil {
					log.Printf("fleet bench: destroy %s: %v", id, err)
				}
			}()
		}
		wg.Wait()
		f.DestroySeconds = time.Since(t0).Seconds()
	}()
	if createErr != nil {
		log.Printf("fleet bench: create: %v (fleet not measured)", createErr)
		return nil, nil
	}

	// The watchers' HTTP clients (and the job starts) run in a child process, this binary
	// re-executed with -fleet-client (fleetClientMain), so that this process's CPU over the
	// window is the server's alone: the control plane, the REST API and the watch streams.
	f.LoadBefore = loadavg()
	spec := fleetSpec{URL: c.BaseURL(), Token: token, IDs: ids, Watchers: watchers, Seconds: seconds, Par: par}
	specJSON, err := json.Marshal(spec)
	if err != nil {
		log.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		log.Fatalf("fleet bench: %v", err)
	}
	cmd := exec.CommandContext(ctx, self, "-fleet-client")
	cmd.Stdin = bytes.NewReader(specJSON)
	cmd.Stderr = os.Stderr
	var out bytes.Buffer
	cmd.Stdout = &out
	cpu0, host0 := procCPU(), hostCPU()
	w0 := time.Now()
	if err := cmd.Run(); err != nil {
		log.Printf("fleet bench: the client process: %v (fleet not measured)", err)
		return nil, nil
	}
	window := time.Since(w0)
	cpu1, host1 := procCPU(), hostCPU()
	f.LoadAfter = loadavg()
	var cr fleetClientResult
	if err := json.Unmarshal(out.Bytes(), &cr); err != nil {
		log.Printf("fleet bench: the client process's result: %v (fleet not measured)", err)
		return nil, nil
	}
	f.PerWatcher, f.StartSeconds = cr.PerWatcher, cr.StartSeconds
	delays := cr.Delays
	f.WindowSeconds = window.Seconds()
	f.ServerCPUPercent = 100 * (cpu1 - cpu0).Seconds() / window.Seconds()
	if st := cmd.ProcessState; st != nil {
		f.ClientCPUPercent = 100 * (st.UserTime() + st.SystemTime()).Seconds() / window.Seconds()
	}
	f.ServerCPUNote = "the server's process alone (utime+stime of the bench process, which serves the API in-process and does nothing else during the window; the sandboxes' processes are not in it); the 200 SSE clients and the job starts ran in a child process, whose CPU is client_cpu_percent_of_one_core"
	if busy, total := host1[0]-host0[0], host1[1]-host0[1]; total > 0 {
		f.HostBusyPercent = 100 * busy / total
	}
	var received []float64
	for _, fw := range f.PerWatcher {
		f.LinesExpected += fw.Expected
		f.LinesReceived += fw.Received
		f.LinesMissing += fw.Missing
		f.LinesDuplicate += fw.Duplicates
		f.OffsetGaps += fw.OffsetGaps
		received = append(received, float64(fw.Received))
		for _, e := range fw.Errors {
			log.Printf("fleet bench: %s", e)
		}
	}
	size := fmt.Sprintf("%d sandboxes, %d watchers, %d s", sandboxes, watchers, seconds)
	var stats []Stat
	if len(delays) > 0 {
		d := summarize("fleet: logs line printed → SSE receipt ("+size+")", "ms", delays)
		d.Floor = fmt.Sprintf("pushed by the agent's long poll (one outstanding read per job); the %d jobs share the host's cores at 0.1 core each", sandboxes)
		stats = append(stats, d)
	}
	r := summarize("fleet: lines received per watcher", "n", received)
	r.Floor = fmt.Sprintf("expected %d each; missing %d, duplicated %d, offset gaps %d in all", f.LinesExpected/max(1, watchers), f.LinesMissing, f.LinesDuplicate, f.OffsetGaps)
	stats = append(stats, r)
	stats = append(stats, Stat{Name: "fleet: server CPU over the window (the server's process alone)", Unit: "%", N: 1,
		P50: f.ServerCPUPercent, P99: f.ServerCPUPercent, Mean: f.ServerCPUPercent,
		Floor: fmt.Sprintf("of one core, %.0f s (last job started at %.0f s); watchers' client process %.1f%%; host busy %.0f%% of %d cores; load %s → %s", f.WindowSeconds, f.StartSeconds, f.ClientCPUPercent, f.HostBusyPercent, goruntime.NumCPU(), f.LoadBefore, f.LoadAfter)})
	return f, stats
}

// procCPU is this process's utime+stime from /proc/self/stat (children excluded).
func procCPU() time.Duration {
	b, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		return 0
	}
	s := string(b)
	// Fields after the command (which may hold spaces) start after the last ')'.
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / 100 // USER_HZ is 100 on Linux
}

// hostCPU returns the host's busy and total jiffies from /proc/stat.
func hostCPU() [2]float64 {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return [2]float64{}
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	var busy, total float64
	for i, v := range f[1:] {
		x, _ := strconv.ParseFloat(v, 64)
		total += x
		if i != 3 && i != 4 { // idle, iowait
			busy += x
		}
	}
	return [2]float64{busy, total}
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

// benchJobs runs the job_start figures (n starts on sandbox id; 0 skips) and the fleet
// (fleetN sandboxes; 0 skips), each figure tagged with runc.
func benchJobs(ctx context.Context, c *client.Client, token, id string, n, fleetN, watchers, seconds, par int) ([]Stat, *Fleet) {
	if fleetN < 0 || watchers < 1 || seconds < 1 || seconds > 600 || par < 1 {
		log.Fatalf("fleet flags: -fleet-sandboxes must be ≥ 0, -fleet-watchers ≥ 1, -fleet-seconds 1..600, -fleet-create-parallel ≥ 1; got %d, %d, %d, %d", fleetN, watchers, seconds, par)
	}
	var stats []Stat
	if n > 0 {
		stats = append(stats, benchJobStart(ctx, c, id, n)...)
	}
	var fleet *Fleet
	if fleetN > 0 {
		var fs []Stat
		fleet, fs = benchFleet(ctx, c, token, fleetN, watchers, seconds, par)
		stats = append(stats, fs...)
	}
	for i := range stats {
		stats[i].Runtime = "runc"
	}
	return stats, fleet
}

// fleetSpec is what the fleet's client process is given (on stdin, JSON).
type fleetSpec struct {
	URL      string   `json:"url"`
	Token    string   `json:"token"`
	IDs      []string `json:"ids"`
	Watchers int      `json:"watchers"`
	Seconds  int      `json:"seconds"`
	Par      int      `json:"par"`
}

// fleetClientResult is what it reports (on stdout, JSON).
type fleetClientResult struct {
	PerWatcher   []FleetWatcher `json:"per_watcher"`
	StartSeconds float64        `json:"start_seconds"`
	// Delays are the lines' times from printed to received, in ms.
	Delays []float64 `json:"delays"`
}

// fleetClientMain is the fleet's client process (-fleet-client): it starts the jobs and runs
// the watchers against the server named on stdin, and writes its tallies to stdout.
func fleetClientMain() {
	var spec fleetSpec
	if err := json.NewDecoder(os.Stdin).Decode(&spec); err != nil {
		log.Fatalf("fleet client: spec: %v", err)
	}
	c := client.New(spec.URL, spec.Token)
	res := fleetWatch(context.Background(), c, spec)
	if err := json.NewEncoder(os.Stdout).Encode(res); err != nil {
		log.Fatalf("fleet client: %v", err)
	}
}

// fleetWatch starts in each sandbox the job that prints "<n> <unix time>" every 100 ms and has
// spec.Watchers watchers each follow the logs streams of its share of the jobs over SSE.
func fleetWatch(ctx context.Context, c *client.Client, spec fleetSpec) fleetClientResult {
	ids, watchers, seconds := spec.IDs, spec.Watchers, spec.Seconds
	sandboxes, lines := len(ids), seconds*10
	sem := make(chan struct{}, spec.Par)
	var mu sync.Mutex
	var res fleetClientResult
	// The job waits 1 s before its first line, so that its watcher is open by then. It is bash
	// builtins only (EPOCHREALTIME for the time, read -t on an empty pipe for the 100 ms), so
	// that the figure is the stream's and not fork/exec under the sandbox's 0.1 CPU quota.
	script := fmt.Sprintf(`exec 3<> <(:); read -t 1 -u 3; i=0; while [ $i -lt %d ]; do i=$((i+1)); echo "$i $EPOCHREALTIME"; read -t 0.1 -u 3; done`, lines)
	job := wire.ExecRequest{Command: []string{"bash", "-c", script}, Env: map[string]string{"LC_ALL": "C"}}
	w0 := time.Now()
	res.PerWatcher = make([]FleetWatcher, watchers)
	var ww sync.WaitGroup
	for w := 0; w < watchers; w++ {
		ww.Add(1)
		go func() {
			defer ww.Done()
			fw := &res.PerWatcher[w]
			var sw sync.WaitGroup
			for i := w; i < sandboxes; i += watchers {
				fw.Sandboxes++
				fw.Expected += lines
				sem <- struct{}{} // job starts bounded like creates
				j, err := c.StartJob(ctx, ids[i], job)
				<-sem
				mu.Lock()
				res.StartSeconds = max(res.StartSeconds, time.Since(w0).Seconds())
				mu.Unlock()
				if err != nil {
					mu.Lock()
					fw.Errors = append(fw.Errors, fmt.Sprintf("%s: start: %v", ids[i], err))
					fw.Missing += lines
					mu.Unlock()
					continue
				}
				sw.Add(1)
				go func() {
					defer sw.Done()
					seen := make([]int, lines+1)
					var pending []byte
					var next int64
					var local []float64
					var received, gaps int
					_, err := c.Watch(ctx, ids[i], client.WatchOptions{Stream: watch.StreamLogs, JobID: j.ID, DurationSeconds: int64(seconds)*3 + 60},
						func(m wire.WatchMessage) error {
							if m.Kind != wire.WatchLogs {
								return nil
							}
							now := time.Now()
							if m.Offset != next {
								gaps++
							}
							next = m.Offset + int64(len(m.Data))
							pending = append(pending, m.Data...)
							for {
								k := bytes.IndexByte(pending, '\n')
								if k < 0 {
									break
								}
								line := string(pending[:k])
								pending = pending[k+1:]
								num, ts, ok := strings.Cut(line, " ")
								n, err1 := strconv.Atoi(num)
								sec, err2 := strconv.ParseFloat(ts, 64)
								if !ok || err1 != nil || err2 != nil || n < 1 || n > lines {
									continue
								}
								received++
								seen[n]++
								at := time.Unix(0, int64(sec*1e9))
								local = append(local, ms(now.Sub(at)))
							}
							return nil
						})
					mu.Lock()
					defer mu.Unlock()
					if err != nil {
						fw.Errors = append(fw.Errors, fmt.Sprintf("%s: watch: %v", ids[i], err))
					}
					fw.Received += received
					fw.OffsetGaps += gaps
					for _, k := range seen[1:] {
						if k == 0 {
							fw.Missing++
						} else if k > 1 {
							fw.Duplicates += k - 1
						}
					}
					res.Delays = append(res.Delays, local...)
				}()
			}
			sw.Wait()
		}()
	}
	ww.Wait()
	return res
}
