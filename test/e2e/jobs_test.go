package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/testenv"
	"github.com/agentbox/agentbox/internal/wire"
)

type bearerRT struct{ next http.RoundTripper }

func (b bearerRT) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+token)
	return b.next.RoundTrip(r)
}

// jobScript writes 50 MiB of a seeded generator's bytes to stdout over about 20 s, then one
// line "SHA256 <hex of what it wrote>".
const jobScript = `
import hashlib, random, sys, time
r = random.Random(20251111)
h = hashlib.sha256()
out = sys.stdout.buffer
for i in range(50):
    chunk = r.randbytes(1 << 20)
    h.update(chunk)
    out.write(chunk)
    out.flush()
    time.sleep(0.4)
out.write(b"SHA256 " + h.hexdigest().encode() + b"\n")
out.flush()
`

// TestJobSurvivesClientAndServerKill is the detached jobs' headline: a job started over MCP, writing
// 50 MiB over 20 s, survives the MCP client disconnecting and `agentbox serve` SIGKILLed and
// restarted mid-job; afterwards its log, paged by offset, is byte for byte what it wrote, and
// it ends exited 0.
func TestJobSurvivesClientAndServerKill(t *testing.T) {
	for _, rt := range []string{"runc", "gvisor"} {
		t.Run(rt, func(t *testing.T) {
			testenv.RequireRoot(t)
			testJobSurvives(t, rt)
		})
	}
}

func testJobSurvives(t *testing.T, rt string) {
	dir := testenv.ShortTempDir(t, "abjob")
	s := startServer(t, dir)
	ctx := context.Background()
	sb, err := s.client().Create(ctx, wire.CreateRequest{Runtime: rt, DiskMB: 512, MemoryMB: 512})
	if err != nil {
		t.Fatal(err)
	}

	// Start it over MCP, then hang up.
	c := mcp.NewClient(&mcp.Implementation{Name: "e2e-jobs", Version: "1"}, nil)
	cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: s.URL + "/mcp", HTTPClient: &http.Client{Transport: bearerRT{http.DefaultTransport}}}, nil)
	if err != nil {
		t.Fatalf("mcp connect: %v", err)
	}
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "job_start", Arguments: map[string]any{
		"sandbox_id": sb.ID, "command": []string{"python3", "-c", jobScript}}})
	if err != nil || res.IsError {
		t.Fatalf("job_start: %v %+v", err, res)
	}
	sc, _ := res.StructuredContent.(map[string]any)
	jobID, _ := sc["job_id"].(string)
	if !sandbox.ValidJobID(jobID) || sc["state"] != "running" {
		t.Fatalf("job_start reply %v", sc)
	}
	cs.Close()

	// Mid-job: SIGKILL the server, restart it.
	time.Sleep(5 * time.Second)
	mid, err := s.client().JobStatus(ctx, sb.ID, jobID)
	if err != nil || mid.State != wire.JobRunning || mid.LogBytes == 0 {
		t.Fatalf("job after the client left: %+v, %v; want running with output", mid, err)
	}
	s.kill()
	time.Sleep(2 * time.Second)
	s = startServer(t, dir)
	cl := s.client()
	st, err := cl.JobStatus(ctx, sb.ID, jobID)
	if err != nil || st.State != wire.JobRunning || st.LogBytes < mid.LogBytes {
		t.Fatalf("job after the restart: %+v, %v; want still running, log grown from %d", st, err, mid.LogBytes)
	}

	deadline := time.Now().Add(2 * time.Minute)
	for st.State.Active() {
		if time.Now().After(deadline) {
			t.Fatalf("the job did not end: %+v", st)
		}
		if st, err = cl.WaitJob(ctx, sb.ID, jobID, 10*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	if st.State != wire.JobExited || st.ExitCode == nil || *st.ExitCode != 0 || !st.Success {
		t.Fatalf("job ended %+v; want exited 0", st)
	}

	// Page the whole log by offset.
	var log []byte
	var off int64
	page := int64(sandbox.MaxJobLogBytes)
	for {
		o := off
		l, err := cl.JobLogs(ctx, sb.ID, jobID, wire.JobLogsRequest{Offset: &o, MaxBytes: &page})
		if err != nil {
			t.Fatalf("logs at %d: %v", off, err)
		}
		if l.Offset != off || int64(len(l.Data)) > page || l.Truncated {
			t.Fatalf("page at %d: offset %d, %d bytes, truncated %v", off, l.Offset, len(l.Data), l.Truncated)
		}
		log = append(log, l.Data...)
		off = l.NextOffset
		if off == l.TotalBytes {
			break
		}
	}
	const want = 50 << 20
	if int64(len(log)) != st.LogBytes || len(log) != want+len("SHA256 ")+64+1 {
		t.Fatalf("log is %d bytes (status says %d); want %d of data and the sum line", len(log), st.LogBytes, want)
	}
	data, line := log[:want], string(log[want:])
	sum := sha256.Sum256(data)
	if line != "SHA256 "+hex.EncodeToString(sum[:])+"\n" {
		t.Fatalf("the log is not what the job wrote: it printed %q, the log hashes to %x", strings.TrimSpace(line), sum)
	}

	// The record was settled too (the re-attached watch), with the end of the output.
	l, err := cl.ListJobs(ctx, sb.ID, 0)
	if err != nil || len(l.Jobs) != 1 || l.Jobs[0].State != wire.JobExited {
		t.Fatalf("job_list: %+v, %v", l, err)
	}
	if _, err := cl.Destroy(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	after, err := cl.JobStatus(ctx, sb.ID, jobID)
	if err != nil || after.State != wire.JobExited || !after.Success {
		t.Fatalf("status after the sandbox is gone: %+v, %v", after, err)
	}
	tail, err := cl.JobLogs(ctx, sb.ID, jobID, wire.JobLogsRequest{})
	if err != nil || tail.Source != "record" || !strings.HasSuffix(string(tail.Data), line) {
		t.Fatalf("logs after the sandbox is gone: %q… (%s), %v", tail.Data[:min(len(tail.Data), 40)], tail.Source, err)
	}
	s.stop()
	assertHostClean(t, dir, []string{sb.ID})
}
