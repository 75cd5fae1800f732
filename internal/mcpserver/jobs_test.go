package mcpserver_test

import (
	"context"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/mcpserver"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// TestJobTools drives the job tools (on the fake runtime: the tools' logic over real guest jobs): exec background starts a job with
// job_start's reply, job_wait reports progress while waiting, job_logs pages, job_list counts
// what it omitted, job_cancel ends a job, and every numeric bound is refused naming its argument.
func TestJobTools(t *testing.T) {
	svc := fakeService(t)
	srv := mcpserver.New(svc, mcpserver.Options{})
	defer srv.Close()
	c := connect(t, srv, "2025-11-25")
	var sb mcpserver.SandboxInfo
	c.ok("sandbox_create", map[string]any{}, &sb)

	var started map[string]any
	c.ok("exec", map[string]any{"sandbox_id": sb.SandboxID, "background": true,
		"command": []string{"sh", "-c", "sleep 6; seq 1 1000"}}, &started)
	jobID, _ := started["job_id"].(string)
	if !sandbox.ValidJobID(jobID) || started["state"] != "running" || started["sandbox_id"] != sb.SandboxID {
		t.Fatalf("exec background reply %v", started)
	}
	if _, ok := started["exit_code"]; ok {
		t.Errorf("a background start claims an exit_code: %v", started)
	}

	res := c.callCtx(context.Background(), "job_wait", map[string]any{"sandbox_id": sb.SandboxID, "job_id": jobID, "timeout_seconds": 60}, "tok-1")
	if res.IsError {
		t.Fatalf("job_wait: %+v", res)
	}
	w, _ := res.StructuredContent.(map[string]any)
	if w["state"] != "exited" || w["exit_code"] != float64(0) || w["success"] != true {
		t.Fatalf("job_wait = %v", w)
	}
	c.mu.Lock()
	np := len(c.progress)
	c.mu.Unlock()
	if np == 0 {
		t.Errorf("job_wait with a progressToken sent no progress while the job ran 6 s")
	}

	var lg mcpserver.JobLogsOut
	c.ok("job_logs", map[string]any{"sandbox_id": sb.SandboxID, "job_id": jobID}, &lg)
	if lines := strings.Split(strings.TrimSuffix(lg.Data, "\n"), "\n"); len(lines) != 200 || lines[199] != "1000" || lg.NextOffset != lg.TotalBytes {
		t.Errorf("job_logs default: %d lines, last %q, next %d of %d", len(lines), lines[len(lines)-1], lg.NextOffset, lg.TotalBytes)
	}
	var all []byte
	for off := int64(0); ; {
		var p mcpserver.JobLogsOut
		c.ok("job_logs", map[string]any{"sandbox_id": sb.SandboxID, "job_id": jobID, "offset_bytes": off, "max_bytes": 1000}, &p)
		all = append(all, p.Data...)
		off = p.NextOffset
		if off == p.TotalBytes {
			break
		}
	}
	if !strings.HasPrefix(string(all), "1\n2\n3\n") || !strings.HasSuffix(string(all), "\n999\n1000\n") || int64(len(all)) != lg.TotalBytes {
		t.Errorf("paged log: %d bytes", len(all))
	}

	var sl map[string]any
	c.ok("job_start", map[string]any{"sandbox_id": sb.SandboxID, "command": []string{"sleep", "600"}}, &sl)
	var l mcpserver.JobListOut
	c.ok("job_list", map[string]any{"sandbox_id": sb.SandboxID, "limit": 1}, &l)
	if len(l.Jobs) != 1 || l.Omitted != 1 || l.Jobs[0].JobID != sl["job_id"] {
		t.Errorf("job_list limit 1 = %+v", l)
	}
	var cj mcpserver.JobOut
	c.ok("job_cancel", map[string]any{"sandbox_id": sb.SandboxID, "job_id": sl["job_id"], "grace_seconds": 1}, &cj)
	if cj.State != "canceled" || cj.Success {
		t.Errorf("job_cancel = %+v", cj)
	}

	for _, bad := range []struct {
		tool string
		args map[string]any
		arg  string
	}{
		{"job_list", map[string]any{"limit": 0}, "limit"},
		{"job_list", map[string]any{"limit": 1001}, "limit"},
		{"job_logs", map[string]any{"job_id": jobID, "tail_lines": 0}, "tail_lines"},
		{"job_logs", map[string]any{"job_id": jobID, "tail_lines": 10001}, "tail_lines"},
		{"job_logs", map[string]any{"job_id": jobID, "max_bytes": 0}, "max_bytes"},
		{"job_logs", map[string]any{"job_id": jobID, "max_bytes": 262145}, "max_bytes"},
		{"job_logs", map[string]any{"job_id": jobID, "offset_bytes": -1}, "offset_bytes"},
		{"job_wait", map[string]any{"job_id": jobID, "timeout_seconds": 3601}, "timeout_seconds"},
		{"job_wait", map[string]any{"job_id": jobID, "timeout_seconds": -1}, "timeout_seconds"},
		{"job_cancel", map[string]any{"job_id": jobID, "grace_seconds": 601}, "grace_seconds"},
		{"exec", map[string]any{"command": []string{"true"}, "background": true, "timeout_seconds": 5}, "timeout_seconds"},
	} {
		bad.args["sandbox_id"] = sb.SandboxID
		if msg := c.fails(bad.tool, bad.args, "INVALID_ARGUMENT"); !strings.Contains(msg, bad.arg) {
			t.Errorf("%s %v: %q does not name %s", bad.tool, bad.args, msg, bad.arg)
		}
	}
	c.fails("job_status", map[string]any{"sandbox_id": sb.SandboxID, "job_id": sandbox.NewJobID()}, "JOB_NOT_FOUND")
}
