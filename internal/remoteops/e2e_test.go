package remoteops_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/machine"
	"github.com/agentbox/agentbox/internal/machine/agent"
	"github.com/agentbox/agentbox/internal/machine/proto"
	"github.com/agentbox/agentbox/internal/remoteexec"
	"github.com/agentbox/agentbox/internal/remoteops"
	"github.com/agentbox/agentbox/internal/store/sqlite"
)

// joined is a server (registry over a real SQLite store, the join and connect routes on
// loopback HTTP) and one machine joined to it: an agent enrolled with a join token, connected
// over the WebSocket and yamux, serving the agent's real handler (with /exec and /screenshot).
type joined struct {
	reg         *machine.Registry
	stopAgent   context.CancelFunc
	agentDone   chan error
	machineName string
}

func joinMachine(t testing.TB) *joined {
	t.Helper()
	st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "db.sqlite"))
	if err != nil {
		t.Fatal(err)
	}
	reg := machine.New(st, machine.Options{HeartbeatInterval: 500 * time.Millisecond})
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+proto.JoinPath, func(w http.ResponseWriter, r *http.Request) {
		var req proto.JoinRequest
		if err := json.NewDecoder(io.LimitReader(r.Body, proto.MaxJoinBody)).Decode(&req); err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		rep, err := reg.Enroll(r.Context(), req)
		if err != nil {
			w.WriteHeader(errcode.HTTPStatus(errcode.Of(err)))
			_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]string{"code": string(errcode.Of(err)), "message": errcode.Message(err)}})
			return
		}
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(rep)
	})
	mux.HandleFunc("GET "+proto.ConnectPath, reg.ServeConnect)
	srv := httptest.NewServer(mux)
	tok, err := reg.CreateToken(context.Background(), machine.TokenRequest{Uses: 1})
	if err != nil {
		t.Fatal(err)
	}
	cfg := agent.Config{ServerURL: srv.URL, StateDir: t.TempDir(), Handler: agent.Handler(agent.HandlerOptions{}),
		MinBackoff: 50 * time.Millisecond, MaxBackoff: 200 * time.Millisecond}
	state, err := agent.Enroll(context.Background(), cfg, tok.Secret, "box1")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	j := &joined{reg: reg, stopAgent: cancel, agentDone: make(chan error, 1), machineName: "box1"}
	go func() { j.agentDone <- agent.Run(ctx, cfg, state) }()
	t.Cleanup(func() {
		cancel()
		<-j.agentDone
		srv.CloseClientConnections()
		reg.Close()
		srv.Close()
		st.Close()
	})
	deadline := time.Now().Add(15 * time.Second)
	for {
		if _, _, err := reg.Client(context.Background(), "box1"); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the machine did not come online")
		}
		time.Sleep(20 * time.Millisecond)
	}
	return j
}

func ms(n int64) *int64 { return &n }

// TestRemoteExecJoined: remote_exec through a real joined agent: sh and bash, env and cwd, a
// timeout (partial, the tree killed), the 1 MiB cap, every numeric bound, env with elevated.
func TestRemoteExecJoined(t *testing.T) {
	j := joinMachine(t)
	svc := remoteops.NewExec(j.reg)
	ctx := context.Background()
	run := func(req remoteexec.Request) *remoteexec.Result {
		t.Helper()
		res, err := svc.Exec(ctx, "box1", req)
		if err != nil {
			t.Fatalf("%.60q: %v", req.Command, err)
		}
		return res
	}
	res := run(remoteexec.Request{Command: `echo "$0 $X" $(pwd); echo e >&2; exit 7`, Env: map[string]string{"X": "x y"}, Cwd: "/tmp"})
	if res.Stdout != "sh x y /tmp\n" || res.Stderr != "e\n" || res.ExitCode == nil || *res.ExitCode != 7 || res.Shell != "sh" || res.Partial {
		t.Errorf("sh: %+v", res)
	}
	res = run(remoteexec.Request{Shell: "bash", Command: `declare -A m=([k]=v); echo "${m[k]} $BASH_VERSION" | cut -c1-2`})
	if res.Stdout != "v \n" || *res.ExitCode != 0 || res.Shell != "bash" {
		t.Errorf("bash: %+v", res)
	}

	pidFile := filepath.Join(t.TempDir(), "pid")
	began := time.Now()
	res = run(remoteexec.Request{TimeoutMS: ms(1000), Command: fmt.Sprintf(`sleep 300 & echo $! >%s; echo before; sleep 300`, pidFile)})
	if !res.Partial || res.Reason != "timeout" || res.ExitCode != nil || res.Stdout != "before\n" || time.Since(began) > 10*time.Second {
		t.Errorf("timeout: %+v after %v", res, time.Since(began))
	}
	b, _ := os.ReadFile(pidFile)
	if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err != nil {
		t.Errorf("pid file: %q", b)
	} else {
		waitGone(t, pid)
	}

	res = run(remoteexec.Request{Command: `head -c 5000000 /dev/zero | tr '\0' x; echo tail >&2`})
	if !res.Truncated || res.TotalBytes != 5_000_005 || len(res.Stdout)+len(res.Stderr) != remoteexec.MaxOutputBytes || *res.ExitCode != 0 {
		t.Errorf("cap: truncated=%v total=%d kept=%d", res.Truncated, res.TotalBytes, len(res.Stdout)+len(res.Stderr))
	}

	for _, n := range []int64{0, -1, 999, 3_600_001, 1 << 40} {
		if _, err := svc.Exec(ctx, "box1", remoteexec.Request{Command: "true", TimeoutMS: ms(n)}); errcode.Of(err) != errcode.InvalidArgument ||
			!strings.Contains(errcode.Message(err), "1000–3600000") {
			t.Errorf("timeout_ms %d: %v", n, err)
		}
	}
	for _, n := range []int64{1000, 3_600_000} {
		if res := run(remoteexec.Request{Command: "true", TimeoutMS: ms(n)}); *res.ExitCode != 0 {
			t.Errorf("timeout_ms %d: %+v", n, res)
		}
	}
	if _, err := svc.Exec(ctx, "box1", remoteexec.Request{Command: "id", Elevated: true, Env: map[string]string{"A": "1"}}); errcode.Of(err) != errcode.InvalidArgument {
		t.Errorf("env+elevated: %v", err)
	}
	if _, err := svc.Exec(ctx, "box1", remoteexec.Request{Command: "dir", Shell: "cmd"}); errcode.Of(err) != errcode.InvalidArgument ||
		!strings.Contains(errcode.Message(err), "sh, bash") {
		t.Errorf("cmd on linux: %v", err)
	}
	if _, err := svc.Exec(ctx, "nope", remoteexec.Request{Command: "true"}); errcode.Of(err) != errcode.MachineNotFound {
		t.Errorf("unknown machine: %v", err)
	}
}

// TestRemoteExecDisconnect: the machine's connection cut mid-command returns what arrived,
// partial, and the machine kills the command's tree.
func TestRemoteExecDisconnect(t *testing.T) {
	j := joinMachine(t)
	svc := remoteops.NewExec(j.reg)
	pidFile := filepath.Join(t.TempDir(), "pid")
	go func() {
		for range 200 {
			if b, _ := os.ReadFile(pidFile); len(b) > 0 {
				time.Sleep(300 * time.Millisecond)
				j.stopAgent() // the agent's session ends: its streams break
				return
			}
			time.Sleep(25 * time.Millisecond)
		}
	}()
	res, err := svc.Exec(context.Background(), "box1", remoteexec.Request{Command: fmt.Sprintf(`echo $$ >%s; echo hello; sleep 300`, pidFile)})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Partial || res.Reason != "disconnected" || res.ExitCode != nil || res.Stdout != "hello\n" {
		t.Errorf("disconnect: %+v", res)
	}
	b, _ := os.ReadFile(pidFile)
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	waitGone(t, pid)
	if _, err := svc.Exec(context.Background(), "box1", remoteexec.Request{Command: "true"}); errcode.Of(err) != errcode.MachineOffline {
		t.Errorf("after the cut: %v, want MACHINE_OFFLINE", err)
	}
}

func waitGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil || strings.Contains(string(b[strings.LastIndexByte(string(b), ')'):]), ") Z") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pid %d still alive", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
