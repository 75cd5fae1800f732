package guest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
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

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/text"
)

// NetSession is the host's side of a sandbox's egress session: a control connection to the
// agent (its end ends the session; the agent writes a byte on it whenever a connection inside
// the sandbox finds no parked connection) and the connections the host parks at the agent
// (POST /v1/net/accept with the session's token), each of which the agent hands one
// connection made inside the sandbox. The host keeps netParkedIdle of them parked, dials a
// replacement for each one handed over and one more for each byte of demand, at most
// netParkedMax parked or being dialed at once.
type NetSession struct {
	Reply NetSessionReply

	c     *Client
	ctl   net.Conn
	ready chan *NetStream
	done  chan struct{}
	ctx   context.Context // ends with the session
	stop  context.CancelFunc
	once  sync.Once
	wg    sync.WaitGroup
	bad   atomic.Int64
	// passFDs: the session was opened with NetSessionRequest.PassFDs.
	passFDs bool
	// passListeners: opened with PassListeners; listeners counts those taken.
	passListeners bool
	listeners     atomic.Int64
	start         atomic.Pointer[func(*NetStream) func()]

	mu      sync.Mutex
	idle    int // parked connections kept while nothing asks for more
	parkers int // dialing or parked
	want    int // demand not yet answered with a dial
	conns   map[net.Conn]struct{}
	lns     map[string]net.Listener // the agent's listeners the host accepts on, by address
}

// NetStream is one connection from inside the sandbox. Conn is the connection to the agent
// itself (a *net.UnixConn unless the agent sent the first bytes with its header): copying it to
// or from a TCP connection with io.Copy splices. CloseWrite half-closes it (the sandbox's side
// reads EOF and may still send); Close ends it.
type NetStream struct {
	net.Conn
	Header NetStreamHeader
	ln     *net.TCPListener // a listener handed over (Header.Listener); Conn is nil then
}

// CloseWrite half-closes the stream: the sandbox's side reads EOF and may still send.
func (s *NetStream) CloseWrite() error { return closeWrite(s.Conn) }

// Accept returns the next stream the agent handed over, with its header read (bounded by
// MaxNetHeader, within 10 s of its first byte; a stream whose header is late, oversized or not
// one of the protocol's is closed and skipped); it fails with SANDBOX_NOT_RUNNING once the
// session is closed or broken.
func (s *NetSession) Accept() (*NetStream, error) {
	select {
	case st := <-s.ready:
		return st, nil
	case <-s.done:
		return nil, errcode.New(errcode.SandboxNotRunning, "the sandbox's egress session ended (the sandbox stopped, or the session was closed or replaced)")
	}
}

// Handle makes the session hand each later stream to start in the goroutine that read its
// header, instead of to Accept (no handoff between goroutines on a connection's way in).
// start runs while that goroutine still counts among the session's (Close waits for it, and
// the connection's replacement is dialed only once start returns), so it may wait — for a
// slot, or until Done — but must return promptly; the func it returns (nil: start closed the
// stream) then runs outside the session's count and owns the stream. Streams already waiting
// for Accept stay there.
func (s *NetSession) Handle(start func(*NetStream) func()) { s.start.Store(&start) }

// Close ends the session and its parked connections, and waits for its goroutines. Streams
// already returned by Accept are the caller's.
func (s *NetSession) Close() error {
	s.end()
	s.wg.Wait()
	return nil
}

func (s *NetSession) end() {
	s.once.Do(func() {
		close(s.done)
		s.stop()
		_ = s.ctl.Close()
		s.mu.Lock()
		for c := range s.conns {
			_ = c.Close()
		}
		s.conns = nil
		for _, ln := range s.lns {
			_ = ln.Close()
		}
		s.lns = nil
		s.mu.Unlock()
	})
}

// Done is closed when the session ends.
func (s *NetSession) Done() <-chan struct{} { return s.done }

// BadStreams counts the streams skipped for a bad header.
func (s *NetSession) BadStreams() int64 { return s.bad.Load() }

// Listeners counts the agent's listeners the host accepts on (a session opened with
// PassListeners).
func (s *NetSession) Listeners() int64 { return s.listeners.Load() }

// takeListener keeps ln, handed over for h, if the session asked for listeners and h.Dst is
// the address the reply gave for h.Kind and not yet taken; false: the caller closes ln.
func (s *NetSession) takeListener(ln *net.TCPListener, h NetStreamHeader) bool {
	if !s.passListeners {
		return false
	}
	var want []string
	switch h.Kind {
	case "proxy":
		want = []string{s.Reply.ProxyAddr}
	case "dns":
		want = []string{s.Reply.DNSAddr}
	case "transparent":
		want = s.Reply.Transparent
	}
	if h.Dst == "" || !slices.Contains(want, h.Dst) {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lns == nil || s.lns[h.Dst] != nil {
		return false
	}
	s.lns[h.Dst] = ln
	s.listeners.Add(1)
	return true
}

// acceptLoop accepts the sandbox's connections on ln (an agent's listener of kind, in the
// sandbox's network namespace) until the session ends, and serves each as a stream whose
// socket was handed over: through Handle's start in this goroutine (which waits for a slot,
// so a sandbox at its bound accepts nothing more), else Accept. The connection's addresses
// are the kernel's: for a transparent one, dst is its local address (the original
// destination under the runtime's AnyIP route).
func (s *NetSession) acceptLoop(ln *net.TCPListener, kind string) {
	defer s.wg.Done()
	for {
		c, err := ln.AcceptTCP()
		if err != nil {
			select {
			case <-s.done:
				return
			default:
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			select { // EMFILE and the like: let it pass
			case <-s.done:
				return
			case <-time.After(50 * time.Millisecond):
			}
			continue
		}
		st := &NetStream{Conn: c, Header: NetStreamHeader{Kind: kind, Src: c.RemoteAddr().String(), FD: true}}
		if kind == "transparent" {
			st.Header.Dst = c.LocalAddr().String()
		}
		if start := s.start.Load(); start != nil {
			if run := (*start)(st); run != nil {
				go run()
			}
			continue
		}
		select {
		case s.ready <- st:
		case <-s.done:
			_ = c.Close()
			return
		}
	}
}

// track adds (or, with add false, removes) a parked connection closed by end; false: ended.
func (s *NetSession) track(c net.Conn, add bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conns == nil {
		return false
	}
	if add {
		s.conns[c] = struct{}{}
	} else {
		delete(s.conns, c)
	}
	return true
}

// control reads the agent's demand bytes until the control connection ends, which ends the
// session.
func (s *NetSession) control(r io.Reader) {
	defer s.wg.Done()
	defer s.end()
	buf := make([]byte, 64)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			s.mu.Lock()
			s.want = min(s.want+n, maxLiveConnsHost)
			s.mu.Unlock()
			s.spawn(false)
		}
		if err != nil {
			return
		}
	}
}

// maxLiveConnsHost bounds the demand the host remembers (the agent relays at most 4,096).
const maxLiveConnsHost = 4096

// spawn starts parkers: up to netParkedIdle, and one per unanswered demand up to netParkedMax.
// after is set when a parker just ended (its connection handed over or lost).
func (s *NetSession) spawn(after bool) {
	s.mu.Lock()
	if after {
		s.parkers--
	}
	n := 0
	for s.conns != nil && s.parkers < netParkedMax {
		if s.parkers < s.idle {
		} else if s.want > 0 {
			s.want--
		} else {
			break
		}
		s.parkers++
		n++
	}
	s.wg.Add(n)
	s.mu.Unlock()
	for range n {
		go func() {
			if run := s.park(); run != nil {
				run()
			}
		}()
	}
}

// park dials one connection, parks it at the agent and hands the stream it carries to
// Accept; a connection the agent closes before a header, or one it never accepted, is
// replaced only after a pause (an agent that keeps closing them cannot make the host spin).
// With a Handle, it returns what serves the stream, run once park is no longer counted.
func (s *NetSession) park() (run func()) {
	defer s.wg.Done()
	pause := false
	defer func() {
		if pause {
			select {
			case <-s.done:
			case <-time.After(100 * time.Millisecond):
			}
		}
		s.spawn(true)
	}()
	ctx, cancel := context.WithTimeout(s.ctx, 10*time.Second)
	conn, br, lr, stopUp, err := s.c.upgradeBuf(ctx, "/net/accept", NetConnProtocol, NetAcceptRequest{Token: s.Reply.Token}, netCodes, 1<<10, netConn101)
	if err != nil {
		cancel()
		pause = true
		return nil
	}
	ok := stopUp()
	cancel()
	if !ok || !s.track(conn, true) {
		_ = conn.Close()
		return nil
	}
	lr.unlimit()
	st, err := readStreamFrame(conn, br, s.passFDs)
	s.track(conn, false)
	if err != nil {
		if !errors.Is(err, errNoFrame) {
			s.bad.Add(1)
		} else {
			pause = true
		}
		_ = conn.Close()
		return nil
	}
	if st.ln != nil {
		if !s.takeListener(st.ln, st.Header) {
			s.bad.Add(1)
			_ = st.ln.Close()
			return nil
		}
		s.wg.Add(1)
		go s.acceptLoop(st.ln, st.Header.Kind)
		return nil
	}
	if start := s.start.Load(); start != nil {
		return (*start)(st)
	}
	select {
	case s.ready <- st:
	case <-s.done:
		_ = conn.Close()
	}
	return nil
}

var errNoFrame = errors.New("closed before a stream header")

// readStreamFrame reads a stream's header frame: its 2-byte length (waiting as long as the
// connection stays parked), then the header, within netHeaderWait. What br holds past the
// frame (bytes the agent sent with it) is read first by the stream. With wantFD (a session
// opened with PassFDs), the first byte is read with its ancillary data: a socket the agent
// handed over with a header saying "fd" is checked (takeSocket) and becomes the stream's
// connection, and the parked connection is closed. Any descriptor the frame did not announce,
// or more than one, is closed at once and the stream refused.
func readStreamFrame(conn net.Conn, br *bufio.Reader, wantFD bool) (_ *NetStream, err error) {
	// Read from the connection itself while br holds nothing, so nothing past the frame is read.
	r := func() io.Reader {
		if br.Buffered() > 0 {
			return br
		}
		return conn
	}
	var fds []int
	defer func() {
		for _, fd := range fds {
			closeFD(fd)
		}
	}()
	var l [2]byte
	if uc, ok := conn.(*net.UnixConn); ok && wantFD && br.Buffered() == 0 {
		got, err := readFirstWithRights(uc, l[:1])
		fds = got
		if err != nil {
			return nil, err
		}
	} else if _, err := io.ReadFull(r(), l[:1]); err != nil {
		return nil, errNoFrame
	}
	_ = conn.SetReadDeadline(time.Now().Add(netHeaderWait))
	if _, err := io.ReadFull(r(), l[1:]); err != nil {
		return nil, err
	}
	n := int(binary.BigEndian.Uint16(l[:]))
	if n > MaxNetHeader {
		return nil, errLineTooLong
	}
	line := make([]byte, n)
	if _, err := io.ReadFull(r(), line); err != nil {
		return nil, err
	}
	var h NetStreamHeader
	if err := json.Unmarshal(line, &h); err != nil {
		return nil, err
	}
	if err := validStreamHeader(&h); err != nil {
		return nil, err
	}
	switch {
	case h.FD && !wantFD:
		return nil, errors.New("a handed-over socket in a session that did not ask for them")
	case h.Listener && !h.FD:
		return nil, errors.New("a listener's header without its descriptor")
	case h.FD && len(fds) != 1:
		return nil, fmt.Errorf("a header saying fd came with %d descriptors", len(fds))
	case !h.FD && len(fds) > 0:
		return nil, fmt.Errorf("%d descriptors the header did not announce", len(fds))
	}
	if h.FD {
		if br.Buffered() > 0 {
			return nil, errors.New("bytes after a handed-over socket's header")
		}
		fd := fds[0]
		fds = nil
		if h.Listener {
			ln, err := takeListenerFD(fd, h)
			if err != nil {
				return nil, err
			}
			_ = conn.Close()
			return &NetStream{Header: h, ln: ln}, nil
		}
		tc, err := takeSocket(fd, h)
		if err != nil {
			return nil, err
		}
		_ = conn.Close()
		return &NetStream{Conn: tc, Header: h}, nil
	}
	_ = conn.SetReadDeadline(time.Time{})
	if br.Buffered() > 0 {
		return &NetStream{Conn: &bufConn{Conn: conn, br: br}, Header: h}, nil
	}
	return &NetStream{Conn: conn, Header: h}, nil
}

func validStreamHeader(h *NetStreamHeader) error {
	if !slices.Contains(netKinds, h.Kind) {
		return fmt.Errorf("unknown stream kind %q", text.Clean(h.Kind, 32))
	}
	if h.Dst != "" {
		if _, err := netip.ParseAddrPort(h.Dst); err != nil {
			return fmt.Errorf("bad dst %q", text.Clean(h.Dst, 64))
		}
	} else if h.Kind == "transparent" {
		return errors.New("a transparent stream without dst")
	}
	if h.Src != "" {
		if _, err := netip.ParseAddrPort(h.Src); err != nil {
			return fmt.Errorf("bad src %q", text.Clean(h.Src, 64))
		}
	}
	return nil
}

// NetSession opens the sandbox's egress session: the agent binds (on the first session) or
// checks (on a later one, which replaces the current one) the listeners req asks for. ctx
// bounds the dial and the upgrade only; the session lasts until Close or until the control
// connection breaks.
func (c *Client) NetSession(ctx context.Context, req NetSessionRequest) (*NetSession, error) {
	req.ListenersInReply = req.PassListeners && req.PassFDs && !c.parkedListeners
	if err := req.Validate(); err != nil {
		return nil, err
	}
	var exact []byte
	if req.ListenersInReply {
		exact = netSession101
	}
	conn, br, lr, stop, err := c.upgradeBuf(ctx, "/net/session", NetProtocol, req, netCodes, MaxNetHeader+1, exact)
	if err != nil {
		return nil, err
	}
	var fds []int
	defer func() {
		for _, fd := range fds {
			closeFD(fd)
		}
	}()
	fail := func(err error) (*NetSession, error) {
		stop()
		_ = conn.Close()
		return nil, ctxErr(ctx, err)
	}
	var line []byte
	uc, isUnix := conn.(*net.UnixConn)
	if req.ListenersInReply && isUnix && br.Buffered() == 0 {
		// Exactly the 101 was read: the reply line comes with the listeners' descriptors.
		var rest []byte
		line, rest, fds, err = readReplyWithRights(uc, MaxNetHeader)
		if err == nil && len(rest) > 0 { // demand bytes sent after the reply: the control's
			br = bufio.NewReaderSize(io.MultiReader(bytes.NewReader(rest), lr), MaxNetHeader+1)
		}
	} else {
		line, err = readLineMax(br, MaxNetHeader)
	}
	switch {
	case errors.Is(err, errLineTooLong):
		return fail(agent.Oversized("the net session (its reply line)", MaxNetHeader))
	case err != nil:
		return fail(errcode.Wrap(errcode.SandboxNotRunning, err, "the sandbox's agent broke off its reply to the net session (the sandbox may have stopped)"))
	}
	var reply NetSessionReply
	if err := json.Unmarshal(line, &reply); err != nil {
		return fail(agent.Malformed("the net session", err))
	}
	if err := validNetReply(&reply, req); err != nil {
		return fail(agent.Malformed("the net session", err))
	}
	if !stop() {
		_ = conn.Close()
		return nil, ctx.Err()
	}
	lr.unlimit()
	s := &NetSession{Reply: reply, passFDs: req.PassFDs, passListeners: req.PassFDs && req.PassListeners, c: c, ctl: conn,
		ready: make(chan *NetStream), done: make(chan struct{}), conns: map[net.Conn]struct{}{}, lns: map[string]net.Listener{},
		idle: netParkedIdle}
	s.ctx, s.stop = context.WithCancel(context.Background())
	if len(reply.Listeners) > 0 || len(fds) > 0 {
		if s.takeReplyListeners(fds) {
			s.idle = netParkedIdleHeld
		}
		fds = nil
	}
	s.wg.Add(1)
	go s.control(&bufConn{Conn: conn, br: br})
	s.spawn(false)
	return s, nil
}

// takeReplyListeners takes the listeners handed over with the reply (Reply.Listeners, one
// descriptor each, in order), each checked as one handed over a parked connection is, and
// accepts on them; it closes every descriptor. A reply whose descriptors do not match its
// list is refused whole (counted in BadStreams; the agent's listeners are then not accepted
// on until the session ends). It reports whether every listener was taken.
func (s *NetSession) takeReplyListeners(fds []int) bool {
	hs := s.Reply.Listeners
	if len(fds) != len(hs) || !s.passListeners {
		for _, fd := range fds {
			closeFD(fd)
		}
		s.bad.Add(1)
		return false
	}
	all := true
	for i, h := range hs {
		if err := validStreamHeader(&h); err != nil || !h.FD || !h.Listener {
			closeFD(fds[i])
			s.bad.Add(1)
			all = false
			continue
		}
		ln, err := takeListenerFD(fds[i], h)
		if err != nil {
			s.bad.Add(1)
			all = false
			continue
		}
		if !s.takeListener(ln, h) {
			_ = ln.Close()
			s.bad.Add(1)
			all = false
			continue
		}
		s.wg.Add(1)
		go s.acceptLoop(ln, h.Kind)
	}
	return all
}

// validNetReply checks the addresses of a session's reply against what was asked.
func validNetReply(r *NetSessionReply, req NetSessionRequest) error {
	if _, err := netip.ParseAddrPort(r.ProxyAddr); err != nil {
		return fmt.Errorf("bad proxy_addr %q", text.Clean(r.ProxyAddr, 64))
	}
	if len(r.Token) != 32 || strings.Trim(r.Token, "0123456789abcdef") != "" {
		return fmt.Errorf("bad token %q (32 hex digits)", text.Clean(r.Token, 64))
	}
	if (r.DNSAddr == "") != (req.DNSPort == -1) {
		return fmt.Errorf("dns_addr %q for dns_port %d", text.Clean(r.DNSAddr, 64), req.DNSPort)
	}
	if r.DNSAddr != "" {
		if _, err := netip.ParseAddrPort(r.DNSAddr); err != nil {
			return fmt.Errorf("bad dns_addr %q", text.Clean(r.DNSAddr, 64))
		}
	}
	if len(r.Transparent) != len(req.TransparentPorts) {
		return fmt.Errorf("%d transparent listeners for %d ports", len(r.Transparent), len(req.TransparentPorts))
	}
	for _, a := range r.Transparent {
		if _, err := netip.ParseAddrPort(a); err != nil {
			return fmt.Errorf("bad transparent address %q", text.Clean(a, 64))
		}
	}
	if len(r.Listeners) > 0 && !req.ListenersInReply {
		return fmt.Errorf("%d listeners in a reply to a session that did not ask for them", len(r.Listeners))
	}
	if len(r.Listeners) > MaxTransparentPorts+2 {
		return fmt.Errorf("%d listeners in the reply; at most %d", len(r.Listeners), MaxTransparentPorts+2)
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
	return c.upgradeBuf(ctx, path, proto, body, codes, 32<<10, nil)
}

// netConn101 is the agent's whole answer to a good POST /v1/net/accept.
var netConn101 = []byte("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: " + NetConnProtocol + "\r\n\r\n")

// netSession101 is the agent's 101 to a POST /v1/net/session asking ListenersInReply.
var netSession101 = []byte("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: " + NetProtocol + "\r\n\r\n")

// upgradeBuf is upgrade with a reader of bufSize bytes. With exact101 (netConn101 or
// netSession101), the reply is first read as exactly its bytes: when they are those, nothing
// past them was read (br holds nothing); otherwise they are parsed as any reply.
func (c *Client) upgradeBuf(ctx context.Context, path, proto string, body any, codes []errcode.Code, bufSize int, exact101 []byte) (net.Conn, *bufio.Reader, *limitedConnReader, func() bool, error) {
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
	var br *bufio.Reader
	if exact101 != nil {
		got := make([]byte, len(exact101))
		n, _ := io.ReadFull(lr, got)
		if n == len(got) && bytes.Equal(got, exact101) {
			return conn, bufio.NewReaderSize(lr, bufSize), lr, stop, nil
		}
		br = bufio.NewReaderSize(io.MultiReader(bytes.NewReader(got[:n]), lr), bufSize)
	} else {
		br = bufio.NewReaderSize(lr, bufSize)
	}
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		if lr.left <= 0 {
			return fail(agent.Oversized(path+" (its header)", maxHeaderBytes))
		}
		return fail(errcode.Wrap(errcode.SandboxNotRunning, err, "the sandbox's agent broke off its reply to %s (the sandbox may have stopped)", path))
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		defer resp.Body.Close()
		if resp.StatusCode >= 300 {
			return fail(agent.ReadError(resp, path, codes...))
		}
		return fail(errcode.New(errcode.Internal, "the sandbox's agent answered HTTP %d to %s instead of switching protocols", resp.StatusCode, path).With("origin", agent.Origin))
	}
	if !strings.EqualFold(resp.Header.Get("Upgrade"), proto) {
		return fail(agent.Malformed(path, fmt.Errorf("upgraded to %q, not %q", text.Clean(resp.Header.Get("Upgrade"), 64), proto)))
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

// WriteTo writes what br holds, then copies the connection itself (so a TCP destination
// splices from it).
func (c *bufConn) WriteTo(w io.Writer) (int64, error) {
	var n int64
	if c.br != nil {
		if b := c.br.Buffered(); b > 0 {
			p, _ := c.br.Peek(b)
			m, err := w.Write(p)
			_, _ = c.br.Discard(m)
			n += int64(m)
			if err != nil {
				return n, err
			}
		}
	}
	m, err := io.Copy(w, c.Conn)
	return n + m, err
}
