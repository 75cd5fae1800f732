//go:build linux

package guest_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/guest"
)

// impostor is a hostile agent: an HTTP server on a unix socket that answers as the test says.
// It counts what it wrote and notes when the client stopped reading.
type impostor struct {
	c       *guest.Client
	written atomic.Int64
	// gone is closed when a write to the client first fails (the client closed the connection).
	gone     chan struct{}
	goneOnce sync.Once
}

func startImpostor(t *testing.T, h func(im *impostor, w http.ResponseWriter, r *http.Request)) *impostor {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	im := &impostor{gone: make(chan struct{})}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { h(im, w, r) })}
	go srv.Serve(ln)
	im.c = guest.NewUnixClient(sock)
	t.Cleanup(func() {
		im.c.Close()
		srv.Close()
	})
	return im
}

// write writes p and flushes, counting; it reports whether the client still reads.
func (im *impostor) write(w http.ResponseWriter, p []byte) bool {
	n, err := w.Write(p)
	im.written.Add(int64(n))
	if err == nil {
		err = http.NewResponseController(w).Flush()
	}
	if err != nil {
		im.goneOnce.Do(func() { close(im.gone) })
		return false
	}
	return true
}

// endless writes head, then filler until the client goes (or 8 GiB, far past any bound).
func (im *impostor) endless(w http.ResponseWriter, status int, ctype, head string, filler []byte) {
	w.Header().Set("Content-Type", ctype)
	w.WriteHeader(status)
	if !im.write(w, []byte(head)) {
		return
	}
	for im.written.Load() < 8<<30 {
		if !im.write(w, filler) {
			return
		}
	}
}

var aaaa = []byte(strings.Repeat("A", 64<<10))

// endlessExec answers exec with one JSON string that never ends: a non-streamed result, or a
// streamed output frame.
func endlessExec(im *impostor, w http.ResponseWriter, r *http.Request) {
	if strings.Contains(readAllString(r.Body), `"stream":true`) {
		im.endless(w, http.StatusOK, "application/x-ndjson", `{"stream":"stdout","data":"`, aaaa)
		return
	}
	im.endless(w, http.StatusOK, "application/json", `{"exit_code":0,"stdout":"`, aaaa)
}

func readAllString(r io.Reader) string {
	b, _ := io.ReadAll(io.LimitReader(r, 1<<20))
	return string(b)
}

// TestImpostorEndlessReply: an agent that answers exec with an endless JSON string must get an
// oversized-reply error once the protocol's bound is passed, not be read without end.
func TestImpostorEndlessReply(t *testing.T) {
	t.Parallel()
	for _, stream := range []bool{false, true} {
		name := map[bool]string{false: "result", true: "frame"}[stream]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			im := startImpostor(t, endlessExec)
			var onOutput guest.OutputFunc
			if stream {
				onOutput = func(string, []byte) { t.Error("an unfinished frame was delivered") }
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			_, err := im.c.Exec(ctx, guest.ExecRequest{Argv: []string{"true"}}, onOutput)
			if ctx.Err() != nil {
				t.Fatalf("the client read %d MiB of one reply for 20 s and was still reading", im.written.Load()>>20)
			}
			wantOversized(t, err)
			// The bound of a default exec (1 MiB a stream) is 2×6 MiB and some slack.
			if n := im.written.Load(); n > 32<<20 {
				t.Errorf("the impostor wrote %d MiB before the client gave up", n>>20)
			}
			select {
			case <-im.gone:
			case <-time.After(5 * time.Second):
				t.Error("the client did not drop the connection after the oversized reply")
			}
		})
	}
}

func wantOversized(t *testing.T, err error) {
	t.Helper()
	e, ok := errcode.As(err)
	if !ok || e.Code != errcode.Internal || !strings.Contains(e.Message, "oversized") {
		t.Fatalf("want INTERNAL saying the agent's reply is oversized, got %v", err)
	}
}

// TestImpostorForgedCodes: codes the agent never sends (the server's own) become INTERNAL, marked
// as the sandbox agent's, on every kind of call.
func TestImpostorForgedCodes(t *testing.T) {
	t.Parallel()
	for _, forged := range []errcode.Code{errcode.AuthFailed, errcode.CapacityUnavailable, errcode.RuntimeUnavailable, errcode.SandboxNotFound, "MADE_UP"} {
		im := startImpostor(t, func(_ *impostor, w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(errcode.HTTPStatus(forged))
			_, _ = io.WriteString(w, `{"code":"`+string(forged)+`","message":"invalid token: log in again at https://evil.example","details":{"retry_after":1}}`)
		})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := im.c.Stat(ctx, "/x")
		cancel()
		e, ok := errcode.As(err)
		if !ok || e.Code != errcode.Internal {
			t.Errorf("forged %s: got %v, want INTERNAL", forged, err)
			continue
		}
		if !strings.Contains(e.Message, "unexpected error code") || !strings.Contains(e.Message, string(forged)) {
			t.Errorf("forged %s: message %q does not name the unexpected code", forged, e.Message)
		}
		if e.Details["origin"] != "sandbox_agent" {
			t.Errorf("forged %s: details %v do not mark the sandbox agent as the origin", forged, e.Details)
		}
	}
}

// TestImpostorCallerGoes: an agent streaming well-formed output without end is legitimate (a
// `yes`): it reaches the callback as it comes, and the call returns and the connection closes as
// soon as the caller goes.
func TestImpostorCallerGoes(t *testing.T) {
	t.Parallel()
	frame := []byte(`{"stream":"stdout","data":"eWVzCg=="}` + "\n")
	im := startImpostor(t, func(im *impostor, w http.ResponseWriter, r *http.Request) {
		im.endless(w, http.StatusOK, "application/x-ndjson", "", []byte(strings.Repeat(string(frame), 256)))
	})
	ctx, cancel := context.WithCancel(context.Background())
	var got atomic.Int64
	done := make(chan error, 1)
	go func() {
		_, err := im.c.Exec(ctx, guest.ExecRequest{Argv: []string{"yes"}}, func(stream string, data []byte) {
			if stream != "stdout" || string(data) != "yes\n" {
				t.Errorf("callback got %s %q", stream, data)
			}
			got.Add(int64(len(data)))
		})
		done <- err
	}()
	time.Sleep(time.Second)
	if got.Load() == 0 {
		t.Fatal("no output reached the callback")
	}
	cancel()
	cancelled := time.Now()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("after cancel: %v, want context.Canceled", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("the call did not return within 2 s of the caller going")
	}
	select {
	case <-im.gone:
	case <-time.After(2 * time.Second):
		t.Fatal("the connection was still read 2 s after the caller went")
	}
	t.Logf("returned and closed %s after cancel; %d MiB delivered", time.Since(cancelled).Round(time.Millisecond), got.Load()>>20)
}
