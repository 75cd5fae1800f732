package mcpserver_test

import (
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentbox/agentbox/internal/mcpserver"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/oci"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/sandbox/jobs"
	"github.com/agentbox/agentbox/internal/store/sqlite"
	"github.com/agentbox/agentbox/internal/testenv"
	"github.com/agentbox/agentbox/internal/testenv/fakecp"
)

// *sandbox.Service with its jobs feature is a Backend as it is.
var _ mcpserver.Backend = jobs.Sandboxes{}

// Protocol versions the tests run under: the newest (per-request, SEP-2575) and the newest
// session-based one.
var protocolVersions = []string{"2026-07-28", "2025-11-25"}

// The tests run in two tiers. Tool logic (argument validation, error mapping, schemas, the
// exec and file tools' replies, listing, the sessions' held lists, resources and
// subscriptions, the jobs tools' replies, the gate and the audit) runs on fakeService in every
// mode, without root and under -short: real SQLite, the real service and the fake runtime,
// whose agents are real guest agents in this process. What needs a real sandbox (the
// end-to-end exec path with its users and /workspace, a cancelled command killed in its
// sandbox, cgroup metrics, the images' interpreters) runs on service, real runc, when root.

// fakeService is the control plane over real SQLite and the fake runtime (named "runc"), with
// the default config: no root needed.
func fakeService(t *testing.T) jobs.Sandboxes {
	t.Helper()
	return fakeServiceWith(t, sandbox.Config{})
}

// fakeServiceWith is fakeService with cfg.
func fakeServiceWith(t *testing.T, cfg sandbox.Config) jobs.Sandboxes {
	t.Helper()
	return jobs.With(fakecp.New(t, cfg).Service)
}

// service builds a real control plane: real SQLite, real runc, the real agentbox binary as
// the in-sandbox agent. It skips without root.
func service(t *testing.T, cfg sandbox.Config) jobs.Sandboxes {
	t.Helper()
	testenv.RequireRoot(t)
	dir := testenv.ShortTempDir(t, "abmcp")
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(dir, "agentbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(dir, "rt")
	parent := "abmcp-" + filepath.Base(dir)
	rt, err := oci.New(ctx, oci.Config{Name: "runc", Binary: "runc", Root: root, GuestBinary: testenv.GuestBinary(t),
		CgroupParent: parent, Subreaper: true})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := sandbox.NewService(st, []runtime.Runtime{rt}, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		list, _ := svc.List(ctx, sandbox.ListFilter{})
		var ids []string
		for _, sb := range list {
			ids = append(ids, sb.ID)
			if _, err := svc.Destroy(ctx, sb.ID); err != nil {
				t.Errorf("cleanup: destroy %s: %v", sb.ID, err)
			}
		}
		out, _ := exec.Command("runc", "--root", filepath.Join(root, "state"), "list", "-q").CombinedOutput()
		if s := strings.TrimSpace(string(out)); s != "" {
			t.Errorf("leaked containers: %s", s)
		}
		if len(ids) > 0 {
			if leaks := testenv.Leaks(ids...); len(leaks) > 0 {
				t.Errorf("leaked host resources:\n%s", strings.Join(leaks, "\n"))
			}
		}
		svc.Close()
		st.Close()
	})
	return jobs.With(svc)
}

// client is an SDK client session connected in memory to a Server, recording what the server
// sends it.
type client struct {
	t  *testing.T
	cs *mcp.ClientSession

	mu       sync.Mutex
	progress []*mcp.ProgressNotificationParams
	progAt   []time.Time
	updated  []string
	tools    map[string]*mcp.Tool
}

func connect(t *testing.T, srv *mcpserver.Server, version string) *client {
	t.Helper()
	ct, st := mcp.NewInMemoryTransports()
	ss, err := srv.MCP().Connect(context.Background(), st, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ss.Wait() })
	return connectOver(t, ct, version)
}

// connectOver connects a recording client session over the client transport ct.
func connectOver(t *testing.T, ct mcp.Transport, version string) *client {
	t.Helper()
	c := &client{t: t, tools: map[string]*mcp.Tool{}}
	ctx := context.Background()
	cl := mcp.NewClient(&mcp.Implementation{Name: "mcpserver-test", Version: "1"}, &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, r *mcp.ProgressNotificationClientRequest) {
			c.mu.Lock()
			c.progress = append(c.progress, r.Params)
			c.progAt = append(c.progAt, time.Now())
			c.mu.Unlock()
		},
		ResourceUpdatedHandler: func(_ context.Context, r *mcp.ResourceUpdatedNotificationRequest) {
			c.mu.Lock()
			c.updated = append(c.updated, r.Params.URI)
			c.mu.Unlock()
		},
	})
	cs, err := cl.Connect(ctx, ct, &mcp.ClientSessionOptions{ProtocolVersion: version})
	if err != nil {
		t.Fatal(err)
	}
	c.cs = cs
	t.Cleanup(func() { cs.Close() })
	tools, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tl := range tools.Tools {
		c.tools[tl.Name] = tl
	}
	return c
}

// call calls a tool and checks what every client may check: the structured content conforms
// to the tool's output schema (also for errors), and there is a text rendering.
func (c *client) call(name string, args any) *mcp.CallToolResult {
	c.t.Helper()
	return c.callCtx(context.Background(), name, args, nil)
}

func (c *client) callCtx(ctx context.Context, name string, args any, progressToken any) *mcp.CallToolResult {
	c.t.Helper()
	p := &mcp.CallToolParams{Name: name, Arguments: args}
	if progressToken != nil {
		p.SetProgressToken(progressToken)
	}
	res, err := c.cs.CallTool(ctx, p)
	if err != nil {
		c.t.Fatalf("%s: protocol error: %v", name, err)
	}
	if len(res.Content) == 0 {
		c.t.Fatalf("%s: no content", name)
	}
	if _, ok := res.Content[0].(*mcp.TextContent); !ok {
		c.t.Fatalf("%s: content is %T, want text", name, res.Content[0])
	}
	if res.StructuredContent == nil {
		c.t.Fatalf("%s: no structured content", name)
	}
	tool := c.tools[name]
	if tool == nil || tool.OutputSchema == nil {
		c.t.Fatalf("%s: no output schema", name)
	}
	var s jsonschema.Schema
	b, _ := json.Marshal(tool.OutputSchema)
	if err := json.Unmarshal(b, &s); err != nil {
		c.t.Fatal(err)
	}
	rs, err := s.Resolve(nil)
	if err != nil {
		c.t.Fatalf("%s: output schema does not resolve: %v", name, err)
	}
	var v any
	b, _ = json.Marshal(res.StructuredContent)
	json.Unmarshal(b, &v)
	if err := rs.Validate(&v); err != nil {
		c.t.Fatalf("%s: structured content %s does not conform to the output schema: %v", name, b, err)
	}
	return res
}

// ok calls a tool that must succeed and decodes its structured content into out.
func (c *client) ok(name string, args any, out any) string {
	c.t.Helper()
	res := c.call(name, args)
	if res.IsError {
		c.t.Fatalf("%s(%v): %s", name, args, text(res))
	}
	decode(c.t, res, out)
	return text(res)
}

// fails calls a tool that must fail with code, and returns the message.
func (c *client) fails(name string, args any, code string) string {
	c.t.Helper()
	res := c.call(name, args)
	if !res.IsError {
		c.t.Fatalf("%s(%v) succeeded: %s; want %s", name, args, text(res), code)
	}
	var e struct {
		Error mcpserver.ToolError `json:"error"`
	}
	decode(c.t, res, &e)
	if string(e.Error.Code) != code {
		c.t.Fatalf("%s(%v): code %s (%s), want %s", name, args, e.Error.Code, e.Error.Message, code)
	}
	if want := code + ": " + e.Error.Message; text(res) != want {
		c.t.Fatalf("%s: text %q, want %q", name, text(res), want)
	}
	return e.Error.Message
}

func (c *client) updates() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.updated...)
}

func decode(t *testing.T, res *mcp.CallToolResult, out any) {
	t.Helper()
	if out == nil {
		return
	}
	b, _ := json.Marshal(res.StructuredContent)
	if err := json.Unmarshal(b, out); err != nil {
		t.Fatalf("decode %s: %v", b, err)
	}
}

func text(res *mcp.CallToolResult) string {
	if len(res.Content) == 0 {
		return ""
	}
	if tc, ok := res.Content[0].(*mcp.TextContent); ok {
		return tc.Text
	}
	return ""
}

type obj = map[string]any

func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
