package faults

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/agentbox/agentbox/internal/testenv"
)

// liveState: a record in it holds (or may hold) resources; the capacity figures count it.
func liveState(s string) bool {
	return s == "creating" || s == "running" || s == "stopping" || s == "sleeping"
}

// mayHold: a record in state s may hold host resources: a live one, and a failed or lost one,
// which keeps what it has until destroy or its TTL cleans it up (docs/architecture/lifecycle.md).
func mayHold(s string) bool { return liveState(s) || s == "failed" || s == "lost" }

// checkAll checks every invariant with the clients paused.
func (c *campaign) checkAll(after string) {
	c.gate.Lock()
	defer c.gate.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	start := time.Now()
	if !c.checkServes(ctx, after) {
		return
	}
	c.settle(ctx, after)
	c.checkHost(ctx, after)
	c.checkAcks(ctx, after)
	c.checkIdempotency(ctx, after)
	c.checkCapacity(ctx, after)
	c.t.Logf("%s checks after %s took %s", time.Now().UTC().Format("15:04:05.000"), after, time.Since(start).Round(time.Millisecond))
}

// checkServes: the server runs (it never exits on its own) and answers.
func (c *campaign) checkServes(ctx context.Context, after string) bool {
	c.checks.add("serves")
	c.srvMu.Lock()
	p := c.srv
	c.srvMu.Unlock()
	if p.exited() {
		c.violate("after %s the server exited on its own: %v", after, p.cmd.ProcessState)
		if err := c.start(); err != nil {
			c.violate("and does not start again: %v", err)
			return false
		}
	}
	if err := waitHealthy(ctx, c.api(), 90*time.Second); err != nil {
		c.violate("after %s the server does not serve: %v", after, err)
		return false
	}
	return true
}

// settle waits (up to 10 s) until no record is in a transitional state; one still creating
// or stopping after that may hold resources anyway.
func (c *campaign) settle(ctx context.Context, after string) {
	var busy []string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		recs, err := c.records(ctx)
		if err != nil {
			continue
		}
		busy = nil
		for id, r := range recs {
			if st := str(r["state"]); st == "creating" || st == "stopping" {
				busy = append(busy, id+" "+st)
			}
		}
		if len(busy) == 0 {
			return
		}
	}
	sort.Strings(busy)
	c.note("after %s, still in a transitional state 10 s later: %s", after, strings.Join(busy, ", "))
}

// hostIDs returns the sandbox ids the host holds something of, by what: the runtime's
// containers (with their status), the cgroups under the server's parent and the runtime's
// sandbox directories.
func (c *campaign) hostIDs() (containers map[string]string, others map[string][]string) {
	containers, others = map[string]string{}, map[string][]string{}
	root := filepath.Join(c.state, "runtimes", "runc", "state")
	if out, err := exec.Command("runc", "--root", root, "list", "--format", "json").Output(); err == nil {
		var list []struct {
			ID     string `json:"id"`
			Status string `json:"status"`
		}
		json.Unmarshal(out, &list)
		for _, x := range list {
			containers[x.ID] = x.Status
		}
	}
	cgroupRoots := []string{filepath.Join("/sys/fs/cgroup", c.parent)}
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err != nil { // v1: one hierarchy per controller
		cgroupRoots, _ = filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", c.parent))
	}
	for _, cr := range cgroupRoots {
		ents, _ := os.ReadDir(cr)
		for _, e := range ents {
			if e.IsDir() {
				others[e.Name()] = append(others[e.Name()], "cgroup "+filepath.Join(cr, e.Name()))
			}
		}
	}
	dirs, _ := filepath.Glob(filepath.Join(c.state, "runtimes", "runc", "sandboxes", "*"))
	for _, d := range dirs {
		others[filepath.Base(d)] = append(others[filepath.Base(d)], "directory "+d)
	}
	return containers, others
}

// checkHost: every record matches the host. A running record has its container running; what
// the host holds belongs to a record that may hold it (live, failed or lost); a destroyed one
// holds nothing, and a failed or lost one says why. Asked again for up to 20 s while it finds
// something: the server's control loop may be finishing a step.
func (c *campaign) checkHost(ctx context.Context, after string) {
	c.checks.add("host")
	var problems []string
	var leaks []string
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(time.Second) {
		problems, leaks = nil, nil
		recs, err := c.records(ctx)
		if err != nil {
			problems = append(problems, "records: "+err.Error())
		} else {
			containers, others := c.hostIDs()
			for id, status := range containers {
				r, ok := recs[id]
				switch {
				case !ok:
					problems = append(problems, fmt.Sprintf("container %s (%s) of no record", id, status))
				case !mayHold(str(r["state"])):
					problems = append(problems, fmt.Sprintf("container %s (%s) of a record in state %s", id, status, str(r["state"])))
				}
			}
			for id, what := range others {
				r, ok := recs[id]
				switch {
				case !ok:
					problems = append(problems, fmt.Sprintf("%s of no record", strings.Join(what, ", ")))
				case !mayHold(str(r["state"])):
					problems = append(problems, fmt.Sprintf("%s of a record in state %s", strings.Join(what, ", "), str(r["state"])))
				}
			}
			var dead []string
			for id, r := range recs {
				st := str(r["state"])
				switch {
				case st == "running" && containers[id] != "running":
					problems = append(problems, fmt.Sprintf("record %s is running; its container is %q", id, containers[id]))
				case (st == "failed" || st == "lost") && str(r["error"]) == "":
					problems = append(problems, fmt.Sprintf("record %s is %s with no reason", id, st))
				}
				if !mayHold(st) {
					dead = append(dead, id)
				}
			}
			if len(dead) > 0 {
				leaks = testenv.Leaks(dead...)
			}
		}
		if (len(problems) == 0 && len(leaks) == 0) || time.Now().After(deadline) {
			break
		}
	}
	for _, p := range problems {
		c.violate("after %s: store and host differ: %s", after, p)
	}
	if len(leaks) > 0 {
		c.led.addLeaked(len(leaks))
		c.violate("after %s: resources of destroyed sandboxes:\n%s", after, strings.Join(leaks, "\n"))
	}
}

// checkAcks: nothing the server acknowledged is missing — files written, jobs started and the
// output they had, runs' events, approvals decided and the audit records of answered calls.
func (c *campaign) checkAcks(ctx context.Context, after string) {
	recs, err := c.records(ctx)
	if err != nil {
		c.violate("after %s: records: %v", after, err)
		return
	}
	running := func(id string) bool { return str(recs[id]["state"]) == "running" }
	r := c.api()
	l := &c.led
	l.mu.Lock()
	files := map[string]map[string]string{}
	for id, fs := range l.files {
		if running(id) && !l.agentKilled[id] {
			files[id] = map[string]string{}
			for p, s := range fs {
				files[id][p] = s
			}
		}
	}
	jobs := append([]*jobAck(nil), l.jobs...)
	var runIDs []string
	for id := range l.runs {
		runIDs = append(runIDs, id)
	}
	approvals := map[string]string{}
	for a, s := range l.approvals {
		approvals[a] = s
	}
	execs := map[string]int{}
	for id, n := range l.execs {
		execs[id] = n
	}
	fullExecs := map[string]int{}
	for id, n := range l.execsDiskFull {
		fullExecs[id] = n
	}
	killedAgent := map[string]bool{}
	for id := range l.agentKilled {
		killedAgent[id] = true
	}
	l.mu.Unlock()

	c.checks.add("files")
	for id, fs := range files {
		for p, want := range fs {
			var got []byte
			err := r.do(ctx, "GET", "/v1/sandboxes/"+id+"/files", url.Values{"path": {p}}, nil, &got)
			if err != nil || string(got) != want {
				l.addLost(1)
				c.violate("after %s: file %s in %s (written, acknowledged): %d bytes, want %d (%v)", after, p, id, len(got), len(want), err)
			}
		}
	}

	c.checks.add("jobs")
	for _, j := range jobs {
		var jr jobReply
		if err := r.do(ctx, "GET", "/v1/sandboxes/"+j.sandbox+"/jobs/"+j.job, nil, nil, &jr); err != nil {
			if code(err) == "JOB_NOT_FOUND" {
				l.addLost(1)
				c.violate("after %s: job %s of %s, acknowledged, is not found", after, j.job, j.sandbox)
			}
			continue
		}
		if !running(j.sandbox) || killedAgent[j.sandbox] {
			continue
		}
		l.mu.Lock()
		ended, logs, killed := j.ended, j.logs, j.killedMarker
		l.mu.Unlock()
		if !ended && killed == "" {
			continue
		}
		var lg logsReply
		if err := r.do(ctx, "GET", "/v1/sandboxes/"+j.sandbox+"/jobs/"+j.job+"/logs", url.Values{"stream": {"stdout"}, "offset": {"0"}}, nil, &lg); err != nil {
			c.violate("after %s: logs of job %s in %s: %v", after, j.job, j.sandbox, err)
			continue
		}
		if ended && lg.bytes() != logs {
			l.addLost(1)
			c.violate("after %s: job %s in %s: stdout %q, read as %q when it ended", after, j.job, j.sandbox, lg.bytes(), logs)
		}
		if killed != "" && !strings.Contains(lg.bytes(), "start-"+killed) {
			l.addLost(1)
			c.violate("after %s: killed job %s in %s lost the line it wrote before the kill: %q", after, j.job, j.sandbox, lg.bytes())
		}
	}

	c.checks.add("runs")
	sort.Strings(runIDs)
	for _, id := range runIDs {
		c.pollRun(ctx, id)
	}

	c.checks.add("approvals")
	var approvedIDs []string
	for a, sb := range approvals {
		var ap approvalReply
		if err := r.do(ctx, "GET", "/v1/approvals/"+a, nil, nil, &ap); err != nil {
			l.addLost(1)
			c.violate("after %s: approval %s (approved for %s): %v", after, a, sb, err)
			continue
		}
		if ap.State != "approved" && ap.State != "used" {
			l.addLost(1)
			c.violate("after %s: approval %s, approved, is %s", after, a, ap.State)
		}
		if ap.State == "used" {
			approvedIDs = append(approvedIDs, a)
		}
	}

	c.checks.add("audit")
	rows, err := r.query(ctx, `SELECT sandbox_id, approval_id, action, tool FROM audit_log`)
	if err != nil {
		c.violate("after %s: audit log: %v", after, err)
		return
	}
	audited := map[string]int{}
	withApproval := map[string]bool{}
	for _, row := range rows {
		if a := str(row["action"]); a == "exec" || str(row["tool"]) == "exec" {
			audited[str(row["sandbox_id"])]++
		}
		withApproval[str(row["approval_id"])] = true
	}
	// Every acknowledged exec has its record, those answered while the state dir's file system
	// was full too: a call whose record the store refuses is not acknowledged (UNAVAILABLE).
	dropped := 0
	ids := map[string]bool{}
	for id := range execs {
		ids[id] = true
	}
	for id := range fullExecs {
		ids[id] = true
	}
	for id := range ids {
		n, full := execs[id], fullExecs[id]
		if audited[id] >= n+full {
			continue
		}
		missing := n + full - audited[id]
		if audited[id] >= n {
			dropped += missing
		}
		l.addLost(missing)
		c.violate("after %s: %d REST execs in %s were answered (%d of them while the disk was full); the audit log has %d exec records of it",
			after, n+full, id, full, audited[id])
	}
	l.mu.Lock()
	l.auditDroppedDiskFull = max(l.auditDroppedDiskFull, dropped)
	l.mu.Unlock()
	for _, a := range approvedIDs {
		if !withApproval[a] {
			l.addLost(1)
			c.violate("after %s: the call approval %s let through has no audit record", after, a)
		}
	}
}

// checkIdempotency: no idempotency key made two sandboxes (the records' idempotency_key, of
// every state; a fork copies its source's labels, not its key).
func (c *campaign) checkIdempotency(ctx context.Context, after string) {
	c.checks.add("idempotency")
	var list struct {
		Sandboxes []struct {
			ID  string `json:"sandbox_id"`
			Key string `json:"idempotency_key"`
		} `json:"sandboxes"`
	}
	q := url.Values{"state": {"creating,running,stopping,sleeping,destroyed,failed,lost"}, "limit": {"1000"}}
	if err := c.api().do(ctx, "GET", "/v1/sandboxes", q, nil, &list); err != nil {
		c.violate("after %s: list sandboxes: %v", after, err)
		return
	}
	byKey := map[string][]string{}
	for _, sb := range list.Sandboxes {
		if sb.Key != "" {
			byKey[sb.Key] = append(byKey[sb.Key], sb.ID)
		}
	}
	for k, ids := range byKey {
		if len(ids) > 1 {
			c.violate("after %s: idempotency key %s made %d sandboxes: %v", after, k, len(ids), ids)
		}
	}
}

// checkCapacity: the capacity reply's live count and sums are the live records' (the pool
// refills meanwhile: asked again a few times).
func (c *campaign) checkCapacity(ctx context.Context, after string) {
	c.checks.add("capacity")
	var last string
	for i := 0; i < 5; i++ {
		var cp capacityReply
		if err := c.api().do(ctx, "GET", "/v1/capacity", nil, nil, &cp); err != nil {
			last = err.Error()
			continue
		}
		recs, err := c.records(ctx)
		if err != nil {
			last = err.Error()
			continue
		}
		var live, sleeping int
		var cpu float64
		var mem, disk int64
		for _, r := range recs {
			st := str(r["state"])
			if !liveState(st) {
				continue
			}
			live++
			disk += int64(num(r["disk_mb"]))
			if st == "sleeping" { // a sleeping sandbox holds its disk, not its cpu or memory
				sleeping++
				continue
			}
			cpu += num(r["cpu"])
			mem += int64(num(r["memory_mb"]))
		}
		got := fmt.Sprintf("live %d sleeping %d cpu %.2f memory %d MiB disk %d MiB", cp.Live, cp.Sleeping, cp.CPUUsed, cp.MemoryUsedMB, cp.DiskUsedMB)
		want := fmt.Sprintf("live %d sleeping %d cpu %.2f memory %d MiB disk %d MiB", live, sleeping, cpu, mem, disk)
		if got == want && cp.Live <= cp.MaxSandboxes && math.Abs(cp.CPUUsed-cpu) < 0.01 {
			return
		}
		last = fmt.Sprintf("capacity says %s; the records, %s (bound %d)", got, want, cp.MaxSandboxes)
		time.Sleep(time.Second)
	}
	c.violate("after %s: %s", after, last)
}

// settleRuns waits (up to 4 minutes) for every acknowledged run to settle.
func (c *campaign) settleRuns() {
	ctx := context.Background()
	c.led.mu.Lock()
	var ids []string
	for id := range c.led.runs {
		ids = append(ids, id)
	}
	c.led.mu.Unlock()
	sort.Strings(ids)
	deadline := time.Now().Add(4 * time.Minute)
	for _, id := range ids {
		for {
			var run runReply
			err := c.api().do(ctx, "GET", "/v1/runs/"+id, nil, nil, &run)
			if err == nil && (run.State == "succeeded" || run.State == "failed" || run.State == "errored" || run.State == "canceled" || run.State == "timed_out") {
				c.ops.add("run:" + run.State)
				if run.State == "errored" {
					c.opErrs.add("run_errored:" + firstWords(run.Reason, 6))
				}
				break
			}
			if time.Now().After(deadline) {
				c.violate("run %s has not settled 4 minutes after the campaign: %+v %v", id, run, err)
				break
			}
			time.Sleep(500 * time.Millisecond)
		}
		c.pollRun(ctx, id)
	}
	c.checks.add("runs-settled")
}

func sortStrings(s []string) { sort.Strings(s) }

func firstWords(s string, n int) string {
	w := strings.Fields(s)
	if len(w) > n {
		w = w[:n]
	}
	return strings.Join(w, "_")
}
