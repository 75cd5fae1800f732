//go:build linux

package guest_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

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

// frame is a stream header frame: the 2-byte length of h, then h.
func frame(h string) []byte {
	return append([]byte{byte(len(h) >> 8), byte(len(h))}, h...)
}

// TestImpostorNetStreamHeaders: parked connections whose header is oversized, of an unknown
// kind, with a bad address, or cut short are closed and counted; the good one after them is
// delivered with the bytes that came with its header; a stale token is refused.
func TestImpostorNetStreamHeaders(t *testing.T) {
	t.Parallel()
	const token = "0123456789abcdef0123456789abcdef"
	bad := [][]byte{
		append([]byte{0x20, 0x00}, strings.Repeat("x", 5000)...), // 8 KiB announced
		frame(`{"kind":"exfil"}`),
		frame(`{"kind":"transparent"}`),
		frame(`{"kind":"proxy","dst":"not-an-address"}`),
		frame(`not json`),
		frame(`{"kind":"proxy"`)[:6], // cut short
	}
	next := make(chan []byte, len(bad)+1)
	for _, b := range bad {
		next <- b
	}
	next <- append(frame(`{"kind":"proxy","src":"127.0.0.1:5"}`), "hello"...)
	done := make(chan struct{})
	stale := make(chan struct{}, 1)
	im := startImpostor(t, func(im *impostor, w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/net/session":
			conn, _ := hijack101(t, w, r, guest.NetProtocol)
			if conn == nil {
				return
			}
			defer conn.Close()
			_, _ = conn.Write([]byte(`{"proxy_addr":"127.0.0.1:3128","token":"` + token + `"}` + "\n"))
			<-done
		case "/v1/net/accept":
			var req guest.NetAcceptRequest
			_ = json.NewDecoder(r.Body).Decode(&req)
			if req.Token != token {
				select {
				case stale <- struct{}{}:
				default:
				}
				w.WriteHeader(http.StatusConflict)
				return
			}
			conn, _ := hijack101(t, w, r, guest.NetConnProtocol)
			if conn == nil {
				return
			}
			select {
			case b := <-next:
				_, _ = conn.Write(b)
				if len(b) < 10 { // cut short: the host waits for the rest until it gives up
					time.Sleep(100 * time.Millisecond)
					conn.Close()
					return
				}
				<-done
				conn.Close()
			case <-done:
				conn.Close()
			}
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
	for s.BadStreams() != int64(len(bad)) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := s.BadStreams(); n != int64(len(bad)) {
		t.Fatalf("%d streams skipped, want %d", n, len(bad))
	}
	select {
	case <-stale:
		t.Fatal("the host sent a token other than the session's")
	default:
	}
}

// TestImpostorNetBadToken: a session reply without a proper token is refused.
func TestImpostorNetBadToken(t *testing.T) {
	t.Parallel()
	im := startImpostor(t, func(im *impostor, w http.ResponseWriter, r *http.Request) {
		conn, _ := hijack101(t, w, r, guest.NetProtocol)
		if conn == nil {
			return
		}
		defer conn.Close()
		_, _ = conn.Write([]byte(`{"proxy_addr":"127.0.0.1:3128","token":"../../x"}` + "\n"))
		time.Sleep(time.Second)
	})
	_, err := im.c.NetSession(ctxT(t, 10*time.Second), guest.NetSessionRequest{DNSPort: -1})
	wantCode(t, err, errcode.Internal, "token")
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
