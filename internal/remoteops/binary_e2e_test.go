package remoteops_test

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"image/png"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/testenv"
	"github.com/agentbox/agentbox/internal/testenv/machinelab"
	"github.com/agentbox/agentbox/internal/wire"
)

// TestRemoteEndToEndBinary runs the real binary: `agentbox serve` over TLS on a bridge of the
// test's own, `agentbox join` in a network namespace with its own address, and the CLI
// (`agentbox machine exec`, `agentbox machine screenshot`) and the REST client against the
// server. The command runs in the machine's namespace (it sees the machine's address).
func TestRemoteEndToEndBinary(t *testing.T) {
	testenv.RequireRoot(t)
	lab := machinelab.New(t)
	bin := testenv.Binary(t)
	host := lab.ServerAddr().String()
	ln, err := net.Listen("tcp", host+":0")
	if err != nil {
		t.Fatal(err)
	}
	listen := ln.Addr().String()
	ln.Close()
	srv := testenv.StartServer(t, testenv.ShortTempDir(t, "abre-"), "re-token-"+strconv.FormatInt(time.Now().UnixNano(), 36),
		"--listen", listen, "--allow-remote", "--allow-private-network", "--tls-self-signed")
	cl := srv.Client()
	ctx := t.Context()
	tok, err := cl.CreateJoinToken(ctx, wire.TokenRequest{Uses: 1})
	if err != nil {
		t.Fatal(err)
	}
	m := lab.AddMachine()
	logs := &testenv.SyncBuffer{}
	join := m.Command(bin, "join", srv.URL, "--token", tok.Secret, "--name", "lab-exec", "--state-dir",
		filepath.Join(testenv.ShortTempDir(t, "abrej-"), "m"), "--fingerprint", srv.Fingerprint)
	join.Stdout, join.Stderr = logs, logs
	if err := join.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = join.Process.Signal(syscall.SIGTERM); _ = join.Wait() })
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if ms, err := cl.ListMachines(ctx); err == nil && len(ms) == 1 && ms[0].Online {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the machine did not come online:\n%s", logs)
		}
	}

	// REST client: the command runs in the machine's namespace.
	res, err := cl.RemoteExec(ctx, "lab-exec", wire.RemoteExecRequest{Shell: "bash", Command: "ip -o -4 addr show; echo err >&2; exit 5"})
	if err != nil || !strings.Contains(res.Stdout, m.Addr.String()+"/") || res.Stderr != "err\n" || res.ExitCode == nil || *res.ExitCode != 5 {
		t.Fatalf("rest exec: %+v %v (machine address %s)", res, err, m.Addr)
	}
	res, err = cl.RemoteExec(ctx, "lab-exec", wire.RemoteExecRequest{Command: "echo a; sleep 30", TimeoutMS: ms(1000)})
	if err != nil || !res.Partial || res.Reason != "timeout" || res.ExitCode != nil || res.Stdout != "a\n" {
		t.Fatalf("rest timeout: %+v %v", res, err)
	}
	if _, err := cl.RemoteExec(ctx, "lab-exec", wire.RemoteExecRequest{Command: "true", TimeoutMS: ms(0)}); errcode.Of(err) != errcode.InvalidArgument {
		t.Fatalf("timeout_ms 0 over REST: %v", err)
	}

	// The CLI.
	cli := func(args ...string) (string, string, int) {
		t.Helper()
		cmd := exec.Command(bin, append(args[:2:2], append([]string{"--server", srv.URL, "--token", srv.Token, "--fingerprint", srv.Fingerprint}, args[2:]...)...)...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return stdout.String(), stderr.String(), code
	}
	if out, errOut, code := cli("machine", "exec", "lab-exec", "--shell", "bash", "--env", "N=6", "--", `echo $((N*7)); echo warn >&2; exit 3`); out != "42\n" || errOut != "warn\n" || code != 3 {
		t.Errorf("cli exec: %q %q exit %d", out, errOut, code)
	}
	if out, errOut, code := cli("machine", "exec", "lab-exec", "--timeout-ms", "1000", "--", "echo started; sleep 30"); out != "started\n" || code != 124 || !strings.Contains(errOut, "timed out") {
		t.Errorf("cli timeout: %q %q exit %d", out, errOut, code)
	}
	for _, args := range [][]string{{"--timeout-ms", "0"}, {"--timeout-ms", "3600001"}, {"--elevated", "--env", "A=1"}, {"--shell", "cmd"}} {
		a := append(append([]string{"machine", "exec", "lab-exec"}, args...), "--", "true")
		if _, errOut, code := cli(a...); code == 0 || !strings.Contains(errOut, "INVALID_ARGUMENT") {
			t.Errorf("cli %v: exit %d %q", args, code, errOut)
		}
	}

	// A screenshot of an Xvfb display on the machine (its X socket is a file the namespace shares).
	n := xvfbRed(t)
	file := filepath.Join(t.TempDir(), "shot.png")
	out, errOut, code := cli("machine", "screenshot", "lab-exec", "--display", strconv.Itoa(n), "-o", file)
	if code != 0 || !strings.Contains(out, fmt.Sprintf("X11 display :%d, screen 0 of 1, 160×120", n)) {
		t.Fatalf("cli screenshot: exit %d %q %q", code, out, errOut)
	}
	b, _ := os.ReadFile(file)
	img, err := png.Decode(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	if r, g, bl, _ := img.At(80, 60).RGBA(); r>>8 != 255 || g != 0 || bl != 0 || img.Bounds().Dx() != 160 {
		t.Errorf("pixel %d,%d,%d of %v", r>>8, g>>8, bl>>8, img.Bounds())
	}
	if _, errOut, code := cli("machine", "screenshot", "lab-exec", "--display", "987", "-o", file); code == 0 || !strings.Contains(errOut, "no display") {
		t.Errorf("no display: exit %d %q", code, errOut)
	}
}

// xvfbRed starts Xvfb (160×120) with a red root and returns its display number.
func xvfbRed(t *testing.T) int {
	t.Helper()
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("Xvfb", "-displayfd", "3", "-screen", "0", "160x120x24", "-nolisten", "tcp", "-noreset")
	cmd.ExtraFiles = []*os.File{pw}
	if err := cmd.Start(); err != nil {
		t.Fatalf("Xvfb (make deps installs xvfb): %v", err)
	}
	pw.Close()
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	_ = pr.SetReadDeadline(time.Now().Add(20 * time.Second))
	line, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil {
		t.Fatalf("Xvfb did not start: %v", err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		t.Fatal(err)
	}
	set := exec.Command("xsetroot", "-solid", "#ff0000")
	set.Env = append(os.Environ(), fmt.Sprintf("DISPLAY=:%d", n))
	if out, err := set.CombinedOutput(); err != nil {
		t.Fatalf("xsetroot: %v %s", err, out)
	}
	return n
}
