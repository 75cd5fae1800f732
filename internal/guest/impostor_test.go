//go:build linux

package guest_test

import (
	"bytes"
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

// fixed answers every call with one reply.
func fixed(status int, ctype, body string, header ...string) func(*impostor, http.ResponseWriter, *http.Request) {
	return func(im *impostor, w http.ResponseWriter, _ *http.Request) {
		for i := 0; i+1 < len(header); i += 2 {
			w.Header().Set(header[i], header[i+1])
		}
		w.Header().Set("Content-Type", ctype)
		w.WriteHeader(status)
		im.write(w, []byte(body))
	}
}

// calls are every client call, returning only its error.
var calls = map[string]func(ctx context.Context, c *guest.Client) error{
	"health":  func(ctx context.Context, c *guest.Client) error { _, err := c.Health(ctx); return err },
	"oomkill": func(ctx context.Context, c *guest.Client) error { _, err := c.OOMKill(ctx); return err },
	"exec": func(ctx context.Context, c *guest.Client) error {
		_, err := c.Exec(ctx, guest.ExecRequest{Argv: []string{"true"}}, nil)
		return err
	},
	"stream": func(ctx context.Context, c *guest.Client) error {
		_, err := c.Exec(ctx, guest.ExecRequest{Argv: []string{"true"}}, func(string, []byte) {})
		return err
	},
	"write": func(ctx context.Context, c *guest.Client) error {
		_, err := c.WriteFile(ctx, "/x", 0o644, strings.NewReader("x"))
		return err
	},
	"read": func(ctx context.Context, c *guest.Client) error {
		rc, _, err := c.ReadFile(ctx, "/x", 0, 0, 0)
		if err == nil {
			_, err = io.Copy(io.Discard, rc)
			rc.Close()
		}
		return err
	},
	"stat": func(ctx context.Context, c *guest.Client) error { _, err := c.Stat(ctx, "/x"); return err },
	"list": func(ctx context.Context, c *guest.Client) error { _, err := c.List(ctx, "/x"); return err },
	"mkdir": func(ctx context.Context, c *guest.Client) error {
		_, err := c.Mkdir(ctx, guest.MkdirRequest{Path: "/x"})
		return err
	},
	"remove": func(ctx context.Context, c *guest.Client) error { return c.Remove(ctx, "/x", false) },
}

// TestImpostorHugeString: a 1 GiB JSON string as the reply of any call (and as an error body)
// is cut off at that call's bound with an oversized-reply error.
func TestImpostorHugeString(t *testing.T) {
	t.Parallel()
	heads := map[string]string{"reply": `{"path":"`, "error": `{"code":"INTERNAL","message":"`}
	for kind, head := range heads {
		for name, call := range calls {
			t.Run(kind+"/"+name, func(t *testing.T) {
				im := startImpostor(t, func(im *impostor, w http.ResponseWriter, r *http.Request) {
					status, ctype := http.StatusOK, "application/json"
					switch {
					case kind == "error":
						status = http.StatusInternalServerError
					case r.Method == http.MethodGet && r.URL.Path == "/v1/files":
						ctype = "application/octet-stream"
						w.Header().Set(guest.SizeHeader, "1")
					case strings.Contains(readAllString(r.Body), `"stream":true`):
						head, ctype = `{"stream":"stdout","data":"`, "application/x-ndjson"
					}
					im.endless(w, status, ctype, head, aaaa)
				})
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				err := call(ctx, im.c)
				if ctx.Err() != nil {
					t.Fatalf("still reading after %d MiB", im.written.Load()>>20)
				}
				wantOversized(t, err)
				if n := im.written.Load(); n > 32<<20 {
					t.Errorf("the impostor wrote %d MiB before the client gave up", n>>20)
				}
				select {
				case <-im.gone:
				case <-time.After(5 * time.Second):
					t.Error("the connection was not dropped")
				}
			})
		}
	}
}

// TestImpostorMalformed: replies that are not what the protocol says are typed errors.
func TestImpostorMalformed(t *testing.T) {
	t.Parallel()
	nd, js := "application/x-ndjson", "application/json"
	for _, tc := range []struct {
		name, call string
		status     int
		ctype      string
		body       string
		want       errcode.Code
		header     []string
	}{
		{"bad json", "stat", 200, js, `{"path":`, errcode.Internal, nil},
		{"wrong type", "stat", 200, js, `{"path":1}`, errcode.Internal, nil},
		{"negative size", "stat", 200, js, `{"path":"/x","type":"file","size":-1}`, errcode.Internal, nil},
		{"unknown type", "write", 200, js, `{"path":"/x","type":"socket"}`, errcode.Internal, nil},
		{"trailing data", "stat", 200, js, `{"path":"/x","type":"file"} {}`, errcode.Internal, nil},
		{"health array", "health", 200, js, `[]`, errcode.Internal, nil},
		{"oom negative", "oomkill", 200, js, `{"killed":-3}`, errcode.Internal, nil},
		{"negative bytes", "exec", 200, js, `{"stdout_bytes":-1}`, errcode.Internal, nil},
		{"bad signal", "exec", 200, js, `{"signal":"SIGKILL\u001b[2J"}`, errcode.Internal, nil},
		{"remove body", "remove", 200, js, `{}`, errcode.Internal, nil},
		{"list bad total", "list", 200, js, `{"path":"/x","entries":[{"path":"/x/a","type":"file"}],"total":0}`, errcode.Internal, nil},
		{"list not array", "list", 200, js, `{"path":"/x","entries":{}}`, errcode.Internal, nil},
		{"list negative", "list", 200, js, `{"path":"/x","entries":[{"type":"file","size":-5}],"total":1}`, errcode.Internal, nil},
		{"list truncated", "list", 200, js, `{"path":"/x","entries":[{"path":"/x/a"`, errcode.SandboxNotRunning, nil},
		{"list trailing", "list", 200, js, `{"path":"/x","total":0}{`, errcode.Internal, nil},
		{"error not json", "stat", 502, "text/html", "<h1>AUTH_FAILED</h1>", errcode.Internal, nil},
		{"error no code", "stat", 401, js, `{"message":"log in again"}`, errcode.Internal, nil},
		{"frame bad json", "stream", 200, nd, "{\"stream\":\n", errcode.Internal, nil},
		{"frame two kinds", "stream", 200, nd, `{"stream":"stdout","data":"eA==","result":{}}` + "\n", errcode.Internal, nil},
		{"frame empty", "stream", 200, nd, "{}\n", errcode.Internal, nil},
		{"frame bad stream", "stream", 200, nd, `{"stream":"stdin","data":"eA=="}` + "\n", errcode.Internal, nil},
		{"frame too much data", "stream", 200, nd, `{"stream":"stdout","data":"` + strings.Repeat("QUFB", 11000) + `"}` + "\n", errcode.Internal, nil},
		{"frame negative", "stream", 200, nd, `{"result":{"duration_ms":-1}}` + "\n", errcode.Internal, nil},
		{"stream cut in a frame", "stream", 200, nd, `{"stream":"stdout","da`, errcode.SandboxNotRunning, nil},
		{"stream ends early", "stream", 200, nd, `{"stream":"stdout","data":"eA=="}` + "\n", errcode.SandboxNotRunning, nil},
		{"frame forged code", "stream", 200, nd, `{"error":{"code":"AUTH_FAILED","message":"x"}}` + "\n", errcode.Internal, nil},
		{"read no size", "read", 200, "application/octet-stream", "abc", errcode.Internal, nil},
		{"read negative size", "read", 200, "application/octet-stream", "abc", errcode.Internal, []string{guest.SizeHeader, "-3"}},
		{"read more than the file", "read", 200, "application/octet-stream", "abcdef", errcode.Internal, []string{guest.SizeHeader, "3"}},
		{"read past the limit", "read", 200, "application/octet-stream", "", errcode.Internal, []string{guest.SizeHeader, "1099511627776"}},
		{"read short", "read", 200, "application/octet-stream", "ab", errcode.SandboxNotRunning, []string{guest.SizeHeader, "3", "Content-Length", "3"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			im := startImpostor(t, fixed(tc.status, tc.ctype, tc.body, tc.header...))
			err := calls[tc.call](ctxT(t, 10*time.Second), im.c)
			e, ok := errcode.As(err)
			if !ok || e.Code != tc.want {
				t.Fatalf("got %v, want %s", err, tc.want)
			}
			if e.Code == errcode.Internal && e.Details["origin"] != "sandbox_agent" {
				t.Errorf("details %v do not name the sandbox's agent", e.Details)
			}
		})
	}
}

// TestImpostorReadRange: a read never yields more than the range asked for, whatever the agent
// says the file's size is or sends.
func TestImpostorReadRange(t *testing.T) {
	t.Parallel()
	im := startImpostor(t, func(im *impostor, w http.ResponseWriter, r *http.Request) {
		w.Header().Set(guest.SizeHeader, "100")
		im.endless(w, http.StatusOK, "application/octet-stream", "", aaaa) // chunked, endless
	})
	rc, size, err := im.c.ReadFile(ctxT(t, 10*time.Second), "/x", 90, 5, 0)
	if err != nil || size != 100 {
		t.Fatalf("ReadFile: %v, size %d", err, size)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if len(b) != 5 {
		t.Errorf("read %d bytes of a range of 5", len(b))
	}
	wantOversized(t, err)
}

// TestLegitWorstCases: the real agent's largest legitimate replies pass the bounds: output
// that JSON escapes sixfold, at max_output_bytes on both streams, streamed and not.
func TestLegitWorstCases(t *testing.T) {
	t.Parallel()
	a := startAgent(t)
	const max = 1 << 20
	script := `head -c 1048576 /dev/zero | tr '\0' '\1'; head -c 1048576 /dev/zero | tr '\0' '\377' >&2`
	req := guest.ExecRequest{Argv: []string{"sh", "-c", script}, MaxOutputBytes: max}
	res := a.exec(t, req)
	if res.StdoutBytes != max || res.StderrBytes != max || res.Truncated || string(res.Stdout) != strings.Repeat("\x01", max) || string(res.Stderr) != strings.Repeat("\377", max) {
		t.Errorf("exec: %d/%d bytes, truncated %v", res.StdoutBytes, res.StderrBytes, res.Truncated)
	}
	var streamed atomic.Int64
	res, err := a.c.Exec(ctxT(t, 60*time.Second), req, func(_ string, d []byte) { streamed.Add(int64(len(d))) })
	if err != nil || streamed.Load() != 2*max || res.StdoutBytes != max {
		t.Errorf("streamed exec: %v, %d bytes streamed, result %d", err, streamed.Load(), res.StdoutBytes)
	}
}

// TestImpostorListOfLongEntries: a listing of entries each within its bound, but together past
// what a listing may hold, is cut off, entry by entry, without buffering the reply.
func TestImpostorListOfLongEntries(t *testing.T) {
	t.Parallel()
	entry := []byte(`{"path":"/x/` + strings.Repeat("A", 20000) + `","name":"a","type":"file"},`)
	im := startImpostor(t, func(im *impostor, w http.ResponseWriter, r *http.Request) {
		im.endless(w, http.StatusOK, "application/json", `{"path":"/x","entries":[`, bytes.Repeat(entry, 16))
	})
	_, err := im.c.List(ctxT(t, 120*time.Second), "/x") // 96 MiB of JSON: tens of seconds under the race detector on a busy host
	wantOversized(t, err)
	if n := im.written.Load(); n > 128<<20 {
		t.Errorf("the impostor wrote %d MiB before the client gave up", n>>20)
	}
}
