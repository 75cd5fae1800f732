package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/agentbox/agentbox/internal/remotejobs"
)

// TestMachineJobStartArgs: `agentbox machine job start` sends the words after -- as one
// command string, with its flags, to POST /v1/machines/{ref}/jobs; without -- it is a usage
// error that sends nothing.
func TestMachineJobStartArgs(t *testing.T) {
	var mu sync.Mutex
	var got []remotejobs.StartRequest
	var paths []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req remotejobs.StartRequest
		json.NewDecoder(r.Body).Decode(&req)
		mu.Lock()
		got, paths = append(got, req), append(paths, r.Method+" "+r.URL.Path)
		mu.Unlock()
		w.WriteHeader(http.StatusCreated)
		json.NewEncoder(w).Encode(remotejobs.Job{JobID: "rjob-0123456789abcdef", State: "running"})
	}))
	defer srv.Close()
	t.Setenv("AGENTBOX_URL", srv.URL)
	t.Setenv("AGENTBOX_TOKEN", "t")
	if rc := run([]string{"machine", "job", "start", "--gpu", "1", "--shell", "bash", "--env", "A=b", "gpubox", "--", "echo", "$A;", "exit 3"}); rc != 0 {
		t.Fatalf("exit %d", rc)
	}
	if rc := run([]string{"machine", "job", "start", "gpubox", "echo", "hi"}); rc != 2 {
		t.Fatalf("without --: exit %d, want 2", rc)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 1 || paths[0] != "POST /v1/machines/gpubox/jobs" {
		t.Fatalf("requests: %v", paths)
	}
	r := got[0]
	if r.Command != "echo $A; exit 3" || r.Shell != "bash" || r.GPUIndex == nil || *r.GPUIndex != 1 || r.Env["A"] != "b" {
		t.Fatalf("request: %+v", r)
	}
}
