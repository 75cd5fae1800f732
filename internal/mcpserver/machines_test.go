package mcpserver_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/gpu"
	"github.com/agentbox/agentbox/internal/machine"
	"github.com/agentbox/agentbox/internal/machine/agent"
	"github.com/agentbox/agentbox/internal/machine/proto"
	"github.com/agentbox/agentbox/internal/mcpserver"
	"github.com/agentbox/agentbox/internal/store/sqlite"
)

// TestMachineTools: machine_list and machine_status over a real registry (SQLite) with one
// in-process agent connected over a real WebSocket on loopback: the reply has the contract's
// fields (output schema checked by the client), online with last_seen and GPUs from its
// heartbeat; an unknown machine is MACHINE_NOT_FOUND; without a registry, UNSUPPORTED_OPERATION.
func TestMachineTools(t *testing.T) {
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "db.sqlite"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	reg := machine.New(st, machine.Options{HeartbeatInterval: 200 * time.Millisecond})
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+proto.JoinPath, func(w http.ResponseWriter, r *http.Request) {
		var req proto.JoinRequest
		json.NewDecoder(r.Body).Decode(&req)
		rep, err := reg.Enroll(r.Context(), req)
		if err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		w.WriteHeader(http.StatusCreated)
		json.NewEncoder(w).Encode(rep)
	})
	mux.HandleFunc("GET "+proto.ConnectPath, reg.ServeConnect)
	hs := httptest.NewServer(mux)
	defer hs.Close()
	defer reg.Close()
	tok, err := reg.CreateToken(t.Context(), machine.TokenRequest{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := agent.Config{ServerURL: hs.URL, StateDir: t.TempDir(), GPUs: func(context.Context) ([]gpu.GPU, error) {
		return gpu.Parse([]byte("0, NVIDIA GeForce RTX 3090, 24576, 1234, 7\n1, NVIDIA A100-SXM4-80GB, 81920, 0, 0\n"))
	}}
	ms, err := agent.Enroll(t.Context(), cfg, tok.Secret, "gpu-box")
	if err != nil {
		t.Fatal(err)
	}
	actx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { agent.Run(actx, cfg, ms); close(done) }()
	defer func() { cancel(); <-done }()

	srv := mcpserver.New(nil, mcpserver.Options{Machines: mcpserver.RegistryMachines{R: reg}})
	defer srv.Close()
	c := connect(t, srv, protocolVersions[0])
	var raw struct {
		Machines []map[string]any `json:"machines"`
		Count    int              `json:"count"`
		Online   int              `json:"online"`
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		c.ok("machine_list", nil, &raw)
		if raw.Online == 1 && raw.Machines[0]["last_seen"] != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("machine_list never showed it online with a heartbeat: %+v", raw)
		}
		time.Sleep(50 * time.Millisecond)
	}
	m := raw.Machines[0]
	for _, k := range []string{"machine_id", "name", "aliases", "online", "platform", "arch", "agent_version", "last_seen", "gpus"} {
		if _, ok := m[k]; !ok {
			t.Errorf("machine_list entry lacks %q: %v", k, m)
		}
	}
	if m["name"] != "gpu-box" || m["online"] != true || len(m["gpus"].([]any)) != 2 || raw.Count != 1 {
		t.Fatalf("machine_list: %+v", raw)
	}
	var one machine.Info
	c.ok("machine_status", map[string]any{"machine": "gpu-box"}, &one)
	if one.ID != ms.MachineID || !one.Online || one.GPUs[1].Name != "NVIDIA A100-SXM4-80GB" {
		t.Fatalf("machine_status: %+v", one)
	}
	c.fails("machine_status", map[string]any{"machine": "nope"}, "MACHINE_NOT_FOUND")
	c.fails("machine_status", map[string]any{"machine": ""}, "INVALID_ARGUMENT")
	bare := mcpserver.New(nil, mcpserver.Options{})
	defer bare.Close()
	connect(t, bare, protocolVersions[0]).fails("machine_list", nil, "UNSUPPORTED_OPERATION")
}
