package guest

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
