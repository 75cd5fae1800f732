package faults

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/faultpoint"
	"github.com/agentbox/agentbox/internal/testenv"
)

// Regression tests of defects the campaign found, each against a real server and runtime.

// lone is one server of the built binary on a state dir of its own (a small loop-mounted file
// system when sizeMB > 0), stopped and checked for leaks at the end of the test.
type lone struct {
	t      *testing.T
	bin    string
	state  string
	parent string
	logs   *testenv.SyncBuffer
	p      *proc
}

func newLone(t *testing.T, sizeMB int64) *lone {
	t.Helper()
	testenv.RequireRoot(t)
	base := testenv.ShortTempDir(t, "abr")
	l := &lone{t: t, bin: testenv.Binary(t), state: filepath.Join(base, "s"), parent: "abregress-" + filepath.Base(base), logs: &testenv.SyncBuffer{}}
	if sizeMB > 0 {
		loopFS(t, l.state, sizeMB)
	} else if err := os.MkdirAll(l.state, 0o711); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if l.p != nil && !l.p.stop() {
			t.Errorf("the server did not stop on SIGTERM within 30 s")
		}
		if t.Failed() {
			t.Logf("server log:\n%s", tail(l.logs.String(), 6000))
		}
	})
	return l
}

func (l *lone) start(bin string, env ...string) {
	l.t.Helper()
	p, err := startServe(bin, l.state, append(env, "AGENTBOX_TOKEN="+token), l.logs, "--cgroup-parent", l.parent, "--ready-timeout", "90s")
	if err != nil {
		l.t.Fatalf("start: %v\n%s", err, tail(l.logs.String(), 4000))
	}
	l.p = p
}

func (l *lone) api() rest { return rest{base: l.p.url, token: token, hc: httpClient} }

func (l *lone) create(ctx context.Context, key string) (sandboxReply, error) {
	var sb sandboxReply
	err := l.api().do(ctx, "POST", "/v1/sandboxes", nil, map[string]any{"cpu": shapeCPU, "memory_mb": shapeMemory,
		"disk_mb": shapeDisk, "ttl_seconds": 600, "idempotency_key": key}, &sb)
	return sb, err
}

func (l *lone) state1(ctx context.Context, id string) (string, string) {
	rows, err := l.api().query(ctx, `SELECT state, error FROM sandboxes WHERE id = '`+id+`'`)
	if err != nil || len(rows) != 1 {
		l.t.Fatalf("record of %s: %v (%d rows)", id, err, len(rows))
	}
	return str(rows[0]["state"]), str(rows[0]["error"])
}

// TestFullStateDirRefusesCleanly: with the state dir's file system full, the store's refusals
// are UNAVAILABLE (503, Retry-After), never INTERNAL; no exec is acknowledged without its
// audit record; a sleep is refused (RESOURCE_EXHAUSTED or UNAVAILABLE) and the sandbox runs on,
// never lost; once space is back everything works.
func TestFullStateDirRefusesCleanly(t *testing.T) {
	l := newLone(t, 1024)
	l.start(l.bin)
	ctx := t.Context()
	sb, err := l.create(ctx, "full-1")
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	filler, err := fillFS(l.state)
	if err != nil {
		t.Fatalf("fill the state dir: %v", err)
	}
	removed := false
	free := func() {
		if !removed {
			os.Remove(filler)
			removed = true
		}
	}
	defer free()

	// Sleep: refused, the sandbox running.
	var slept sandboxReply
	err = l.api().do(ctx, "POST", "/v1/sandboxes/"+sb.ID+"/sleep", nil, nil, &slept)
	if c := code(err); c != "RESOURCE_EXHAUSTED" && c != "UNAVAILABLE" {
		t.Errorf("sleep on a full state dir: %v (state %q); want RESOURCE_EXHAUSTED or UNAVAILABLE, the sandbox running", err, slept.State)
	}

	// Execs: each acknowledged one must have its record; the full disk must refuse some.
	acked, refused := 0, 0
	for i := 0; i < 40 && refused < 3; i++ {
		var r execReply
		err := l.api().do(ctx, "POST", "/v1/sandboxes/"+sb.ID+"/exec", nil, map[string]any{"command": []string{"true"}}, &r)
		switch c := code(err); c {
		case "":
			acked++
		case "UNAVAILABLE":
			refused++
			if ae := err.(*apiError); ae.Status != http.StatusServiceUnavailable {
				t.Errorf("UNAVAILABLE with status %d, want 503", ae.Status)
			}
		default:
			t.Errorf("exec on a full state dir: %v; want success or UNAVAILABLE", err)
		}
	}
	if refused == 0 {
		t.Fatalf("the full state dir refused none of %d execs' audit records: this test proves nothing here", acked)
	}
	// A store write answered 503 with Retry-After, never 500 INTERNAL.
	req, _ := http.NewRequestWithContext(ctx, "POST", l.p.url+"/v1/sandboxes", strings.NewReader(`{"cpu":0.5,"memory_mb":256,"disk_mb":256,"idempotency_key":"full-2"}`))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Errorf("create on a full state dir: %d (Retry-After %q); want 503 with a Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}

	free()
	if st, e := l.state1(ctx, sb.ID); st != "running" {
		t.Errorf("after the full disk: sandbox %s is %s (%s); want running", sb.ID, st, e)
	}
	rows, err := l.api().query(ctx, `SELECT count(*) AS n FROM audit_log WHERE sandbox_id = '`+sb.ID+`' AND action = 'exec' AND outcome = 'ok'`)
	if err != nil || len(rows) != 1 {
		t.Fatalf("audit: %v", err)
	}
	if n, _ := rows[0]["n"].(float64); int(n) < acked {
		t.Errorf("%d execs were acknowledged while the disk was full; the audit log has %v records of them", acked, rows[0]["n"])
	}
	var r execReply
	if err := l.api().do(ctx, "POST", "/v1/sandboxes/"+sb.ID+"/exec", nil, map[string]any{"command": []string{"true"}}, &r); err != nil {
		t.Errorf("exec once space is back: %v", err)
	}
	if err := l.api().do(ctx, "DELETE", "/v1/sandboxes/"+sb.ID, nil, nil, nil); err != nil {
		t.Errorf("destroy: %v", err)
	}
}

// buildFaultBinary builds the server with its fault points (-tags faultpoints).
func buildFaultBinary(t *testing.T) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "agentbox-faultpoints")
	cmd := exec.Command("go", "build", "-tags", "faultpoints", "-o", out, "./cmd/agentbox")
	cmd.Dir = testenv.ModuleRoot(t)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build agentbox -tags faultpoints: %v\n%s", err, b)
	}
	return out
}

// TestCreateConvergesWhenItsRecordWriteFails: a create whose last write (creating → running)
// keeps failing is torn down and recorded failed with its reason at once — never left creating
// until its deadline, nothing left on the host; one that fails once is retried and runs.
func TestCreateConvergesWhenItsRecordWriteFails(t *testing.T) {
	l := newLone(t, 0)
	bin := buildFaultBinary(t)
	l.start(bin, faultpoint.FailEnvVar+"="+faultpoint.CreateRunningWrite+":1000")
	ctx := t.Context()
	began := time.Now()
	_, err := l.create(ctx, "conv-1")
	if c := code(err); c != "UNAVAILABLE" {
		t.Fatalf("create whose running write fails: %v; want UNAVAILABLE", err)
	}
	rows, err := l.api().query(ctx, `SELECT id, state, error FROM sandboxes`)
	if err != nil || len(rows) != 1 {
		t.Fatalf("records: %v (%d)", err, len(rows))
	}
	id, st := str(rows[0]["id"]), str(rows[0]["state"])
	if st != "failed" || !strings.Contains(str(rows[0]["error"]), "could not be written running") {
		t.Errorf("after its create failed (%s): sandbox %s is %s (%q); want failed with the reason", time.Since(began).Round(time.Millisecond), id, st, str(rows[0]["error"]))
	}
	if leaks := testenv.LeaksAfter(15*time.Second, id); len(leaks) > 0 {
		t.Errorf("a create torn down left host resources:\n%s", strings.Join(leaks, "\n"))
	}
	if !l.p.stop() {
		t.Fatal("the server did not stop")
	}
	l.start(bin, faultpoint.FailEnvVar+"="+faultpoint.CreateRunningWrite+":1")
	sb, err := l.create(ctx, "conv-2")
	if err != nil || sb.State != "running" {
		t.Fatalf("create whose running write fails once: %v (state %q); want it retried and running", err, sb.State)
	}
	if err := l.api().do(ctx, "DELETE", "/v1/sandboxes/"+sb.ID, nil, nil, nil); err != nil {
		t.Errorf("destroy: %v", err)
	}
}

// TestTwoServersNeverShareHostIDs: two servers on one host with default flags (each its own
// state dir and store) hand their sandboxes disjoint host id ranges — before the host-wide
// claims both began their pools at the same base.
func TestTwoServersNeverShareHostIDs(t *testing.T) {
	a, b := newLone(t, 0), newLone(t, 0)
	a.start(a.bin)
	b.start(b.bin)
	ctx := t.Context()
	type rng struct {
		server      string
		id          string
		base, count int64
	}
	var all []rng
	for _, l := range []*lone{a, b} {
		for i := range 2 {
			sb, err := l.create(ctx, fmt.Sprintf("ids-%d", i))
			if err != nil {
				t.Fatalf("create on %s: %v", l.state, err)
			}
			t.Cleanup(func() { l.api().do(context.Background(), "DELETE", "/v1/sandboxes/"+sb.ID, nil, nil, nil) })
			// The host ids the sandbox really maps: its user namespace's uid_map.
			var r execReply
			if err := l.api().do(ctx, "POST", "/v1/sandboxes/"+sb.ID+"/exec", nil, map[string]any{"command": []string{"cat", "/proc/self/uid_map"}}, &r); err != nil {
				t.Fatalf("uid_map of %s: %v", sb.ID, err)
			}
			var inside, base, count int64
			if _, err := fmt.Sscan(r.Stdout, &inside, &base, &count); err != nil || inside != 0 || count < 1 {
				t.Fatalf("uid_map of %s: %q (%v)", sb.ID, r.Stdout, err)
			}
			all = append(all, rng{l.state, sb.ID, base, count})
		}
	}
	for i := range all {
		for j := i + 1; j < len(all); j++ {
			x, y := all[i], all[j]
			if x.base < y.base+y.count && y.base < x.base+x.count {
				t.Errorf("sandboxes %s (%s) and %s (%s) share host ids: [%d, %d) and [%d, %d)", x.id, x.server, y.id, y.server, x.base, x.base+x.count, y.base, y.base+y.count)
			}
		}
	}
}
