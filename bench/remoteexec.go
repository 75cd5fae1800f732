package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/machine"
	"github.com/agentbox/agentbox/internal/machine/agent"
	"github.com/agentbox/agentbox/internal/machine/proto"
	"github.com/agentbox/agentbox/internal/remoteexec"
	"github.com/agentbox/agentbox/internal/remoteops"
	"github.com/agentbox/agentbox/internal/store/sqlite"
)

// The remote exec figure: remote_exec of `true` on a joined machine over loopback, p50
// ≤ 5 ms. The server (registry over SQLite, the join and connect routes on loopback HTTP) and one
// agent (enrolled with a join token, connected over the WebSocket and yamux, serving the agent's
// real handler) run in this process; each call is remoteops.Exec → Registry.Client → a new yamux
// stream → POST /exec → `sh -c true` on the "machine" → NDJSON frames back. Floors, measured in
// the same run and interleaved with it: `sh -c true` and `true` started directly on the host
// (os/exec), i.e. what the call costs beyond starting the shell.

type remoteExecBenchFlags struct {
	only  *bool
	calls *int
}

func remoteExecFlags() remoteExecBenchFlags {
	return remoteExecBenchFlags{
		only:  flag.Bool("remoteexec-only", false, "measure only remote_exec of `true` over a joined agent on loopback (no sandboxes)"),
		calls: flag.Int("remoteexec-calls", 500, "timed remote_exec calls (each beside one of each floor)"),
	}
}

const (
	measureRemoteExec   = "remote_exec `true` on a joined machine (loopback)"
	measureHostShTrue   = "floor: `sh -c true` started on the host (os/exec)"
	measureHostTrueExec = "floor: `true` started on the host (os/exec)"
)

func runRemoteExecBench(ctx context.Context, f remoteExecBenchFlags, out string) {
	res := Results{CPUs: goruntime.NumCPU(), When: time.Now().UTC(), Skipped: map[string]string{}}
	res.Host, _ = os.Hostname()
	res.Stats = benchRemoteExec(ctx, f)
	printStats(res.Stats)
	if out != "bench/results.json" {
		writeResults(res, out)
	}
}

// benchRemoteExec joins an agent in process and times the calls beside the floors.
func benchRemoteExec(ctx context.Context, f remoteExecBenchFlags) []Stat {
	dir, err := os.MkdirTemp("", "abbench-remoteexec")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	st, err := sqlite.Open(ctx, filepath.Join(dir, "agentbox.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer st.Close()
	reg := machine.New(st, machine.Options{})
	defer reg.Close()
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+proto.JoinPath, func(w http.ResponseWriter, r *http.Request) {
		var req proto.JoinRequest
		if err := json.NewDecoder(io.LimitReader(r.Body, proto.MaxJoinBody)).Decode(&req); err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		rep, err := reg.Enroll(r.Context(), req)
		if err != nil {
			http.Error(w, errcode.Message(err), errcode.HTTPStatus(errcode.Of(err)))
			return
		}
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(rep)
	})
	mux.HandleFunc("GET "+proto.ConnectPath, reg.ServeConnect)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	defer srv.CloseClientConnections()
	tok, err := reg.CreateToken(ctx, machine.TokenRequest{Uses: 1})
	if err != nil {
		log.Fatal(err)
	}
	cfg := agent.Config{ServerURL: srv.URL, StateDir: filepath.Join(dir, "agent"), Handler: agent.Handler(agent.HandlerOptions{})}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		log.Fatal(err)
	}
	state, err := agent.Enroll(ctx, cfg, tok.Secret, "bench")
	if err != nil {
		log.Fatal(err)
	}
	actx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- agent.Run(actx, cfg, state) }()
	defer func() { cancel(); <-done }()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, _, err := reg.Client(ctx, "bench"); err == nil {
			break
		}
		if time.Now().After(deadline) {
			log.Fatal("the agent did not come online")
		}
	}
	svc := remoteops.NewExec(reg)
	var remote, sh, tr []float64
	for i := range *f.calls + 20 {
		t0 := time.Now()
		r, err := svc.Exec(ctx, "bench", remoteexec.Request{Command: "true"})
		d := time.Since(t0)
		if err != nil || r.ExitCode == nil || *r.ExitCode != 0 || r.Partial {
			log.Fatalf("remote exec: %+v %v", r, err)
		}
		t1 := time.Now()
		if err := exec.Command("sh", "-c", "true").Run(); err != nil {
			log.Fatal(err)
		}
		d1 := time.Since(t1)
		t2 := time.Now()
		if err := exec.Command("true").Run(); err != nil {
			log.Fatal(err)
		}
		d2 := time.Since(t2)
		if i < 20 {
			continue // warm-up
		}
		remote, sh, tr = append(remote, ms(d)), append(sh, ms(d1)), append(tr, ms(d2))
	}
	s := summarize(measureRemoteExec, "ms", remote)
	fs, ft := summarize(measureHostShTrue, "ms", sh), summarize(measureHostTrueExec, "ms", tr)
	s.Floor = fmt.Sprintf("p50 ≤ 5 ms; floors in the same run: sh -c true p50 %.2f ms, true p50 %.2f ms", fs.P50, ft.P50)
	return []Stat{s, fs, ft}
}
