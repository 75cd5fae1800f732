package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/testenv"
	"github.com/agentbox/agentbox/internal/wire"
)

// tmux drives one tmux server of its own (socket name per test).
type tmux struct {
	t    *testing.T
	sock string
}

func newTmux(t *testing.T, name string) *tmux {
	t.Helper()
	if _, err := exec.LookPath("tmux"); err != nil {
		t.Fatal("tmux is not installed: `sudo make deps` installs it (apt-get install tmux)")
	}
	tm := &tmux{t: t, sock: fmt.Sprintf("abtest-%d-%s", os.Getpid(), name)}
	t.Cleanup(func() { _ = exec.Command("tmux", "-L", tm.sock, "kill-server").Run() })
	return tm
}

func (tm *tmux) run(args ...string) string {
	tm.t.Helper()
	out, err := exec.Command("tmux", append([]string{"-L", tm.sock, "-f", "/dev/null"}, args...)...).CombinedOutput()
	if err != nil {
		tm.t.Fatalf("tmux %q: %v: %s", args, err, out)
	}
	return string(out)
}

func (tm *tmux) capture(target string) string {
	return tm.run("capture-pane", "-p", "-t", target)
}

// waitFor waits until the pane shows text matching re.
func (tm *tmux) waitFor(target, re string) string {
	tm.t.Helper()
	rx := regexp.MustCompile(re)
	deadline := time.Now().Add(30 * time.Second)
	var screen string
	for time.Now().Before(deadline) {
		screen = tm.capture(target)
		if m := rx.FindString(screen); m != "" {
			return m
		}
		time.Sleep(50 * time.Millisecond)
	}
	tm.t.Fatalf("pane %s never showed %q; it shows:\n%s", target, re, screen)
	return ""
}

// TestShellUnderTmux uses `agentbox shell` the way a person does: in a terminal (a tmux pane),
// typing, a full-screen program, a window resize, Ctrl-C, and the exit code.
// It runs on runc and on gVisor, whose kernel has its own terminal implementation.
func TestShellUnderTmux(t *testing.T) {
	testenv.RequireRoot(t)
	s := startServer(t, testenv.ShortTempDir(t, "abpty"))
	for _, rt := range []string{"runc", "gvisor"} {
		t.Run(rt, func(t *testing.T) { testShell(t, s, rt) })
	}
}

func testShell(t *testing.T, s *server, runtime string) {
	id, errOut, code := s.cli("", "sandbox", "create", "--memory-mb", "256", "--runtime", runtime)
	id = strings.TrimSpace(id)
	if code != 0 || !sandbox.ValidID(id) {
		t.Fatalf("create printed %q (stderr %q, exit %d)", id, errOut, code)
	}
	tm := newTmux(t, runtime)
	shell := fmt.Sprintf("env AGENTBOX_URL=%s AGENTBOX_TOKEN=%s TERM=xterm-256color %s shell %s; echo CLI-EXIT=$?; echo MODE=$(stty -a | grep -ow -- '-\\?icanon') $(stty -a | grep -ow -- '-\\?echo'); sleep 600", s.URL, token, s.Bin, id)
	tm.run("new-session", "-d", "-s", "a", "-x", "100", "-y", "30", shell)

	// Typing: the command runs in the sandbox (as its agent user) and its output shows.
	tm.run("send-keys", "-t", "a", "echo hi-$((20+22)) $(id -un)", "Enter")
	tm.waitFor("a", `hi-42 agent`)
	tm.run("send-keys", "-t", "a", "stty size", "Enter")
	tm.waitFor("a", `(?m)^30 100\s*$`)

	// A full-screen program: top draws its header, and q leaves it.
	tm.run("send-keys", "-t", "a", "clear; top -d 1", "Enter")
	tm.waitFor("a", `(?m)^top - .*load average`)
	tm.waitFor("a", `(?m)^Tasks: +\d+ total`)
	// top discards what was typed before it set its terminal up: press q until it has gone.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cl := s.client()
	sandboxRuns := func(prefix string) bool {
		res, err := cl.Exec(ctx, id, wire.ExecRequest{Command: []string{"ps", "-eo", "args"}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(prefix)).MatchString(res.Stdout)
	}
	for deadline := time.Now().Add(20 * time.Second); sandboxRuns("top -d 1"); {
		if time.Now().After(deadline) {
			t.Fatalf("top did not quit on q:\n%s", tm.capture("a"))
		}
		tm.run("send-keys", "-t", "a", "q")
		time.Sleep(300 * time.Millisecond)
	}
	tm.run("send-keys", "-t", "a", "clear; echo back-$((1+2))", "Enter")
	tm.waitFor("a", `back-3`)

	// Resizing the window resizes the sandbox's terminal.
	tm.run("resize-window", "-t", "a", "-x", "120", "-y", "40")
	time.Sleep(200 * time.Millisecond)
	tm.run("send-keys", "-t", "a", "stty size", "Enter")
	tm.waitFor("a", `(?m)^40 120\s*$`)

	// Ctrl-C interrupts the foreground command in the sandbox; the shell lives on.
	tm.run("send-keys", "-t", "a", "sleep 100; echo not-interrupted", "Enter")
	time.Sleep(500 * time.Millisecond)
	start := time.Now()
	tm.run("send-keys", "-t", "a", "C-c")
	tm.run("send-keys", "-t", "a", "echo alive-$((2+3))", "Enter")
	tm.waitFor("a", `alive-5`)
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("Ctrl-C took %v", d)
	}
	if regexp.MustCompile(`(?m)^not-interrupted`).MatchString(tm.capture("a")) {
		t.Fatal("sleep ran to its end: Ctrl-C did not reach it")
	}

	// The CLI exits with the shell's exit code, and the local terminal is restored.
	tm.run("send-keys", "-t", "a", "exit 3", "Enter")
	tm.waitFor("a", `CLI-EXIT=3`)
	tm.waitFor("a", `(?m)^MODE=icanon echo`) // not raw any more

	// A dropped connection leaves nothing running: close the terminal (tmux kills the CLI)
	// while a command runs in the sandbox.
	tm.run("new-session", "-d", "-s", "b", "-x", "80", "-y", "24", fmt.Sprintf("env AGENTBOX_URL=%s AGENTBOX_TOKEN=%s %s shell %s", s.URL, token, s.Bin, id))
	tm.run("send-keys", "-t", "b", "sleep 4321 & sleep 4322", "Enter")
	running := func() string {
		res, err := cl.Exec(ctx, id, wire.ExecRequest{Command: []string{"ps", "-eo", "args"}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		var left []string
		for _, l := range strings.Split(res.Stdout, "\n") {
			if strings.HasPrefix(l, "sleep 432") || strings.HasPrefix(l, "-bash") || strings.HasPrefix(l, "-sh") {
				left = append(left, l)
			}
		}
		return strings.Join(left, ", ")
	}
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(running(), "sleep 4322") {
		if time.Now().After(deadline) {
			t.Fatalf("the shell's commands never started: %q", running())
		}
		time.Sleep(100 * time.Millisecond)
	}
	tm.run("kill-session", "-t", "b")
	deadline = time.Now().Add(20 * time.Second)
	for left := running(); left != ""; left = running() {
		if time.Now().After(deadline) {
			t.Fatalf("after the terminal closed, still running in the sandbox: %s", left)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestPTYEndpointChecks: the terminal WebSocket is behind the token and refuses other origins
// (a web page cannot open it) and bad arguments, before any upgrade.
func TestPTYEndpointChecks(t *testing.T) {
	testenv.RequireRoot(t)
	s := startServer(t, testenv.ShortTempDir(t, "abptyc"))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sb, err := s.client().Create(ctx, wire.CreateRequest{MemoryMB: 256})
	if err != nil {
		t.Fatal(err)
	}
	u := strings.Replace(s.URL, "http://", "ws://", 1) + "/v1/sandboxes/" + sb.ID + "/pty"
	dial := func(rawURL string, h http.Header) int {
		c, resp, err := websocket.Dial(ctx, rawURL, &websocket.DialOptions{HTTPHeader: h})
		if err == nil {
			c.CloseNow()
			return http.StatusSwitchingProtocols
		}
		if resp == nil {
			t.Fatalf("dial %s: %v", rawURL, err)
		}
		return resp.StatusCode
	}
	auth := http.Header{"Authorization": {"Bearer " + token}}
	// A plain GET (no WebSocket handshake) starts nothing.
	plain, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.URL+"/v1/sandboxes/"+sb.ID+"/pty", nil)
	plain.Header = auth
	if resp, err := http.DefaultClient.Do(plain); err != nil || resp.StatusCode != http.StatusBadRequest {
		t.Errorf("plain GET: %v %v, want 400", resp, err)
	} else {
		resp.Body.Close()
	}
	if got := dial(u, nil); got != http.StatusUnauthorized {
		t.Errorf("no token: HTTP %d, want 401", got)
	}
	evil := http.Header{"Authorization": {"Bearer " + token}, "Origin": {"http://evil.example"}}
	if got := dial(u, evil); got != http.StatusForbidden {
		t.Errorf("foreign Origin: HTTP %d, want 403", got)
	}
	if got := dial(u+"?rows=0&cols=80", auth); got != http.StatusBadRequest {
		t.Errorf("rows=0: HTTP %d, want 400", got)
	}
	if got := dial(u+"?user=bob", auth); got != http.StatusBadRequest {
		t.Errorf("user=bob: HTTP %d, want 400", got)
	}
	if got := dial(strings.Replace(u, sb.ID, "sb-000000000000", 1), auth); got != http.StatusNotFound {
		t.Errorf("unknown sandbox: HTTP %d, want 404", got)
	}
	_, err = s.client().PTY(ctx, sb.ID, wire.PTYRequest{Rows: 2000, Cols: 80})
	if errcode.Of(err) != errcode.InvalidArgument || !strings.Contains(errcode.Message(err), "between 1 and 1000") {
		t.Errorf("rows=2000: %v", err)
	}
	// Same origin is fine, and the Go client round-trips a command's output and exit code.
	same := http.Header{"Authorization": {"Bearer " + token}, "Origin": {s.URL}}
	if got := dial(u+"?arg=true", same); got != http.StatusSwitchingProtocols {
		t.Errorf("same Origin: HTTP %d, want 101", got)
	}
	p, err := s.client().PTY(ctx, sb.ID, wire.PTYRequest{Argv: []string{"sh", "-c", "tty; exit 5"}, Rows: 10, Cols: 20})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var out []byte
	for {
		b, x, err := p.Next()
		if err != nil {
			t.Fatal(err)
		}
		if x != nil {
			if x.ExitCode != 5 || !regexp.MustCompile(`^/dev/pts/\d+\r\n$`).Match(out) {
				t.Fatalf("exit %d, output %q", x.ExitCode, out)
			}
			return
		}
		out = append(out, b...)
	}
}

// TestCpProgress: a long copy shows a progress bar on a terminal, and none when stdout or stderr
// is not one (`cp ID:PATH - | x` on a terminal included: the bar would draw on stderr).
func TestCpProgress(t *testing.T) {
	testenv.RequireRoot(t)
	s := startServer(t, testenv.ShortTempDir(t, "abcpp"))
	id, errOut, code := s.cli("", "sandbox", "create", "--memory-mb", "256")
	id = strings.TrimSpace(id)
	if code != 0 || !sandbox.ValidID(id) {
		t.Fatalf("create printed %q (stderr %q, exit %d)", id, errOut, code)
	}
	tm := newTmux(t, "cp")
	// 16 MiB from a producer that pauses, so the copy lasts past the bar's delay.
	cmd := fmt.Sprintf("(head -c 8388608 /dev/urandom; sleep 2; head -c 8388608 /dev/urandom) | env AGENTBOX_URL=%s AGENTBOX_TOKEN=%s %s cp - %s:/workspace/big; echo CP-EXIT=$?; sleep 600", s.URL, token, s.Bin, id)
	tm.run("new-session", "-d", "-s", "cp", "-x", "120", "-y", "10", "sh", "-c", cmd)
	tm.waitFor("cp", `CP-EXIT=0`)
	tm.waitFor("cp", regexp.QuoteMeta(id+":/workspace/big")+` 16\.0 MiB [0-9.]+ [KMG]?i?B/s in [0-9.]+s`)
	out, _, code := s.cli("", "exec", id, "--", "stat", "-c", "%s", "/workspace/big")
	if code != 0 || strings.TrimSpace(out) != "16777216" {
		t.Fatalf("copied file: %q exit %d", out, code)
	}
	// Stdout a pipe, stderr the terminal: quiet, for a copy that lasts (the reader waits 2 s).
	cmd = fmt.Sprintf("env AGENTBOX_URL=%s AGENTBOX_TOKEN=%s %s cp %s:/workspace/big - | (sleep 2; wc -c | sed 's/^/BYTES=/'); echo CP2-EXIT=$?; sleep 600", s.URL, token, s.Bin, id)
	tm.run("new-session", "-d", "-s", "cp2", "-x", "120", "-y", "10", "sh", "-c", cmd)
	tm.waitFor("cp2", `CP2-EXIT=0`)
	pane := tm.capture("cp2")
	if !strings.Contains(pane, "BYTES=16777216") || strings.Contains(pane, "/s") || strings.Contains(pane, "MiB") {
		t.Fatalf("cp to a pipe on a terminal drew on it:\n%s", pane)
	}
	// Not a terminal: quiet (stderr is a pipe here), even for a copy that lasts.
	_, stderr, code := s.cli("", "cp", id+":/workspace/big", filepath.Join(t.TempDir(), "big"))
	if code != 0 || stderr != "" {
		t.Fatalf("cp out with stderr not a terminal: exit %d, stderr %q", code, stderr)
	}
}
