package guest

import (
	"bufio"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/agentbox/agentbox/internal/errcode"
)

// The network half of the guest protocol (skeleton: the guest engineer fills in net_server*.go
// and net_client.go; these types are the contract).
//
// Egress: the host opens POST /v1/net/session with "Upgrade: agentbox-net/1" and a
// NetSessionRequest body; the agent answers 101 with a NetSessionReply as one JSON line
// (≤ 4 KiB) and both sides then speak yamux over the connection (host: yamux server; agent:
// yamux client, which opens one stream per local connection). Every stream starts with one
// NetStreamHeader as a JSON line (≤ 4 KiB), then raw bytes both ways.
//
// Inbound (preview URLs): POST /v1/tcp with "Upgrade: agentbox-tcp/1" and a DialPortRequest
// body; the agent connects to the port on the sandbox's loopback and answers 101, or a JSON
// error (CONFLICT: nothing listens there) before any upgrade; then raw bytes both ways.

// NetProtocol and TCPProtocol are the Upgrade tokens.
const (
	NetProtocol = "agentbox-net/1"
	TCPProtocol = "agentbox-tcp/1"
)

// MaxNetHeader bounds a NetSessionReply line and a NetStreamHeader line.
const MaxNetHeader = 4 << 10

// NetSessionRequest configures the sandbox's listeners. The agent binds them on the first
// session and keeps them for its life; a later session (a restarted server) replaces the
// previous one and must carry the same configuration.
type NetSessionRequest struct {
	// ProxyPort is the HTTP proxy's port on 127.0.0.1 (HTTP_PROXY); 0 picks a free one.
	ProxyPort int `json:"proxy_port"`
	// DNSPort is the resolver's port on 127.0.0.1, UDP and TCP (53 for resolv.conf; 0 picks a
	// free one; -1: no resolver).
	DNSPort int `json:"dns_port"`
	// TransparentPorts are ports the agent listens on at 0.0.0.0 for connections to any
	// address (80, 443), where the runtime routes every IPv4 address to the sandbox's
	// loopback (runtime hardening "transparent_egress"); empty: none.
	TransparentPorts []int `json:"transparent_ports,omitempty"`
}

// NetSessionReply says where the listeners are.
type NetSessionReply struct {
	ProxyAddr   string   `json:"proxy_addr"`
	DNSAddr     string   `json:"dns_addr,omitempty"`
	Transparent []string `json:"transparent,omitempty"`
}

// NetStreamHeader opens every stream the agent opens in a session.
type NetStreamHeader struct {
	// Kind is "proxy", "transparent" or "dns" (egress.Kind's values).
	Kind string `json:"kind"`
	// Dst is the original destination "ip:port" of a transparent connection (the local
	// address the connection was accepted on).
	Dst string `json:"dst,omitempty"`
	// Src is the local peer's address inside the sandbox ("127.0.0.1:40000"), for logs.
	Src string `json:"src,omitempty"`
}

// DialPortRequest is the body of POST /v1/tcp.
type DialPortRequest struct {
	Port int `json:"port"`
}

// Bounds of the net protocol.
const (
	// MaxTransparentPorts bounds NetSessionRequest.TransparentPorts.
	MaxTransparentPorts = 8
	// netStreamWindow is the most a stream's receiver buffers (yamux's window): large enough
	// that one stream runs at the connection's speed (the default 256 KiB caps a stream at
	// window/RTT), small enough that every stream of a busy sandbox fits in memory. Measured
	// (BenchmarkNetSessionThroughput): 1 MiB as fast as 2 or 4 MiB, 16 MiB several times slower.
	netStreamWindow = 1 << 20
	// netHeaderWait bounds the wait for a stream's header line.
	netHeaderWait = 10 * time.Second
)

// Validate checks the ports: INVALID_ARGUMENT naming the field and its range.
func (r NetSessionRequest) Validate() error {
	if r.ProxyPort < 0 || r.ProxyPort > 65535 {
		return errcode.New(errcode.InvalidArgument, "proxy_port %d is out of range: 0–65535 (0 picks a free port)", r.ProxyPort).With("field", "proxy_port")
	}
	if r.DNSPort < -1 || r.DNSPort > 65535 {
		return errcode.New(errcode.InvalidArgument, "dns_port %d is out of range: -1–65535 (-1: no resolver; 0 picks a free port)", r.DNSPort).With("field", "dns_port")
	}
	if len(r.TransparentPorts) > MaxTransparentPorts {
		return errcode.New(errcode.InvalidArgument, "transparent_ports lists %d ports; at most %d", len(r.TransparentPorts), MaxTransparentPorts).With("field", "transparent_ports")
	}
	for i, p := range r.TransparentPorts {
		if p < 0 || p > 65535 {
			return errcode.New(errcode.InvalidArgument, "transparent_ports[%d] = %d is out of range: 0–65535 (0 picks a free port)", i, p).With("field", "transparent_ports")
		}
		if p != 0 && slices.Contains(r.TransparentPorts[:i], p) {
			return errcode.New(errcode.InvalidArgument, "transparent_ports lists port %d twice", p).With("field", "transparent_ports")
		}
	}
	return nil
}

// checkDialPort validates the port of a DialPort request.
func checkDialPort(port int) error {
	if port < 1 || port > 65535 {
		return errcode.New(errcode.InvalidArgument, "port %d is out of range: 1–65535", port).With("field", "port")
	}
	return nil
}

// netKinds are the kinds of stream an agent opens.
var netKinds = []string{"proxy", "transparent", "dns"}

// yamuxConfig is the configuration of both ends of a session: keepalive on, a stream window
// of netStreamWindow, yamux's own log lines to logw.
func yamuxConfig(logw io.Writer) *yamux.Config {
	c := yamux.DefaultConfig()
	c.AcceptBacklog = 256
	c.EnableKeepAlive = true
	c.KeepAliveInterval = 15 * time.Second
	c.ConnectionWriteTimeout = 30 * time.Second
	c.MaxStreamWindowSize = netStreamWindow
	c.StreamOpenTimeout = 30 * time.Second
	c.LogOutput = logw
	return c
}

// closeWrite ends c's writing half: a FIN for TCP and unix connections and for a yamux
// stream (whose Close is a half-close: reads go on until the peer's FIN).
func closeWrite(c net.Conn) error {
	switch v := c.(type) {
	case interface{ CloseWrite() error }:
		return v.CloseWrite()
	case *yamux.Stream:
		return v.Close()
	}
	return c.Close()
}

// abortConn ends c at once, waking its blocked reads and writes (a yamux stream's Close alone
// would leave its reader waiting for the peer).
func abortConn(c net.Conn) {
	if st, ok := c.(*yamux.Stream); ok {
		_ = st.SetDeadline(time.Now())
	}
	_ = c.Close()
}

// readerOnly and writerOnly hide ReadFrom/WriteTo so a copy uses splice's own buffer.
type readerOnly struct{ io.Reader }
type writerOnly struct{ io.Writer }

// splice copies both ways between a and b (ar reads a; nil: a itself) until both directions
// end: a direction that ends cleanly half-closes its destination, one that fails ends both.
// Both are closed when it returns.
func splice(a net.Conn, ar io.Reader, b net.Conn) {
	if ar == nil {
		ar = a
	}
	abort := sync.OnceFunc(func() { abortConn(a); abortConn(b) })
	one := func(dst net.Conn, src io.Reader) {
		buf := make([]byte, 64<<10)
		if _, err := io.CopyBuffer(writerOnly{dst}, readerOnly{src}, buf); err != nil {
			abort()
			return
		}
		if closeWrite(dst) != nil {
			abort()
		}
	}
	done := make(chan struct{})
	go func() { defer close(done); one(b, ar) }()
	one(a, b)
	<-done
	_ = a.Close()
	_ = b.Close()
}

// readLineMax reads one line of at most max bytes (newline excluded) from br.
func readLineMax(br *bufio.Reader, max int) ([]byte, error) {
	var line []byte
	for {
		chunk, err := br.ReadSlice('\n')
		if len(line)+len(chunk) > max+1 {
			return nil, errLineTooLong
		}
		switch {
		case err == nil:
			line = append(line, chunk...)
			return line[:len(line)-1], nil
		case errors.Is(err, bufio.ErrBufferFull):
			line = append(line, chunk...)
		default:
			return nil, err
		}
	}
}

var errLineTooLong = errors.New("line too long")

// yamuxConn is the connection under a yamux session: it sends a data frame's 12-byte header
// and its body in one write (yamux's send loop writes them one after the other, two
// syscalls), halving the writes of a bulk transfer. Every other frame is written at once.
type yamuxConn struct {
	net.Conn
	r   io.Reader
	hdr []byte // a data frame's header waiting for its body
}

func (c *yamuxConn) Read(p []byte) (int, error) { return c.r.Read(p) }

func (c *yamuxConn) Write(p []byte) (int, error) {
	if c.hdr != nil {
		bufs := net.Buffers{c.hdr, p}
		c.hdr = nil
		n, err := bufs.WriteTo(c.Conn)
		return max(0, int(n)-12), err
	}
	// A data frame (version 0, type 0) with a body: hold the header for the body's write.
	if len(p) == 12 && p[0] == 0 && p[1] == 0 && binary.BigEndian.Uint32(p[8:]) > 0 {
		c.hdr = slices.Clone(p)
		return len(p), nil
	}
	return c.Conn.Write(p)
}
