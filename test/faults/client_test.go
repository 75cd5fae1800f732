package faults

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// client is one of the campaign's concurrent users: it owns a few sandboxes and does a
// weighted random mix of operations on them, recording what the server acknowledged.
type client struct {
	c    *campaign
	n    int
	rng  *rand.Rand
	seq  int
	mine []string // sandboxes this client created (and has not destroyed)
	// pending: idempotency keys whose create got no answer; a retry must not make a second.
	pending []string
	egress  string // this client's sandbox with a network policy
}

type op struct {
	name   string
	weight int
	fn     func(*client, context.Context) error
}

var ops = []op{
	{"create", 10, (*client).create},
	{"create_retry", 3, (*client).createRetry},
	{"destroy", 5, (*client).destroy},
	{"exec_rest", 12, (*client).execREST},
	{"exec_mcp", 5, (*client).execMCP},
	{"cli", 4, (*client).cli},
	{"files", 10, (*client).files},
	{"job", 7, (*client).job},
	{"job_cancel", 2, (*client).jobCancel},
	{"run_start", 3, (*client).runStart},
	{"run_poll", 3, (*client).runPoll},
	{"snapshot_fork", 3, (*client).snapshotFork},
	{"sleep_wake", 3, (*client).sleepWake},
	{"egress", 3, (*client).egressOp},
	{"approval", 3, (*client).approval},
}

// errSkip: the operation had nothing to act on.
var errSkip = fmt.Errorf("skipped")

func (cl *client) loop(ctx context.Context) {
	var mix []op
	total := 0
	for _, o := range ops {
		if !cl.c.set.skip[o.name] || o.name == "create" {
			mix = append(mix, o)
			total += o.weight
		}
	}
	for ctx.Err() == nil {
		o := ops[0]
		if len(cl.mine) > 0 {
			k := cl.rng.IntN(total)
			for _, cand := range mix {
				if k < cand.weight {
					o = cand
					break
				}
				k -= cand.weight
			}
		}
		cl.c.gate.RLock()
		octx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		err := o.fn(cl, octx)
		cancel()
		cl.c.gate.RUnlock()
		switch {
		case err == errSkip:
		case err != nil:
			cl.c.ops.add(o.name + ":failed")
			cl.c.opErrs.sample(o.name+":"+code(err), err.Error())
		default:
			cl.c.ops.add(o.name)
		}
		time.Sleep(time.Duration(50+cl.rng.IntN(250)) * time.Millisecond)
	}
}

func (cl *client) pick() (string, bool) {
	if len(cl.mine) == 0 {
		return "", false
	}
	return cl.mine[cl.rng.IntN(len(cl.mine))], true
}

func (cl *client) marker() string {
	cl.seq++
	return fmt.Sprintf("m%d-%d-%x", cl.n, cl.seq, cl.rng.Uint32())
}

func (cl *client) create(ctx context.Context) error {
	if len(cl.mine) >= 4 {
		return cl.destroy(ctx)
	}
	key := "k-" + cl.marker()
	body := map[string]any{"cpu": shapeCPU, "memory_mb": shapeMemory, "disk_mb": shapeDisk, "ttl_seconds": 3600,
		"labels": map[string]string{"fk": key, "client": fmt.Sprint(cl.n)}, "idempotency_key": key}
	l := &cl.c.led
	l.mu.Lock()
	l.keyBody[key] = body
	l.mu.Unlock()
	var sb sandboxReply
	if err := cl.c.api().do(ctx, "POST", "/v1/sandboxes", nil, body, &sb); err != nil {
		cl.pending = append(cl.pending, key)
		return err
	}
	cl.acked(key, sb.ID)
	cl.mine = append(cl.mine, sb.ID)
	if cl.rng.IntN(4) == 0 { // a client retrying at once, as after a timeout
		return cl.retry(ctx, key)
	}
	return nil
}

// acked records key's acknowledged create of id; a key that returns another sandbox than its
// first acknowledged one breaks the idempotency promise.
func (cl *client) acked(key, id string) {
	l := &cl.c.led
	l.mu.Lock()
	prev, ok := l.keys[key]
	if !ok {
		l.keys[key] = id
	}
	l.created[id], l.seenIDs[id] = true, true
	l.mu.Unlock()
	if ok && prev != id {
		cl.c.violate("idempotency key %s created twice: %s, then %s", key, prev, id)
	}
}

func (cl *client) retry(ctx context.Context, key string) error {
	l := &cl.c.led
	l.mu.Lock()
	body, prev := l.keyBody[key], l.keys[key]
	destroyed := prev != "" && l.destroyed[prev]
	l.mu.Unlock()
	if destroyed {
		return errSkip
	}
	var sb sandboxReply
	if err := cl.c.api().do(ctx, "POST", "/v1/sandboxes", nil, body, &sb); err != nil {
		return err
	}
	if prev == "" { // the first create's answer was lost: this is its sandbox
		cl.mine = append(cl.mine, sb.ID)
		for i, k := range cl.pending {
			if k == key {
				cl.pending = append(cl.pending[:i], cl.pending[i+1:]...)
				break
			}
		}
	}
	cl.acked(key, sb.ID)
	return nil
}

// createRetry retries an earlier create: one whose answer was lost, or an acknowledged one.
func (cl *client) createRetry(ctx context.Context) error {
	if len(cl.pending) > 0 && cl.rng.IntN(2) == 0 {
		return cl.retry(ctx, cl.pending[cl.rng.IntN(len(cl.pending))])
	}
	id, ok := cl.pick()
	if !ok {
		return errSkip
	}
	l := &cl.c.led
	l.mu.Lock()
	key := ""
	for k, v := range l.keys {
		if v == id {
			key = k
		}
	}
	l.mu.Unlock()
	if key == "" { // a fork's sandbox has no key
		return errSkip
	}
	return cl.retry(ctx, key)
}

func (cl *client) forget(id string) {
	for i, m := range cl.mine {
		if m == id {
			cl.mine = append(cl.mine[:i], cl.mine[i+1:]...)
			return
		}
	}
}

func (cl *client) destroy(ctx context.Context) error {
	id, ok := cl.pick()
	if !ok {
		return errSkip
	}
	if err := cl.c.api().do(ctx, "DELETE", "/v1/sandboxes/"+id, nil, nil, nil); err != nil && code(err) != "SANDBOX_NOT_FOUND" {
		return err
	}
	cl.forget(id)
	if id == cl.egress {
		cl.egress = ""
	}
	l := &cl.c.led
	l.mu.Lock()
	l.destroyed[id] = true
	l.mu.Unlock()
	return nil
}

// dead reports whether err says the sandbox is gone for good (lost, failed, destroyed): the
// client then stops using it.
func (cl *client) dead(id string, err error) {
	if c := code(err); c == "SANDBOX_NOT_RUNNING" || c == "SANDBOX_NOT_FOUND" {
		var sb sandboxReply
		gctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if cl.c.api().do(gctx, "GET", "/v1/sandboxes/"+id, nil, nil, &sb) == nil && sb.State != "running" && sb.State != "sleeping" && sb.State != "creating" {
			cl.forget(id)
		}
	}
}

func (cl *client) execREST(ctx context.Context) error {
	id, ok := cl.pick()
	if !ok {
		return errSkip
	}
	m := cl.marker()
	var r execReply
	if err := cl.c.api().do(ctx, "POST", "/v1/sandboxes/"+id+"/exec", nil,
		map[string]any{"command": []string{"sh", "-c", "echo " + m}}, &r); err != nil {
		cl.dead(id, err)
		return err
	}
	l := &cl.c.led
	l.mu.Lock()
	if cl.c.fullDisk.Load() {
		l.execsDiskFull[id]++
	} else {
		l.execs[id]++
	}
	l.mu.Unlock()
	if r.ExitCode == 0 && r.Stdout != m+"\n" {
		cl.c.violate("exec in %s: stdout %q, want %q", id, r.Stdout, m+"\n")
	}
	return nil
}

// bearer adds the token to every request of the MCP client.
type bearer struct{ rt http.RoundTripper }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+token)
	return b.rt.RoundTrip(r)
}

func (cl *client) execMCP(ctx context.Context) error {
	id, ok := cl.pick()
	if !ok {
		return errSkip
	}
	m := cl.marker()
	mc := mcp.NewClient(&mcp.Implementation{Name: "faults", Version: "1"}, nil)
	cs, err := mc.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: cl.c.api().base + "/mcp",
		HTTPClient: &http.Client{Transport: bearer{httpClient.Transport}}}, nil)
	if err != nil {
		return &apiError{Err: err}
	}
	defer cs.Close()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "exec", Arguments: map[string]any{
		"sandbox_id": id, "command": []string{"echo", m}}})
	if err != nil {
		return &apiError{Err: err}
	}
	b, _ := json.Marshal(res)
	if res.IsError {
		var e struct {
			Code string `json:"code"`
		}
		if sc, ok := res.StructuredContent.(map[string]any); ok {
			if em, ok := sc["error"].(map[string]any); ok {
				e.Code = str(em["code"])
			}
		}
		if e.Code == "" {
			e.Code = "mcp_error"
		}
		err := &apiError{Status: 200, Code: e.Code, Message: string(b)}
		cl.dead(id, err)
		return err
	}
	if !bytes.Contains(b, []byte(m)) {
		cl.c.violate("MCP exec in %s: result %s lacks %q", id, b, m)
	}
	return nil
}

func (cl *client) cli(ctx context.Context) error {
	r := cl.c.api()
	var args []string
	m := cl.marker()
	id, ok := cl.pick()
	if ok && cl.rng.IntN(3) > 0 {
		args = []string{"exec", id, "--", "echo", m}
	} else {
		args, m = []string{"sandbox", "ls"}, ""
	}
	cmd := exec.CommandContext(ctx, cl.c.bin, args...)
	cmd.Env = append(os.Environ(), "AGENTBOX_URL="+r.base, "AGENTBOX_TOKEN="+token)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	if err := cmd.Run(); err != nil {
		return &apiError{Status: 0, Code: "cli_exit", Message: err.Error() + ": " + e.String()}
	}
	if m != "" && !strings.Contains(o.String(), m) {
		cl.c.violate("CLI exec in %s: stdout %q lacks %q", id, o.String(), m)
	}
	return nil
}

func (cl *client) files(ctx context.Context) error {
	id, ok := cl.pick()
	if !ok {
		return errSkip
	}
	m := cl.marker()
	p := "/workspace/f-" + m
	content := strings.Repeat(m+"\n", 1+cl.rng.IntN(200))
	r := cl.c.api()
	if err := r.do(ctx, "PUT", "/v1/sandboxes/"+id+"/files", url.Values{"path": {p}, "mode": {"0644"}}, []byte(content), nil); err != nil {
		cl.dead(id, err)
		return err
	}
	l := &cl.c.led
	l.mu.Lock()
	if l.files[id] == nil {
		l.files[id] = map[string]string{}
	}
	l.files[id][p] = content
	l.mu.Unlock()
	var got []byte
	if err := r.do(ctx, "GET", "/v1/sandboxes/"+id+"/files", url.Values{"path": {p}}, nil, &got); err != nil {
		return err
	}
	if string(got) != content {
		cl.c.led.addLost(1)
		cl.c.violate("file %s in %s read back %d bytes, written %d", p, id, len(got), len(content))
	}
	return nil
}

// jobScript prints what jobOutput expects.
func jobScript(m string) string {
	return "echo start-" + m + "; for i in 1 2 3 4 5; do echo line-$i; sleep 0.2; done; echo end-" + m
}

func jobOutput(m string) string {
	return "start-" + m + "\nline-1\nline-2\nline-3\nline-4\nline-5\nend-" + m + "\n"
}

func (cl *client) job(ctx context.Context) error {
	id, ok := cl.pick()
	if !ok {
		return errSkip
	}
	m := cl.marker()
	r := cl.c.api()
	var j jobReply
	if err := r.do(ctx, "POST", "/v1/sandboxes/"+id+"/jobs", nil, map[string]any{"command": []string{"sh", "-c", jobScript(m)}}, &j); err != nil {
		cl.dead(id, err)
		return err
	}
	ack := &jobAck{sandbox: id, job: j.ID}
	l := &cl.c.led
	l.mu.Lock()
	l.jobs = append(l.jobs, ack)
	l.mu.Unlock()
	if err := r.do(ctx, "GET", "/v1/sandboxes/"+id+"/jobs/"+j.ID+"/wait", url.Values{"timeout_seconds": {"60"}}, nil, &j); err != nil {
		return err
	}
	if j.State == "running" || j.State == "starting" {
		return nil // still running after a minute on a loaded host: checked later
	}
	var lg logsReply
	if err := r.do(ctx, "GET", "/v1/sandboxes/"+id+"/jobs/"+j.ID+"/logs", url.Values{"stream": {"stdout"}, "offset": {"0"}}, nil, &lg); err != nil {
		return err
	}
	l.mu.Lock()
	ack.ended, ack.logs = true, lg.bytes()
	l.mu.Unlock()
	if j.State == "exited" && lg.bytes() != jobOutput(m) {
		cl.c.led.addLost(1)
		cl.c.violate("job %s in %s exited; its stdout is %q, want %q", j.ID, id, lg.bytes(), jobOutput(m))
	}
	return nil
}

func (cl *client) runStart(ctx context.Context) error {
	m := cl.marker()
	var run runReply
	spec := map[string]any{"repo_url": "file://" + cl.c.repos + "/repo", "ref": "main",
		"command": []string{"sh", "-c", "cat README; echo run-" + m}, "labels": map[string]string{"client": fmt.Sprint(cl.n)},
		"idempotency_key": "r-" + m, "timeout_seconds": 600}
	if err := cl.c.api().do(ctx, "POST", "/v1/runs", nil, spec, &run); err != nil {
		return err
	}
	l := &cl.c.led
	l.mu.Lock()
	if l.runs[run.ID] == nil {
		l.runs[run.ID] = map[int64]string{}
	}
	l.mu.Unlock()
	return nil
}

func (cl *client) runPoll(ctx context.Context) error {
	l := &cl.c.led
	l.mu.Lock()
	var ids []string
	for id := range l.runs {
		ids = append(ids, id)
	}
	l.mu.Unlock()
	if len(ids) == 0 {
		return errSkip
	}
	// Map order is random; the seed's choice is by sorted position.
	sortStrings(ids)
	return cl.c.pollRun(ctx, ids[cl.rng.IntN(len(ids))])
}

// pollRun reads a run's events and checks that every event seen before is still there.
func (c *campaign) pollRun(ctx context.Context, id string) error {
	var ev struct {
		Events []runEvent `json:"events"`
	}
	if err := c.api().do(ctx, "GET", "/v1/runs/"+id+"/events", url.Values{"after": {"0"}, "limit": {"1000"}}, nil, &ev); err != nil {
		if code(err) == "RUN_NOT_FOUND" {
			c.violate("run %s, acknowledged, is not found", id)
		}
		return err
	}
	now := map[int64]string{}
	for _, e := range ev.Events {
		now[e.Seq] = e.To
	}
	l := &c.led
	l.mu.Lock()
	defer l.mu.Unlock()
	for seq, to := range l.runs[id] {
		if now[seq] != to {
			l.lost++
			c.violate("run %s: event %d (to %s), seen before, is now %q", id, seq, to, now[seq])
		}
	}
	for seq, to := range now {
		l.runs[id][seq] = to
	}
	return nil
}

func (cl *client) snapshotFork(ctx context.Context) error {
	id, ok := cl.pick()
	if !ok || len(cl.mine) >= 4 {
		return errSkip
	}
	r := cl.c.api()
	var sn struct {
		ID string `json:"snapshot_id"`
	}
	if err := r.do(ctx, "POST", "/v1/sandboxes/"+id+"/snapshots", nil, map[string]any{}, &sn); err != nil {
		cl.dead(id, err)
		return err
	}
	var fk struct {
		Sandboxes []sandboxReply `json:"sandboxes"`
	}
	err := r.do(ctx, "POST", "/v1/sandboxes/"+id+"/fork", nil, map[string]any{"snapshot_id": sn.ID, "count": 1, "ttl_seconds": 3600}, &fk)
	for _, s := range fk.Sandboxes {
		cl.mine = append(cl.mine, s.ID)
		l := &cl.c.led
		l.mu.Lock()
		l.created[s.ID], l.seenIDs[s.ID] = true, true
		l.mu.Unlock()
	}
	r.do(ctx, "DELETE", "/v1/snapshots/"+sn.ID, nil, nil, nil) // room on the small file system
	return err
}

func (cl *client) sleepWake(ctx context.Context) error {
	id, ok := cl.pick()
	if !ok {
		return errSkip
	}
	r := cl.c.api()
	var sb sandboxReply
	if err := r.do(ctx, "POST", "/v1/sandboxes/"+id+"/sleep", nil, nil, &sb); err != nil {
		cl.dead(id, err)
		return err
	}
	if err := r.do(ctx, "POST", "/v1/sandboxes/"+id+"/wake", nil, nil, &sb); err != nil {
		return err
	}
	if sb.State != "running" {
		cl.c.violate("wake of %s acknowledged in state %s", id, sb.State)
	}
	return nil
}

// egressOp asks for a host the sandbox's policy does not allow and checks that the refusal is
// recorded by the time the sandbox sees it.
func (cl *client) egressOp(ctx context.Context) error {
	r := cl.c.api()
	if cl.egress == "" {
		var sb sandboxReply
		key := "e-" + cl.marker()
		body := map[string]any{"memory_mb": shapeMemory, "disk_mb": shapeDisk, "ttl_seconds": 3600, "idempotency_key": key,
			"labels": map[string]string{"fk": key}, "network": map[string]any{"allow": []string{"allowed.invalid"}}}
		l := &cl.c.led
		l.mu.Lock()
		l.keyBody[key] = body
		l.mu.Unlock()
		if err := r.do(ctx, "POST", "/v1/sandboxes", nil, body, &sb); err != nil {
			cl.pending = append(cl.pending, key)
			return err
		}
		cl.acked(key, sb.ID)
		cl.egress = sb.ID
		cl.mine = append(cl.mine, sb.ID)
	}
	host := "denied-" + cl.marker() + ".invalid"
	var ex execReply
	if err := r.do(ctx, "POST", "/v1/sandboxes/"+cl.egress+"/exec", nil, map[string]any{"command": []string{"sh", "-c",
		"curl -s -o /dev/null -w '%{http_code}' --max-time 20 http://" + host + "/"}}, &ex); err != nil {
		cl.dead(cl.egress, err)
		return err
	}
	var conns struct {
		Connections []struct {
			Host     string `json:"host"`
			Decision string `json:"decision"`
		} `json:"connections"`
	}
	if err := r.do(ctx, "GET", "/v1/sandboxes/"+cl.egress+"/connections", url.Values{"limit": {"1000"}}, nil, &conns); err != nil {
		return err
	}
	found := func() bool {
		for _, cn := range conns.Connections {
			if cn.Host == host {
				return true
			}
		}
		return false
	}
	if found() {
		return nil
	}
	// Not there yet: how late is it?
	refused := time.Now()
	for time.Since(refused) < 10*time.Second {
		time.Sleep(50 * time.Millisecond)
		if r.do(ctx, "GET", "/v1/sandboxes/"+cl.egress+"/connections", url.Values{"limit": {"1000"}}, nil, &conns) == nil && found() {
			cl.c.violate("egress: the refused request to %s (the sandbox saw %q) was not among %s's connections right after it; it came %s later",
				host, ex.Stdout, cl.egress, time.Since(refused).Round(10*time.Millisecond))
			return nil
		}
	}
	cl.c.violate("egress: the refused request to %s (the sandbox saw %q) is not among %s's connections, even 10 s after it", host, ex.Stdout, cl.egress)
	return nil
}

// approval makes a gated call (sandbox_extend, behind --approval-tools) and approves it as
// the admin, as an operator would.
func (cl *client) approval(ctx context.Context) error {
	id, ok := cl.pick()
	if !ok {
		return errSkip
	}
	r := cl.c.api()
	done := make(chan error, 1)
	// An approval covers one call with exactly these arguments: each extend asks for another TTL.
	ttl := 3600 + cl.rng.IntN(3600)
	go func() {
		done <- r.do(ctx, "POST", "/v1/sandboxes/"+id+"/extend", nil, map[string]any{"ttl_seconds": ttl}, nil)
	}()
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		select {
		case err := <-done:
			cl.dead(id, err)
			if err == nil {
				return fmt.Errorf("a gated extend returned without a decision")
			}
			return err
		default:
		}
		var list struct {
			Approvals []approvalReply `json:"approvals"`
		}
		if err := r.do(ctx, "GET", "/v1/approvals", url.Values{"state": {"pending"}}, nil, &list); err != nil {
			<-done
			return err
		}
		for _, a := range list.Approvals {
			if a.SandboxID != id {
				continue
			}
			var dec approvalReply
			if err := r.do(ctx, "POST", "/v1/approvals/"+a.ID+"/approve", nil, map[string]any{"reason": "faults campaign"}, &dec); err != nil {
				<-done
				return err
			}
			err := <-done
			if err == nil { // the gated call was answered: its approval and audit record are promised
				l := &cl.c.led
				l.mu.Lock()
				l.approvals[a.ID] = id
				l.mu.Unlock()
			}
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
	return <-done
}

// jobCancel starts a job that leaves its process group (setsid), cancels it, and checks that a
// job reported canceled has nothing of it left running.
func (cl *client) jobCancel(ctx context.Context) error {
	id, ok := cl.pick()
	if !ok {
		return errSkip
	}
	m := cl.marker()
	r := cl.c.api()
	var j jobReply
	script := "setsid sh -c 'sleep 300; echo inner-" + m + "' & echo started-" + m + "; sleep 300; echo outer-" + m
	if err := r.do(ctx, "POST", "/v1/sandboxes/"+id+"/jobs", nil, map[string]any{"command": []string{"sh", "-c", script}}, &j); err != nil {
		cl.dead(id, err)
		return err
	}
	for deadline := time.Now().Add(20 * time.Second); len(pidsOf(id, "inner-"+m)) == 0; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			return fmt.Errorf("job %s in %s: its setsid process never showed", j.ID, id)
		}
	}
	if err := r.do(ctx, "POST", "/v1/sandboxes/"+id+"/jobs/"+j.ID+"/cancel", nil, map[string]any{"grace_seconds": 1}, &j); err != nil {
		return err
	}
	if j.State != "canceled" {
		return nil // it ended some other way first
	}
	var left []int
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if left = pidsOf(id, m); len(left) == 0 {
			return nil
		}
	}
	cl.c.violate("job %s in %s is reported canceled; its processes %v (one left its process group) still run", j.ID, id, left)
	for _, pid := range left {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	return nil
}
