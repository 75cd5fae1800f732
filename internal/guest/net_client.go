package guest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/agentbox/agentbox/internal/errcode"
)

// NetSession is the host's side of a sandbox's egress session: a yamux session (the host is
// its server) over one upgraded connection to the agent, on which the agent opens a stream per
// connection made inside the sandbox.
type NetSession struct {
	Reply NetSessionReply

	sess  *yamux.Session
	ready chan *NetStream
	wg    sync.WaitGroup
	bad   atomic.Int64
}

// NetStream is one connection from inside the sandbox. Its Conn's CloseWrite half-closes the
// stream (the sandbox's side reads EOF and may still send); Close ends it.
type NetStream struct {
	net.Conn
	Header NetStreamHeader
}

// CloseWrite half-closes the stream: the sandbox's side reads EOF and may still send.
func (s *NetStream) CloseWrite() error {
	if cw, ok := s.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return s.Conn.Close()
}

// maxHeaderReaders bounds the streams whose header is being read at once.
const maxHeaderReaders = 256

// Accept returns the next stream the agent opened, with its header read (bounded by
// MaxNetHeader, within 10 s; a stream whose header is late, oversized or not one of the
// protocol's is closed and skipped); it fails with SANDBOX_NOT_RUNNING once the session is
// closed or broken.
func (s *NetSession) Accept() (*NetStream, error) {
	select {
	case st := <-s.ready:
		return st, nil
	case <-s.sess.CloseChan():
		return nil, errcode.New(errcode.SandboxNotRunning, "the sandbox's egress session ended (the sandbox stopped, or the session was closed or replaced)")
	}
}

// Close ends the session and every stream of it, and waits for its goroutines.
func (s *NetSession) Close() error {
	err := s.sess.Close()
	s.wg.Wait()
	return err
}

// Done is closed when the session ends.
func (s *NetSession) Done() <-chan struct{} { return s.sess.CloseChan() }

// BadStreams counts the streams skipped for a bad header.
func (s *NetSession) BadStreams() int64 { return s.bad.Load() }

// acceptLoop accepts the agent's streams and reads each one's header in a goroutine of its
// own (at most maxHeaderReaders at once), handing the good ones to Accept.
func (s *NetSession) acceptLoop() {
	defer s.wg.Done()
	sem := make(chan struct{}, maxHeaderReaders)
	for {
		st, err := s.sess.AcceptStream()
		if err != nil {
			return
		}
		select {
		case sem <- struct{}{}:
		case <-s.sess.CloseChan():
			_ = st.Close()
			return
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer func() { <-sem }()
			ns, err := readStreamHeader(st)
			if err != nil {
				s.bad.Add(1)
				abortConn(st)
				return
			}
			select {
			case s.ready <- ns:
			case <-s.sess.CloseChan():
				abortConn(st)
			}
		}()
	}
}

// readStreamHeader reads and checks a stream's header line.
func readStreamHeader(st *yamux.Stream) (*NetStream, error) {
	_ = st.SetReadDeadline(time.Now().Add(netHeaderWait))
	br := bufio.NewReaderSize(st, MaxNetHeader+1)
	line, err := readLineMax(br, MaxNetHeader)
	if err != nil {
		return nil, err
	}
	var h NetStreamHeader
	if err := json.Unmarshal(line, &h); err != nil {
		return nil, err
	}
	if err := validStreamHeader(&h); err != nil {
		return nil, err
	}
	_ = st.SetReadDeadline(time.Time{})
	return &NetStream{Conn: &streamConn{Stream: st, br: br}, Header: h}, nil
}

func validStreamHeader(h *NetStreamHeader) error {
	if !slices.Contains(netKinds, h.Kind) {
		return fmt.Errorf("unknown stream kind %q", cleanText(h.Kind, 32))
	}
	if h.Dst != "" {
		if _, err := netip.ParseAddrPort(h.Dst); err != nil {
			return fmt.Errorf("bad dst %q", cleanText(h.Dst, 64))
		}
	} else if h.Kind == "transparent" {
		return errors.New("a transparent stream without dst")
	}
	if h.Src != "" {
		if _, err := netip.ParseAddrPort(h.Src); err != nil {
			return fmt.Errorf("bad src %q", cleanText(h.Src, 64))
		}
	}
	return nil
}

// streamConn is a stream whose first bytes (read with its header) are in br.
type streamConn struct {
	*yamux.Stream
	br *bufio.Reader
}

func (c *streamConn) Read(p []byte) (int, error) {
	if c.br != nil && c.br.Buffered() > 0 {
		return c.br.Read(p)
	}
	return c.Stream.Read(p)
}

// CloseWrite half-closes the stream: the sandbox's side reads EOF.
func (c *streamConn) CloseWrite() error { return c.Stream.Close() }

// Close ends the stream: pending reads and writes fail at once.
func (c *streamConn) Close() error {
	_ = c.Stream.SetDeadline(time.Now())
	return c.Stream.Close()
}

// NetSession opens the sandbox's egress session: the agent binds (on the first session) or
// checks (on a later one, which replaces the current one) the listeners req asks for. ctx
// bounds the dial and the upgrade only; the session lasts until Close or until the connection
// breaks.
func (c *Client) NetSession(ctx context.Context, req NetSessionRequest) (*NetSession, error) {
	if err := req.Validate(); err != nil {
		return nil, err
	}
	conn, br, lr, stop, err := c.upgrade(ctx, "/net/session", NetProtocol, req, netCodes)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*NetSession, error) {
		stop()
		_ = conn.Close()
		return nil, ctxErr(ctx, err)
	}
	line, err := readLineMax(br, MaxNetHeader)
	switch {
	case errors.Is(err, errLineTooLong):
		return fail(oversized("the net session (its reply line)", MaxNetHeader))
	case err != nil:
		return fail(errcode.Wrap(errcode.SandboxNotRunning, err, "the sandbox's agent broke off its reply to the net session (the sandbox may have stopped)"))
	}
	var reply NetSessionReply
	if err := json.Unmarshal(line, &reply); err != nil {
		return fail(malformed("the net session", err))
	}
	if err := validNetReply(&reply, req); err != nil {
		return fail(malformed("the net session", err))
	}
	if !stop() {
		_ = conn.Close()
		return nil, ctx.Err()
	}
	lr.unlimit()
	sess, err := yamux.Server(&yamuxConn{Conn: conn, r: &bufConn{Conn: conn, br: br}}, yamuxConfig(io.Discard))
	if err != nil {
		_ = conn.Close()
		return nil, errcode.Wrap(errcode.Internal, err, "cannot start the egress session: %v", err)
	}
	s := &NetSession{Reply: reply, sess: sess, ready: make(chan *NetStream)}
	s.wg.Add(1)
	go s.acceptLoop()
	return s, nil
}

// validNetReply checks the addresses of a session's reply against what was asked.
func validNetReply(r *NetSessionReply, req NetSessionRequest) error {
	if _, err := netip.ParseAddrPort(r.ProxyAddr); err != nil {
		return fmt.Errorf("bad proxy_addr %q", cleanText(r.ProxyAddr, 64))
	}
	if (r.DNSAddr == "") != (req.DNSPort == -1) {
		return fmt.Errorf("dns_addr %q for dns_port %d", cleanText(r.DNSAddr, 64), req.DNSPort)
	}
	if r.DNSAddr != "" {
		if _, err := netip.ParseAddrPort(r.DNSAddr); err != nil {
			return fmt.Errorf("bad dns_addr %q", cleanText(r.DNSAddr, 64))
		}
	}
	if len(r.Transparent) != len(req.TransparentPorts) {
		return fmt.Errorf("%d transparent listeners for %d ports", len(r.Transparent), len(req.TransparentPorts))
	}
	for _, a := range r.Transparent {
		if _, err := netip.ParseAddrPort(a); err != nil {
			return fmt.Errorf("bad transparent address %q", cleanText(a, 64))
		}
	}
	return nil
}

// DialPort connects to port on the sandbox's loopback through the agent (127.0.0.1, then
// ::1). The connection is the upgraded connection to the agent itself: bytes go both ways
// as they are, CloseWrite half-closes. Nothing listening there is CONFLICT.
func (c *Client) DialPort(ctx context.Context, port int) (net.Conn, error) {
	if err := checkDialPort(port); err != nil {
		return nil, err
	}
	conn, br, lr, stop, err := c.upgrade(ctx, "/tcp", TCPProtocol, DialPortRequest{Port: port}, netCodes)
	if err != nil {
		return nil, err
	}
	if !stop() {
		_ = conn.Close()
		return nil, ctx.Err()
	}
	lr.unlimit()
	return &bufConn{Conn: conn, br: br}, nil
}

// upgrade sends POST path with body as JSON and "Upgrade: proto" on a connection of its own
// and reads the reply's header (bounded by maxHeaderBytes; an error reply's body by
// maxErrorReply, decoded with codes). On 101 it returns the connection, the reader holding
// what the agent sent after the header, the reader's limit (lifted by the caller once it has
// read what it reads bounded) and stop, which detaches ctx from the connection (false: ctx
// ended and closed it).
func (c *Client) upgrade(ctx context.Context, path, proto string, body any, codes []errcode.Code) (net.Conn, *bufio.Reader, *limitedConnReader, func() bool, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return nil, nil, nil, nil, errcode.Wrap(errcode.InvalidArgument, err, "cannot encode request")
	}
	if c.dial == nil {
		return nil, nil, nil, nil, errcode.New(errcode.Internal, "the guest client has no dialer")
	}
	conn, err := c.dial(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil, nil, nil, nil, ctx.Err()
		}
		return nil, nil, nil, nil, errcode.Wrap(errcode.SandboxNotRunning, err, "the sandbox's agent is not reachable")
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	fail := func(err error) (net.Conn, *bufio.Reader, *limitedConnReader, func() bool, error) {
		stop()
		_ = conn.Close()
		return nil, nil, nil, nil, ctxErr(ctx, err)
	}
	req, err := http.NewRequest(http.MethodPost, base+path, bytes.NewReader(b))
	if err != nil {
		return fail(errcode.Wrap(errcode.InvalidArgument, err, "bad request to the guest agent"))
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", proto)
	if err := req.Write(conn); err != nil {
		return fail(errcode.Wrap(errcode.SandboxNotRunning, err, "the sandbox's agent is not reachable"))
	}
	lr := &limitedConnReader{r: conn, left: maxHeaderBytes + maxErrorReply + 4<<10}
	br := bufio.NewReaderSize(lr, 32<<10)
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		if lr.left <= 0 {
			return fail(oversized(path+" (its header)", maxHeaderBytes))
		}
		return fail(errcode.Wrap(errcode.SandboxNotRunning, err, "the sandbox's agent broke off its reply to %s (the sandbox may have stopped)", path))
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		defer resp.Body.Close()
		if resp.StatusCode >= 300 {
			return fail(decodeError(resp, codes))
		}
		return fail(errcode.New(errcode.Internal, "the sandbox's agent answered HTTP %d to %s instead of switching protocols", resp.StatusCode, path).With("origin", agentOrigin))
	}
	if !strings.EqualFold(resp.Header.Get("Upgrade"), proto) {
		return fail(malformed(path, fmt.Errorf("upgraded to %q, not %q", cleanText(resp.Header.Get("Upgrade"), 64), proto)))
	}
	return conn, br, lr, stop, nil
}

// limitedConnReader reads at most left bytes until unlimit is called.
type limitedConnReader struct {
	r         io.Reader
	left      int64
	unlimited atomic.Bool
}

func (l *limitedConnReader) Read(p []byte) (int, error) {
	if l.unlimited.Load() {
		return l.r.Read(p)
	}
	if l.left <= 0 {
		return 0, errOverBudget
	}
	if int64(len(p)) > l.left {
		p = p[:l.left]
	}
	n, err := l.r.Read(p)
	l.left -= int64(n)
	return n, err
}

func (l *limitedConnReader) unlimit() { l.unlimited.Store(true) }

// bufConn is a connection whose first bytes are in br: what was read with the reply's header.
type bufConn struct {
	net.Conn
	br *bufio.Reader
}

func (c *bufConn) Read(p []byte) (int, error) {
	if c.br != nil && c.br.Buffered() > 0 {
		return c.br.Read(p)
	}
	return c.Conn.Read(p)
}

// CloseWrite half-closes the connection (the sandbox's side reads EOF).
func (c *bufConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.New("the connection to the agent cannot be half-closed")
}
