package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/mcpserver"
	"github.com/agentbox/agentbox/internal/testenv"
)

// These tests drive the built binary: `agentbox mcp` over stdio, and `agentbox serve`'s /mcp
// (streamable HTTP) and /sse endpoints, with the SDK's own client.

const testToken = "mcp-test-token-0123456789abcdef"

// serve starts `agentbox serve` on a free loopback port and returns its URL.
func serve(t *testing.T, stateDir string, extra ...string) (string, *testenv.SyncBuffer) {
	t.Helper()
	srv := testenv.StartServer(t, stateDir, testToken, extra...)
	return srv.URL, srv.Logs
}

// removeCgroupParent removes a test's (empty) cgroup parent from every hierarchy.
func removeCgroupParent(name string) {
	dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", name))
	dirs = append(dirs, filepath.Join("/sys/fs/cgroup", name))
	for _, d := range dirs {
		os.Remove(d) // rmdir: succeeds only when no sandbox cgroup is left in it
	}
}

// bearer adds the token to every request.
type bearer struct {
	token string
	base  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.base.RoundTrip(r)
}

func authClient() *http.Client {
	return &http.Client{Transport: bearer{testToken, http.DefaultTransport}}
}

// session is a connected SDK client that records progress notifications.
type session struct {
	t  *testing.T
	cs *mcp.ClientSession

	mu       sync.Mutex
	progress []string
}

func open(t *testing.T, tr mcp.Transport, version string) *session {
	t.Helper()
	s := &session{t: t}
	c := mcp.NewClient(&mcp.Implementation{Name: "agentbox-cmd-test", Version: "1"}, &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, r *mcp.ProgressNotificationClientRequest) {
			s.mu.Lock()
			s.progress = append(s.progress, r.Params.Message)
			s.mu.Unlock()
		},
	})
	// The SSE transport's event stream lives as long as this context: end it with the test.
	ctx, cancel := context.WithCancel(context.Background())
	cs, err := c.Connect(ctx, tr, &mcp.ClientSessionOptions{ProtocolVersion: version})
	if err != nil {
		cancel()
		t.Fatalf("connect: %v", err)
	}
	s.cs = cs
	t.Cleanup(func() { cs.Close(); cancel() })
	return s
}

func (s *session) call(name string, args any, out any) *mcp.CallToolResult {
	s.t.Helper()
	res, err := s.cs.CallTool(context.Background(), &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		s.t.Fatalf("%s: %v", name, err)
	}
	if out != nil {
		b, _ := json.Marshal(res.StructuredContent)
		json.Unmarshal(b, out)
	}
	return res
}

func (s *session) ok(name string, args any, out any) {
	s.t.Helper()
	if res := s.call(name, args, out); res.IsError {
		s.t.Fatalf("%s: %v", name, res.StructuredContent)
	}
}

// loop runs the model's loop through s: health, create, exec with progress (the lines arrive
// before the result), a text and a binary file in and out, list, cancel a running exec (it is
// killed), destroy. It returns health's control_plane.
func (s *session) loop() string {
	t := s.t
	ctx := context.Background()
	tools, err := s.cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatalf("tools/list: %v", err)
	}
	// The exact set is mcpserver's TestToolsList; here the served list has the loop's tools.
	listed := map[string]bool{}
	for _, tl := range tools.Tools {
		listed[tl.Name] = true
	}
	for _, name := range []string{"sandbox_create", "sandbox_list", "sandbox_get", "sandbox_destroy", "sandbox_extend",
		"exec", "file_write", "file_read", "file_list", "health", "watch", "watch_fleet", "sandbox_metrics"} {
		if !listed[name] {
			t.Fatalf("tools/list lacks %s (%d tools)", name, len(tools.Tools))
		}
	}
	for _, tl := range tools.Tools {
		if tl.InputSchema == nil || tl.OutputSchema == nil {
			t.Fatalf("%s lacks a schema", tl.Name)
		}
	}
	var h mcpserver.HealthOut
	s.ok("health", nil, &h)
	if h.Status != "ok" || len(h.Runtimes) == 0 {
		t.Fatalf("health: %+v", h)
	}
	var sb mcpserver.SandboxInfo
	s.ok("sandbox_create", map[string]any{"ttl_seconds": 300}, &sb)
	id := sb.SandboxID

	p := &mcp.CallToolParams{Name: "exec", Arguments: map[string]any{"sandbox_id": id,
		"command": []string{"sh", "-c", "for i in 1 2 3; do echo tick $i; sleep 0.3; done"}}}
	p.SetProgressToken("exec-1")
	res, err := s.cs.CallTool(ctx, p)
	if err != nil || res.IsError {
		t.Fatalf("exec: %v %v", res, err)
	}
	s.mu.Lock()
	streamed := strings.Join(s.progress, "")
	s.mu.Unlock()
	if streamed != "tick 1\ntick 2\ntick 3\n" {
		t.Fatalf("progress before the result: %q", streamed)
	}
	var ex mcpserver.ExecOut
	b, _ := json.Marshal(res.StructuredContent)
	json.Unmarshal(b, &ex)
	if ex.ExitCode != 0 || ex.Stdout != "tick 1\ntick 2\ntick 3\n" {
		t.Fatalf("exec result: %+v", ex)
	}

	s.ok("file_write", map[string]any{"sandbox_id": id, "path": "note.txt", "content": "hello\n"}, nil)
	bin := []byte{0, 1, 2, 0xff, 0xfe}
	s.ok("file_write", map[string]any{"sandbox_id": id, "path": "b.bin", "content_base64": base64.StdEncoding.EncodeToString(bin)}, nil)
	var fr mcpserver.FileReadOut
	s.ok("file_read", map[string]any{"sandbox_id": id, "path": "note.txt"}, &fr)
	if fr.Content == nil || *fr.Content != "hello\n" {
		t.Fatalf("file_read text: %+v", fr)
	}
	s.ok("file_read", map[string]any{"sandbox_id": id, "path": "b.bin"}, &fr)
	if got, _ := base64.StdEncoding.DecodeString(derefStr(fr.ContentBase64)); !bytes.Equal(got, bin) {
		t.Fatalf("file_read binary: %+v", fr)
	}
	var dl mcpserver.FileListOut
	s.ok("file_list", map[string]any{"sandbox_id": id}, &dl)
	if dl.Total != 2 {
		t.Fatalf("file_list: %+v", dl)
	}

	// Cancelling an exec kills the command.
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.cs.CallTool(cctx, &mcp.CallToolParams{Name: "exec", Arguments: map[string]any{"sandbox_id": id,
			"command": []string{"sh", "-c", "echo $$ > /tmp/victim; exec sleep 300"}}})
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if res := s.call("file_read", map[string]any{"sandbox_id": id, "path": "/tmp/victim"}, &fr); !res.IsError && strings.TrimSpace(derefStr(fr.Content)) != "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the command to cancel did not start")
		}
		time.Sleep(50 * time.Millisecond)
	}
	pid := strings.TrimSpace(*fr.Content)
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the cancelled call did not return")
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		s.ok("exec", map[string]any{"sandbox_id": id, "command": []string{"kill", "-0", pid}}, &ex)
		if ex.ExitCode != 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the cancelled command is still running")
		}
		time.Sleep(100 * time.Millisecond)
	}

	var l mcpserver.SandboxList
	s.ok("sandbox_list", nil, &l)
	if l.Count != 1 || l.Sandboxes[0].SandboxID != id {
		t.Fatalf("sandbox_list: %+v", l)
	}
	s.ok("sandbox_destroy", map[string]any{"sandbox_id": id}, &sb)
	if sb.State != "destroyed" {
		t.Fatalf("destroy: %+v", sb)
	}
	return h.ControlPlane
}

func derefStr(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// TestMCPStdio: `agentbox mcp` with no server runs the control plane in-process; a second one on
// the same state dir refuses to start a second control plane and says what to do.
func TestMCPStdio(t *testing.T) {
	testenv.RequireRoot(t)
	dir := testenv.ShortTempDir(t, "abmcp")
	stderr := &testenv.SyncBuffer{}
	t.Cleanup(func() { removeCgroupParent("abmcpt-" + filepath.Base(dir)) })
	cmd := exec.Command(testenv.Binary(t), "mcp", "--state-dir", dir, "--cgroup-parent", "abmcpt-"+filepath.Base(dir), "--log-level", "info")
	cmd.Stderr = stderr
	s := open(t, &mcp.CommandTransport{Command: cmd}, "")
	if cp := s.loop(); !strings.Contains(cp, "in-process") {
		t.Fatalf("control plane %q, want in-process", cp)
	}
	if !strings.Contains(stderr.String(), "agentbox mcp serving on stdio") {
		t.Fatalf("logs do not go to stderr: %q", stderr)
	}

	second := exec.Command(testenv.Binary(t), "mcp", "--state-dir", dir, "--cgroup-parent", "abmcpt-x")
	second.Stdin = strings.NewReader("")
	out, err := second.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
		t.Fatalf("second agentbox mcp on one state dir: %v\n%s", err, out)
	}
	for _, want := range []string{"locked", "agentbox serve --state-dir " + dir} {
		if !strings.Contains(string(out), want) {
			t.Fatalf("second agentbox mcp: message lacks %q:\n%s", want, out)
		}
	}

	// The first session still works; closing it ends the process cleanly.
	var h mcpserver.HealthOut
	s.ok("health", nil, &h)
	// The data-assistant tools in process: run_python, and fetch_metrics over the process's own registry with
	// the state collector attached (no REST server does it here).
	var rp mcpserver.RunCodeOut
	s.ok("run_python", map[string]any{"code": "6*7"}, &rp)
	if rp.Value == nil || rp.Value.JSON != float64(42) || rp.Kept {
		t.Fatalf("run_python in process: %+v", rp)
	}
	var fm mcpserver.FetchMetricsOut
	s.ok("fetch_metrics", map[string]any{"name": "agentbox_capacity_sandboxes_used"}, &fm)
	if len(fm.Metrics) != 1 || len(fm.Metrics[0].Samples) != 1 || fm.Metrics[0].Samples[0].Value != 0 {
		t.Fatalf("fetch_metrics in process: %+v", fm)
	}
	if err := s.cs.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	if cmd.ProcessState == nil || !cmd.ProcessState.Success() {
		t.Fatalf("agentbox mcp exit: %v\n%s", cmd.ProcessState, stderr)
	}
	if left, err := testenv.Containers(dir); err != nil || len(left) > 0 {
		t.Fatalf("containers left: %v %v", left, err)
	}
}

// TestMCPStdioUsesRunningServer: with `agentbox serve` up on the state dir, `agentbox mcp` finds
// it and its token and relays stdio to its /mcp endpoint — sandboxes, streamed output and
// cancellation included; the server's own MCP server answers (its control plane, its tools).
func TestMCPStdioUsesRunningServer(t *testing.T) {
	testenv.RequireRoot(t)
	dir := testenv.ShortTempDir(t, "abmcp")
	url, _ := serve(t, dir)
	mcpCmd := func(token string) *exec.Cmd {
		cmd := exec.Command(testenv.Binary(t), "mcp", "--state-dir", dir)
		cmd.Env = append(os.Environ(), "AGENTBOX_TOKEN="+token)
		return cmd
	}
	for _, v := range []string{"2026-07-28", "2025-06-18"} {
		t.Run(v, func(t *testing.T) {
			s := open(t, &mcp.CommandTransport{Command: mcpCmd(testToken)}, v)
			if cp := s.loop(); cp != "agentbox serve (state dir "+dir+")" {
				t.Fatalf("control plane %q, want the server of %s", cp, dir)
			}
		})
	}
	// A sandbox made through stdio is the server's.
	s := open(t, &mcp.CommandTransport{Command: mcpCmd(testToken)}, "")
	var sb mcpserver.SandboxInfo
	s.ok("sandbox_create", nil, &sb)
	if got, err := client.New(url, testToken).Get(context.Background(), sb.SandboxID); err != nil || got.State != "running" {
		t.Fatalf("the server does not know %s: %v %v", sb.SandboxID, got, err)
	}
	s.ok("sandbox_destroy", map[string]any{"sandbox_id": sb.SandboxID}, nil)
	// run_python and fetch_metrics are the server's own: its registry, with the state collector.
	var rp mcpserver.RunCodeOut
	s.ok("run_python", map[string]any{"code": "print('hi')\n6*7"}, &rp)
	if rp.Value == nil || rp.Value.JSON != float64(42) || rp.Stdout != "hi\n" {
		t.Fatalf("run_python through the relay: %+v", rp)
	}
	var fm mcpserver.FetchMetricsOut
	s.ok("fetch_metrics", map[string]any{"name": "agentbox_capacity_sandboxes_used"}, &fm)
	if len(fm.Metrics) != 1 || len(fm.Metrics[0].Samples) != 1 {
		t.Fatalf("fetch_metrics through the relay: %+v", fm)
	}

	cmd := mcpCmd("wrong-token-0123456789")
	cmd.Stdin = strings.NewReader("")
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "refuses this token") {
		t.Fatalf("wrong token: %v\n%s", err, out)
	}
}

// TestMCPStreamableHTTP: serve's /mcp with the token, under each protocol version; and the
// HTTP hardening: no token → 401, another Origin (scheme, host or port) → 403, a rebinding
// Host → 403.
func TestMCPStreamableHTTP(t *testing.T) {
	testenv.RequireRoot(t)
	url, _ := serve(t, testenv.ShortTempDir(t, "abmcp"))
	for _, v := range []string{"2026-07-28", "2025-11-25", "2025-03-26"} {
		t.Run(v, func(t *testing.T) {
			s := open(t, &mcp.StreamableClientTransport{Endpoint: url + "/mcp", HTTPClient: authClient()}, v)
			if cp := s.loop(); !strings.HasPrefix(cp, "agentbox serve") {
				t.Fatalf("control plane %q", cp)
			}
		})
	}

	initBody := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`
	post := func(hdr map[string]string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest("POST", url+"/mcp", strings.NewReader(initBody))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		for k, v := range hdr {
			if k == "Host" {
				req.Host = v
			} else {
				req.Header.Set(k, v)
			}
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
		return resp.StatusCode, string(b)
	}
	auth := "Bearer " + testToken
	cases := []struct {
		name string
		hdr  map[string]string
		code int
		says string
	}{
		{"no token", nil, 401, "bearer token"},
		{"wrong token", map[string]string{"Authorization": "Bearer nope"}, 401, "AUTH_FAILED"},
		{"cross origin", map[string]string{"Authorization": auth, "Origin": "http://evil.example"}, 403, "cross-origin"},
		{"cross site fetch", map[string]string{"Authorization": auth, "Sec-Fetch-Site": "cross-site"}, 403, "cross-origin"},
		{"rebinding Host", map[string]string{"Authorization": auth, "Host": "evil.example:8765"}, 403, "loopback"},
		{"rebinding Host and Origin", map[string]string{"Authorization": auth, "Host": "evil.example", "Origin": "http://evil.example"}, 403, "loopback"},
		{"same origin", map[string]string{"Authorization": auth, "Origin": url}, 200, `"protocolVersion"`},
		// The origin is the scheme, host and port: an https page of the same host and port is
		// another origin of a plain HTTP server, and so is another port of the same host.
		{"https origin on plain HTTP", map[string]string{"Authorization": auth, "Origin": "https://" + strings.TrimPrefix(url, "http://")}, 403, "cross-origin"},
		{"another port", map[string]string{"Authorization": auth, "Origin": "http://127.0.0.1:1"}, 403, "cross-origin"},
		{"opaque origin", map[string]string{"Authorization": auth, "Origin": "null"}, 403, "cross-origin"},
		{"no origin (not a browser)", map[string]string{"Authorization": auth}, 200, `"serverInfo"`},
		{"localhost Host", map[string]string{"Authorization": auth, "Host": "localhost" + strings.TrimPrefix(url, "http://127.0.0.1")}, 200, `"serverInfo"`},
	}
	for _, tc := range cases {
		code, body := post(tc.hdr)
		if code != tc.code || !strings.Contains(body, tc.says) {
			t.Errorf("%s: %d %s; want %d with %q", tc.name, code, body, tc.code, tc.says)
		}
	}
	// The SDK's client without the token cannot connect.
	c := mcp.NewClient(&mcp.Implementation{Name: "no-token", Version: "1"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url + "/mcp", MaxRetries: -1}, nil); err == nil {
		cs.Close()
		t.Fatal("connected without the token")
	}
	// /health stays open.
	resp, err := http.Get(url + "/health")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("/health: %v %v", resp, err)
	}
	resp.Body.Close()
}

// TestMCPSSE: the older HTTP+SSE transport at /sse, behind the same token.
func TestMCPSSE(t *testing.T) {
	testenv.RequireRoot(t)
	url, _ := serve(t, testenv.ShortTempDir(t, "abmcp"))
	s := open(t, &mcp.SSEClientTransport{Endpoint: url + "/sse", HTTPClient: authClient()}, "2024-11-05")
	s.loop()

	resp, err := http.Get(url + "/sse")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 {
		t.Fatalf("/sse without the token: %d", resp.StatusCode)
	}
	req, _ := http.NewRequest("GET", url+"/sse", nil)
	req.Header.Set("Authorization", "Bearer "+testToken)
	req.Header.Set("Origin", "http://evil.example")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 403 {
		t.Fatalf("/sse from another origin: %d", resp.StatusCode)
	}
}

// TestServeInsecureNoAuth: the flag works only on loopback and says so loudly.
func TestServeInsecureNoAuth(t *testing.T) {
	testenv.RequireRoot(t)
	bin := testenv.Binary(t)
	dir := testenv.ShortTempDir(t, "abmcp")
	for _, args := range [][]string{
		{"--listen", "0.0.0.0:0"},
		{"--listen", "0.0.0.0:0", "--allow-remote"},
		{"--listen", "127.0.0.1:0", "--allow-remote"},
	} {
		out, err := exec.Command(bin, append([]string{"serve", "--insecure-no-auth", "--state-dir", dir}, args...)...).CombinedOutput()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), "only on a loopback") {
			t.Fatalf("--insecure-no-auth %v: %v\n%s", args, err, out)
		}
	}
	url, logs := serve(t, dir, "--insecure-no-auth")
	if !strings.Contains(logs.String(), "WITHOUT A TOKEN") {
		t.Fatalf("no loud warning on stderr:\n%s", logs)
	}
	s := open(t, &mcp.StreamableClientTransport{Endpoint: url + "/mcp"}, "")
	var h mcpserver.HealthOut
	s.ok("health", nil, &h)
	if h.Status != "ok" {
		t.Fatalf("health without a token: %+v", h)
	}
	req, _ := http.NewRequest("POST", url+"/mcp", strings.NewReader(`{}`))
	req.Host = "evil.example"
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 403 {
		t.Fatalf("rebinding Host without auth: %d", resp.StatusCode)
	}
}

// TestMCPRuns: the run tools work through `agentbox mcp`, in process (the run service wired on
// its own control plane) and against a running serve (over REST), in real runc sandboxes: a
// run waited for, and its artifact inline.
func TestMCPRuns(t *testing.T) {
	testenv.RequireRoot(t)
	check := func(t *testing.T, s *session) {
		t.Helper()
		var r mcpserver.RunOut
		res := s.call("run", map[string]any{"command": []string{"sh", "-c", "echo made > art.txt"}, "artifacts": []string{"art.txt"},
			"validation_commands": [][]string{{"test", "-s", "art.txt"}}, "wait_seconds": 120}, &r)
		if res.IsError || r.State != "succeeded" || len(r.Artifacts) != 1 || r.CleanupFailed {
			t.Fatalf("run: %+v", res.StructuredContent)
		}
		var a mcpserver.RunArtifactOut
		s.ok("run_artifact", map[string]any{"run_id": r.ID, "path": "art.txt"}, &a)
		if b, _ := base64.StdEncoding.DecodeString(a.ContentBase64); !a.Inline || string(b) != "made\n" {
			t.Fatalf("run_artifact: %+v", a)
		}
		var l mcpserver.RunListOut
		s.ok("run_list", nil, &l)
		if len(l.Runs) == 0 || l.Runs[0].ID != r.ID {
			t.Fatalf("run_list: %+v", l)
		}
	}
	t.Run("in-process", func(t *testing.T) {
		dir := testenv.ShortTempDir(t, "abmcpr")
		t.Cleanup(func() { removeCgroupParent("abmcpr-" + filepath.Base(dir)) })
		cmd := exec.Command(testenv.Binary(t), "mcp", "--state-dir", dir, "--cgroup-parent", "abmcpr-"+filepath.Base(dir), "--run-workers", "2")
		stderr := &testenv.SyncBuffer{}
		cmd.Stderr = stderr
		s := open(t, &mcp.CommandTransport{Command: cmd}, "")
		check(t, s)
		if err := s.cs.Close(); err != nil {
			t.Fatalf("close: %v", err)
		}
		if cmd.ProcessState == nil || !cmd.ProcessState.Success() {
			t.Fatalf("agentbox mcp exit: %v\n%s", cmd.ProcessState, stderr)
		}
	})
	t.Run("serve", func(t *testing.T) {
		dir := testenv.ShortTempDir(t, "abmcpr")
		serve(t, dir)
		cmd := exec.Command(testenv.Binary(t), "mcp", "--state-dir", dir)
		cmd.Env = append(os.Environ(), "AGENTBOX_TOKEN="+testToken)
		check(t, open(t, &mcp.CommandTransport{Command: cmd}, ""))
	})
}

// TestMCPServerFlagRefusesNoServer: `agentbox mcp --server URL` relays to that server or to
// none: nothing answering there is an error, never a control plane of its own.
func TestMCPServerFlagRefusesNoServer(t *testing.T) {
	cmd := exec.Command(testenv.Binary(t), "mcp", "--server", "http://127.0.0.1:1", "--state-dir", t.TempDir())
	cmd.Stdin = strings.NewReader("")
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(string(out), "no agentbox server answers at http://127.0.0.1:1") {
		t.Fatalf("agentbox mcp --server with nothing there: %v\n%s", err, out)
	}
}
