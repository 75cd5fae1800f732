//go:build linux

package remotejobs_test

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/api"
	"github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/wire"
)

// TestREST drives /v1/machines/{ref}/jobs… through the Go client against the real REST handler
// (token auth on) over the service and a real job handler.
func TestREST(t *testing.T) {
	e := setup(t)
	h := api.New(nil, api.Options{Token: "secret-token", RemoteJobs: e.svc})
	t.Cleanup(h.Close)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	ctx := context.Background()
	if _, err := client.New(srv.URL, "wrong").ListRemoteJobs(ctx, "gpubox", 0); !errcode.Is(err, errcode.AuthFailed) {
		t.Fatalf("wrong token: %v", err)
	}
	c := client.New(srv.URL, "secret-token")
	j, err := c.StartRemoteJob(ctx, "gpubox", wire.RemoteJobStart{Command: "echo one; echo two; exec sleep 300", GPUIndex: gpuIdx(1)})
	if err != nil || j.State != "running" {
		t.Fatalf("start: %+v %v", j, err)
	}
	_, err = c.StartRemoteJob(ctx, "gpubox", wire.RemoteJobStart{Command: "true", GPUIndex: gpuIdx(1)})
	if ec, ok := errcode.As(err); !ok || ec.Code != errcode.GPUBusy || ec.Details["job_id"] != j.JobID {
		t.Fatalf("GPU busy over REST: %v", err)
	}
	if _, err := c.ListRemoteJobs(ctx, "gpubox", 1001); !errcode.Is(err, errcode.InvalidArgument) {
		t.Fatalf("limit 1001: %v", err)
	}
	for start := time.Now(); ; time.Sleep(20 * time.Millisecond) {
		l, err := c.RemoteJobLogs(ctx, "gpubox", j.JobID, wire.RemoteJobLogsRequest{TailLines: 1})
		if err != nil {
			t.Fatal(err)
		}
		if string(l.Data) == "two\n" {
			break
		}
		if time.Since(start) > 10*time.Second {
			t.Fatalf("tail: %q", l.Data)
		}
	}
	if s, err := c.RemoteJobStatus(ctx, "gpubox", j.JobID); err != nil || s.State != "running" {
		t.Fatalf("status: %+v %v", s, err)
	}
	got, err := c.CancelRemoteJob(ctx, "gpubox", j.JobID, 0)
	if err != nil || got.State != "canceled" {
		t.Fatalf("cancel: %+v %v", got, err)
	}
	if _, err := c.RemoteJobStatus(ctx, "gpubox", "rjob-0000000000000000"); !errcode.Is(err, errcode.JobNotFound) {
		t.Fatalf("unknown job: %v", err)
	}
}
