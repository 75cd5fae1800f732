package faults

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/agentbox/agentbox/internal/testenv"
	"github.com/agentbox/agentbox/internal/testenv/pglab"
)

// faultKinds are the faults the campaign injects. Each round takes them in an order the seed
// shuffles, so a short campaign still tries each kind.
var faultKinds = []struct {
	name string
	fn   func(*campaign, context.Context, *rand.Rand)
}{
	{"server_kill", (*campaign).serverKill},
	{"agent_kill", (*campaign).agentKill},
	{"job_kill", (*campaign).jobKill},
	{"runtime_fail", (*campaign).runtimeFail},
	{"runtime_hang", (*campaign).runtimeHang},
	{"disk_full", (*campaign).diskFull},
	{"second_server", (*campaign).secondServer},
	{"crash_point", (*campaign).crashPoint},
	{"postgres_restart", (*campaign).postgresRestart},
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

// injectFaults injects a fault every few seconds until ctx ends, checking the invariants after
// each.
func (c *campaign) injectFaults(ctx context.Context, rng *rand.Rand) {
	var order []int
	for {
		if !sleepCtx(ctx, time.Duration(2000+rng.IntN(3000))*time.Millisecond) {
			return
		}
		if len(order) == 0 {
			order = rng.Perm(len(faultKinds))
		}
		f := faultKinds[order[0]]
		order = order[1:]
		if c.set.skip[f.name] || (f.name == "postgres_restart" && !c.set.postgres) {
			continue
		}
		c.t.Logf("%s fault: %s", time.Now().UTC().Format("15:04:05.000"), f.name)
		fmt.Fprintf(c.logs, "\n===== faults: %s at %s =====\n", f.name, time.Now().UTC().Format(time.RFC3339Nano))
		c.faults.add(f.name)
		f.fn(c, ctx, rng)
		c.checkAll(f.name)
	}
}

// serverKill SIGKILLs the server, as a crash would, and starts it again on the same state.
func (c *campaign) serverKill(ctx context.Context, rng *rand.Rand) {
	c.srvMu.Lock()
	p := c.srv
	c.srvMu.Unlock()
	p.kill()
	time.Sleep(time.Duration(rng.IntN(1000)) * time.Millisecond)
	if err := c.start(); err != nil {
		c.violate("the server does not start again after a SIGKILL: %v", err)
		if err := c.start(); err != nil {
			c.t.Fatalf("the server does not start again: %v\n%s", err, tail(c.logs.String(), 20000))
		}
	}
}

// records returns the store's sandbox records (the SQL view), by id.
func (c *campaign) records(ctx context.Context) (map[string]map[string]any, error) {
	rows, err := c.api().query(ctx, `SELECT id, state, error, labels, cpu, memory_mb, disk_mb FROM sandboxes`)
	if err != nil {
		return nil, err
	}
	out := map[string]map[string]any{}
	for _, r := range rows {
		out[str(r["id"])] = r
		c.led.seen(str(r["id"]))
	}
	return out, nil
}

// runningOurs returns the running sandboxes a client created (not pool members), sorted.
func (c *campaign) runningOurs(ctx context.Context) []string {
	recs, err := c.records(ctx)
	if err != nil {
		return nil
	}
	var ids []string
	for id, r := range recs {
		if str(r["state"]) == "running" && strings.Contains(str(r["labels"]), `"client"`) {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	return ids
}

// pidsOf returns the host pids in sandbox id's cgroup whose command line contains all of
// words.
func pidsOf(id string, words ...string) []int {
	var out []int
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		cg, _ := os.ReadFile(p + "/cgroup")
		if !strings.Contains(string(cg), id) {
			continue
		}
		b, _ := os.ReadFile(p + "/cmdline")
		cmd := strings.ReplaceAll(string(b), "\x00", " ")
		ok := true
		for _, w := range words {
			ok = ok && strings.Contains(cmd, w)
		}
		if ok {
			if n, err := strconv.Atoi(filepath.Base(p)); err == nil {
				out = append(out, n)
			}
		}
	}
	return out
}

// agentKill SIGKILLs a running sandbox's agent (its init): the sandbox must end up lost with a
// reason and nothing of it left, or running and answering.
func (c *campaign) agentKill(ctx context.Context, rng *rand.Rand) {
	ids := c.runningOurs(ctx)
	if len(ids) == 0 {
		c.faults.add("agent_kill:no_target")
		return
	}
	id := ids[rng.IntN(len(ids))]
	pids := pidsOf(id, "guest", "--socket")
	if len(pids) == 0 {
		c.note("agent_kill: no agent process found for running sandbox %s", id)
		return
	}
	c.led.mu.Lock()
	c.led.agentKilled[id] = true
	c.led.mu.Unlock()
	for _, pid := range pids {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	deadline := time.Now().Add(45 * time.Second)
	for time.Now().Before(deadline) {
		var sb sandboxReply
		gctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := c.api().do(gctx, "GET", "/v1/sandboxes/"+id, nil, nil, &sb)
		cancel()
		if err == nil && sb.State != "running" {
			if sb.Error == "" {
				c.violate("agent_kill: sandbox %s is %s with no reason", id, sb.State)
			}
			return
		}
		time.Sleep(300 * time.Millisecond)
	}
	c.note("agent_kill: sandbox %s still running 45 s after its agent was killed", id)
}

// jobKill SIGKILLs a job's process once its first line is out: the job must end (not stay
// running, not be reported a clean exit) and keep that line.
func (c *campaign) jobKill(ctx context.Context, rng *rand.Rand) {
	ids := c.runningOurs(ctx)
	if len(ids) == 0 {
		c.faults.add("job_kill:no_target")
		return
	}
	id := ids[rng.IntN(len(ids))]
	m := fmt.Sprintf("jk-%x", rng.Uint32())
	r := c.api()
	var j jobReply
	jctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := r.do(jctx, "POST", "/v1/sandboxes/"+id+"/jobs", nil, map[string]any{"command": []string{"sh", "-c",
		"echo start-" + m + "; sleep 300; echo never-" + m}}, &j); err != nil {
		c.note("job_kill: start a job in %s: %v", id, err)
		return
	}
	ack := &jobAck{sandbox: id, job: j.ID, killedMarker: m}
	c.led.mu.Lock()
	c.led.jobs = append(c.led.jobs, ack)
	c.led.mu.Unlock()
	var pids []int
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		var lg logsReply
		if r.do(jctx, "GET", "/v1/sandboxes/"+id+"/jobs/"+j.ID+"/logs", url.Values{"stream": {"stdout"}, "offset": {"0"}}, nil, &lg) == nil &&
			strings.Contains(lg.bytes(), "start-"+m) {
			pids = pidsOf(id, "start-"+m)
			if len(pids) > 0 {
				break
			}
		}
	}
	if len(pids) == 0 {
		c.note("job_kill: job %s in %s never showed its first line and process", j.ID, id)
		return
	}
	for _, pid := range pids {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	if err := r.do(jctx, "GET", "/v1/sandboxes/"+id+"/jobs/"+j.ID+"/wait", url.Values{"timeout_seconds": {"45"}}, nil, &j); err != nil {
		c.note("job_kill: wait for job %s: %v", j.ID, err)
		return
	}
	if j.State == "running" || j.State == "starting" {
		c.violate("job_kill: job %s in %s is still %s 45 s after its process was killed", j.ID, id, j.State)
	}
	if j.State == "exited" && j.Signal == "" {
		c.violate("job_kill: job %s, killed by SIGKILL, is reported a clean exit: %+v", j.ID, j)
	}
}

func (c *campaign) runtimeFail(ctx context.Context, rng *rand.Rand) {
	c.setMode("fail")
	sleepCtx(ctx, time.Duration(5000+rng.IntN(5000))*time.Millisecond)
	c.setMode("ok")
}

func (c *campaign) runtimeHang(ctx context.Context, rng *rand.Rand) {
	c.setMode("hang")
	sleepCtx(ctx, time.Duration(5000+rng.IntN(5000))*time.Millisecond)
	c.setMode("ok")
}

// diskFull fills the state dir's file system for a few seconds while the clients go on.
func (c *campaign) diskFull(ctx context.Context, rng *rand.Rand) {
	c.fullDisk.Store(true)
	p, err := fillFS(c.state)
	defer func() {
		os.Remove(p)
		// A call answered just after the space came back may have had its audit record
		// refused while it was gone.
		time.Sleep(time.Second)
		c.fullDisk.Store(false)
	}()
	if err != nil {
		c.note("disk_full: %v", err)
		return
	}
	sleepCtx(ctx, time.Duration(4000+rng.IntN(4000))*time.Millisecond)
}

// secondServer starts another server on the same host with a state dir of its own, either with
// default flags (its cgroup parent derived from its state dir: it must start and, for longer
// than a sweep, disturb nothing of the first) or configured to the first's cgroup parent (it
// must refuse to start, naming the first's pid). Either way the first server's sandboxes must
// run on.
func (c *campaign) secondServer(ctx context.Context, rng *rand.Rand) {
	before := c.runningOurs(ctx)
	dir := filepath.Join(testenv.ShortTempDir(c.t, "abf2"), "s")
	os.MkdirAll(dir, 0o711)
	logs := &testenv.SyncBuffer{}
	sameParent := rng.IntN(2) == 0
	var args []string
	if sameParent {
		args = []string{"--cgroup-parent", c.parent}
	}
	c.srvMu.Lock()
	firstPID := c.srv.cmd.Process.Pid
	c.srvMu.Unlock()
	p, err := startServe(c.bin, dir, []string{"AGENTBOX_TOKEN=" + token + "-2"}, logs, args...)
	switch {
	case sameParent && err == nil:
		c.violate("second_server: a server configured to the first's cgroup parent %s started beside it", c.parent)
		p.stop()
	case sameParent:
		if !strings.Contains(logs.String(), strconv.Itoa(firstPID)) {
			c.violate("second_server: on the first's cgroup parent it refused to start without naming the first (pid %d): %s", firstPID, lastLines(logs.String(), 3))
		}
		c.faults.add("second_server:same_parent_refused")
	case err != nil:
		c.violate("second_server: with default flags and a state dir of its own it does not start: %v: %s", err, lastLines(logs.String(), 3))
	default:
		sleepCtx(context.Background(), 15*time.Second)
		if !p.stop() {
			c.violate("second_server: did not stop on SIGTERM")
		}
		c.faults.add("second_server:default_flags_ran")
	}
	time.Sleep(2 * time.Second)
	recs, err := c.records(ctx)
	if err != nil {
		return
	}
	for _, id := range before {
		r := recs[id]
		c.led.mu.Lock()
		killed := c.led.agentKilled[id] || c.led.destroyed[id]
		c.led.mu.Unlock()
		if st := str(r["state"]); (st == "lost" || st == "failed") && !killed { // a client's sleep, wake or destroy may be under way
			c.violate("second_server: sandbox %s of the first server, running before, is now %s (%s)", id, st, str(r["error"]))
		}
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// postgresRestart restarts the store's Postgres (FAULTS_STORE=postgres) while the clients go on:
// its connections drop, and the server must carry on once it is back.
func (c *campaign) postgresRestart(ctx context.Context, rng *rand.Rand) {
	rctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := pglab.Restart(rctx); err != nil {
		c.t.Fatalf("postgres_restart: %v", err)
	}
}
