//go:build linux

package guest_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/guest"
)

// agent is a running server under test.
type agent struct {
	c       *guest.Client
	socket  string
	workdir string
}

// startAgent runs guest.Run in a goroutine on a socket in a short temp dir (unix socket paths
// are limited to 108 bytes) with a fresh workdir, and waits until it answers.
func startAgent(t *testing.T) *agent {
	t.Helper()
	return startAgentWith(t, t.TempDir(), nil)
}

// startAgentWith is startAgent with a given workdir and a default user for commands.
func startAgentWith(t testing.TB, workdir string, user *guest.User) *agent {
	t.Helper()
	sockDir, err := os.MkdirTemp("", "ag")
	if err != nil {
		t.Fatal(err)
	}
	a := &agent{socket: filepath.Join(sockDir, "a.sock"), workdir: workdir}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	log := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	go func() {
		done <- guest.Run(ctx, guest.ServerConfig{Socket: a.socket, Workdir: workdir, Logger: log, ShutdownGrace: time.Second, DefaultUser: user})
	}()
	a.c = guest.NewUnixClient(a.socket)
	t.Cleanup(func() {
		a.c.Close()
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("Run did not return after its context ended")
		}
		_ = os.RemoveAll(sockDir)
	})
	deadline := time.Now().Add(5 * time.Second)
	for {
		hctx, hcancel := context.WithTimeout(context.Background(), time.Second)
		_, err := a.c.Health(hctx)
		hcancel()
		if err == nil {
			return a
		}
		select {
		case err := <-done:
			t.Fatalf("Run returned early: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent not healthy: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// testWriter sends the agent's warnings to the test log. Writes after the test ended are
// dropped (t.Log would panic).
type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	defer func() { _ = recover() }()
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func (a *agent) exec(t *testing.T, req guest.ExecRequest) guest.ExecResult {
	t.Helper()
	res, err := a.c.Exec(ctxT(t, 60*time.Second), req, nil)
	if err != nil {
		t.Fatalf("Exec(%q): %v", req.Argv, err)
	}
	return res
}

func wantCode(t *testing.T, err error, code errcode.Code, msgPart string) {
	t.Helper()
	if err == nil {
		t.Fatalf("want %s error, got nil", code)
	}
	if got := errcode.Of(err); got != code {
		t.Fatalf("want %s, got %s (%v)", code, got, err)
	}
	if msgPart != "" && !strings.Contains(errcode.Message(err), msgPart) {
		t.Fatalf("message %q does not mention %q", errcode.Message(err), msgPart)
	}
}

// processGone waits until pid no longer exists (it was killed and reaped).
func processGone(t *testing.T, pid int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		err := unix.Kill(pid, 0)
		if errors.Is(err, unix.ESRCH) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d still exists (state %s)", pid, procState(pid))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// procStat returns the state and parent pid of pid from /proc.
func procStat(pid int) (state string, ppid int, ok bool) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return "", 0, false
	}
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return "", 0, false
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 2 {
		return "", 0, false
	}
	ppid, _ = strconv.Atoi(f[1])
	return f[0], ppid, true
}

func procState(pid int) string {
	s, _, ok := procStat(pid)
	if !ok {
		return "gone"
	}
	return s
}

// zombieChildren lists the test process's children in Z state.
func zombieChildren(t *testing.T) []int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	me := os.Getpid()
	var zs []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, ppid, ok := procStat(pid); ok && ppid == me && st == "Z" {
			zs = append(zs, pid)
		}
	}
	return zs
}

// raw sends a hand-made request (for what guest.Client cannot send, e.g. malformed JSON).
func (a *agent) raw(t *testing.T, method, path, body string) (int, guest.ErrorBody) {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", a.socket)
	}}}
	defer hc.CloseIdleConnections()
	// 60 s, not less: a body of tens of MiB takes the agent seconds to refuse on a loaded
	// machine, several times that under the race detector (make test).
	req, err := http.NewRequestWithContext(ctxT(t, 60*time.Second), method, "http://agent/v1"+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var eb guest.ErrorBody
	_ = json.Unmarshal(data, &eb)
	return resp.StatusCode, eb
}

func syscallKill(pid int) error { return unix.Kill(pid, unix.SIGKILL) }
