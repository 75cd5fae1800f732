package remoteexec_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/remoteexec"
)

// machine serves the real handler on loopback, as the agent does, and returns a Client of it.
func machine(t *testing.T) *remoteexec.Client {
	t.Helper()
	srv := httptest.NewServer(remoteexec.NewHandler(remoteexec.Options{}))
	t.Cleanup(srv.Close)
	return remoteexec.NewClient(clientTo(srv))
}

// clientTo is an *http.Client whose every request reaches srv, whatever the URL's host (as the
// machine transport does).
func clientTo(srv *httptest.Server) *http.Client {
	tr := srv.Client().Transport.(*http.Transport).Clone()
	addr := srv.Listener.Addr().String()
	base := tr.DialContext
	if base == nil {
		base = (&netDialer{}).DialContext
	}
	tr.DialContext = func(ctx context.Context, network, _ string) (netConn, error) { return base(ctx, network, addr) }
	return &http.Client{Transport: tr}
}

func ms(n int64) *int64 { return &n }

func run(t *testing.T, c *remoteexec.Client, req remoteexec.Request) *remoteexec.Result {
	t.Helper()
	res, err := c.Exec(context.Background(), req)
	if err != nil {
		t.Fatalf("%+v: %v", req, err)
	}
	return res
}

func TestExecShAndBash(t *testing.T) {
	c := machine(t)
	res := run(t, c, remoteexec.Request{Command: `echo out; echo err >&2; exit 3`})
	if res.Stdout != "out\n" || res.Stderr != "err\n" || res.ExitCode == nil || *res.ExitCode != 3 ||
		res.Partial || res.Truncated || res.TotalBytes != 8 || res.Shell != "sh" {
		t.Errorf("sh: %+v", res)
	}
	res = run(t, c, remoteexec.Request{Command: `[[ -n $BASH_VERSION ]] && echo "bash $X" && pwd`, Shell: "bash",
		Env: map[string]string{"X": "it's \"quoted\" $HOME"}, Cwd: "/tmp"})
	if res.Stdout != "bash it's \"quoted\" $HOME\n/tmp\n" || *res.ExitCode != 0 || res.Shell != "bash" {
		t.Errorf("bash: %+v", res)
	}
	res = run(t, c, remoteexec.Request{Command: `kill -9 $$`})
	if res.ExitCode == nil || *res.ExitCode != 128+9 || res.Partial {
		t.Errorf("killed by a signal: %+v", res)
	}
	res = run(t, c, remoteexec.Request{Command: `id -u`, Elevated: true}) // the tests run as root
	if strings.TrimSpace(res.Stdout) != "0" {
		t.Errorf("elevated: %+v", res)
	}
}

func TestExecRefusals(t *testing.T) {
	c := machine(t)
	for name, req := range map[string]remoteexec.Request{
		"timeout 0":       {Command: "true", TimeoutMS: ms(0)},
		"timeout 999":     {Command: "true", TimeoutMS: ms(999)},
		"timeout -1":      {Command: "true", TimeoutMS: ms(-1)},
		"timeout 3600001": {Command: "true", TimeoutMS: ms(3_600_001)},
		"env+elevated":    {Command: "true", Env: map[string]string{"A": "1"}, Elevated: true},
		"empty":           {Command: "  "},
		"cmd on linux":    {Command: "dir", Shell: "cmd"},
		"powershell":      {Command: "dir", Shell: "powershell"},
		"relative cwd":    {Command: "true", Cwd: "tmp"},
		"missing cwd":     {Command: "true", Cwd: "/nonexistent-remote-exec"},
		"env name":        {Command: "true", Env: map[string]string{"A=B": "1"}},
		"too long":        {Command: strings.Repeat("x", remoteexec.MaxCommandBytes+1)},
	} {
		_, err := c.Exec(context.Background(), req)
		if errcode.Of(err) != errcode.InvalidArgument {
			t.Errorf("%s: %v, want INVALID_ARGUMENT", name, err)
		}
	}
	// The machine checks too: a client that skips Validate is refused by the handler.
	_, err := c.Exec(context.Background(), remoteexec.Request{Command: "dir", Shell: "cmd"})
	if !strings.Contains(errcode.Message(err), "sh, bash") {
		t.Errorf("cmd on linux: %v, want the shells that exist", err)
	}
	// The bounds themselves are accepted.
	for _, n := range []int64{remoteexec.MinTimeoutMS, remoteexec.MaxTimeoutMS} {
		if res := run(t, c, remoteexec.Request{Command: "true", TimeoutMS: ms(n)}); *res.ExitCode != 0 {
			t.Errorf("timeout %d: %+v", n, res)
		}
	}
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	return !strings.Contains(s[strings.LastIndexByte(s, ')'):], ") Z")
}

func waitDead(t *testing.T, pids ...int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for _, pid := range pids {
		for alive(pid) {
			if time.Now().After(deadline) {
				t.Fatalf("pid %d still alive", pid)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

func pidsIn(t *testing.T, path string) []int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, f := range strings.Fields(string(b)) {
		n, err := strconv.Atoi(f)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		t.Fatal("no pids")
	}
	return out
}

// TestExecTimeout: the timeout kills the whole tree (a background child, and one in a process
// group of its own) and returns what was written, partial, without an exit code.
func TestExecTimeout(t *testing.T) {
	c := machine(t)
	pidFile := filepath.Join(t.TempDir(), "pids")
	began := time.Now()
	res := run(t, c, remoteexec.Request{TimeoutMS: ms(1000), Shell: "bash", Command: fmt.Sprintf(
		`sleep 300 & echo $! >%[1]s; set -m; sleep 301 & echo $! >>%[1]s; echo before; echo warn >&2; sleep 300`, pidFile)})
	if !res.Partial || res.Reason != remoteexec.ReasonTimeout || res.ExitCode != nil || res.Stdout != "before\n" || res.Stderr != "warn\n" {
		t.Errorf("timeout: %+v", res)
	}
	if d := time.Since(began); d > 6*time.Second || res.DurationMS < 1000 {
		t.Errorf("took %v (duration_ms %d)", d, res.DurationMS)
	}
	waitDead(t, pidsIn(t, pidFile)...)
}

// TestExecDisconnect: the server going away mid-run returns what arrived, partial, and the
// machine kills the tree.
func TestExecDisconnect(t *testing.T) {
	c := machine(t)
	pidFile := filepath.Join(t.TempDir(), "pids")
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	res, err := c.Exec(ctx, remoteexec.Request{Command: fmt.Sprintf(`echo $$ >%s; echo hello; sleep 300`, pidFile)})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Partial || res.Reason != remoteexec.ReasonDisconnected || res.ExitCode != nil || res.Stdout != "hello\n" {
		t.Errorf("disconnect: %+v", res)
	}
	waitDead(t, pidsIn(t, pidFile)...)
}

func TestExecCap(t *testing.T) {
	c := machine(t)
	res := run(t, c, remoteexec.Request{Command: `head -c 700000 /dev/zero | tr '\0' o; head -c 2300000 /dev/zero | tr '\0' e >&2; echo done`})
	if !res.Truncated || res.TotalBytes != 3_000_005 || len(res.Stdout)+len(res.Stderr) != remoteexec.MaxOutputBytes || *res.ExitCode != 0 || res.Partial {
		t.Errorf("cap: truncated=%v total=%d kept=%d+%d exit=%v", res.Truncated, res.TotalBytes, len(res.Stdout), len(res.Stderr), res.ExitCode)
	}
	if strings.Trim(res.Stdout, "o") != "" || strings.Trim(res.Stderr, "e") != "" {
		t.Error("output mixed up")
	}
	// Exactly the cap is not truncated.
	res = run(t, c, remoteexec.Request{Command: fmt.Sprintf(`head -c %d /dev/zero`, remoteexec.MaxOutputBytes)})
	if res.Truncated || res.TotalBytes != remoteexec.MaxOutputBytes || len(res.Stdout) != remoteexec.MaxOutputBytes {
		t.Errorf("exactly 1 MiB: truncated=%v total=%d", res.Truncated, res.TotalBytes)
	}
}
