// Package e2e drives the built agentbox binary end to end: `agentbox serve` on loopback with a
// real state dir, the CLI, the REST API over HTTP, and server crashes with restart.
package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/testenv"
	"github.com/agentbox/agentbox/internal/wire"
)

const token = "e2e-test-token-0123456789abcdef"

// server is a running `agentbox serve` with the e2e token.
type server struct {
	*testenv.Server
	t *testing.T
}

func startServer(t *testing.T, stateDir string, extra ...string) *server {
	t.Helper()
	return &server{testenv.StartServer(t, stateDir, token, extra...), t}
}

func (s *server) stop()                  { s.Stop() }
func (s *server) kill()                  { s.Kill() }
func (s *server) client() *client.Client { return s.Client() }

// cli runs the agentbox CLI against the server.
func (s *server) cli(stdin string, args ...string) (stdout, stderr string, code int) {
	cmd := exec.Command(s.Bin, args...)
	cmd.Env = append(os.Environ(), "AGENTBOX_URL="+s.URL, "AGENTBOX_TOKEN="+token)
	cmd.Stdin = strings.NewReader(stdin)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	code = 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		s.t.Fatal(err)
	}
	return o.String(), e.String(), code
}

func TestCLI(t *testing.T) {
	testenv.RequireRoot(t)
	s := startServer(t, testenv.ShortTempDir(t, "abe2e"))
	id, errOut, code := s.cli("", "sandbox", "create", "--memory-mb", "256", "--label", "suite=e2e", "--env", "FOO=bar")
	id = strings.TrimSpace(id)
	if code != 0 || !sandbox.ValidID(id) {
		t.Fatalf("create printed %q (stderr %q, exit %d)", id, errOut, code)
	}
	out, _, code := s.cli("", "exec", id, "--", "sh", "-c", "echo $FOO; echo err >&2; exit 7")
	if out != "bar\n" || code != 7 {
		t.Fatalf("exec: %q exit %d", out, code)
	}
	out, _, code = s.cli("piped input", "exec", id, "--", "cat")
	if out != "piped input" || code != 0 {
		t.Fatalf("exec stdin: %q %d", out, code)
	}
	out, _, code = s.cli("", "exec", id, "--", "git", "--version")
	if !strings.HasPrefix(out, "git version") || code != 0 {
		t.Fatalf("git --version: %q %d", out, code)
	}
	// Commands run as the unprivileged agent user; root on request.
	if out, e, code := s.cli("", "exec", id, "--", "id", "-un"); out != "agent\n" || code != 0 {
		t.Fatalf("default user: %q %q %d", out, e, code)
	}
	if out, e, code := s.cli("", "exec", "--user", "root", id, "--", "sh", "-c", "id -u; touch /root/ok"); out != "0\n" || code != 0 {
		t.Fatalf("--user root: %q %q %d", out, e, code)
	}
	if _, e, code := s.cli("", "exec", "--user", "bob", id, "--", "true"); code != 1 || !strings.Contains(e, "INVALID_ARGUMENT") {
		t.Fatalf("--user bob: %q %d", e, code)
	}
	// cp in and out, binary-safe.
	local := filepath.Join(t.TempDir(), "notes.bin")
	data := make([]byte, 3<<20)
	rand.Read(data)
	os.WriteFile(local, data, 0o640)
	if _, e, code := s.cli("", "cp", local, id+":/workspace/notes.bin"); code != 0 {
		t.Fatalf("cp in: %s", e)
	}
	back := filepath.Join(t.TempDir(), "back.bin")
	if _, e, code := s.cli("", "cp", id+":/workspace/notes.bin", back); code != 0 {
		t.Fatalf("cp out: %s", e)
	}
	if got, _ := os.ReadFile(back); !bytes.Equal(got, data) {
		t.Fatal("cp round trip differs")
	}
	if out, _, _ := s.cli("", "exec", id, "--", "stat", "-c", "%a", "notes.bin"); out != "640\n" {
		t.Fatalf("mode after cp: %q", out)
	}
	out, _, code = s.cli("", "sandbox", "ls", "--json")
	var list []sandbox.Sandbox
	if err := json.Unmarshal([]byte(out), &list); err != nil || code != 0 || len(list) != 1 || list[0].ID != id || list[0].Labels["suite"] != "e2e" {
		t.Fatalf("ls --json: %q %v", out, err)
	}
	if out, _, code := s.cli("", "sandbox", "ls"); code != 0 || !strings.Contains(out, id) {
		t.Fatalf("ls: %q", out)
	}
	if _, e, code := s.cli("", "sandbox", "get", "sb-000000000000"); code != 1 || !strings.Contains(e, "SANDBOX_NOT_FOUND") {
		t.Fatalf("get unknown: %q %d", e, code)
	}
	if _, e, code := s.cli("", "sandbox", "create", "--memory-mb", "-1"); code != 1 || !strings.Contains(e, "INVALID_ARGUMENT") || !strings.Contains(e, "memory_mb") {
		t.Fatalf("bad create: %q %d", e, code)
	}
	if out, _, code := s.cli("", "sandbox", "extend", "--ttl", "60", id); code != 0 || !strings.Contains(out, "expires") {
		t.Fatalf("extend: %q", out)
	}
	if out, _, code := s.cli("", "sandbox", "rm", id); code != 0 || strings.TrimSpace(out) != id {
		t.Fatalf("rm: %q %d", out, code)
	}
	if out, _, _ := s.cli("", "sandbox", "ls", "--json"); strings.TrimSpace(out) != "[]" {
		t.Fatalf("ls after rm: %q", out)
	}
	if _, e, code := s.cli("", "exec", id, "--", "true"); code != 1 || !strings.Contains(e, "SANDBOX_NOT_RUNNING") {
		t.Fatalf("exec after rm: %q", e)
	}
	out, _, code = s.cli("", "version")
	if code != 0 || !strings.HasPrefix(out, "agentbox ") {
		t.Fatalf("version: %q", out)
	}
}

func TestRESTHardeningAndBadInput(t *testing.T) {
	testenv.RequireRoot(t)
	s := startServer(t, testenv.ShortTempDir(t, "abe2e"))
	do := func(method, path, body string, hdr map[string]string) (int, map[string]any) {
		req, _ := http.NewRequest(method, s.URL+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
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
		var m map[string]any
		json.NewDecoder(resp.Body).Decode(&m)
		return resp.StatusCode, m
	}
	code := func(m map[string]any) string {
		e, _ := m["error"].(map[string]any)
		c, _ := e["code"].(string)
		return c
	}
	// /health is open; everything else needs the token.
	resp, err := http.Get(s.URL + "/health")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("health: %v %v", resp, err)
	}
	resp.Body.Close()
	if st, m := do("GET", "/v1/sandboxes", "", map[string]string{"Authorization": "Bearer wrong"}); st != 401 || code(m) != "AUTH_FAILED" {
		t.Fatalf("wrong token: %d %v", st, m)
	}
	if st, _ := do("GET", "/v1/sandboxes", "", map[string]string{"Authorization": ""}); st != 401 {
		t.Fatalf("no token: %d", st)
	}
	if st, _ := do("GET", "/v1/sandboxes", "", map[string]string{"Host": "evil.example:8765"}); st != 403 {
		t.Fatalf("rebinding Host: %d", st)
	}
	bad := []struct{ method, path, body, want string }{
		{"POST", "/v1/sandboxes", `{"memroy_mb": 5}`, "INVALID_ARGUMENT"},
		{"POST", "/v1/sandboxes", `{"memory_mb": -5}`, "INVALID_ARGUMENT"},
		{"POST", "/v1/sandboxes", `{"memory_mb": "lots"}`, "INVALID_ARGUMENT"},
		{"POST", "/v1/sandboxes", `{"cpu": 1} {"cpu": 2}`, "INVALID_ARGUMENT"},
		{"POST", "/v1/sandboxes", `not json`, "INVALID_ARGUMENT"},
		{"POST", "/v1/sandboxes", ``, "INVALID_ARGUMENT"},
		{"POST", "/v1/sandboxes", `{"env": {"A": "` + strings.Repeat("x", 30<<20) + `"}}`, "FILE_TOO_LARGE"}, // 413: over the JSON bound
		{"GET", "/v1/sandboxes/not-an-id", ``, "INVALID_ARGUMENT"},
		{"GET", "/v1/sandboxes/sb-0123456789ab", ``, "SANDBOX_NOT_FOUND"},
		{"DELETE", "/v1/sandboxes/sb-0123456789ab", ``, "SANDBOX_NOT_FOUND"},
		{"POST", "/v1/sandboxes/sb-0123456789ab/exec", `{"command": ["true"]}`, "SANDBOX_NOT_FOUND"},
		{"GET", "/v1/sandboxes?state=bogus", ``, "INVALID_ARGUMENT"},
	}
	if st, m := do("GET", "/v1/nope", "", nil); st != 404 || code(m) != "INVALID_ARGUMENT" {
		t.Errorf("unknown endpoint: %d %v", st, m)
	}
	for _, b := range bad {
		st, m := do(b.method, b.path, b.body, nil)
		if code(m) != b.want || st != errcode.HTTPStatus(errcode.Code(b.want)) {
			t.Errorf("%s %s %.40q: %d %v, want %s", b.method, b.path, b.body, st, m, b.want)
		}
	}
	c := s.client()
	ctx := context.Background()
	if list, err := c.List(ctx, []string{"creating", "running", "failed", "destroyed"}, nil); err != nil || len(list) != 0 {
		t.Fatalf("bad input created sandboxes: %v %v", list, err)
	}
	sb, err := c.Create(ctx, wire.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Destroy(ctx, sb.ID)
	for _, b := range []struct{ method, path, body, want string }{
		{"POST", "/v1/sandboxes/" + sb.ID + "/exec", `{"command": []}`, "INVALID_ARGUMENT"},
		{"POST", "/v1/sandboxes/" + sb.ID + "/exec", `{"command": "ls -la"}`, "INVALID_ARGUMENT"},
		{"POST", "/v1/sandboxes/" + sb.ID + "/exec", `{"command": ["true"], "timeout_seconds": -1}`, "INVALID_ARGUMENT"},
		{"POST", "/v1/sandboxes/" + sb.ID + "/exec", `{"command": ["true"], "stdin_base64": "%%%"}`, "INVALID_ARGUMENT"},
		{"GET", "/v1/sandboxes/" + sb.ID + "/files?path=/etc/pass%00wd", ``, "INVALID_ARGUMENT"},
		{"GET", "/v1/sandboxes/" + sb.ID + "/files?path=/nope", ``, "FILE_NOT_FOUND"},
		{"GET", "/v1/sandboxes/" + sb.ID + "/files?path=/workspace", ``, "INVALID_ARGUMENT"},
		{"GET", "/v1/sandboxes/" + sb.ID + "/files?path=/etc/passwd&offset=-1", ``, "INVALID_ARGUMENT"},
		{"PUT", "/v1/sandboxes/" + sb.ID + "/files?path=/workspace/x&mode=999", `x`, "INVALID_ARGUMENT"},
		{"POST", "/v1/sandboxes/" + sb.ID + "/extend", `{"ttl_seconds": -3}`, "INVALID_ARGUMENT"},
	} {
		st, m := do(b.method, b.path, b.body, nil)
		if code(m) != b.want {
			t.Errorf("%s %s %q: %d %v, want %s", b.method, b.path, b.body, st, m, b.want)
		}
	}
	// The server still serves after all that.
	res, err := c.Exec(ctx, sb.ID, apiExec("echo", "ok"), nil)
	if err != nil || res.Stdout != "ok\n" {
		t.Fatalf("exec after bad input: %+v %v", res, err)
	}
}

func TestServeRefusesUnsafeStarts(t *testing.T) {
	testenv.RequireRoot(t)
	bin := testenv.Binary(t)
	dir := testenv.ShortTempDir(t, "abe2e")
	out, err := exec.Command(bin, "serve", "--listen", "0.0.0.0:0", "--state-dir", dir, "--cgroup-parent", "abe2e-x").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "--allow-remote") {
		t.Fatalf("non-loopback listen: %v %s", err, out)
	}
	startServer(t, dir)
	cmd := exec.Command(bin, "serve", "--listen", "127.0.0.1:0", "--state-dir", dir, "--cgroup-parent", "abe2e-y")
	cmd.Env = append(os.Environ(), "AGENTBOX_TOKEN="+token)
	out, err = cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "locked") {
		t.Fatalf("second server on one state dir: %v %s", err, out)
	}
}

// TestKillAndRestart: a server killed with SIGKILL and restarted loses no running sandbox and
// leaks nothing.
func TestKillAndRestart(t *testing.T) {
	testenv.RequireRoot(t)
	dir := testenv.ShortTempDir(t, "abe2e")
	s := startServer(t, dir)
	ctx := context.Background()
	c := s.client()
	var ids []string
	for i := 0; i < 3; i++ {
		sb, err := c.Create(ctx, wire.CreateRequest{})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sb.ID)
	}
	c.Exec(ctx, ids[0], apiExec("sh", "-c", "echo kept > /workspace/state.txt"), nil)
	s.kill()
	s2 := startServer(t, dir)
	c2 := s2.client()
	for _, id := range ids {
		sb, err := c2.Get(ctx, id)
		if err != nil || sb.State != wire.StateRunning {
			t.Fatalf("after restart %s: %+v %v\n%s", id, sb, err, s2.Logs)
		}
	}
	res, err := c2.Exec(ctx, ids[0], apiExec("cat", "/workspace/state.txt"), nil)
	if err != nil || res.Stdout != "kept\n" {
		t.Fatalf("exec after restart: %+v %v", res, err)
	}
	for _, id := range ids {
		if _, err := c2.Destroy(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	s2.stop()
	assertHostClean(t, dir, ids)
}

// TestKillDuringCreate: SIGKILL while a create is in flight; the restart marks it failed (or
// keeps it, if it finished) and leaks nothing.
func TestKillDuringCreate(t *testing.T) {
	testenv.RequireRoot(t)
	dir := testenv.ShortTempDir(t, "abe2e")
	for _, delay := range []time.Duration{5 * time.Millisecond, 30 * time.Millisecond, 60 * time.Millisecond} {
		s := startServer(t, dir)
		go s.client().Create(context.Background(), wire.CreateRequest{})
		time.Sleep(delay)
		s.kill()
	}
	s := startServer(t, dir)
	c := s.client()
	ctx := context.Background()
	list, err := c.List(ctx, []string{"creating", "running", "stopping", "failed", "lost", "destroyed"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, sb := range list {
		ids = append(ids, sb.ID)
		if sb.State == wire.StateCreating || sb.State == wire.StateStopping {
			t.Errorf("after restart %s is still %s", sb.ID, sb.State)
		}
		if sb.State == wire.StateRunning {
			if res, err := c.Exec(ctx, sb.ID, apiExec("true"), nil); err != nil || res.ExitCode != 0 {
				t.Errorf("adopted sandbox does not run: %v", err)
			}
		}
		c.Destroy(ctx, sb.ID)
	}
	s.stop()
	assertHostClean(t, dir, ids)
}

func assertHostClean(t *testing.T, dir string, ids []string) {
	t.Helper()
	if left, err := testenv.Containers(dir); err != nil || len(left) > 0 {
		t.Errorf("containers left: %v %v", left, err)
	}
	if d, _ := filepath.Glob(filepath.Join(dir, "runtimes", "*", "sandboxes", "*")); len(d) > 0 {
		t.Errorf("sandbox dirs left: %v", d)
	}
	if len(ids) > 0 {
		if leaks := testenv.Leaks(ids...); len(leaks) > 0 {
			t.Errorf("host leaks:\n%s", strings.Join(leaks, "\n"))
		}
	}
}

func TestDoctor(t *testing.T) {
	testenv.RequireRoot(t)
	out, err := exec.Command(testenv.Binary(t), "doctor").CombinedOutput()
	if err != nil {
		t.Fatalf("doctor failed on a host that runs sandboxes: %v\n%s", err, out)
	}
	for _, want := range []string{"runc", "cgroups", "rlimits", "runc sandbox", "sandboxes run " + filepath.Join(filepath.Dir(testenv.Binary(t)), "agentbox-guest"),
		// runc takes OCI images here (the image tests run them): the overlay line says so.
		"ok   overlay          overlayfs in the kernel; OCI images on runc (id-mapped layers)"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("doctor output lacks %q:\n%s", want, out)
		}
	}
}
