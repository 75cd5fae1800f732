//go:build unix

package guest

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

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
	// tcp are the TCP listeners with their stream kinds (what PassListeners hands over), and
	// heldBy the session each was handed to: while that session is current, the agent does
	// not accept on it.
	tcp    []kindListener
	heldBy map[net.Listener]*agentSession
	udp    *net.UDPConn
	cur    *agentSession
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
}

func newNetAgent(log *slog.Logger) *netAgent {
	return &netAgent{log: log, changed: make(chan struct{}), quit: make(chan struct{}), dnsSem: make(chan struct{}, maxDNSInFlight),
		heldBy: map[net.Listener]*agentSession{}}
}

// kindListener is a TCP listener and the kind of the streams it accepts.
type kindListener struct {
	ln   net.Listener
	kind string
}

// agentSession is a net session on the agent's side: its control connection, its token and
// the connections the host parked for it.
type agentSession struct {
	token  string
	ctl    net.Conn
	parked chan net.Conn // at most netParkedMax
	done   chan struct{}
	once   sync.Once
	ctlMu  sync.Mutex
	// lastWant is when a connection last found no parked connection (unix nanoseconds).
	lastWant atomic.Int64
	// passFDs: hand accepted sockets over (NetSessionRequest.PassFDs), until a send fails.
	passFDs atomic.Bool
}

func newAgentSession(ctl net.Conn) *agentSession {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return &agentSession{token: hex.EncodeToString(b[:]), ctl: ctl, parked: make(chan net.Conn, netParkedMax), done: make(chan struct{})}
}

// close ends the session: its control connection and its parked connections.
func (s *agentSession) close() {
	s.once.Do(func() {
		close(s.done)
		_ = s.ctl.Close()
		s.drain(0)
	})
}

func (s *agentSession) isDone() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// drain closes parked connections until at most keep are left.
func (s *agentSession) drain(keep int) {
	for len(s.parked) > keep {
		select {
		case c := <-s.parked:
			_ = c.Close()
		default:
			return
		}
	}
}

// park keeps c for a local connection; false: the session ended or holds netParkedMax.
func (s *agentSession) park(c net.Conn) bool {
	if s.isDone() {
		return false
	}
	select {
	case s.parked <- c:
	default:
		return false
	}
	if s.isDone() { // ended meanwhile: what close drained before c came is drained here
		s.drain(0)
	}
	return true
}

// want asks the host for one more parked connection (one byte on the control connection).
func (s *agentSession) want() {
	s.lastWant.Store(time.Now().UnixNano())
	s.ctlMu.Lock()
	defer s.ctlMu.Unlock()
	_ = s.ctl.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if _, err := s.ctl.Write([]byte{1}); err != nil {
		s.close()
	}
}

// trim closes the parked connections past netParkedIdle once none was asked for in
// netParkedTrim.
func (s *agentSession) trim() {
	if time.Since(time.Unix(0, s.lastWant.Load())) >= netParkedTrim {
		s.drain(netParkedIdle)
	}
}

// rateLimit lets something happen at most once a second.
type rateLimit struct{ last atomic.Int64 }

func (r *rateLimit) allow() bool {
	now := time.Now().UnixNano()
	last := r.last.Load()
	return now-last >= int64(time.Second) && r.last.CompareAndSwap(last, now)
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
			a.cur.close()
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
	a.tcp = []kindListener{{proxy, "proxy"}}
	if dnsTCP != nil {
		a.tcp = append(a.tcp, kindListener{dnsTCP, "dns"})
	}
	for _, ln := range transparent {
		a.tcp = append(a.tcp, kindListener{ln, "transparent"})
	}
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
func (a *netAgent) setSession(sess *agentSession) bool {
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
		old.close()
		a.log.Info("guest: a new net session replaced the previous one")
	}
	return true
}

// clearSession forgets sess if it is still the current session.
func (a *netAgent) clearSession(sess *agentSession) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.cur == sess {
		a.cur = nil
		close(a.changed)
		a.changed = make(chan struct{})
	}
}

// session is the current session if its token is token, else nil.
func (a *netAgent) session(token string) *agentSession {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.cur == nil || subtle.ConstantTimeCompare([]byte(a.cur.token), []byte(token)) != 1 {
		return nil
	}
	return a.cur
}

var (
	errNoSession   = errors.New("no net session")
	errTooMany     = errors.New("too many connections wait for a net session")
	errAgentClosed = errors.New("the agent is closing")
)

// take takes a parked connection of the current session, asking the host for one more when
// none is waiting, and waiting (for one, or for a session when none is up) until deadline;
// pending counts a wait with no session against maxPendingConns.
func (a *netAgent) take(deadline time.Time, pending bool) (net.Conn, *agentSession, error) {
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
		if sess != nil && !sess.isDone() {
			select {
			case c := <-sess.parked:
				return c, sess, nil
			default:
			}
			sess.want()
			if timer == nil {
				timer = time.NewTimer(time.Until(deadline))
			}
			select {
			case c := <-sess.parked:
				return c, sess, nil
			case <-sess.done:
				continue
			case <-timer.C:
				return nil, nil, errNoSession
			case <-a.quit:
				return nil, nil, errAgentClosed
			}
		}
		if pending && !counted {
			if a.pending.Add(1) > maxPendingConns {
				a.pending.Add(-1)
				return nil, nil, errTooMany
			}
			counted = true
		}
		if timer == nil {
			timer = time.NewTimer(time.Until(deadline))
		}
		select {
		case <-changed:
		case <-timer.C:
			return nil, nil, errNoSession
		case <-a.quit:
			return nil, nil, errAgentClosed
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
			if errors.Is(err, os.ErrDeadlineExceeded) { // handed to the host, or was
				if !a.waitHeld(ln) {
					return
				}
				continue
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

// waitHeld waits while the current session holds ln (the host accepts on it) and reports
// false when the agent closes; once no session holds it, ln accepts again.
func (a *netAgent) waitHeld(ln net.Listener) bool {
	for {
		a.mu.Lock()
		s := a.heldBy[ln]
		held := s != nil && s == a.cur && !s.isDone()
		if !held {
			delete(a.heldBy, ln)
			if dl, ok := ln.(interface{ SetDeadline(time.Time) error }); ok {
				_ = dl.SetDeadline(time.Time{})
			}
		}
		changed := a.changed
		a.mu.Unlock()
		if !held {
			return true
		}
		select {
		case <-changed:
		case <-s.done:
		case <-a.quit:
			return false
		}
	}
}

// handListeners hands sess's host each TCP listener (a session opened with PassListeners),
// each over a parked connection: a frame whose header says fd and listener, with the
// listener's descriptor (SCM_RIGHTS). A listener handed over is held by sess: the agent stops
// accepting on it (its Accept is woken by a past deadline) until sess is no longer current.
// One that cannot be handed over stays the agent's.
func (a *netAgent) handListeners(sess *agentSession) {
	a.mu.Lock()
	lns := slices.Clone(a.tcp)
	a.mu.Unlock()
	for _, kl := range lns {
		tl, ok := kl.ln.(*net.TCPListener)
		if !ok {
			continue
		}
		pc, cur, err := a.take(time.Now().Add(pendingWait), false)
		if err != nil {
			return
		}
		if cur != sess {
			if !cur.park(pc) {
				_ = pc.Close()
			}
			return
		}
		uc, ok := pc.(*net.UnixConn)
		raw, err := tl.SyscallConn()
		if !ok || err != nil {
			_ = pc.Close()
			return
		}
		frame := appendStreamHeader(nil, NetStreamHeader{Kind: kl.kind, Dst: kl.ln.Addr().String(), FD: true, Listener: true})
		_ = uc.SetWriteDeadline(time.Now().Add(pendingWait))
		var n int
		var sendErr error
		if err := raw.Control(func(fd uintptr) {
			n, _, sendErr = uc.WriteMsgUnix(frame, syscall.UnixRights(int(fd)), nil)
		}); err != nil {
			sendErr = err
		}
		_ = uc.Close()
		if sendErr != nil || n != len(frame) {
			if a.fullLog.allow() {
				a.log.Warn("guest: cannot hand a listener to the host; the agent keeps accepting on it", "listener", kl.ln.Addr().String(), "err", sendErr)
			}
			return
		}
		a.mu.Lock()
		if a.cur == sess && !sess.isDone() {
			a.heldBy[kl.ln] = sess
			_ = tl.SetDeadline(time.Now()) // wakes the agent's Accept
		}
		a.mu.Unlock()
	}
}

// listenerDups returns the TCP listeners (those a session may hold) with a duplicate of each
// one's descriptor (close-on-exec), which the caller sends and closes; a listener whose
// descriptor cannot be duplicated is left out (it stays the agent's).
func (a *netAgent) listenerDups() ([]kindListener, []int) {
	a.mu.Lock()
	lns := slices.Clone(a.tcp)
	a.mu.Unlock()
	var out []kindListener
	var fds []int
	for _, kl := range lns {
		tl, ok := kl.ln.(*net.TCPListener)
		if !ok {
			continue
		}
		raw, err := tl.SyscallConn()
		if err != nil {
			continue
		}
		var fd int
		var derr error
		if err := raw.Control(func(f uintptr) { fd, derr = dupCloexec(int(f)) }); err != nil || derr != nil {
			continue
		}
		out = append(out, kl)
		fds = append(fds, fd)
	}
	return out, fds
}

// hold marks lns, handed to sess, as held by it: the agent stops accepting on them (each
// Accept is woken by a past deadline) while sess is current.
func (a *netAgent) hold(sess *agentSession, lns []kindListener) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.cur != sess || sess.isDone() {
		return
	}
	for _, kl := range lns {
		a.heldBy[kl.ln] = sess
		_ = kl.ln.(*net.TCPListener).SetDeadline(time.Now())
	}
}

// relay hands c to a parked connection (waiting for one, or for a session if none is up):
// the header frame, then the bytes both ways. A parked connection that fails the header's
// write (the host dropped it) is replaced by the next, until the wait's deadline.
func (a *netAgent) relay(c net.Conn, kind string) {
	h := NetStreamHeader{Kind: kind, Src: c.RemoteAddr().String()}
	if kind == "transparent" {
		h.Dst = c.LocalAddr().String()
	}
	frame := appendStreamHeader(nil, h)
	deadline := time.Now().Add(pendingWait)
	for {
		pc, sess, err := a.take(deadline, true)
		if err != nil {
			_ = c.Close()
			return
		}
		if sess != nil && sess.passFDs.Load() {
			switch a.handOver(c, h, pc) {
			case handedOver:
				_ = c.Close()
				return
			case handFailed: // pc may hold half a frame: the next one relays
				sess.passFDs.Store(false)
				continue
			}
		}
		_ = pc.SetWriteDeadline(time.Now().Add(pendingWait))
		if _, err := pc.Write(frame); err != nil {
			_ = pc.Close()
			continue
		}
		_ = pc.SetWriteDeadline(time.Time{})
		splice(c, nil, pc)
		return
	}
}

type handResult int

const (
	handedOver handResult = iota
	handFailed            // the send failed: pc is closed and hands over nothing more
	handNotTCP            // c is not a TCP socket over a unix connection: relay it
)

// handOver sends c's socket to the host over pc with h (FD set) in one sendmsg (SCM_RIGHTS),
// then closes pc: the host serves the socket itself and the agent relays nothing. The caller
// closes its own copy of c.
func (a *netAgent) handOver(c net.Conn, h NetStreamHeader, pc net.Conn) handResult {
	tc, ok1 := c.(*net.TCPConn)
	uc, ok2 := pc.(*net.UnixConn)
	if !ok1 || !ok2 {
		return handNotTCP
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return handNotTCP
	}
	plain := false
	_ = raw.Control(func(fd uintptr) { plain = isPlainTCP(int(fd)) })
	if !plain { // MPTCP (a client that asked for it), or off Linux: the host takes plain TCP only
		return handNotTCP
	}
	h.FD = true
	frame := appendStreamHeader(nil, h)
	_ = uc.SetWriteDeadline(time.Now().Add(pendingWait))
	var n int
	var sendErr error
	if err := raw.Control(func(fd uintptr) {
		n, _, sendErr = uc.WriteMsgUnix(frame, syscall.UnixRights(int(fd)), nil)
	}); err != nil {
		sendErr = err
	}
	_ = uc.Close()
	if sendErr != nil || n != len(frame) {
		if a.fullLog.allow() {
			a.log.Warn("guest: cannot hand a connection's socket to the host; relaying its bytes instead", "err", sendErr)
		}
		return handFailed
	}
	return handedOver
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
	msg := appendStreamHeader(make([]byte, 0, 64+len(q)), NetStreamHeader{Kind: "dns"})
	msg = append(binary.BigEndian.AppendUint16(msg, uint16(len(q))), q...)
	var st net.Conn
	for {
		c, _, err := a.take(deadline, false)
		if err != nil {
			return nil, err
		}
		_ = c.SetDeadline(deadline)
		if _, err := c.Write(msg); err != nil {
			_ = c.Close()
			continue
		}
		st = c
		break
	}
	defer st.Close()
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

// handleNetSession binds (or checks) the egress listeners, answers with the session's token
// and keeps the connection as the session's control channel until it ends or another session
// replaces it.
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
	passListeners := req.PassFDs && req.PassListeners
	var conn net.Conn
	var br *bufio.Reader
	if passListeners && req.ListenersInReply {
		// The 101 by hand, always the same bytes, so that the host reads exactly it and then
		// the reply line with its descriptors (a plain read past it would drop them).
		var brw *bufio.ReadWriter
		if conn, brw, err = http.NewResponseController(w).Hijack(); err != nil {
			s.log.Warn("guest: cannot take over the connection", "proto", NetProtocol, "err", err)
			return
		}
		_ = conn.SetDeadline(time.Time{})
		_ = conn.SetWriteDeadline(time.Now().Add(10 * time.Second))
		if _, err := conn.Write(netSession101); err != nil {
			_ = conn.Close()
			return
		}
		br = brw.Reader
	} else {
		var ok bool
		if conn, br, ok = s.switchProtocols(w, NetProtocol); !ok {
			return
		}
	}
	sess := newAgentSession(conn)
	sess.passFDs.Store(req.PassFDs)
	reply.Token = sess.token
	// No demand byte (want) goes on the control connection before the reply line: the host
	// reads the line first.
	sess.ctlMu.Lock()
	// The session is current before the host learns its token: a POST /v1/net/accept that
	// follows the reply at once must find it.
	if !s.net.setSession(sess) {
		sess.ctlMu.Unlock()
		sess.close()
		return
	}
	var handed []kindListener
	var fds []int
	if _, ok := conn.(*net.UnixConn); ok && passListeners && req.ListenersInReply {
		handed, fds = s.net.listenerDups()
		for _, kl := range handed {
			reply.Listeners = append(reply.Listeners, NetStreamHeader{Kind: kl.kind, Dst: kl.ln.Addr().String(), FD: true, Listener: true})
		}
	}
	line, _ := json.Marshal(reply)
	line = append(line, '\n')
	_ = conn.SetWriteDeadline(time.Now().Add(10 * time.Second))
	if len(fds) > 0 {
		var n int
		n, _, err = conn.(*net.UnixConn).WriteMsgUnix(line, syscall.UnixRights(fds...), nil)
		if err == nil && n != len(line) {
			err = io.ErrShortWrite
		}
		for _, fd := range fds {
			closeFD(fd)
		}
	} else {
		_, err = conn.Write(line)
	}
	_ = conn.SetWriteDeadline(time.Time{})
	sess.ctlMu.Unlock()
	if err != nil {
		sess.close()
		s.net.clearSession(sess)
		return
	}
	switch {
	case len(handed) > 0:
		s.net.hold(sess, handed)
	case passListeners:
		s.net.goTracked(func() { s.net.handListeners(sess) })
	}
	// Not r.Context(): net/http may cancel it once the connection is taken over. The session
	// ends when the host closes the connection, when another replaces it (which closes it)
	// or when the agent closes. The host sends nothing on it; what it sends is discarded.
	buf := make([]byte, 64)
	for !sess.isDone() {
		_ = conn.SetReadDeadline(time.Now().Add(netParkedTrim / 3))
		if _, err := br.Read(buf); err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				sess.trim()
				continue
			}
			break
		}
	}
	sess.close()
	s.net.clearSession(sess)
}

// handleNetAccept parks the connection in the session whose token it carries, for the next
// local connection.
func (s *server) handleNetAccept(w http.ResponseWriter, r *http.Request) {
	if !strings.EqualFold(r.Header.Get("Upgrade"), NetConnProtocol) {
		s.writeError(w, errcode.New(errcode.InvalidArgument, "POST /v1/net/accept needs \"Connection: Upgrade\" and \"Upgrade: %s\"", NetConnProtocol))
		return
	}
	var req NetAcceptRequest
	if err := decodeJSON(w, r, MaxNetHeader, &req); err != nil {
		s.writeError(w, err)
		return
	}
	sess := s.net.session(req.Token)
	if sess == nil {
		s.writeError(w, errcode.New(errcode.Conflict, "no net session has this token: it ended or a newer session replaced it"))
		return
	}
	// The 101 is written by hand, always the same bytes (netConn101), so that the host reads
	// exactly it and nothing of the frame that may follow at once.
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		s.log.Warn("guest: cannot take over the connection", "proto", NetConnProtocol, "err", err)
		return
	}
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	// The host sends nothing before the agent's frame: anything buffered breaks the protocol.
	if _, err := conn.Write(netConn101); err != nil || brw.Reader.Buffered() > 0 {
		_ = conn.Close()
		return
	}
	_ = conn.SetDeadline(time.Time{})
	if !sess.park(conn) {
		_ = conn.Close()
	}
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
			_ = conn.Close()
			_ = target.Close()
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
