package guest

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
)

// The network half of the guest protocol.
//
// Egress: the host opens POST /v1/net/session with "Upgrade: agentbox-net/1" and a
// NetSessionRequest body; the agent answers 101 with a NetSessionReply as one JSON line
// (≤ 4 KiB), which carries the session's random token. That connection stays the session's
// control channel: the agent writes one byte on it for each local connection that finds no
// parked connection waiting, and the session ends when it closes. The host keeps a few
// connections parked: POST /v1/net/accept with "Upgrade: agentbox-netconn/1" and the token
// (a stale token is CONFLICT), answered 101 and then nothing until the agent hands that
// connection a local one: a frame of a 2-byte big-endian length and a NetStreamHeader (JSON,
// ≤ 4 KiB), then the raw bytes both ways. Each relayed connection is thus a unix connection of
// its own, which both ends copy to and from TCP with splice(2); the host dials them all (the
// sandbox never dials the host). In a session opened with PassFDs (runc, crun) the agent
// instead sends the accepted TCP socket itself with the header (SCM_RIGHTS, "fd": true) and
// relays nothing; the host checks it (readStreamFrame, takeSocket) and serves it directly.
// With PassListeners too, the agent hands over its TCP listeners themselves the same way
// (NetStreamHeader.Listener; takeListenerFD) and the host accepts the sandbox's connections;
// with ListenersInReply, all of them come with the session's reply line instead (one
// message, NetSessionReply.Listeners), so that opening the session is one round trip.
//
// Inbound (preview URLs): POST /v1/tcp with "Upgrade: agentbox-tcp/1" and a DialPortRequest
// body; the agent connects to the port on the sandbox's loopback and answers 101, or a JSON
// error (CONFLICT: nothing listens there) before any upgrade; then raw bytes both ways.

// NetProtocol and TCPProtocol are the Upgrade tokens.
const (
	NetProtocol     = "agentbox-net/1"
	NetConnProtocol = "agentbox-netconn/1"
	TCPProtocol     = "agentbox-tcp/1"
)

// MaxNetHeader bounds a NetSessionReply line and a NetStreamHeader frame.
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
	// PassFDs asks the agent to hand each accepted TCP connection's socket itself to the
	// host (SCM_RIGHTS with the stream's header, NetStreamHeader.FD) instead of relaying its
	// bytes. The host sets it where the agent's sockets are host kernel sockets (runtime
	// isolation "process": runc, crun), never under gVisor, whose sockets are its own. Not
	// part of the listeners' configuration: each session says it anew.
	PassFDs bool `json:"pass_fds,omitempty"`
	// PassListeners (with PassFDs) asks the agent to hand the host its TCP listeners
	// themselves (the HTTP proxy, the resolver's TCP side, the transparent ports), each over a
	// parked connection as a frame with NetStreamHeader.Listener and its descriptor; the host
	// then accepts the sandbox's connections itself, and the agent stops accepting on a
	// listener the current session holds until that session ends. A new connection then costs
	// one wake-up of the host, not the agent's accept, its hand-over and the host's read of it.
	PassListeners bool `json:"pass_listeners,omitempty"`
	// ListenersInReply (with PassListeners) asks the agent to hand its TCP listeners over with
	// the session's reply itself: the 101 is exactly netSession101, and the reply line comes in
	// one message with every listener's descriptor (SCM_RIGHTS), NetSessionReply.Listeners
	// naming them in order. The session then needs no parked connection to take them, and the
	// host keeps one parked (for the resolver's UDP queries) instead of netParkedIdle: a
	// create's session costs one round trip. An agent that cannot (no unix connection, another
	// OS) hands them over parked connections as before, and says so by listing none.
	// Client.NetSession sets it with PassListeners.
	ListenersInReply bool `json:"listeners_in_reply,omitempty"`
}

// NetSessionReply says where the listeners are.
type NetSessionReply struct {
	ProxyAddr   string   `json:"proxy_addr"`
	DNSAddr     string   `json:"dns_addr,omitempty"`
	Transparent []string `json:"transparent,omitempty"`
	// Token names the session in POST /v1/net/accept: 32 random hex digits, new each session.
	Token string `json:"token"`
	// Listeners are the listeners handed over with this reply (a session asking
	// ListenersInReply), one header (Kind, Dst, FD and Listener set) per descriptor that came
	// with the reply line, in their order; at most MaxTransparentPorts+2.
	Listeners []NetStreamHeader `json:"listeners,omitempty"`
}

// NetAcceptRequest is the body of POST /v1/net/accept: a parked connection of the session
// whose token it carries.
type NetAcceptRequest struct {
	Token string `json:"token"`
}

// NetStreamHeader opens every connection the agent hands the host (after its 2-byte length).
type NetStreamHeader struct {
	// Kind is "proxy", "transparent" or "dns" (egress.Kind's values).
	Kind string `json:"kind"`
	// Dst is the original destination "ip:port" of a transparent connection (the local
	// address the connection was accepted on).
	Dst string `json:"dst,omitempty"`
	// Src is the local peer's address inside the sandbox ("127.0.0.1:40000"), for logs.
	Src string `json:"src,omitempty"`
	// FD says the frame came with the accepted socket's file descriptor (SCM_RIGHTS, in the
	// same sendmsg): the host serves that socket itself and the parked connection carries
	// nothing more. Only in a session opened with PassFDs.
	FD bool `json:"fd,omitempty"`
	// Listener (with FD, in a session opened with PassListeners) says the descriptor is the
	// listening socket of Kind bound at Dst: the host accepts from it for the session's life.
	Listener bool `json:"listener,omitempty"`
}

// DialPortRequest is the body of POST /v1/tcp.
type DialPortRequest struct {
	Port int `json:"port"`
}

// Bounds of the net protocol.
const (
	// MaxTransparentPorts bounds NetSessionRequest.TransparentPorts.
	MaxTransparentPorts = 8
	// netParkedIdle is how many connections the host keeps parked at the agent while nothing
	// asks for more; netParkedMax bounds them (parked or being dialed) in a burst, when the
	// agent asks for one more per local connection that found none waiting.
	netParkedIdle = 4
	// netParkedIdleHeld is how many the host keeps parked in a session that took the agent's
	// listeners with its reply: they carry only the resolver's UDP queries (and connections
	// the agent relays, e.g. MPTCP ones), and the demand byte asks for more.
	netParkedIdleHeld = 1
	netParkedMax      = 64
	// netParkedTrim: parked connections past netParkedIdle are closed by the agent once no
	// connection asked for one for this long.
	netParkedTrim = 30 * time.Second
	// netHeaderWait bounds the wait for the rest of a stream's header once its first byte came.
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
	if r.PassListeners && !r.PassFDs {
		return errcode.New(errcode.InvalidArgument, "pass_listeners needs pass_fds").With("field", "pass_listeners")
	}
	if r.ListenersInReply && !r.PassListeners {
		return errcode.New(errcode.InvalidArgument, "listeners_in_reply needs pass_listeners").With("field", "listeners_in_reply")
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

// closeWrite ends c's writing half: a FIN for TCP and unix connections.
func closeWrite(c net.Conn) error {
	if v, ok := c.(interface{ CloseWrite() error }); ok {
		return v.CloseWrite()
	}
	return c.Close()
}

// splice copies both ways between a and b (ar reads a; nil: a itself) until both directions
// end: a direction that ends cleanly half-closes its destination, one that fails ends both.
// Both are closed when it returns. Between a TCP and a unix connection io.Copy moves the bytes
// with splice(2) (TCPConn.ReadFrom and WriteTo), never through user space.
func splice(a net.Conn, ar io.Reader, b net.Conn) {
	if ar == nil {
		ar = a
	}
	abort := sync.OnceFunc(func() { _ = a.Close(); _ = b.Close() })
	one := func(dst net.Conn, src io.Reader) {
		if _, err := io.Copy(dst, src); err != nil {
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

// appendStreamHeader appends h as a frame: its 2-byte big-endian length, then its JSON.
func appendStreamHeader(buf []byte, h NetStreamHeader) []byte {
	line, _ := json.Marshal(h)
	buf = binary.BigEndian.AppendUint16(buf, uint16(len(line)))
	return append(buf, line...)
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
