//go:build linux

package remotejobs_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/gpu"
	"github.com/agentbox/agentbox/internal/machine"
	"github.com/agentbox/agentbox/internal/machine/agent"
	"github.com/agentbox/agentbox/internal/machine/proto"
	"github.com/agentbox/agentbox/internal/remotejobs"
	"github.com/agentbox/agentbox/internal/store/sqlite"
)

// TestThroughJoinedAgent runs remote jobs end to end: a machine joins a real registry (SQLite,
// HTTP on loopback, WebSocket + yamux), reports the stand-in nvidia-smi's two GPUs in its
// heartbeats, and serves the real agent handler; the job outlives the agent's restart, is
// reported running by the new agent, ends, and its GPU is released.
func TestThroughJoinedAgent(t *testing.T) {
	standInGPUs(t) // PATH: the stand-in nvidia-smi, which the agent's heartbeats run
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "db.sqlite"))
	if err != nil {
		t.Fatal(err)
	}
	reg := machine.New(st, machine.Options{HeartbeatInterval: 200 * time.Millisecond})
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+proto.JoinPath, func(w http.ResponseWriter, r *http.Request) {
		var req proto.JoinRequest
		if err := json.NewDecoder(io.LimitReader(r.Body, proto.MaxJoinBody)).Decode(&req); err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		rep, err := reg.Enroll(r.Context(), req)
		if err != nil {
			http.Error(w, err.Error(), errcode.HTTPStatus(errcode.Of(err)))
			return
		}
		w.WriteHeader(http.StatusCreated)
		json.NewEncoder(w).Encode(rep)
	})
	mux.HandleFunc("GET "+proto.ConnectPath, reg.ServeConnect)
	srv := httptest.NewServer(mux)
	t.Cleanup(func() { srv.CloseClientConnections(); reg.Close(); srv.Close(); st.Close() })

	tok, err := reg.CreateToken(ctx, machine.TokenRequest{Uses: 1})
	if err != nil {
		t.Fatal(err)
	}
	cfg := agent.Config{ServerURL: srv.URL, StateDir: t.TempDir(), GPUs: gpu.Query, MinBackoff: 50 * time.Millisecond, MaxBackoff: 200 * time.Millisecond}
	state, err := agent.Enroll(ctx, cfg, tok.Secret, "gpubox")
	if err != nil {
		t.Fatal(err)
	}
	run := func() (stop func()) {
		actx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- agent.Run(actx, cfg, state) }()
		var once bool
		stop = func() {
			if !once {
				once = true
				cancel()
				<-done
			}
		}
		t.Cleanup(stop)
		return stop
	}
	waitOnline := func(want bool) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			i, err := reg.Get(ctx, "gpubox")
			if err == nil && i.Online == want && (!want || len(i.GPUs) == 2) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("machine never became online=%v: %+v %v", want, i, err)
			}
		}
	}
	stop := run()
	waitOnline(true)

	svc := remotejobs.New(reg, st, remotejobs.Options{})
	done := filepath.Join(t.TempDir(), "done")
	j, err := svc.Start(ctx, "gpubox", remotejobs.StartRequest{Shell: "bash",
		Command: "echo gpu=$CUDA_VISIBLE_DEVICES; while [ ! -e " + done + " ]; do sleep 0.05; done; echo bye", GPUIndex: gpuIdx(1)})
	if err != nil || j.State != "running" {
		t.Fatalf("start: %+v %v", j, err)
	}
	if _, err := svc.Start(ctx, "gpubox", remotejobs.StartRequest{Command: "true", GPUIndex: gpuIdx(1)}); !errcode.Is(err, errcode.GPUBusy) {
		t.Fatalf("GPU 1 while its job runs: %v", err)
	}
	if _, err := svc.Start(ctx, "gpubox", remotejobs.StartRequest{Command: "true", GPUIndex: gpuIdx(7)}); !errcode.Is(err, errcode.InvalidArgument) {
		t.Fatalf("GPU 7 of a two-GPU machine: %v", err)
	}

	// The agent stops (its handler and job manager with it) and a new one starts on the same
	// state dir.
	stop()
	waitOnline(false)
	if _, err := svc.Status(ctx, "gpubox", j.JobID); !errcode.Is(err, errcode.MachineOffline) {
		t.Fatalf("status while the machine is offline: %v", err)
	}
	run()
	waitOnline(true)
	got, err := svc.Status(ctx, "gpubox", j.JobID)
	if err != nil || got.State != "running" || got.GPUIndex == nil || *got.GPUIndex != 1 {
		t.Fatalf("after the agent's restart: %+v %v", got, err)
	}
	os.WriteFile(done, nil, 0o600)
	for deadline := time.Now().Add(20 * time.Second); got.State == "running"; time.Sleep(50 * time.Millisecond) {
		if got, err = svc.Status(ctx, "gpubox", j.JobID); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatal("the job never ended")
		}
	}
	if got.State != "exited" || !got.Success {
		t.Fatalf("ended: %+v", got)
	}
	logs, err := svc.Logs(ctx, "gpubox", j.JobID, remotejobs.LogsRequest{})
	if err != nil || string(logs.Data) != "gpu=1\nbye\n" {
		t.Fatalf("logs: %q %v", logs.Data, err)
	}
	if r := reservations(t, st, got.MachineID); len(r) != 0 {
		t.Fatalf("reservations after the job ended: %v", r)
	}
	list, err := svc.List(ctx, "gpubox", 20)
	if err != nil || len(list.Jobs) != 1 || list.Jobs[0].JobID != j.JobID {
		t.Fatalf("list: %+v %v", list, err)
	}
}
