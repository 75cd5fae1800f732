package main

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/testenv"
	"github.com/agentbox/agentbox/internal/wire"
)

// TestApprovalsEndToEnd drives a real server (runc) with --approval-tools exec,file_write:
// a REST exec waits (nothing acts while pending), is approved through `agentbox approvals
// approve`, runs once, and its retry is refused as used (the file it appends to has one line);
// a denial carries the operator's reason; an unanswered call is APPROVAL_REFUSED unreachable;
// an MCP client that answers elicitation approves its file_write, whose queue entry and
// elicitation message show the content's length and digest, never the content.
func TestApprovalsEndToEnd(t *testing.T) {
	testenv.RequireRoot(t)
	srv := testenv.StartServer(t, testenv.ShortTempDir(t, "abappr"), testToken,
		"--approval-tools", "exec,file_write", "--approval-timeout", "8s", "--approval-elicit")
	c := srv.Client()
	ctx := t.Context()
	sb, err := c.Create(ctx, wire.CreateRequest{}) // not gated: only exec and file_write are
	if err != nil {
		t.Fatalf("create: %v\n%s", err, srv.Logs)
	}
	cli := func(args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, srv.Bin, args...)
		cmd.Env = append(os.Environ(), "AGENTBOX_URL="+srv.URL, "AGENTBOX_TOKEN="+testToken)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	pending := func() wire.Approval {
		t.Helper()
		deadline := time.Now().Add(6 * time.Second)
		for time.Now().Before(deadline) {
			l, err := c.ListApprovals(ctx, wire.ApprovalPending, 0)
			if err != nil {
				t.Fatal(err)
			}
			if len(l) == 1 {
				return l[0]
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Fatalf("no pending approval\n%s", srv.Logs)
		return wire.Approval{}
	}
	lines := func() string {
		t.Helper()
		rc, _, err := c.ReadFile(ctx, sb.ID, "/workspace/count", 0, 0)
		if errcode.Is(err, errcode.FileNotFound) {
			return ""
		}
		if err != nil {
			t.Fatal(err)
		}
		defer rc.Close()
		b, _ := io.ReadAll(rc)
		return string(b)
	}
	execAsync := func(cmd ...string) chan error {
		done := make(chan error, 1)
		go func() {
			_, err := c.Exec(ctx, sb.ID, wire.ExecRequest{Command: cmd}, nil)
			done <- err
		}()
		return done
	}
	appendCmd := []string{"sh", "-c", "echo ran >> /workspace/count"}

	// Approve through the CLI; nothing acts while pending; the retry does not run again.
	done := execAsync(appendCmd...)
	a := pending()
	if a.Tool != "POST /v1/sandboxes/{id}/exec" || a.Action != "exec" || a.SandboxID != sb.ID || len(a.Digest) != 64 {
		t.Fatalf("pending approval %+v", a)
	}
	time.Sleep(300 * time.Millisecond)
	if got := lines(); got != "" {
		t.Fatalf("the exec acted while pending: %q", got)
	}
	if out, err := cli("approvals", "show", a.ID); err != nil || !strings.Contains(out, `"state": "pending"`) || !strings.Contains(out, "echo ran") {
		t.Fatalf("approvals show: %v\n%s", err, out)
	}
	if out, err := cli("approvals", "approve", a.ID); err != nil || !strings.Contains(out, a.ID+" approved") {
		t.Fatalf("approvals approve: %v\n%s", err, out)
	}
	if err := <-done; err != nil {
		t.Fatalf("approved exec: %v", err)
	}
	_, err = c.Exec(ctx, sb.ID, wire.ExecRequest{Command: appendCmd}, nil)
	if e, ok := errcode.As(err); !ok || e.Code != errcode.ApprovalRefused || e.Details["used"] != true || e.Details["approval_id"] != a.ID {
		t.Fatalf("retry of the approved exec: %v, want APPROVAL_REFUSED used", err)
	}
	if got := lines(); got != "ran\n" {
		t.Fatalf("the approved exec ran %q, want once", got)
	}
	if got, err := c.GetApproval(ctx, a.ID); err != nil || got.State != wire.ApprovalUsed || got.Outcome != "ok" || got.UsedAt == nil {
		t.Fatalf("used approval: %+v %v", got, err)
	}
	if out, err := cli("approvals", "approve", a.ID); err == nil || !strings.Contains(out, "CONFLICT") {
		t.Fatalf("approving a used approval: %v\n%s", err, out)
	}

	// Deny with a reason (CLI).
	done = execAsync("sh", "-c", "echo denied >> /workspace/count")
	a = pending()
	if out, err := cli("approvals", "deny", "--reason", "not on a Friday", a.ID); err != nil {
		t.Fatalf("deny: %v\n%s", err, out)
	}
	err = <-done
	if e, ok := errcode.As(err); !ok || e.Code != errcode.ApprovalRefused || !strings.Contains(e.Message, "not on a Friday") || e.Details["retryable"] != false {
		t.Fatalf("denied exec: %v", err)
	}

	// Approve through REST (the Go client), a different command.
	done = execAsync("sh", "-c", "echo rest >> /workspace/count")
	a = pending()
	if got, err := c.DecideApproval(ctx, a.ID, true, ""); err != nil || got.State != wire.ApprovalApproved || got.Decider == "" {
		t.Fatalf("REST approve: %+v %v", got, err)
	}
	if err := <-done; err != nil {
		t.Fatalf("REST-approved exec: %v", err)
	}

	// Nobody answers: unreachable, not retryable.
	start := time.Now()
	_, err = c.Exec(ctx, sb.ID, wire.ExecRequest{Command: []string{"sh", "-c", "echo late >> /workspace/count"}}, nil)
	if e, ok := errcode.As(err); !ok || e.Code != errcode.ApprovalRefused || e.Details["unreachable"] != true || e.Details["retryable"] != false {
		t.Fatalf("unanswered exec: %v", err)
	}
	if d := time.Since(start); d < 7*time.Second || d > 30*time.Second {
		t.Fatalf("unanswered exec returned after %v, want about the 8s timeout", d)
	}
	if got := lines(); got != "ran\nrest\n" {
		t.Fatalf("file %q: only the approved calls may have run", got)
	}

	// An MCP client that answers elicitation approves its own file_write (--approval-elicit).
	const content = "TOP-SECRET-CONTENT-7f3a"
	var mu sync.Mutex
	var asked []string
	var queued []wire.Approval
	cl := mcp.NewClient(&mcp.Implementation{Name: "approvals-test", Version: "1"}, &mcp.ClientOptions{
		ElicitationHandler: func(ctx context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			l, err := client.New(srv.URL, testToken).ListApprovals(ctx, wire.ApprovalPending, 0)
			mu.Lock()
			asked, queued = append(asked, req.Params.Message), l
			mu.Unlock()
			if err != nil {
				return nil, err
			}
			return &mcp.ElicitResult{Action: "accept"}, nil
		}})
	cs, err := cl.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: srv.URL + "/mcp", HTTPClient: authClient()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "file_write", Arguments: map[string]any{
		"sandbox_id": sb.ID, "path": "/workspace/secret.txt", "content": content}})
	if err != nil || res.IsError {
		t.Fatalf("file_write: %v %+v", err, res)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(asked) != 1 || strings.Contains(asked[0], content) || !strings.Contains(asked[0], "content_sha256") {
		t.Fatalf("elicitation messages %q: want one, with the content's digest and without the content", asked)
	}
	if len(queued) != 1 {
		t.Fatalf("queue while eliciting: %+v", queued)
	}
	var sum map[string]any
	if err := json.Unmarshal(queued[0].Summary, &sum); err != nil || sum["path"] != "/workspace/secret.txt" || sum["content_bytes"] != float64(len(content)) ||
		len(sum["content_sha256"].(string)) != 64 || strings.Contains(string(queued[0].Summary), content) {
		t.Fatalf("queued file_write summary %s", queued[0].Summary)
	}
	rc, _, err := c.ReadFile(ctx, sb.ID, "/workspace/secret.txt", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if string(b) != content {
		t.Fatalf("written %q", b)
	}
	// The database never holds the content either.
	db, err := os.ReadFile(srv.StateDir + "/agentbox.db")
	if err != nil {
		t.Fatal(err)
	}
	wal, _ := os.ReadFile(srv.StateDir + "/agentbox.db-wal")
	if strings.Contains(string(db)+string(wal), content) {
		t.Fatal("the database holds the file's content")
	}
}

// TestApprovalsStdioElicitation: the in-process `agentbox mcp` takes the approval flags; with
// --approval-elicit its client's answer decides: declined → APPROVAL_REFUSED and the command
// never ran; accepted → it runs.
func TestApprovalsStdioElicitation(t *testing.T) {
	testenv.RequireRoot(t)
	dir := testenv.ShortTempDir(t, "abapst")
	t.Cleanup(func() { removeCgroupParent("abapst-" + filepath.Base(dir)) })
	cmd := exec.Command(testenv.Binary(t), "mcp", "--state-dir", dir, "--cgroup-parent", "abapst-"+filepath.Base(dir),
		"--approval-tools", "exec", "--approval-elicit", "--approval-timeout", "30s", "--log-level", "info")
	stderr := &testenv.SyncBuffer{}
	cmd.Stderr = stderr
	var answer atomic.Value
	answer.Store("decline")
	var asked atomic.Int32
	cl := mcp.NewClient(&mcp.Implementation{Name: "approvals-stdio", Version: "1"}, &mcp.ClientOptions{
		ElicitationHandler: func(ctx context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			asked.Add(1)
			return &mcp.ElicitResult{Action: answer.Load().(string)}, nil
		}})
	ctx := t.Context()
	// Protocol 2026-07-28 forbids a server-initiated elicitation/create during tools/call
	// (SEP-2322: multi round-trip InputRequests instead, not implemented yet): there the
	// elicitation fails at once and the call waits for an operator. 2025-11-25 elicits.
	cs, err := cl.Connect(ctx, &mcp.CommandTransport{Command: cmd}, &mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
	if err != nil {
		t.Fatalf("connect: %v\n%s", err, stderr)
	}
	defer cs.Close()
	call := func(name string, args map[string]any) (*mcp.CallToolResult, map[string]any) {
		t.Helper()
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
		if err != nil {
			t.Fatalf("%s: %v\n%s", name, err, stderr)
		}
		var out map[string]any
		b, _ := json.Marshal(res.StructuredContent)
		json.Unmarshal(b, &out)
		return res, out
	}
	res, out := call("sandbox_create", map[string]any{}) // not gated
	if res.IsError {
		t.Fatalf("create: %v", out)
	}
	id := out["sandbox_id"].(string)
	defer call("sandbox_destroy", map[string]any{"sandbox_id": id})
	res, out = call("exec", map[string]any{"sandbox_id": id, "command": []string{"sh", "-c", "echo no > /workspace/declined"}})
	errObj, _ := out["error"].(map[string]any)
	if !res.IsError || errObj["code"] != string(errcode.ApprovalRefused) || !strings.Contains(errObj["message"].(string), "declined in the MCP client") {
		t.Fatalf("declined exec: %v (asked %d)\n%s", out, asked.Load(), stderr)
	}
	answer.Store("accept")
	res, out = call("exec", map[string]any{"sandbox_id": id, "command": []string{"sh", "-c", "ls /workspace; echo approved"}})
	if res.IsError || out["stdout"] != "approved\n" {
		t.Fatalf("accepted exec: %v (the declined one must not have run)", out)
	}
	if asked.Load() != 2 {
		t.Fatalf("asked %d times, want 2", asked.Load())
	}
}
