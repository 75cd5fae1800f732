//go:build linux

package remotejobs_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentbox/agentbox/internal/mcpserver"
)

// TestMCPTools drives the remote_job_* tools of a real MCP server (in-memory transport) over
// the service, a real job handler and the stand-in GPUs.
func TestMCPTools(t *testing.T) {
	e := setup(t)
	srv := mcpserver.New(nil, mcpserver.Options{RemoteJobs: e.svc})
	t.Cleanup(srv.Close)
	ctx := context.Background()
	ct, st := mcp.NewInMemoryTransports()
	ss, err := srv.MCP().Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ss.Wait() })
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "t", Version: "1"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	call := func(name string, args map[string]any) (map[string]any, bool) {
		t.Helper()
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var out map[string]any
		b, _ := json.Marshal(res.StructuredContent)
		json.Unmarshal(b, &out)
		return out, res.IsError
	}
	errCode := func(out map[string]any) string {
		e, _ := out["error"].(map[string]any)
		s, _ := e["code"].(string)
		return s
	}
	j, isErr := call("remote_job_start", map[string]any{"machine": "gpubox", "command": "echo $CUDA_VISIBLE_DEVICES; exec sleep 300", "gpu_index": 0})
	id, _ := j["job_id"].(string)
	if isErr || j["state"] != "running" || !strings.HasPrefix(id, "rjob-") {
		t.Fatalf("remote_job_start: %v", j)
	}
	if out, isErr := call("remote_job_start", map[string]any{"machine": "gpubox", "command": "true", "gpu_index": 0}); !isErr || errCode(out) != "GPU_BUSY" {
		t.Fatalf("second job on GPU 0: %v", out)
	}
	if out, isErr := call("remote_job_start", map[string]any{"machine": "gpubox", "command": "true", "gpu_index": 5}); !isErr || errCode(out) != "INVALID_ARGUMENT" {
		t.Fatalf("GPU 5: %v", out)
	}
	if out, isErr := call("remote_job_list", map[string]any{"machine": "gpubox", "limit": 0}); !isErr {
		t.Fatalf("limit 0 accepted: %v", out)
	}
	if out, isErr := call("remote_job_status", map[string]any{"machine": "nosuch", "job_id": id}); !isErr || errCode(out) != "MACHINE_NOT_FOUND" {
		t.Fatalf("unknown machine: %v", out)
	}
	for deadline := 0; ; deadline++ {
		l, isErr := call("remote_job_logs", map[string]any{"machine": "gpubox", "job_id": id})
		if isErr {
			t.Fatalf("logs: %v", l)
		}
		if l["data"] == "0\n" {
			break
		}
		if deadline > 500 {
			t.Fatalf("logs: %v", l)
		}
	}
	l, isErr := call("remote_job_list", map[string]any{"machine": "gpubox"})
	if jobs, _ := l["jobs"].([]any); isErr || len(jobs) != 1 || l["omitted"] != 0.0 {
		t.Fatalf("list: %v", l)
	}
	c, isErr := call("remote_job_cancel", map[string]any{"machine": "gpubox", "job_id": id, "grace_seconds": 1})
	if isErr || c["state"] != "canceled" || c["success"] != false {
		t.Fatalf("cancel: %v", c)
	}
	if s, _ := call("remote_job_status", map[string]any{"machine": "gpubox", "job_id": id}); s["state"] != "canceled" {
		t.Fatalf("status after cancel: %v", s)
	}
	if r := reservations(t, e.st, e.machine.ID); len(r) != 0 {
		t.Fatalf("reservations after cancel: %v", r)
	}
}
