//go:build linux

package guest_test

import (
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/guest"
)

// TestNetFDHandoff: in a session opened with PassFDs the agent hands the accepted socket
// itself to the host: the stream's Conn is a *net.TCPConn whose local address is the
// listener's (the original destination for a transparent one) and whose peer is the local
// client, it carries bytes both ways with half-closes, and the agent relays nothing (its
// parked connection is closed).
func TestNetFDHandoff(t *testing.T) {
	t.Parallel()
	a := startAgent(t)
	s := openSession(t, a, guest.NetSessionRequest{DNSPort: -1, TransparentPorts: []int{0}, PassFDs: true})
	_, port, _ := net.SplitHostPort(s.Reply.Transparent[0])
	for _, tc := range []struct{ kind, addr string }{
		{"proxy", s.Reply.ProxyAddr},
		{"transparent", "127.0.0.7:" + port},
	} {
		c := dialTCP(t, tc.addr)
		st := acceptOne(t, s)
		tcp, ok := st.Conn.(*net.TCPConn)
		if !ok {
			t.Fatalf("%s: stream conn is %T, want *net.TCPConn", tc.kind, st.Conn)
		}
		if !st.Header.FD || st.Header.Kind != tc.kind || tcp.LocalAddr().String() != tc.addr || tcp.RemoteAddr().String() != c.LocalAddr().String() {
			t.Fatalf("%s: header %+v, local %s, remote %s; want fd, local %s, remote %s", tc.kind, st.Header, tcp.LocalAddr(), tcp.RemoteAddr(), tc.addr, c.LocalAddr())
		}
		if tc.kind == "transparent" && st.Header.Dst != tc.addr {
			t.Fatalf("transparent dst %q, want %q", st.Header.Dst, tc.addr)
		}
		go echo(st)
		echoHalfClose(t, c, 8<<20)
	}
	// A client asking for MPTCP: if the listener accepts it as MPTCP (not TCP), the agent
	// relays it rather than handing over a socket the host refuses; either way it works.
	var d net.Dialer
	d.SetMultipathTCP(true)
	mc, err := d.Dial("tcp4", s.Reply.ProxyAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer mc.Close()
	st := acceptOne(t, s)
	if _, relayed := st.Conn.(*net.UnixConn); relayed == st.Header.FD {
		t.Fatalf("MPTCP client: conn %T with header %+v", st.Conn, st.Header)
	}
	t.Logf("an MPTCP client's connection was handed over: %v", st.Header.FD)
	go echo(st)
	echoHalfClose(t, mc, 1<<20)
}

// objID names an open file description's object (what /proc/self/fd/N refers to).
type objID struct{ dev, ino uint64 }

func fdObj(t *testing.T, fd int) objID {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		t.Fatal(err)
	}
	return objID{st.Dev, st.Ino}
}

// openObjs lists the objects of every descriptor this process holds.
func openObjs() map[objID]string {
	m := map[objID]string{}
	ents, _ := os.ReadDir("/proc/self/fd")
	for _, e := range ents {
		var st unix.Stat_t
		p := filepath.Join("/proc/self/fd", e.Name())
		if unix.Stat(p, &st) == nil {
			l, _ := os.Readlink(p)
			m[objID{st.Dev, st.Ino}] = l
		}
	}
	return m
}

// TestImpostorNetFDHostile: a hostile agent in a PassFDs session handing over a pipe, a file,
// a unix socket, a UDP or listening socket, two sockets, a socket with a header not saying
// fd, a header saying fd with none, or a transparent socket whose local address is not the
// header's dst: each stream is refused and counted, and none of those descriptors is left open
// in the host; the good one after them arrives as a *net.TCPConn carrying bytes both ways.
func TestImpostorNetFDHostile(t *testing.T) {
	const token = "0123456789abcdef0123456789abcdef"
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var peersMu sync.Mutex
	var peers []net.Conn
	defer func() {
		for _, p := range peers {
			p.Close()
		}
	}()
	// tcpPair returns a connected TCP socket's descriptor (the accepted end; the caller closes
	// it) and keeps its peer open.
	var pairMu sync.Mutex // one dial and its accept at a time: each pair is its own
	tcpPair := func() (*os.File, net.Conn) {
		pairMu.Lock()
		defer pairMu.Unlock()
		c, err := net.Dial("tcp4", ln.Addr().String())
		if err != nil {
			t.Error(err)
			return nil, nil
		}
		peersMu.Lock()
		peers = append(peers, c)
		peersMu.Unlock()
		sc, err := ln.Accept()
		if err != nil {
			t.Error(err)
			return nil, nil
		}
		f, _ := sc.(*net.TCPConn).File()
		sc.Close()
		return f, c
	}
	var hostileMu sync.Mutex
	hostile := map[objID]string{}
	note := func(name string, fds ...int) {
		hostileMu.Lock()
		defer hostileMu.Unlock()
		for _, fd := range fds {
			hostile[fdObj(t, fd)] = name
		}
	}
	hdr := func(h string) []byte { return frame(h) }
	type sendFn func() (msg []byte, fds []int, closeAll func())
	one := func(name, h string, mk func() (int, func())) sendFn {
		return func() ([]byte, []int, func()) {
			fd, cl := mk()
			note(name, fd)
			return hdr(h), []int{fd}, cl
		}
	}
	pipeFD := func() (int, func()) {
		r, w, _ := os.Pipe()
		return int(r.Fd()), func() { r.Close(); w.Close() }
	}
	fileFD := func() (int, func()) {
		f, _ := os.CreateTemp(t.TempDir(), "x")
		return int(f.Fd()), func() { f.Close() }
	}
	unixFD := func() (int, func()) {
		p, _ := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM, 0)
		return p[0], func() { unix.Close(p[0]); unix.Close(p[1]) }
	}
	udpFD := func() (int, func()) {
		c, _ := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		f, _ := c.File()
		c.Close()
		return int(f.Fd()), func() { f.Close() }
	}
	listenFD := func() (int, func()) {
		l, _ := net.Listen("tcp4", "127.0.0.1:0")
		f, _ := l.(*net.TCPListener).File()
		l.Close()
		return int(f.Fd()), func() { f.Close() }
	}
	tcpFD := func() (int, func()) {
		f, _ := tcpPair()
		return int(f.Fd()), func() { f.Close() }
	}
	bad := []sendFn{
		one("pipe", `{"kind":"proxy","fd":true}`, pipeFD),
		one("file", `{"kind":"proxy","fd":true}`, fileFD),
		one("unix socket", `{"kind":"proxy","fd":true}`, unixFD),
		one("udp socket", `{"kind":"proxy","fd":true}`, udpFD),
		one("listening socket", `{"kind":"proxy","fd":true}`, listenFD),
		one("unannounced socket", `{"kind":"proxy"}`, tcpFD),
		func() ([]byte, []int, func()) {
			a, ca := tcpFD()
			b, cb := tcpFD()
			note("two sockets", a, b)
			return hdr(`{"kind":"proxy","fd":true}`), []int{a, b}, func() { ca(); cb() }
		},
		func() ([]byte, []int, func()) {
			return hdr(`{"kind":"proxy","fd":true}`), nil, func() {}
		},
		one("mptcp socket", `{"kind":"proxy","fd":true}`, func() (int, func()) {
			var lc net.ListenConfig
			lc.SetMultipathTCP(true)
			l, err := lc.Listen(context.Background(), "tcp4", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			var d net.Dialer
			d.SetMultipathTCP(true)
			c, err := d.Dial("tcp4", l.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			sc, err := l.Accept()
			if err != nil {
				t.Fatal(err)
			}
			f, _ := sc.(*net.TCPConn).File()
			sc.Close()
			if p, _ := unix.GetsockoptInt(int(f.Fd()), unix.SOL_SOCKET, unix.SO_PROTOCOL); p != unix.IPPROTO_MPTCP {
				t.Errorf("an MPTCP connection's accepted socket has protocol %d, want %d (IPPROTO_MPTCP): this kernel cannot test that case", p, unix.IPPROTO_MPTCP)
			}
			return int(f.Fd()), func() { f.Close(); c.Close() }
		}),
		one("mismatched dst", `{"kind":"transparent","dst":"127.0.0.9:443","fd":true}`, tcpFD),
		one("listener not asked for", `{"kind":"proxy","dst":"127.0.0.1:3128","fd":true,"listener":true}`, listenFD),
	}
	next := make(chan sendFn, len(bad)+1)
	for _, b := range bad {
		next <- b
	}
	goodCh := make(chan net.Conn, 1)
	next <- func() ([]byte, []int, func()) {
		f, peer := tcpPair()
		goodCh <- peer
		return hdr(`{"kind":"transparent","dst":"` + peer.RemoteAddr().String() + `","fd":true}`), []int{int(f.Fd())}, func() { f.Close() }
	}
	done := make(chan struct{})
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
			conn, _ := hijack101(t, w, r, guest.NetConnProtocol)
			if conn == nil {
				return
			}
			defer conn.Close()
			select {
			case send := <-next:
				msg, fds, closeAll := send()
				var oob []byte
				if len(fds) > 0 {
					oob = unix.UnixRights(fds...)
				}
				if _, _, err := conn.(*net.UnixConn).WriteMsgUnix(msg, oob, nil); err != nil {
					t.Errorf("sendmsg: %v", err)
				}
				closeAll() // the impostor's copies: only the host's can remain
				_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
				_, _ = conn.Read(make([]byte, 1)) // until the host closes it
			case <-done:
			}
		}
	})
	s, err := im.c.NetSession(ctxT(t, 10*time.Second), guest.NetSessionRequest{DNSPort: -1, PassFDs: true})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { close(done); s.Close() }()
	st := acceptOne(t, s)
	goodPeer := <-goodCh
	goodLocal := goodPeer.RemoteAddr().String()
	tcp, ok := st.Conn.(*net.TCPConn)
	if !ok || !st.Header.FD || tcp.LocalAddr().String() != goodLocal {
		t.Fatalf("delivered %T %+v (local %v), want a *net.TCPConn on %s", st.Conn, st.Header, st.Conn.LocalAddr(), goodLocal)
	}
	go echo(st)
	echoHalfClose(t, goodPeer, 1<<20)
	deadline := time.Now().Add(5 * time.Second)
	for s.BadStreams() != int64(len(bad)) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := s.BadStreams(); n != int64(len(bad)) {
		t.Fatalf("%d streams refused, want %d", n, len(bad))
	}
	var left []string
	for time.Now().Before(deadline) {
		left = left[:0]
		open := openObjs()
		hostileMu.Lock()
		for id, name := range hostile {
			if l, ok := open[id]; ok {
				left = append(left, name+" ("+l+")")
			}
		}
		hostileMu.Unlock()
		if len(left) == 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if len(left) > 0 {
		t.Fatalf("descriptors of refused streams still open in the host: %s", strings.Join(left, ", "))
	}
	if len(hostile) != len(bad) { // eight streams with one descriptor each, one with two, one with none
		t.Fatalf("%d hostile descriptors noted, want %d: %v", len(hostile), len(bad), hostile)
	}
}

// TestNetListenerHandoff: in a session opened with PassListeners the agent hands the host its
// listeners (here the proxy's and a transparent one) and the host accepts the sandbox's
// connections itself: each stream is a *net.TCPConn with the kernel's addresses (a
// transparent one's dst its local address), carrying bytes both ways. Once that session ends,
// the agent accepts on its listeners again: a later session without PassListeners gets the
// next connection through the agent. The listeners come with the session's reply (taken
// before NetSession returns), or, for a host that does not ask for that, over parked
// connections.
func TestNetListenerHandoff(t *testing.T) {
	t.Parallel()
	t.Run("in-reply", func(t *testing.T) { t.Parallel(); testNetListenerHandoff(t, true) })
	t.Run("parked", func(t *testing.T) { t.Parallel(); testNetListenerHandoff(t, false) })
}

func testNetListenerHandoff(t *testing.T, inReply bool) {
	a := startAgent(t)
	if !inReply {
		guest.ListenersOverParked(a.c)
	}
	s := openSession(t, a, guest.NetSessionRequest{DNSPort: -1, TransparentPorts: []int{0}, PassFDs: true, PassListeners: true})
	if inReply {
		if n, m := s.Listeners(), len(s.Reply.Listeners); n != 2 || m != 2 {
			t.Fatalf("NetSession returned accepting on %d of the agent's listeners (%d in the reply), want 2 (proxy, transparent)", n, m)
		}
	} else if len(s.Reply.Listeners) != 0 {
		t.Fatalf("the reply lists %d listeners to a session that did not ask", len(s.Reply.Listeners))
	}
	deadline := time.Now().Add(10 * time.Second)
	for s.Listeners() < 2 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if n := s.Listeners(); n != 2 {
		t.Fatalf("the host accepts on %d of the agent's listeners, want 2 (proxy, transparent)", n)
	}
	_, port, _ := net.SplitHostPort(s.Reply.Transparent[0])
	for _, tc := range []struct{ kind, addr string }{
		{"proxy", s.Reply.ProxyAddr},
		{"transparent", "127.0.0.7:" + port},
	} {
		for range 3 {
			c := dialTCP(t, tc.addr)
			st := acceptOne(t, s)
			tcp, ok := st.Conn.(*net.TCPConn)
			if !ok {
				t.Fatalf("%s: stream conn is %T, want *net.TCPConn", tc.kind, st.Conn)
			}
			if !st.Header.FD || st.Header.Kind != tc.kind || tcp.LocalAddr().String() != tc.addr || tcp.RemoteAddr().String() != c.LocalAddr().String() {
				t.Fatalf("%s: header %+v, local %s, remote %s; want fd, local %s, remote %s", tc.kind, st.Header, tcp.LocalAddr(), tcp.RemoteAddr(), tc.addr, c.LocalAddr())
			}
			if tc.kind == "transparent" && st.Header.Dst != tc.addr {
				t.Fatalf("transparent dst %q, want %q", st.Header.Dst, tc.addr)
			}
			go echo(st)
			echoHalfClose(t, c, 1<<20)
		}
	}
	if n := s.BadStreams(); n != 0 {
		t.Fatalf("%d bad streams", n)
	}
	// The session ends; the agent takes its listeners back.
	s.Close()
	s2 := openSession(t, a, guest.NetSessionRequest{DNSPort: -1, TransparentPorts: []int{0}, PassFDs: true})
	if s2.Reply.ProxyAddr != s.Reply.ProxyAddr {
		t.Fatalf("the second session's proxy is %s, the first's %s", s2.Reply.ProxyAddr, s.Reply.ProxyAddr)
	}
	c := dialTCP(t, s2.Reply.ProxyAddr)
	st := acceptOne(t, s2)
	if s2.Listeners() != 0 || st.Header.Kind != "proxy" || !st.Header.FD {
		t.Fatalf("after the listeners' session ended: header %+v, listeners %d; want a socket the agent handed over", st.Header, s2.Listeners())
	}
	go echo(st)
	echoHalfClose(t, c, 1<<20)
}

// TestImpostorNetListenerHostile: a hostile agent in a PassListeners session handing over, as
// a listener, a connected socket, a listener bound elsewhere than the reply's proxy address,
// a listener header without a descriptor, or the proxy's listener twice: each is refused and
// counted, and none of those descriptors stays open in the host; the good listener (at the
// reply's proxy address) is accepted on, and a connection to it arrives as a stream.
func TestImpostorNetListenerHostile(t *testing.T) {
	const token = "0123456789abcdef0123456789abcdef"
	good, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer good.Close()
	goodAddr := good.Addr().String()
	lfile := func(l net.Listener) int {
		f, _ := l.(*net.TCPListener).File()
		t.Cleanup(func() { f.Close() })
		return int(f.Fd())
	}
	other, _ := net.Listen("tcp4", "127.0.0.1:0")
	defer other.Close()
	peer, _ := net.Dial("tcp4", goodAddr)
	defer peer.Close()
	conn, _ := good.Accept()
	cf, _ := conn.(*net.TCPConn).File()
	conn.Close()
	defer cf.Close()
	type msg struct {
		h   string
		fds []int
	}
	lh := func(dst string) string { return `{"kind":"proxy","dst":"` + dst + `","fd":true,"listener":true}` }
	hostile := map[objID]string{fdObj(t, int(cf.Fd())): "connected socket", fdObj(t, lfile(other)): "listener elsewhere"}
	bad := []msg{
		{lh(goodAddr), []int{int(cf.Fd())}},
		{lh(other.Addr().String()), []int{lfile(other)}},
		{`{"kind":"proxy","dst":"` + goodAddr + `","listener":true}`, nil},
	}
	goodFD := lfile(good)
	base := map[objID]int{}
	for id := range hostile {
		base[id] = countOpen(id)
	}
	next := make(chan msg, len(bad)+2)
	next <- msg{lh(goodAddr), []int{goodFD}}
	for _, b := range bad {
		next <- b
	}
	next <- msg{lh(goodAddr), []int{goodFD}} // twice: refused the second time
	done := make(chan struct{})
	im := startImpostor(t, func(im *impostor, w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/net/session":
			conn, _ := hijack101(t, w, r, guest.NetProtocol)
			if conn == nil {
				return
			}
			defer conn.Close()
			_, _ = conn.Write([]byte(`{"proxy_addr":"` + goodAddr + `","token":"` + token + `"}` + "\n"))
			<-done
		case "/v1/net/accept":
			conn, _ := hijack101(t, w, r, guest.NetConnProtocol)
			if conn == nil {
				return
			}
			defer conn.Close()
			select {
			case m := <-next:
				var oob []byte
				if len(m.fds) > 0 {
					oob = unix.UnixRights(m.fds...)
				}
				if _, _, err := conn.(*net.UnixConn).WriteMsgUnix(frame(m.h), oob, nil); err != nil {
					t.Errorf("sendmsg: %v", err)
				}
				_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
				_, _ = conn.Read(make([]byte, 1)) // until the host closes it
			case <-done:
			}
		}
	})
	s, err := im.c.NetSession(ctxT(t, 10*time.Second), guest.NetSessionRequest{DNSPort: -1, PassFDs: true, PassListeners: true})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { close(done); s.Close() }()
	deadline := time.Now().Add(10 * time.Second)
	for (s.BadStreams() < int64(len(bad)+1) || s.Listeners() < 1) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if s.Listeners() != 1 || s.BadStreams() != int64(len(bad)+1) {
		t.Fatalf("listeners taken %d, streams refused %d; want 1 and %d", s.Listeners(), s.BadStreams(), len(bad)+1)
	}
	c := dialTCP(t, goodAddr)
	st := acceptOne(t, s)
	if tcp, ok := st.Conn.(*net.TCPConn); !ok || tcp.RemoteAddr().String() != c.LocalAddr().String() || st.Header.Kind != "proxy" {
		t.Fatalf("delivered %T %+v, want the connection from %s", st.Conn, st.Header, c.LocalAddr())
	}
	go echo(st)
	echoHalfClose(t, c, 1<<20)
	// Only the impostor's own descriptors (closed at the test's end) may remain: every copy
	// the host received is closed.
	var left []string
	for time.Now().Before(deadline) {
		left = left[:0]
		open := openObjs()
		for id, name := range hostile {
			if l, ok := open[id]; ok && countOpen(id) > base[id] {
				left = append(left, name+" ("+l+")")
			}
		}
		if len(left) == 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if len(left) > 0 {
		t.Fatalf("descriptors of refused listeners still open in the host: %s", strings.Join(left, ", "))
	}
}

// countOpen counts this process's descriptors on object id.
func countOpen(id objID) int {
	n := 0
	ents, _ := os.ReadDir("/proc/self/fd")
	for _, e := range ents {
		var st unix.Stat_t
		if unix.Stat(filepath.Join("/proc/self/fd", e.Name()), &st) == nil && (objID{st.Dev, st.Ino}) == id {
			n++
		}
	}
	return n
}

// TestImpostorNetReplyListenersHostile: a hostile agent handing listeners over with the
// session's reply: a connected socket as the proxy's listener, a listener bound elsewhere, a
// listener at an address the reply does not give, or more descriptors than the reply lists.
// Each bad one is refused and counted, a good one beside them is accepted on, and none of the
// hostile descriptors stays open in the host.
func TestImpostorNetReplyListenersHostile(t *testing.T) {
	const token = "0123456789abcdef0123456789abcdef"
	good, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer good.Close()
	goodAddr := good.Addr().String()
	lfile := func(l net.Listener) int {
		f, _ := l.(*net.TCPListener).File()
		t.Cleanup(func() { f.Close() })
		return int(f.Fd())
	}
	other, _ := net.Listen("tcp4", "127.0.0.1:0")
	defer other.Close()
	peer, _ := net.Dial("tcp4", goodAddr)
	defer peer.Close()
	conn, _ := good.Accept()
	cf, _ := conn.(*net.TCPConn).File()
	conn.Close()
	defer cf.Close()
	goodFD, otherFD, connFD := lfile(good), lfile(other), int(cf.Fd())
	hostile := map[objID]string{fdObj(t, connFD): "connected socket", fdObj(t, otherFD): "listener elsewhere"}
	base := map[objID]int{}
	for id := range hostile {
		base[id] = countOpen(id)
	}
	lh := func(dst string) string { return `{"kind":"proxy","dst":"` + dst + `","fd":true,"listener":true}` }
	type scenario struct {
		listeners []string
		fds       []int
		taken     int64 // listeners the host accepts on
		bad       int64
	}
	cases := []scenario{
		{[]string{lh(goodAddr)}, []int{connFD}, 0, 1},                                                                              // a connected socket
		{[]string{lh(goodAddr)}, []int{otherFD}, 0, 1},                                                                             // bound elsewhere
		{[]string{lh(other.Addr().String())}, []int{otherFD}, 0, 1},                                                                // not the reply's address
		{[]string{lh(goodAddr)}, []int{goodFD, otherFD}, 0, 1},                                                                     // more descriptors than listed
		{[]string{`{"kind":"dns","dst":"` + goodAddr + `","fd":true,"listener":true}`, lh(goodAddr)}, []int{connFD, goodFD}, 1, 1}, // one bad beside a good one
	}
	next := make(chan scenario, 1)
	done := make(chan struct{})
	defer close(done)
	im := startImpostor(t, func(im *impostor, w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/net/session" {
			return // no parked connection is served
		}
		sc := <-next
		conn, _ := hijack101(t, w, r, guest.NetProtocol)
		if conn == nil {
			return
		}
		defer conn.Close()
		line := `{"proxy_addr":"` + goodAddr + `","token":"` + token + `","listeners":[` + strings.Join(sc.listeners, ",") + `]}` + "\n"
		if _, _, err := conn.(*net.UnixConn).WriteMsgUnix([]byte(line), unix.UnixRights(sc.fds...), nil); err != nil {
			t.Errorf("sendmsg: %v", err)
		}
		select {
		case <-done:
		case <-r.Context().Done():
		}
	})
	for i, sc := range cases {
		next <- sc
		s, err := im.c.NetSession(ctxT(t, 10*time.Second), guest.NetSessionRequest{DNSPort: -1, PassFDs: true, PassListeners: true})
		if err != nil {
			t.Fatalf("case %d: %v", i, err)
		}
		if s.Listeners() != sc.taken || s.BadStreams() != sc.bad {
			t.Errorf("case %d: listeners taken %d, refused %d; want %d and %d", i, s.Listeners(), s.BadStreams(), sc.taken, sc.bad)
		}
		if sc.taken > 0 {
			c := dialTCP(t, goodAddr)
			st := acceptOne(t, s)
			if tcp, ok := st.Conn.(*net.TCPConn); !ok || tcp.RemoteAddr().String() != c.LocalAddr().String() {
				t.Fatalf("case %d: delivered %T %+v, want the connection from %s", i, st.Conn, st.Header, c.LocalAddr())
			}
			go echo(st)
			echoHalfClose(t, c, 64<<10)
		}
		s.Close()
	}
	deadline := time.Now().Add(10 * time.Second)
	var left []string
	for time.Now().Before(deadline) {
		left = left[:0]
		open := openObjs()
		for id, name := range hostile {
			if l, ok := open[id]; ok && countOpen(id) > base[id] {
				left = append(left, name+" ("+l+")")
			}
		}
		if len(left) == 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if len(left) > 0 {
		t.Fatalf("descriptors of refused listeners still open in the host: %s", strings.Join(left, ", "))
	}
}
