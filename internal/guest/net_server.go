//go:build unix

package guest

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/agentbox/agentbox/internal/errcode"
)

// Bounds of the agent's side of the net protocol.
const (
	// maxPendingConns is how many accepted connections wait for a session at once; more are
	// closed at once.
	maxPendingConns = 256
	// pendingWait is how long an accepted connection waits for a session.
	pendingWait = 10 * time.Second
	// maxLiveConns bounds the connections relayed (or waiting) at once.
	maxLiveConns = 4096
	// maxDNSQuery is the largest UDP query relayed; larger ones are dropped.
	maxDNSQuery = 4096
	// maxDNSInFlight bounds the UDP queries relayed at once; more are dropped.
	maxDNSInFlight = 64
	// dnsWait bounds one UDP query's round trip.
	dnsWait = 5 * time.Second
	// dialPortWait bounds POST /v1/tcp's connect inside the sandbox.
	dialPortWait = 5 * time.Second
)

// netAgent holds the agent's egress listeners (bound by the first session, kept for the
// agent's life) and the current session.
type netAgent struct {
	log *slog.Logger

	mu sync.Mutex
	// first and resolved are the first session's configuration as asked and as bound (ports
	// picked); a later session must carry one of them.
	first, resolved *NetSessionRequest
	reply           NetSessionReply
	lns             []net.Listener
	udp             *net.UDPConn
	cur             *yamux.Session
	// changed is closed (and replaced) whenever cur changes.
	changed chan struct{}
	closed  bool
	quit    chan struct{}
	wg      sync.WaitGroup

	pending  atomic.Int64
	live     atomic.Int64
	dnsSem   chan struct{}
	fullLog  rateLimit
	acceptLg rateLimit
	yamuxLog io.Writer
}

func newNetAgent(log *slog.Logger) *netAgent {
	a := &netAgent{log: log, changed: make(chan struct{}), quit: make(chan struct{}), dnsSem: make(chan struct{}, maxDNSInFlight)}
	a.yamuxLog = &slogWriter{log: log, msg: "guest: net session"}
	return a
}

// rateLimit lets something happen at most once a second.
type rateLimit struct{ last atomic.Int64 }

func (r *rateLimit) allow() bool {
	now := time.Now().UnixNano()
	last := r.last.Load()
	return now-last >= int64(time.Second) && r.last.CompareAndSwap(last, now)
}

// slogWriter logs yamux's lines at debug level, at most one a second.
type slogWriter struct {
	log *slog.Logger
	msg string
	rl  rateLimit
}

func (w *slogWriter) Write(p []byte) (int, error) {
	if w.rl.allow() {
		w.log.Debug(w.msg, "yamux", strings.TrimSpace(cutTo(string(p), 512)))
	}
	return len(p), nil
}

// goTracked runs f in a goroutine that close waits for; false: the agent is closing.
func (a *netAgent) goTracked(f func()) bool {
	if !a.enter() {
		return false
	}
	go func() {
		defer a.wg.Done()
		f()
	}()
	return true
}

// enter counts a goroutine close waits for (the caller calls a.wg.Done); false: closing.
func (a *netAgent) enter() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return false
	}
	a.wg.Add(1)
	return true
}

// close closes the listeners and the session and waits for every relay.
func (a *netAgent) close() {
	a.mu.Lock()
	if !a.closed {
		a.closed = true
		close(a.quit)
		for _, ln := range a.lns {
			_ = ln.Close()
		}
		if a.udp != nil {
			_ = a.udp.Close()
		}
		if a.cur != nil {
			_ = a.cur.Close()
		}
	}
	a.mu.Unlock()
	a.wg.Wait()
}

// bind binds the listeners req asks for (the first session) or checks that req is the
// configuration they were bound with.
func (a *netAgent) bind(req NetSessionRequest) (NetSessionReply, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return NetSessionReply{}, errcode.New(errcode.Internal, "the agent is shutting down")
	}
	if a.first != nil {
		if !sameNetConfig(*a.first, req) && !sameNetConfig(*a.resolved, req) {
			return NetSessionReply{}, errcode.New(errcode.Conflict,
				"the sandbox's listeners were bound with another configuration (proxy_port %d, dns_port %d, transparent_ports %v); a later session must carry the same",
				a.first.ProxyPort, a.first.DNSPort, a.first.TransparentPorts)
		}
		return a.reply, nil
	}
	var lns []net.Listener
	var udp *net.UDPConn
	ok := false
	defer func() {
		if !ok {
			for _, ln := range lns {
				_ = ln.Close()
			}
			if udp != nil {
				_ = udp.Close()
			}
		}
	}()
	resolved := NetSessionRequest{DNSPort: -1}
	proxy, err := net.Listen("tcp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(req.ProxyPort)))
	if err != nil {
		return NetSessionReply{}, bindError(err, "the HTTP proxy (TCP 127.0.0.1)", req.ProxyPort)
	}
	lns = append(lns, proxy)
	reply := NetSessionReply{ProxyAddr: proxy.Addr().String()}
	resolved.ProxyPort = proxy.Addr().(*net.TCPAddr).Port
	var dnsTCP net.Listener
	if req.DNSPort != -1 {
		udp, dnsTCP, err = listenDNS(req.DNSPort)
		if err != nil {
			return NetSessionReply{}, err
		}
		lns = append(lns, dnsTCP)
		reply.DNSAddr = udp.LocalAddr().String()
		resolved.DNSPort = udp.LocalAddr().(*net.UDPAddr).Port
	}
	var transparent []net.Listener
	for _, p := range req.TransparentPorts {
		ln, err := net.Listen("tcp4", net.JoinHostPort("0.0.0.0", strconv.Itoa(p)))
		if err != nil {
			return NetSessionReply{}, bindError(err, "a transparent listener (TCP 0.0.0.0)", p)
		}
		lns = append(lns, ln)
		transparent = append(transparent, ln)
		reply.Transparent = append(reply.Transparent, ln.Addr().String())
		resolved.TransparentPorts = append(resolved.TransparentPorts, ln.Addr().(*net.TCPAddr).Port)
	}
	ok = true
	first := req
	first.TransparentPorts = slices.Clone(req.TransparentPorts)
	a.first, a.resolved, a.reply, a.lns, a.udp = &first, &resolved, reply, lns, udp
	a.startLoop(func() { a.acceptLoop(proxy, "proxy") })
	if udp != nil {
		a.startLoop(func() { a.acceptLoop(dnsTCP, "dns") })
		a.startLoop(func() { a.dnsLoop(udp) })
	}
	for _, ln := range transparent {
		a.startLoop(func() { a.acceptLoop(ln, "transparent") })
	}
	a.log.Info("guest: egress listeners bound", "proxy", reply.ProxyAddr, "dns", reply.DNSAddr, "transparent", reply.Transparent)
	return reply, nil
}

// startLoop starts a tracked goroutine; the caller holds a.mu and a is not closed.
func (a *netAgent) startLoop(f func()) {
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		f()
	}()
}

func sameNetConfig(a, b NetSessionRequest) bool {
	return a.ProxyPort == b.ProxyPort && a.DNSPort == b.DNSPort && slices.Equal(a.TransparentPorts, b.TransparentPorts)
}

// listenDNS binds UDP and TCP on 127.0.0.1:port (port 0: the same free port for both).
func listenDNS(port int) (*net.UDPConn, net.Listener, error) {
	for try := 0; ; try++ {
		udp, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port})
		if err != nil {
			return nil, nil, bindError(err, "the resolver (UDP 127.0.0.1)", port)
		}
		p := udp.LocalAddr().(*net.UDPAddr).Port
		tcp, err := net.Listen("tcp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err == nil {
			return udp, tcp, nil
		}
		_ = udp.Close()
		if port != 0 || try == 4 || !errors.Is(err, syscall.EADDRINUSE) {
			return nil, nil, bindError(err, "the resolver (TCP 127.0.0.1)", p)
		}
	}
}

// bindError: a port in use is CONFLICT, anything else (no permission) INTERNAL; both name
// the port.
func bindError(err error, what string, port int) error {
	switch {
	case errors.Is(err, syscall.EADDRINUSE):
		return errcode.Wrap(errcode.Conflict, err, "cannot bind %s port %d in the sandbox: the port is in use", what, port).With("port", port)
	case errors.Is(err, syscall.EACCES) || errors.Is(err, syscall.EPERM):
		return errcode.Wrap(errcode.Internal, err, "cannot bind %s port %d in the sandbox: permission denied (a port below 1024 needs net.ipv4.ip_unprivileged_port_start=0 in the sandbox's network namespace, or CAP_NET_BIND_SERVICE)", what, port).With("port", port)
	}
	return errcode.Wrap(errcode.Internal, err, "cannot bind %s port %d in the sandbox: %v", what, port, err).With("port", port)
}

// setSession makes sess the current session; the previous one is closed.
func (a *netAgent) setSession(sess *yamux.Session) bool {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return false
	}
	old := a.cur
	a.cur = sess
	close(a.changed)
	a.changed = make(chan struct{})
	a.mu.Unlock()
	if old != nil {
		_ = old.Close()
		a.log.Info("guest: a new net session replaced the previous one")
	}
	return true
}

// clearSession forgets sess if it is still the current session.
func (a *netAgent) clearSession(sess *yamux.Session) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.cur == sess {
		a.cur = nil
		close(a.changed)
		a.changed = make(chan struct{})
	}
}

var (
	errNoSession   = errors.New("no net session")
	errTooMany     = errors.New("too many connections wait for a net session")
	errAgentClosed = errors.New("the agent is closing")
)

// open opens a stream on the current session, waiting for one until deadline; pending counts
// the wait against maxPendingConns.
func (a *netAgent) open(deadline time.Time, pending bool) (*yamux.Stream, error) {
	counted := false
	defer func() {
		if counted {
			a.pending.Add(-1)
		}
	}()
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		a.mu.Lock()
		sess, changed := a.cur, a.changed
		a.mu.Unlock()
		if sess != nil && !sess.IsClosed() {
			st, err := sess.OpenStream()
			if err == nil {
				return st, nil
			}
			if !sess.IsClosed() {
				return nil, err
			}
		}
		if pending && !counted {
			if a.pending.Add(1) > maxPendingConns {
				a.pending.Add(-1)
				return nil, errTooMany
			}
			counted = true
		}
		if timer == nil {
			timer = time.NewTimer(time.Until(deadline))
		}
		select {
		case <-changed:
		case <-timer.C:
			return nil, errNoSession
		case <-a.quit:
			return nil, errAgentClosed
		}
	}
}

// acceptLoop relays every connection ln accepts as a stream of kind.
func (a *netAgent) acceptLoop(ln net.Listener, kind string) {
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			if a.acceptLg.allow() {
				a.log.Warn("guest: accepting a connection failed", "listener", ln.Addr().String(), "err", err)
			}
			select {
			case <-a.quit:
				return
			case <-time.After(50 * time.Millisecond): // EMFILE and the like: let it pass
			}
			continue
		}
		if a.live.Add(1) > maxLiveConns {
			a.live.Add(-1)
			_ = c.Close()
			if a.fullLog.allow() {
				a.log.Warn("guest: too many egress connections at once; closing new ones", "limit", maxLiveConns, "listener", ln.Addr().String())
			}
			continue
		}
		if !a.goTracked(func() {
			defer a.live.Add(-1)
			a.relay(c, kind)
		}) {
			a.live.Add(-1)
			_ = c.Close()
			return
		}
	}
}

// relay opens a stream for c (waiting for a session if none is up) and splices them.
func (a *netAgent) relay(c net.Conn, kind string) {
	st, err := a.open(time.Now().Add(pendingWait), true)
	if err != nil {
		_ = c.Close()
		return
	}
	h := NetStreamHeader{Kind: kind, Src: c.RemoteAddr().String()}
	if kind == "transparent" {
		h.Dst = c.LocalAddr().String()
	}
	line, _ := json.Marshal(h)
	_ = st.SetWriteDeadline(time.Now().Add(pendingWait))
	if _, err := st.Write(append(line, '\n')); err != nil {
		abortConn(st)
		_ = c.Close()
		return
	}
	_ = st.SetWriteDeadline(time.Time{})
	splice(c, nil, st)
}

// dnsLoop relays each UDP query as a stream of kind dns.
func (a *netAgent) dnsLoop(udp *net.UDPConn) {
	buf := make([]byte, maxDNSQuery+1)
	for {
		n, from, err := udp.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			select {
			case <-a.quit:
				return
			case <-time.After(10 * time.Millisecond):
			}
			continue
		}
		if n > maxDNSQuery || n < 12 { // larger than the bound, or shorter than a DNS header
			continue
		}
		select {
		case a.dnsSem <- struct{}{}:
		default:
			continue // too many in flight: dropped, the client retries
		}
		q := slices.Clone(buf[:n])
		if !a.goTracked(func() {
			defer func() { <-a.dnsSem }()
			reply, err := a.dnsQuery(q)
			if err == nil && len(reply) > 0 {
				_, _ = udp.WriteToUDPAddrPort(reply, from)
			}
		}) {
			<-a.dnsSem
			return
		}
	}
}

// dnsQuery sends one query over a stream (length-prefixed, as DNS over TCP) and reads the
// reply within dnsWait.
func (a *netAgent) dnsQuery(q []byte) ([]byte, error) {
	deadline := time.Now().Add(dnsWait)
	st, err := a.open(deadline, false)
	if err != nil {
		return nil, err
	}
	defer abortConn(st)
	_ = st.SetDeadline(deadline)
	line, _ := json.Marshal(NetStreamHeader{Kind: "dns"})
	msg := make([]byte, 0, len(line)+1+2+len(q))
	msg = append(append(line, '\n'), byte(len(q)>>8), byte(len(q)))
	msg = append(msg, q...)
	if _, err := st.Write(msg); err != nil {
		return nil, err
	}
	var l [2]byte
	if _, err := io.ReadFull(st, l[:]); err != nil {
		return nil, err
	}
	reply := make([]byte, binary.BigEndian.Uint16(l[:]))
	if _, err := io.ReadFull(st, reply); err != nil {
		return nil, err
	}
	return reply, nil
}

// switchProtocols answers 101 with "Upgrade: proto" and takes the connection over.
func (s *server) switchProtocols(w http.ResponseWriter, proto string) (net.Conn, *bufio.Reader, bool) {
	rc := http.NewResponseController(w)
	w.Header().Set("Connection", "Upgrade")
	w.Header().Set("Upgrade", proto)
	w.WriteHeader(http.StatusSwitchingProtocols)
	if err := rc.Flush(); err != nil {
		return nil, nil, false
	}
	conn, brw, err := rc.Hijack()
	if err != nil {
		s.log.Warn("guest: cannot take over the connection", "proto", proto, "err", err)
		return nil, nil, false
	}
	_ = conn.SetDeadline(time.Time{})
	return conn, brw.Reader, true
}

// handleNetSession binds (or checks) the egress listeners, switches the connection to yamux
// (the agent is the client: it opens the streams) and serves the session until it ends or
// another replaces it.
func (s *server) handleNetSession(w http.ResponseWriter, r *http.Request) {
	if !strings.EqualFold(r.Header.Get("Upgrade"), NetProtocol) {
		s.writeError(w, errcode.New(errcode.InvalidArgument, "POST /v1/net/session needs \"Connection: Upgrade\" and \"Upgrade: %s\"", NetProtocol))
		return
	}
	var req NetSessionRequest
	if err := decodeJSON(w, r, MaxNetHeader, &req); err != nil {
		s.writeError(w, err)
		return
	}
	if err := req.Validate(); err != nil {
		s.writeError(w, err)
		return
	}
	if !s.net.enter() {
		s.writeError(w, errcode.New(errcode.Internal, "the agent is shutting down"))
		return
	}
	defer s.net.wg.Done()
	reply, err := s.net.bind(req)
	if err != nil {
		s.writeError(w, err)
		return
	}
	conn, br, ok := s.switchProtocols(w, NetProtocol)
	if !ok {
		return
	}
	line, _ := json.Marshal(reply)
	_ = conn.SetWriteDeadline(time.Now().Add(10 * time.Second))
	if _, err := conn.Write(append(line, '\n')); err != nil {
		_ = conn.Close()
		return
	}
	_ = conn.SetWriteDeadline(time.Time{})
	sess, err := yamux.Client(&yamuxConn{Conn: conn, r: &bufConn{Conn: conn, br: br}}, yamuxConfig(s.net.yamuxLog))
	if err != nil {
		s.log.Warn("guest: cannot start the net session", "err", err)
		_ = conn.Close()
		return
	}
	if !s.net.setSession(sess) {
		_ = sess.Close()
		return
	}
	// Not r.Context(): net/http may cancel it once the connection is taken over (a client's
	// half-close reads as the connection's end). The agent's end is a.quit.
	select {
	case <-sess.CloseChan():
	case <-s.net.quit:
	}
	_ = sess.Close()
	s.net.clearSession(sess)
}

// handleDialPort connects to a port on the sandbox's loopback and splices the upgraded
// connection to it: how preview URLs reach the sandbox's servers without any route.
func (s *server) handleDialPort(w http.ResponseWriter, r *http.Request) {
	if !strings.EqualFold(r.Header.Get("Upgrade"), TCPProtocol) {
		s.writeError(w, errcode.New(errcode.InvalidArgument, "POST /v1/tcp needs \"Connection: Upgrade\" and \"Upgrade: %s\"", TCPProtocol))
		return
	}
	var req DialPortRequest
	if err := decodeJSON(w, r, MaxNetHeader, &req); err != nil {
		s.writeError(w, err)
		return
	}
	if err := checkDialPort(req.Port); err != nil {
		s.writeError(w, err)
		return
	}
	if !s.net.enter() {
		s.writeError(w, errcode.New(errcode.Internal, "the agent is shutting down"))
		return
	}
	defer s.net.wg.Done()
	target, err := dialLoopback(r.Context(), req.Port)
	if err != nil {
		s.writeError(w, err)
		return
	}
	conn, br, ok := s.switchProtocols(w, TCPProtocol)
	if !ok {
		_ = target.Close()
		return
	}
	// The agent's end ends both (not r.Context(): see handleNetSession).
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		select {
		case <-s.net.quit:
			abortConn(conn)
			abortConn(target)
		case <-stop:
		}
	}()
	splice(conn, br, target)
}

// dialLoopback connects to 127.0.0.1:port, then [::1]:port, within dialPortWait.
func dialLoopback(ctx context.Context, port int) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, dialPortWait)
	defer cancel()
	var d net.Dialer
	ps := strconv.Itoa(port)
	c, err4 := d.DialContext(ctx, "tcp4", "127.0.0.1:"+ps)
	if err4 == nil {
		return c, nil
	}
	c, err6 := d.DialContext(ctx, "tcp6", "[::1]:"+ps)
	if err6 == nil {
		return c, nil
	}
	switch {
	case ctx.Err() != nil:
		return nil, errcode.New(errcode.Conflict, "port %d in the sandbox did not accept a connection within %s", port, dialPortWait).With("port", port)
	case errors.Is(err4, syscall.ECONNREFUSED):
		return nil, errcode.New(errcode.Conflict, "nothing listens on port %d in the sandbox", port).With("port", port)
	}
	return nil, errcode.Wrap(errcode.Internal, err4, "cannot connect to port %d in the sandbox: %v", port, err4).With("port", port)
}
