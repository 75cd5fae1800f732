package testenv

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/config"
)

// SyncBuffer is a bytes.Buffer safe for a process writing while the test reads.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Server is a running `agentbox serve` of the built binary.
type Server struct {
	t        testing.TB
	Bin      string
	StateDir string
	URL      string
	Token    string
	// Fingerprint is the server's TLS certificate's SHA-256 (--tls-self-signed, --tls-cert).
	Fingerprint string
	Logs        *SyncBuffer
	cmd         *exec.Cmd
	done        chan struct{}
}

// StartServer starts `agentbox serve` on a free loopback port with stateDir, a cgroup parent
// of its own (named after stateDir), AGENTBOX_TOKEN=token and extra arguments, and waits until
// it has published its address. At the end of the test it destroys the server's sandboxes and
// stops it with SIGTERM (the test fails if it does not stop, or if its log shows a panic its
// HTTP server recovered).
func StartServer(t testing.TB, stateDir, token string, extra ...string) *Server {
	t.Helper()
	return StartServerEnv(t, stateDir, token, nil, extra...)
}

// StartServerEnv is StartServer with env (KEY=VALUE) added to the server's environment.
func StartServerEnv(t testing.TB, stateDir, token string, env []string, extra ...string) *Server {
	t.Helper()
	return startServer(t, stateDir, token, env, append([]string{"--cgroup-parent", "abtest-" + filepath.Base(stateDir)}, extra...))
}

// StartServerDefaults is StartServer without a cgroup parent chosen by the test: the server
// derives its own from stateDir, as one a user starts does.
func StartServerDefaults(t testing.TB, stateDir, token string, extra ...string) *Server {
	t.Helper()
	return startServer(t, stateDir, token, nil, extra)
}

func startServer(t testing.TB, stateDir, token string, env, extra []string) *Server {
	t.Helper()
	s := &Server{t: t, Bin: Binary(t), StateDir: stateDir, Token: token, Logs: &SyncBuffer{}, done: make(chan struct{})}
	os.Remove(config.ServerInfoPath(stateDir))
	args := append([]string{"serve", "--listen", "127.0.0.1:0", "--state-dir", stateDir}, extra...)
	s.cmd = exec.Command(s.Bin, args...)
	s.cmd.Env = append(append(os.Environ(), env...), "AGENTBOX_TOKEN="+token)
	s.cmd.Stderr = s.Logs
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { s.cmd.Wait(); close(s.done) }()
	t.Cleanup(func() {
		s.destroyAll()
		s.Stop()
		// A recovered panic is a bug even when every reply looked right.
		if logs := s.Logs.String(); strings.Contains(logs, ServerPanic) {
			t.Errorf("agentbox serve recovered a panic (%q):\n%s", ServerPanic, logs)
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		if info, err := config.ReadServerInfo(stateDir); err == nil && info.PID == s.cmd.Process.Pid {
			s.URL, s.Fingerprint = info.URL, info.TLSFingerprint
			return s
		}
		select {
		case <-s.done:
			t.Fatalf("agentbox serve exited:\n%s", s.Logs)
		default:
		}
		if time.Now().After(deadline) {
			s.cmd.Process.Kill()
			t.Fatalf("agentbox serve did not start:\n%s", s.Logs)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Client returns a REST client of the server.
func (s *Server) Client() *client.Client {
	c, err := client.NewTLS(s.URL, s.Token, client.TLS{Fingerprint: s.Fingerprint})
	if err != nil {
		s.t.Fatal(err)
	}
	return c
}

// PID is the server's process id.
func (s *Server) PID() int { return s.cmd.Process.Pid }

// Stop sends SIGTERM and waits for the server to exit (killing it, and failing the test, after
// 20 s). Stopping a stopped server does nothing.
func (s *Server) Stop() {
	select {
	case <-s.done:
		return
	default:
	}
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(20 * time.Second):
		s.cmd.Process.Kill()
		<-s.done
		s.t.Errorf("agentbox serve did not stop on SIGTERM:\n%s", s.Logs)
	}
}

// Kill stops the server with SIGKILL, as a crash would.
func (s *Server) Kill() {
	s.cmd.Process.Kill()
	<-s.done
}

// destroyAll destroys every sandbox the server still holds, if it runs.
func (s *Server) destroyAll() {
	select {
	case <-s.done:
		return
	default:
	}
	c := s.Client()
	ctx := context.Background()
	list, _ := c.List(ctx, nil, nil)
	for _, sb := range list {
		if _, err := c.Destroy(ctx, sb.ID); err != nil {
			s.t.Errorf("cleanup: destroy %s: %v", sb.ID, err)
		}
	}
}
