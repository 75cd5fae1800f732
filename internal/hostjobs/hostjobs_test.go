//go:build linux

package hostjobs_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/hostjobs"
)

func newID() string {
	b := make([]byte, 8)
	rand.Read(b)
	return "rjob-" + hex.EncodeToString(b)
}

// api is what the tests drive: a Manager directly or a Client over HTTP.
type api interface {
	Start(context.Context, hostjobs.StartRequest) (hostjobs.Job, error)
	Status(context.Context, string) (hostjobs.Job, error)
	List(context.Context, int) (hostjobs.List, error)
	Logs(context.Context, string, hostjobs.LogsRequest) (hostjobs.Logs, error)
	Cancel(context.Context, string, time.Duration) (hostjobs.Job, error)
}

func waitEnded(t *testing.T, a api, id string, d time.Duration) hostjobs.Job {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		j, err := a.Status(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		if j.Ended() {
			return j
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s still %s after %v", id, j.State, d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func pidsOf(t *testing.T, dir, id string) (job, sup int) {
	t.Helper()
	var p struct{ PID, Supervisor int }
	b, err := os.ReadFile(filepath.Join(dir, id, "pid.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &p); err != nil {
		t.Fatal(err)
	}
	return p.PID, p.Supervisor
}

func processGone(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	i := strings.LastIndexByte(string(b), ')')
	return i > 0 && len(b) > i+2 && (b[i+2] == 'Z' || b[i+2] == 'X')
}

func waitGone(t *testing.T, pid int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !processGone(pid); {
		if time.Now().After(deadline) {
			t.Fatalf("process %d still alive", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestJobSurvivesAgentRestart: the agent is SIGKILLed while its job runs; a new agent on the
// same state dir reports it running, serves its log, and records its exit when it comes.
func TestJobSurvivesAgentRestart(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "jobs")
	a := startAgent(t, dir)
	ctx := context.Background()
	id := newID()
	marker := filepath.Join(t.TempDir(), "go")
	cmd := fmt.Sprintf("echo started; while [ ! -e %s ]; do sleep 0.05; done; echo finished; exit 7", marker)
	j, err := a.client.Start(ctx, hostjobs.StartRequest{JobID: id, Command: cmd})
	if err != nil {
		t.Fatal(err)
	}
	if j.State != hostjobs.StateRunning || j.PID <= 0 {
		t.Fatalf("started job: %+v", j)
	}
	jobPID, supPID := pidsOf(t, dir, id)
	a.kill()
	if processGone(jobPID) || processGone(supPID) {
		t.Fatalf("the agent's death took the job (%v) or its supervisor (%v) with it", processGone(jobPID), processGone(supPID))
	}
	b := startAgent(t, dir)
	j, err = b.client.Status(ctx, id)
	if err != nil || j.State != hostjobs.StateRunning || j.Success {
		t.Fatalf("after the agent's restart: %+v, %v", j, err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		l, err := b.client.Logs(ctx, id, hostjobs.LogsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if string(l.Data) == "started\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("log after restart: %q", l.Data)
		}
	}
	os.WriteFile(marker, nil, 0o600)
	j = waitEnded(t, b.client, id, 20*time.Second)
	if j.State != hostjobs.StateExited || j.ExitCode == nil || *j.ExitCode != 7 || j.Success || j.FinishedAt == nil {
		t.Fatalf("ended after restart: %+v", j)
	}
	l, err := b.client.Logs(ctx, id, hostjobs.LogsRequest{})
	if err != nil || string(l.Data) != "started\nfinished\n" || l.State != hostjobs.StateExited {
		t.Fatalf("final log: %q %+v %v", l.Data, l, err)
	}
	waitGone(t, supPID)
}

// TestUnknownAfterSIGKILL: a job SIGKILLed from outside (what the OOM killer does) is
// `unknown`, and so is one whose supervisor died with it (no exit record at all); neither is a
// success. Another signal is an exit with that signal.
func TestUnknownAfterSIGKILL(t *testing.T) {
	m, dir := newManager(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name      string
		killSuper bool
		sig       syscall.Signal
		state     string
	}{
		{"job SIGKILL", false, syscall.SIGKILL, hostjobs.StateUnknown},
		{"job and supervisor SIGKILL", true, syscall.SIGKILL, hostjobs.StateUnknown},
		{"job SIGTERM", false, syscall.SIGTERM, hostjobs.StateExited},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := newID()
			if _, err := m.Start(ctx, hostjobs.StartRequest{JobID: id, Command: "exec sleep 300"}); err != nil {
				t.Fatal(err)
			}
			pid, sup := pidsOf(t, dir, id)
			if tc.killSuper {
				syscall.Kill(sup, syscall.SIGKILL)
				waitGone(t, sup)
			}
			syscall.Kill(pid, tc.sig)
			j := waitEnded(t, m, id, 10*time.Second)
			if j.State != tc.state || j.Success {
				t.Fatalf("state %s success %v (%s), want %s", j.State, j.Success, j.Message, tc.state)
			}
			if tc.state == hostjobs.StateUnknown && (j.ExitCode != nil || !strings.Contains(j.Message, "do not treat it as a success")) {
				t.Fatalf("unknown job: %+v", j)
			}
			if tc.state == hostjobs.StateExited && (j.ExitCode == nil || *j.ExitCode != 143 || j.Signal != "SIGTERM") {
				t.Fatalf("SIGTERMed job: %+v", j)
			}
		})
	}
}

// TestCancelKillsTree: cancel reaches a descendant that left the job's session and process
// group, and the job is `canceled`.
func TestCancelKillsTree(t *testing.T) {
	m, _ := newManager(t)
	ctx := context.Background()
	id := newID()
	childFile := filepath.Join(t.TempDir(), "child")
	cmd := fmt.Sprintf(`setsid sh -c 'echo $$ > %s.tmp; mv %s.tmp %s; trap "" TERM; exec sleep 300' & exec sleep 300`, childFile, childFile, childFile)
	if _, err := m.Start(ctx, hostjobs.StartRequest{JobID: id, Command: cmd}); err != nil {
		t.Fatal(err)
	}
	var child int
	for deadline := time.Now().Add(10 * time.Second); child == 0; time.Sleep(20 * time.Millisecond) {
		b, _ := os.ReadFile(childFile)
		child, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		if time.Now().After(deadline) {
			t.Fatal("the job's descendant never started")
		}
	}
	j, err := m.Cancel(ctx, id, 200*time.Millisecond)
	if err != nil || j.State != hostjobs.StateCanceled || j.Success {
		t.Fatalf("cancel: %+v %v", j, err)
	}
	waitGone(t, child)
	// Canceling again changes nothing.
	if j2, err := m.Cancel(ctx, id, 0); err != nil || j2.State != hostjobs.StateCanceled {
		t.Fatalf("second cancel: %+v %v", j2, err)
	}
}

// TestOverHTTP drives the handler through its Client: env, cwd, gpu_index, logs paging and
// tails, list limits, idempotent start, validation.
func TestOverHTTP(t *testing.T) {
	m, _ := newManager(t)
	srv := httptest.NewServer(hostjobs.NewHandler(m))
	defer srv.Close()
	c := hostjobs.NewClient(srv.Client(), srv.URL)
	ctx := context.Background()
	cwd := t.TempDir()
	gpu := 1
	id := newID()
	req := hostjobs.StartRequest{JobID: id, Shell: "bash",
		Command: `echo "gpu=$CUDA_VISIBLE_DEVICES foo=$FOO pwd=$(pwd)"; for i in $(seq 1 300); do echo line$i; done; echo err >&2`,
		Env:     map[string]string{"FOO": "bar"}, Cwd: cwd, GPUIndex: &gpu}
	if _, err := c.Start(ctx, req); err != nil {
		t.Fatal(err)
	}
	j := waitEnded(t, c, id, 20*time.Second)
	if j.State != hostjobs.StateExited || !j.Success || j.Shell != "bash" || len(j.EnvNames) != 1 || j.GPUIndex == nil || *j.GPUIndex != 1 {
		t.Fatalf("job: %+v", j)
	}
	// The same id again starts nothing.
	if again, err := c.Start(ctx, req); err != nil || again.State != hostjobs.StateExited {
		t.Fatalf("second start of %s: %+v %v", id, again, err)
	}
	l, err := c.Logs(ctx, id, hostjobs.LogsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(l.Data), "\n"), "\n")
	if len(lines) != 200 || lines[0] != "line102" || lines[199] != "err" || l.NextOffset != l.TotalBytes {
		t.Fatalf("tail: %d lines, first %q last %q, %+v", len(lines), lines[0], lines[len(lines)-1], l)
	}
	var all []byte
	for off := int64(0); ; {
		p, err := c.Logs(ctx, id, hostjobs.LogsRequest{Offset: &off, MaxBytes: 100})
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, p.Data...)
		if off = p.NextOffset; off == p.TotalBytes {
			break
		}
	}
	want := fmt.Sprintf("gpu=1 foo=bar pwd=%s\n", cwd)
	if !strings.HasPrefix(string(all), want) || int64(len(all)) != l.TotalBytes {
		t.Fatalf("paged log starts %q, want %q (%d of %d bytes)", string(all[:min(len(all), 80)]), want, len(all), l.TotalBytes)
	}
	for range 3 {
		if _, err := c.Start(ctx, hostjobs.StartRequest{JobID: newID(), Command: "true"}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond) // distinct start times
	}
	list, err := c.List(ctx, 2)
	if err != nil || len(list.Jobs) != 2 || list.Omitted != 2 || list.Jobs[0].StartedAt.Before(list.Jobs[1].StartedAt) {
		t.Fatalf("list: %+v %v", list, err)
	}
	neg := int64(-1)
	for name, err := range map[string]error{
		"bad id":       second(c.Start(ctx, hostjobs.StartRequest{JobID: "x", Command: "true"})),
		"no command":   second(c.Start(ctx, hostjobs.StartRequest{JobID: newID()})),
		"relative cwd": second(c.Start(ctx, hostjobs.StartRequest{JobID: newID(), Command: "true", Cwd: "tmp"})),
		"missing cwd":  second(c.Start(ctx, hostjobs.StartRequest{JobID: newID(), Command: "true", Cwd: "/nonexistent/dir"})),
		"shell":        second(c.Start(ctx, hostjobs.StartRequest{JobID: newID(), Command: "true", Shell: "powershell"})),
		"env name":     second(c.Start(ctx, hostjobs.StartRequest{JobID: newID(), Command: "true", Env: map[string]string{"A=B": "c"}})),
		"gpu range":    second(c.Start(ctx, hostjobs.StartRequest{JobID: newID(), Command: "true", GPUIndex: ptr(64)})),
		"limit 0":      second(c.List(ctx, 0)),
		"tail 0":       second(c.Logs(ctx, id, hostjobs.LogsRequest{TailLines: -1})),
		"offset < 0":   second(c.Logs(ctx, id, hostjobs.LogsRequest{Offset: &neg})),
		"max_bytes":    second(c.Logs(ctx, id, hostjobs.LogsRequest{Offset: new(int64), MaxBytes: hostjobs.MaxLogBytes + 1})),
		"grace":        second(m.Cancel(ctx, id, (hostjobs.MaxGraceSeconds+1)*time.Second)),
	} {
		if !errcode.Is(err, errcode.InvalidArgument) {
			t.Errorf("%s: %v, want INVALID_ARGUMENT", name, err)
		}
	}
	if _, err := c.Status(ctx, newID()); !errcode.Is(err, errcode.JobNotFound) {
		t.Errorf("unknown id: %v", err)
	}
	// A refused start leaves nothing behind.
	list, _ = c.List(ctx, 1000)
	if len(list.Jobs) != 4 {
		t.Errorf("%d jobs after refused starts, want 4", len(list.Jobs))
	}
}

func second[T any](_ T, err error) error { return err }
func ptr(n int) *int                     { return &n }

// TestClientChecksReplies: a machine that lies gets an error, never its reply passed on.
func TestClientChecksReplies(t *testing.T) {
	id := newID()
	for name, body := range map[string]string{
		"other id":         `{"job_id":"` + newID() + `","state":"running"}`,
		"bad state":        `{"job_id":"` + id + `","state":"succeeded"}`,
		"unknown success":  `{"job_id":"` + id + `","state":"unknown","success":true}`,
		"success code 1":   `{"job_id":"` + id + `","state":"exited","success":true,"exit_code":1}`,
		"huge message":     `{"job_id":"` + id + `","state":"running","message":"` + strings.Repeat("x", 5000) + `"}`,
		"bad env name":     `{"job_id":"` + id + `","state":"running","env_names":["A B"]}`,
		"not json":         `hello`,
		"gpu out of range": `{"job_id":"` + id + `","state":"running","gpu_index":99}`,
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(body)) }))
		_, err := hostjobs.NewClient(srv.Client(), srv.URL).Status(context.Background(), id)
		srv.Close()
		if err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(`{"job_id":"` + id + `","state":"running","data":"` + strings.Repeat("QUFB", 100) + `","offset":0,"next_offset":5,"total_bytes":300}`))
	}))
	defer srv.Close()
	if _, err := hostjobs.NewClient(srv.Client(), srv.URL).Logs(context.Background(), id, hostjobs.LogsRequest{}); err == nil {
		t.Error("inconsistent log slice accepted")
	}
}

// TestClientCleansMachineText: what a joined machine writes reaches MCP clients only cleaned:
// an error's message and details and a job's message lose their ANSI escape sequences, bidi
// and other control characters, invalid UTF-8 becomes U+FFFD, and the error is marked as the
// machine's; a code the endpoint never returns is INTERNAL.
func TestClientCleansMachineText(t *testing.T) {
	id := newID()
	hostile := `\u001b[31mred\u001b[0m \u001b]0;title\u0007\u202egnp.exe\u202c\u2066x\u2069\u200e\u061c` + "\xff"
	serve := func(status int, body string) *hostjobs.Client {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(status)
			w.Write([]byte(body))
		}))
		t.Cleanup(srv.Close)
		return hostjobs.NewClient(srv.Client(), srv.URL)
	}
	clean := func(s string) bool {
		return utf8.ValidString(s) && !strings.ContainsAny(s, "\x1b\x07\u202e\u202c\u2066\u2069\u200e\u061c")
	}
	_, err := serve(404, `{"error":{"code":"JOB_NOT_FOUND","message":"`+hostile+`","details":{"job_id":"`+hostile+`"}}}`).Status(context.Background(), id)
	e, ok := errcode.As(err)
	if !ok || e.Code != errcode.JobNotFound || e.Details["origin"] != "machine_agent" {
		t.Fatalf("error reply: %v", err)
	}
	if !clean(e.Message) || e.Message != "red gnp.exex\uFFFD" || !clean(e.Details["job_id"].(string)) {
		t.Errorf("error text not cleaned: %q %q", e.Message, e.Details["job_id"])
	}
	// Status never returns GPU_BUSY: a machine that says so is not believed.
	_, err = serve(409, `{"error":{"code":"GPU_BUSY","message":"x"}}`).Status(context.Background(), id)
	if e, ok := errcode.As(err); !ok || e.Code != errcode.Internal || e.Details["origin"] != "machine_agent" {
		t.Errorf("foreign code: %v", err)
	}
	j, err := serve(200, `{"job_id":"`+id+`","state":"running","message":"`+hostile+`"}`).Status(context.Background(), id)
	if err != nil || !clean(j.Message) || j.Message != "red gnp.exex\uFFFD" {
		t.Errorf("job message not cleaned: %q %v", j.Message, err)
	}
}
