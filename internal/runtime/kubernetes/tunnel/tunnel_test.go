package tunnel

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/yamux"
)

// echoAgent listens on a unix socket and echoes every line back, upper-cased by prefix.
func echoAgent(t *testing.T) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					fmt.Fprintf(c, "echo %s\n", sc.Text())
				}
			}()
		}
	}()
	return sock
}

// pair runs Serve on one end of an in-memory pipe and returns a yamux client on the other.
func pair(t *testing.T, cfg ServerConfig) *yamux.Session {
	t.Helper()
	a, b := net.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, b, cfg) }()
	sess, err := yamux.Client(a, Config())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sess.Close()
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Serve: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Serve did not return after the session closed")
		}
	})
	return sess
}

func TestTunnelBridgesToTheAgent(t *testing.T) {
	sock := echoAgent(t)
	sess := pair(t, ServerConfig{Socket: sock, PeerPID: int32(os.Getpid())})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := Dial(ctx, sess)
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			fmt.Fprintf(c, "hello %d\n", i)
			line, err := bufio.NewReader(c).ReadString('\n')
			if err != nil || line != fmt.Sprintf("echo hello %d\n", i) {
				errs <- fmt.Errorf("stream %d read %q, %v", i, line, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestTunnelRefusesAnotherPeer(t *testing.T) {
	sock := echoAgent(t)
	// The listener is this process, not pid 1: the tunnel must refuse it.
	sess := pair(t, ServerConfig{Socket: sock, PeerPID: 1})
	_, err := Dial(context.Background(), sess)
	var pe *PeerError
	if !errors.As(err, &pe) {
		t.Fatalf("dial with a foreign peer: %v, want a *PeerError", err)
	}
}

func TestTunnelAgentNotListening(t *testing.T) {
	sess := pair(t, ServerConfig{Socket: filepath.Join(t.TempDir(), "absent.sock")})
	_, err := Dial(context.Background(), sess)
	var ue *UnavailableError
	if !errors.As(err, &ue) {
		t.Fatalf("dial of an absent socket: %v, want an *UnavailableError", err)
	}
}

func TestDialHonoursContext(t *testing.T) {
	// A pod side that never answers: Dial returns when its context ends.
	a, b := net.Pipe()
	srv, err := yamux.Server(b, Config())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	go func() {
		for {
			st, err := srv.AcceptStream()
			if err != nil {
				return
			}
			go io.Copy(io.Discard, st)
		}
	}()
	sess, err := yamux.Client(a, Config())
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := Dial(ctx, sess); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("dial of a silent pod side: %v, want context.DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("dial took %s past its deadline", d)
	}
}
