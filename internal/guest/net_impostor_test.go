//go:build linux

package guest_test

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/guest"
)

// hijack101 answers 101 by hand and takes the connection over.
func hijack101(t *testing.T, w http.ResponseWriter, r *http.Request, proto string) (net.Conn, *bufio.ReadWriter) {
	_, _ = io.Copy(io.Discard, r.Body)
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		t.Errorf("hijack: %v", err)
		return nil, nil
	}
	_, _ = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: " + proto + "\r\n\r\n")
	_ = brw.Flush()
	return conn, brw
}

// TestImpostorNetReplyOversized: a session reply line past MaxNetHeader is refused.
func TestImpostorNetReplyOversized(t *testing.T) {
	t.Parallel()
	im := startImpostor(t, func(im *impostor, w http.ResponseWriter, r *http.Request) {
		conn, _ := hijack101(t, w, r, guest.NetProtocol)
		if conn == nil {
			return
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
		big := []byte(`{"proxy_addr":"` + strings.Repeat("A", 64<<10))
		for range 64 { // 4 MiB, or until the client closes
			if _, err := conn.Write(big); err != nil {
				return
			}
		}
	})
	_, err := im.c.NetSession(ctxT(t, 10*time.Second), guest.NetSessionRequest{DNSPort: -1})
	wantOversized(t, err)
}

// TestImpostorNetStreamHeaders: streams whose header is oversized, of an unknown kind, or with
// a bad address are closed and skipped; the good one after them is delivered.
func TestImpostorNetStreamHeaders(t *testing.T) {
	t.Parallel()
	done := make(chan struct{})
	im := startImpostor(t, func(im *impostor, w http.ResponseWriter, r *http.Request) {
		conn, brw := hijack101(t, w, r, guest.NetProtocol)
		if conn == nil {
			return
		}
		defer conn.Close()
		_, _ = conn.Write([]byte(`{"proxy_addr":"127.0.0.1:3128"}` + "\n"))
		cfg := yamux.DefaultConfig()
		cfg.LogOutput = io.Discard
		sess, err := yamux.Client(struct {
			io.Reader
			io.WriteCloser
		}{brw.Reader, conn}, cfg)
		if err != nil {
			t.Error(err)
			return
		}
		defer sess.Close()
		for _, h := range []string{
			strings.Repeat("x", 5000) + "\n",
			`{"kind":"exfil"}` + "\n",
			`{"kind":"transparent"}` + "\n",
			`{"kind":"proxy","dst":"not-an-address"}` + "\n",
			`{"kind":"proxy","src":"127.0.0.1:5"}` + "\nhello",
		} {
			st, err := sess.OpenStream()
			if err != nil {
				t.Error(err)
				return
			}
			_, _ = st.Write([]byte(h))
		}
		select {
		case <-sess.CloseChan():
		case <-done:
		}
	})
	defer close(done)
	s, err := im.c.NetSession(ctxT(t, 10*time.Second), guest.NetSessionRequest{DNSPort: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	st := acceptOne(t, s)
	if st.Header.Kind != "proxy" || st.Header.Src != "127.0.0.1:5" {
		t.Fatalf("delivered %+v", st.Header)
	}
	buf := make([]byte, 5)
	if _, err := io.ReadFull(st, buf); err != nil || string(buf) != "hello" {
		t.Fatalf("read %q, %v", buf, err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for s.BadStreams() != 4 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := s.BadStreams(); n != 4 {
		t.Fatalf("%d streams skipped, want 4", n)
	}
}

// TestImpostorNetForgedCodes: codes the net endpoints never send become INTERNAL, as the
// agent's; a 200 instead of 101 is INTERNAL too.
func TestImpostorNetForgedCodes(t *testing.T) {
	t.Parallel()
	im := startImpostor(t, fixed(http.StatusNotFound, "application/json", `{"code":"FILE_NOT_FOUND","message":"gone"}`))
	ctx := ctxT(t, 10*time.Second)
	_, err := im.c.DialPort(ctx, 80)
	wantCode(t, err, errcode.Internal, "unexpected error code")
	_, err = im.c.NetSession(ctx, guest.NetSessionRequest{DNSPort: -1})
	wantCode(t, err, errcode.Internal, "unexpected error code")

	ok := startImpostor(t, fixed(http.StatusOK, "application/json", `{}`))
	_, err = ok.c.DialPort(ctx, 80)
	wantCode(t, err, errcode.Internal, "instead of switching protocols")
}

// TestImpostorNetDialCancel: an agent that never answers the session is left when ctx ends.
func TestImpostorNetDialCancel(t *testing.T) {
	t.Parallel()
	im := startImpostor(t, func(im *impostor, w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		<-r.Context().Done()
	})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := im.c.NetSession(ctx, guest.NetSessionRequest{DNSPort: -1})
	if ctx.Err() == nil || err == nil {
		t.Fatalf("NetSession returned %v before its context ended", err)
	}
}
