// Package egress is the host side of a sandbox's network: the policy (which hosts a sandbox
// may reach), the guarded dialer (names resolved once by agentbox, never-reachable address
// classes refused, the connection made to the address that was checked), the HTTP proxy
// (CONNECT and plain HTTP), the transparent path (TLS SNI or HTTP Host), the DNS answers
// for allowed names, and the record of every connection. The bytes reach it from inside the
// sandbox through the sandbox's own agent (guest.NetSession), never through a route: the
// sandbox has no route to the host's network.
//
// It knows nothing of sandboxes' records or of any adapter: the control plane hands it a
// Target per sandbox and a Recorder for what happened.
package egress

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"time"
)

// Policy is a sandbox's egress policy as users write it: entries are host names with an
// optional "*." wildcard and an optional ":port" (default 80 and 443), or CIDRs (with an
// optional ":port" after an IPv4 CIDR, or "[cidr]:port"). Deny wins over allow; "*" in
// allow means any public host.
type Policy struct {
	Allow []string `json:"allow"`
	Deny  []string `json:"deny"`
}

// Kind is how a connection reached the proxy.
type Kind string

const (
	// KindProxy is a connection to the HTTP proxy (HTTP_PROXY): CONNECT or a plain request.
	KindProxy Kind = "proxy"
	// KindTransparent is a TCP connection to any address on port 80 or 443, redirected
	// inside the sandbox; OrigDst is where it was going; the host reads SNI or Host.
	KindTransparent Kind = "transparent"
	// KindDNS is a stream of DNS messages, each with a 2-byte big-endian length (RFC 1035
	// TCP framing), from the sandbox's resolver address.
	KindDNS Kind = "dns"
)

// Decision values of a Connection.
const (
	Allowed = "allowed"
	Denied  = "denied"
	Failed  = "error" // allowed, but the upstream could not be reached
)

// Secret is one secret of a sandbox: the sandbox sees Placeholder in its environment as
// Name; the proxy swaps it for the value From resolves to ("env:VAR" or "file:/path"),
// in request headers (and the body when Body) of requests to Hosts only.
type Secret struct {
	Name        string   `json:"name"`
	Placeholder string   `json:"placeholder"`
	From        string   `json:"from"`
	Hosts       []string `json:"hosts"`
	Body        bool     `json:"body,omitempty"`
}

// Target is one sandbox as the proxy sees it.
type Target struct {
	SandboxID string
	// Policy returns the sandbox's current policy; it is called once per connection, so a
	// change applies to the next connection.
	Policy func() *Compiled
	// Secrets are the sandbox's secrets (nil: none, nothing is intercepted).
	Secrets []Secret
}

// Connection is the record of one connection (or one DNS query) of a sandbox.
type Connection struct {
	SandboxID string `json:"sandbox_id"`
	// Seq is assigned by the store.
	Seq         int64     `json:"seq"`
	Time        time.Time `json:"time"`
	Kind        Kind      `json:"kind"`
	Host        string    `json:"host"`
	Port        int       `json:"port"`
	Addr        string    `json:"addr,omitempty"` // the resolved address dialed
	Decision    string    `json:"decision"`
	Rule        string    `json:"rule,omitempty"`   // the policy entry that decided, or the built-in class
	Reason      string    `json:"reason,omitempty"` // why, in words, and how to change it when denied
	BytesOut    int64     `json:"bytes_out"`        // sandbox → upstream
	BytesIn     int64     `json:"bytes_in"`         // upstream → sandbox
	DurationMS  int64     `json:"duration_ms"`
	Intercepted bool      `json:"intercepted,omitempty"` // TLS terminated to swap secrets
}

// SecretCall is the record of one request that carried a secret's placeholder, or of one
// response from a secret's host that carried its value (Scrubbed > 0: the sandbox got the
// placeholder in its place), or that was refused because its body could not be scrubbed.
type SecretCall struct {
	SandboxID string    `json:"sandbox_id"`
	Seq       int64     `json:"seq"`
	Time      time.Time `json:"time"`
	Secret    string    `json:"secret"`
	Host      string    `json:"host"`
	Method    string    `json:"method"`
	Path      string    `json:"path"`
	// Replaced is false when the placeholder went to a host the secret does not list (it was
	// left as it was) or the value could not be resolved; Reason says which.
	Replaced bool `json:"replaced"`
	// Scrubbed is how many times the response to the request carried the secret's value
	// (headers, trailers and body, decoded), each replaced by its placeholder before it
	// reached the sandbox.
	Scrubbed int64  `json:"scrubbed,omitempty"`
	Reason   string `json:"reason,omitempty"`
}

// Recorder keeps what the proxy did. A connection that was not allowed (refused, or failed)
// is recorded before its refusal reaches the sandbox: RecordConnection returns once it is
// stored (or a bounded wait passed), so that a client reading the records right after the
// refusal finds it. Other records are written in batches behind the calls, which return at
// once.
type Recorder interface {
	RecordConnection(c Connection)
	RecordSecretCall(c SecretCall)
}

// Resolver resolves a name to addresses (net.DefaultResolver's LookupNetIP fits).
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Interceptor terminates TLS for the hosts a sandbox's secrets name, swaps placeholders,
// and forwards the requests upstream (package egress/mitm).
type Interceptor interface {
	// Wants reports whether connections of t to host carry secrets to swap.
	Wants(t *Target, host string) bool
	// Intercept serves the sandbox's side c (TLS when tls, else plain HTTP) as host:port,
	// forwarding each request over connections from dial (already checked by the policy).
	// It returns the bytes each way.
	Intercept(ctx context.Context, t *Target, c net.Conn, host string, port int, tls bool,
		dial func(context.Context) (net.Conn, error)) (out, in int64, err error)
}

// Config configures a Proxy.
type Config struct {
	// AllowCIDRs are private ranges opened for labs and tests (--egress-allow-cidr).
	AllowCIDRs []netip.Prefix
	// Resolver resolves names (nil: net.DefaultResolver).
	Resolver Resolver
	// HostAddrs returns the host's own addresses, never reachable (nil: the interfaces').
	HostAddrs func() []netip.Addr
	Recorder  Recorder
	// Interceptor swaps secrets (nil: secrets are not supported).
	Interceptor Interceptor
	Logger      *slog.Logger
	// DialTimeout bounds one upstream dial (0: 10 s).
	DialTimeout time.Duration
}
