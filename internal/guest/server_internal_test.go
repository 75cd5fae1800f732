//go:build linux

package guest

import (
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
)

func TestRecoverPanics(t *testing.T) {
	t.Parallel()
	s := &server{log: slog.New(slog.DiscardHandler)}
	h := s.recoverPanics(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("boom") }))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/v1/health", nil))
	var eb ErrorBody
	if err := json.Unmarshal(rec.Body.Bytes(), &eb); err != nil {
		t.Fatal(err)
	}
	if rec.Code != 500 || eb.Code != string(errcode.Internal) || !strings.Contains(eb.Message, "boom") {
		t.Fatalf("%d %+v", rec.Code, eb)
	}

	// A panic in the middle of a stream ends it with an Error frame.
	h = s.recoverPanics(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", ndjson)
		_ = json.NewEncoder(w).Encode(Frame{Stream: "stdout", Data: []byte("x")})
		panic("mid-stream")
	}))
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("POST", "/v1/exec", nil))
	lines := strings.Split(strings.TrimSpace(rec.Body.String()), "\n")
	var last Frame
	if len(lines) != 2 || json.Unmarshal([]byte(lines[1]), &last) != nil || last.Error == nil || last.Error.Code != string(errcode.Internal) {
		t.Fatalf("stream %q", rec.Body.String())
	}
}

func TestCaptureBound(t *testing.T) {
	t.Parallel()
	c := &capture{max: 100 << 10}
	chunk := make([]byte, 30<<10)
	for range 1000 {
		c.add(chunk)
	}
	if len(c.kept) != 100<<10 || cap(c.kept) > 100<<10 || c.total != 1000*30<<10 {
		t.Fatalf("kept %d cap %d total %d", len(c.kept), cap(c.kept), c.total)
	}
}

func TestSocketLifecycle(t *testing.T) {
	t.Parallel()
	dir, err := os.MkdirTemp("", "ag")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "s.sock")

	// A stale socket from a previous agent is replaced.
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	ln.Close()

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, ServerConfig{Socket: sock, Workdir: dir, ShutdownGrace: 500 * time.Millisecond})
	}()
	c := NewUnixClient(sock)
	defer c.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := c.Health(ctx); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("agent did not come up over a stale socket")
		}
		time.Sleep(10 * time.Millisecond)
	}
	fi, err := os.Stat(sock)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode %v %v", fi.Mode(), err)
	}

	// Shutdown kills a command still running once the grace period is over.
	started := make(chan struct{})
	execDone := make(chan error, 1)
	go func() {
		_, err := c.Exec(context.Background(), ExecRequest{Argv: []string{"sleep", "100"}}, func(string, []byte) {})
		execDone <- err
	}()
	go func() {
		_, _ = c.Exec(context.Background(), ExecRequest{Argv: []string{"sh", "-c", "echo up; sleep 100"}}, func(string, []byte) { close(started) })
	}()
	<-started
	start := time.Now()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Run did not shut down")
	}
	if time.Since(start) > 10*time.Second {
		t.Fatalf("shutdown took %v", time.Since(start))
	}
	select {
	case <-execDone:
	case <-time.After(5 * time.Second):
		t.Fatal("in-flight exec not ended by shutdown")
	}
	if _, err := os.Lstat(sock); !os.IsNotExist(err) {
		t.Fatalf("socket left behind: %v", err)
	}

	// A path that is not a socket is never removed.
	if err := os.WriteFile(sock, []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Run(context.Background(), ServerConfig{Socket: sock, Workdir: dir}); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Fatalf("Run over a regular file: %v", err)
	}
}

func TestFSErrorCodes(t *testing.T) {
	t.Parallel()
	for errno, want := range map[syscall.Errno]errcode.Code{
		syscall.ENOENT: errcode.FileNotFound, syscall.EEXIST: errcode.Conflict, syscall.EXDEV: errcode.Conflict,
		syscall.EISDIR: errcode.InvalidArgument, syscall.EFBIG: errcode.FileTooLarge, syscall.EIO: errcode.Internal,
	} {
		err := fsError(&os.LinkError{Op: "rename", Old: "a", New: "b", Err: errno}, "/workspace/x")
		if got := errcode.Of(err); got != want {
			t.Errorf("%v: %s, want %s", errno, got, want)
		}
		if want != errcode.Internal && !strings.Contains(errcode.Message(err), "/workspace/x") {
			t.Errorf("%v: message %q does not name the path", errno, errcode.Message(err))
		}
	}
}
