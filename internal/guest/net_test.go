//go:build linux

package guest_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/guest"
)

// noDNS is a session with only the proxy listener, on a free port.
var noDNS = guest.NetSessionRequest{DNSPort: -1}

// openSession opens a session that the test closes at its end.
func openSession(t testing.TB, a *agent, req guest.NetSessionRequest) *guest.NetSession {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := a.c.NetSession(ctx, req)
	if err != nil {
		t.Fatalf("NetSession(%+v): %v", req, err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// acceptOne accepts the next stream within 10 s.
func acceptOne(t testing.TB, s *guest.NetSession) *guest.NetStream {
	t.Helper()
	type res struct {
		st  *guest.NetStream
		err error
	}
	ch := make(chan res, 1)
	go func() {
		st, err := s.Accept()
		ch <- res{st, err}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("Accept: %v", r.err)
		}
		t.Cleanup(func() { _ = r.st.Close() })
		return r.st
	case <-time.After(10 * time.Second):
		_ = s.Close() // ends the Accept above
		<-ch
		t.Fatal("no stream within 10 s")
		return nil
	}
}

func dialTCP(t testing.TB, addr string) *net.TCPConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c.(*net.TCPConn)
}

// echoHalfClose checks that c carries size random bytes to an echo and back, the echo's end
// arriving as EOF after the client's half-close.
func echoHalfClose(t *testing.T, c net.Conn, size int) {
	t.Helper()
	data := make([]byte, size)
	_, _ = rand.Read(data)
	werr := make(chan error, 1)
	go func() {
		_, err := c.Write(data)
		if err == nil {
			err = c.(interface{ CloseWrite() error }).CloseWrite()
		}
		werr <- err
	}()
	_ = c.SetReadDeadline(time.Now().Add(60 * time.Second))
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("reading the echo: %v (after %d bytes)", err, len(got))
	}
	if err := <-werr; err != nil {
		t.Fatalf("writing: %v", err)
	}
	if sha256.Sum256(got) != sha256.Sum256(data) {
		t.Fatalf("echo of %d bytes came back as %d different bytes", len(data), len(got))
	}
}

// echo copies st back to itself and half-closes it at the end.
func echo(st *guest.NetStream) {
	_, _ = io.Copy(st, st)
	_ = st.CloseWrite()
}

func TestNetSessionProxyEcho(t *testing.T) {
	t.Parallel()
	a := startAgent(t)
	s := openSession(t, a, noDNS)
	if !strings.HasPrefix(s.Reply.ProxyAddr, "127.0.0.1:") || s.Reply.DNSAddr != "" || len(s.Reply.Transparent) != 0 {
		t.Fatalf("reply %+v", s.Reply)
	}
	c := dialTCP(t, s.Reply.ProxyAddr)
	st := acceptOne(t, s)
	if st.Header.Kind != "proxy" || st.Header.Dst != "" || st.Header.Src != c.LocalAddr().String() {
		t.Fatalf("header %+v, want kind proxy, src %s", st.Header, c.LocalAddr())
	}
	go echo(st)
	echoHalfClose(t, c, 10<<20)
}

func TestNetSessionTransparent(t *testing.T) {
	t.Parallel()
	a := startAgent(t)
	s := openSession(t, a, guest.NetSessionRequest{DNSPort: -1, TransparentPorts: []int{0}})
	if len(s.Reply.Transparent) != 1 || !strings.HasPrefix(s.Reply.Transparent[0], "0.0.0.0:") {
		t.Fatalf("reply %+v", s.Reply)
	}
	_, port, _ := net.SplitHostPort(s.Reply.Transparent[0])
	// 127.0.0.7 is the host's loopback too: the listener on 0.0.0.0 accepts it, and its local
	// address is the address dialed (as every address is in a sandbox with the AnyIP route).
	c := dialTCP(t, "127.0.0.7:"+port)
	st := acceptOne(t, s)
	if st.Header.Kind != "transparent" || st.Header.Dst != "127.0.0.7:"+port || st.Header.Src != c.LocalAddr().String() {
		t.Fatalf("header %+v, want transparent to 127.0.0.7:%s from %s", st.Header, port, c.LocalAddr())
	}
	go echo(st)
	echoHalfClose(t, c, 64<<10)
}

// dnsAnswerer answers every dns stream of s: UDP-relayed queries get the query with the QR
// bit set and pad bytes appended (to make the reply larger than 512 bytes).
func dnsAnswerer(t *testing.T, s *guest.NetSession, pad int) {
	go func() {
		for {
			st, err := s.Accept()
			if err != nil {
				return
			}
			go func() {
				defer st.Close()
				if st.Header.Kind != "dns" {
					t.Errorf("stream kind %q on the dns test", st.Header.Kind)
					return
				}
				var l [2]byte
				if _, err := io.ReadFull(st, l[:]); err != nil {
					return
				}
				q := make([]byte, binary.BigEndian.Uint16(l[:]))
				if _, err := io.ReadFull(st, q); err != nil {
					return
				}
				r := append(append([]byte{}, q...), bytes.Repeat([]byte{0xAA}, pad)...)
				r[2] |= 0x80
				binary.BigEndian.PutUint16(l[:], uint16(len(r)))
				_, _ = st.Write(append(l[:], r...))
			}()
		}
	}()
}

func fakeQuery(id uint16, size int) []byte {
	q := make([]byte, size)
	binary.BigEndian.PutUint16(q, id)
	q[5] = 1 // one question
	return q
}

func TestNetSessionDNS(t *testing.T) {
	t.Parallel()
	a := startAgent(t)
	s := openSession(t, a, guest.NetSessionRequest{DNSPort: 0})
	if !strings.HasPrefix(s.Reply.DNSAddr, "127.0.0.1:") {
		t.Fatalf("reply %+v", s.Reply)
	}
	dnsAnswerer(t, s, 1000)
	u, err := net.Dial("udp", s.Reply.DNSAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	// An oversized datagram is dropped: only the second query is answered.
	if _, err := u.Write(fakeQuery(1, 5000)); err != nil {
		t.Fatal(err)
	}
	if _, err := u.Write(fakeQuery(2, 40)); err != nil {
		t.Fatal(err)
	}
	_ = u.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 65536)
	n, err := u.Read(buf)
	if err != nil {
		t.Fatalf("no UDP reply: %v", err)
	}
	if n != 1040 || binary.BigEndian.Uint16(buf) != 2 || buf[2]&0x80 == 0 {
		t.Fatalf("reply of %d bytes, id %d (want the whole 1040-byte answer to query 2)", n, binary.BigEndian.Uint16(buf))
	}
	// DNS over TCP on the same port: the stream carries the framed messages as they are.
	c := dialTCP(t, s.Reply.DNSAddr)
	q := fakeQuery(3, 30)
	if _, err := c.Write(append([]byte{0, 30}, q...)); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	var l [2]byte
	if _, err := io.ReadFull(c, l[:]); err != nil || binary.BigEndian.Uint16(l[:]) != 1030 {
		t.Fatalf("TCP reply length %d, err %v", binary.BigEndian.Uint16(l[:]), err)
	}
}

// TestNetSessionPending: connections accepted while no session is up wait for the next one.
func TestNetSessionPending(t *testing.T) {
	t.Parallel()
	a := startAgent(t)
	s1 := openSession(t, a, noDNS)
	_ = s1.Close()
	time.Sleep(100 * time.Millisecond) // the agent sees the session end
	c := dialTCP(t, s1.Reply.ProxyAddr)
	if _, err := c.Write([]byte("held")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	s2 := openSession(t, a, noDNS)
	if s2.Reply.ProxyAddr != s1.Reply.ProxyAddr {
		t.Fatalf("the second session's proxy is %s, the first's %s: the listeners must be kept", s2.Reply.ProxyAddr, s1.Reply.ProxyAddr)
	}
	st := acceptOne(t, s2)
	buf := make([]byte, 4)
	_ = st.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(st, buf); err != nil || string(buf) != "held" {
		t.Fatalf("read %q, %v", buf, err)
	}
}

// TestNetSessionConfig: a later session with another configuration is CONFLICT and leaves the
// current one up; one with the same (as asked, or as bound) replaces it.
func TestNetSessionConfig(t *testing.T) {
	t.Parallel()
	a := startAgent(t)
	s1 := openSession(t, a, noDNS)
	ctx := ctxT(t, 10*time.Second)
	_, err := a.c.NetSession(ctx, guest.NetSessionRequest{DNSPort: 0})
	wantCode(t, err, errcode.Conflict, "another configuration")
	if e, _ := errcode.As(err); e.Details["origin"] != "sandbox_agent" {
		t.Errorf("details %v", e.Details)
	}
	select {
	case <-s1.Done():
		t.Fatal("a refused session closed the current one")
	case <-time.After(200 * time.Millisecond):
	}
	_, port, _ := net.SplitHostPort(s1.Reply.ProxyAddr)
	p, _ := strconv.Atoi(port)
	s2 := openSession(t, a, guest.NetSessionRequest{ProxyPort: p, DNSPort: -1})
	select {
	case <-s1.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the replaced session is still up")
	}
	if _, err := s1.Accept(); errcode.Of(err) != errcode.SandboxNotRunning {
		t.Fatalf("Accept on the replaced session: %v", err)
	}
	c := dialTCP(t, s2.Reply.ProxyAddr)
	st := acceptOne(t, s2)
	go echo(st)
	echoHalfClose(t, c, 1000)
}

// TestNetSessionBindFailure: a port in use is CONFLICT naming it, and nothing stays bound.
func TestNetSessionBindFailure(t *testing.T) {
	t.Parallel()
	a := startAgent(t)
	busy, err := net.Listen("tcp4", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	busyPort := busy.Addr().(*net.TCPAddr).Port
	free := freePort(t)
	ctx := ctxT(t, 10*time.Second)
	_, err = a.c.NetSession(ctx, guest.NetSessionRequest{ProxyPort: free, DNSPort: -1, TransparentPorts: []int{busyPort}})
	wantCode(t, err, errcode.Conflict, "port "+strconv.Itoa(busyPort))
	ln, err := net.Listen("tcp4", "127.0.0.1:"+strconv.Itoa(free))
	if err != nil {
		t.Fatalf("the proxy port %d is still bound after the failed session: %v", free, err)
	}
	_ = ln.Close()
	s := openSession(t, a, guest.NetSessionRequest{ProxyPort: free, DNSPort: -1})
	if s.Reply.ProxyAddr != "127.0.0.1:"+strconv.Itoa(free) {
		t.Fatalf("reply %+v", s.Reply)
	}
}

func freePort(t *testing.T) int {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func TestNetSessionInvalid(t *testing.T) {
	t.Parallel()
	a := startAgent(t)
	ctx := ctxT(t, 10*time.Second)
	for _, tc := range []struct {
		req  guest.NetSessionRequest
		want string
	}{
		{guest.NetSessionRequest{ProxyPort: 70000}, "proxy_port 70000 is out of range: 0–65535"},
		{guest.NetSessionRequest{DNSPort: -2}, "dns_port -2 is out of range: -1–65535"},
		{guest.NetSessionRequest{TransparentPorts: []int{1, 2, 3, 4, 5, 6, 7, 8, 9}}, "at most 8"},
		{guest.NetSessionRequest{TransparentPorts: []int{80, 80}}, "twice"},
	} {
		_, err := a.c.NetSession(ctx, tc.req)
		wantCode(t, err, errcode.InvalidArgument, tc.want)
		// The agent checks too (a client of another build).
		code, eb := a.rawUpgrade(t, "/net/session", guest.NetProtocol, tc.req)
		if code != http.StatusBadRequest || eb.Code != string(errcode.InvalidArgument) || !strings.Contains(eb.Message, tc.want) {
			t.Errorf("agent: %d %+v, want INVALID_ARGUMENT %q", code, eb, tc.want)
		}
	}
	code, eb := a.rawUpgrade(t, "/tcp", guest.TCPProtocol, guest.DialPortRequest{Port: 0})
	if code != http.StatusBadRequest || !strings.Contains(eb.Message, "port 0 is out of range: 1–65535") {
		t.Errorf("agent: %d %+v", code, eb)
	}
}

func TestDialPort(t *testing.T) {
	t.Parallel()
	a := startAgent(t)
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
				_ = c.(*net.TCPConn).CloseWrite()
			}()
		}
	}()
	ctx := ctxT(t, 10*time.Second)
	c, err := a.c.DialPort(ctx, ln.Addr().(*net.TCPAddr).Port)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	echoHalfClose(t, c, 4<<20)

	closed := freePort(t)
	_, err = a.c.DialPort(ctx, closed)
	wantCode(t, err, errcode.Conflict, "nothing listens on port "+strconv.Itoa(closed))
	if e, _ := errcode.As(err); e.Details["origin"] != "sandbox_agent" {
		t.Errorf("details %v", e.Details)
	}
	_, err = a.c.DialPort(ctx, 65536)
	wantCode(t, err, errcode.InvalidArgument, "1–65535")
}

// TestDialPortCancel: a context that ends while the agent connects closes the connection.
func TestDialPortCancel(t *testing.T) {
	t.Parallel()
	im := startImpostor(t, func(im *impostor, w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		<-r.Context().Done() // never answers (the client's close ends the context)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := im.c.DialPort(ctx, 8080)
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 3*time.Second {
		t.Fatalf("DialPort: %v after %s, want the context's deadline at once", err, time.Since(start))
	}
}

// rawUpgrade sends an upgrade request by hand (past the client's own checks) and returns the
// agent's error reply.
func (a *agent) rawUpgrade(t *testing.T, path, proto string, body any) (int, guest.ErrorBody) {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", a.socket)
	}}}
	defer hc.CloseIdleConnections()
	b, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(ctxT(t, 10*time.Second), http.MethodPost, "http://agent/v1"+path, bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", proto)
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	var eb guest.ErrorBody
	_ = json.Unmarshal(data, &eb)
	return resp.StatusCode, eb
}

// TestNetSessionPendingBounds: with no session up, at most 256 connections wait (the rest are
// closed at once), and those that wait are closed after 10 s.
func TestNetSessionPendingBounds(t *testing.T) {
	t.Parallel()
	a := startAgent(t)
	s := openSession(t, a, noDNS)
	_ = s.Close()
	time.Sleep(100 * time.Millisecond)
	const n = 300
	closedAt := make(chan time.Duration, n)
	start := time.Now()
	for range n {
		c := dialTCP(t, s.Reply.ProxyAddr)
		go func() {
			_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
			_, _ = c.Read(make([]byte, 1))
			closedAt <- time.Since(start)
		}()
	}
	early, late := 0, 0
	for range n {
		d := <-closedAt
		switch {
		case d < 3*time.Second:
			early++
		case d >= 9*time.Second && d < 20*time.Second:
			late++
		default:
			t.Errorf("a connection closed after %s", d)
		}
	}
	if early != n-256 || late != 256 {
		t.Fatalf("%d closed at once, %d after the 10 s wait; want %d and 256", early, late, n-256)
	}
}

// postAccept sends POST /v1/net/accept with token on a connection of its own and returns the
// reply's status line.
func postAccept(t *testing.T, socket, token string) string {
	t.Helper()
	c, err := net.DialTimeout("unix", socket, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	body := `{"token":"` + token + `"}`
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	_, _ = io.WriteString(c, "POST /v1/net/accept HTTP/1.1\r\nHost: agent\r\nConnection: Upgrade\r\nUpgrade: "+guest.NetConnProtocol+
		"\r\nContent-Type: application/json\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\n\r\n"+body)
	buf := make([]byte, 256)
	n, _ := c.Read(buf)
	line, _, _ := strings.Cut(string(buf[:n]), "\r\n")
	return line
}

// TestNetAcceptToken: a parked connection is accepted only with the current session's token:
// a made-up one and the token of a session a newer one replaced are CONFLICT.
func TestNetAcceptToken(t *testing.T) {
	t.Parallel()
	a := startAgent(t)
	s1 := openSession(t, a, noDNS)
	if got := postAccept(t, a.socket, s1.Reply.Token); !strings.Contains(got, " 101 ") {
		t.Fatalf("the current token: %q, want 101", got)
	}
	if got := postAccept(t, a.socket, strings.Repeat("0", 32)); !strings.Contains(got, " 409 ") {
		t.Fatalf("a made-up token: %q, want 409", got)
	}
	s2 := openSession(t, a, noDNS)
	if s2.Reply.Token == s1.Reply.Token {
		t.Fatal("two sessions share a token")
	}
	if got := postAccept(t, a.socket, s1.Reply.Token); !strings.Contains(got, " 409 ") {
		t.Fatalf("the replaced session's token: %q, want 409", got)
	}
}

// TestNetStreamRaw: a stream is the unix connection to the agent itself (the egress proxy
// copies it to TCP with splice), and a burst of connections larger than the parked pool is
// served, each with its own bytes.
func TestNetStreamRaw(t *testing.T) {
	t.Parallel()
	a := startAgent(t)
	s := openSession(t, a, noDNS)
	const n = 100
	go func() {
		for {
			st, err := s.Accept()
			if err != nil {
				return
			}
			if _, ok := st.Conn.(*net.UnixConn); !ok {
				t.Errorf("stream conn is %T, want *net.UnixConn", st.Conn)
			}
			go echo(st)
		}
	}()
	errs := make(chan error, n)
	for i := range n {
		go func() {
			c, err := net.DialTimeout("tcp", s.Reply.ProxyAddr, 5*time.Second)
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(20 * time.Second))
			msg := "conn " + strconv.Itoa(i)
			if _, err := io.WriteString(c, msg); err != nil {
				errs <- err
				return
			}
			_ = c.(*net.TCPConn).CloseWrite()
			got, err := io.ReadAll(c)
			if err == nil && string(got) != msg {
				err = errors.New("echo " + strconv.Quote(string(got)) + ", want " + strconv.Quote(msg))
			}
			errs <- err
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}
