package egress

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"
)

// Bounds of the guarded dialer.
const (
	// DefaultDialTimeout bounds one upstream dial, every address tried included.
	DefaultDialTimeout = 10 * time.Second
	// ResolveTimeout bounds one name resolution.
	ResolveTimeout = 5 * time.Second
	// MaxAddrs bounds the addresses of one name that are checked, dialed or answered.
	MaxAddrs     = 16
	hostAddrsTTL = 5 * time.Second
)

type addrClass struct {
	prefix netip.Prefix
	name   string
}

// neverReachable are the address classes no sandbox reaches unless the server opened a
// range (--egress-allow-cidr) holding the address, and the policy allows the host. The
// first match names the class, so the narrow ones come first.
var neverReachable = func() []addrClass {
	list := []struct{ cidr, name string }{
		{"169.254.169.254/32", "cloud metadata"},
		{"169.254.170.2/32", "cloud metadata"},
		{"100.100.100.200/32", "cloud metadata"},
		{"fd00:ec2::254/128", "cloud metadata"},
		{"255.255.255.255/32", "broadcast"},
		{"0.0.0.0/8", "this network"},
		{"10.0.0.0/8", "private (RFC 1918)"},
		{"100.64.0.0/10", "shared address space (CGNAT)"},
		{"127.0.0.0/8", "loopback"},
		{"169.254.0.0/16", "link-local"},
		{"172.16.0.0/12", "private (RFC 1918)"},
		{"192.0.0.0/24", "IETF protocol assignments"},
		{"192.0.2.0/24", "documentation"},
		{"192.88.99.0/24", "6to4 relay anycast"},
		{"192.168.0.0/16", "private (RFC 1918)"},
		{"198.18.0.0/15", "benchmarking"},
		{"198.51.100.0/24", "documentation"},
		{"203.0.113.0/24", "documentation"},
		{"224.0.0.0/4", "multicast"},
		{"240.0.0.0/4", "reserved"},
		{"::/128", "unspecified"},
		{"::1/128", "loopback"},
		{"::/96", "IPv4-compatible (deprecated)"},
		{"64:ff9b::/96", "NAT64"},
		{"64:ff9b:1::/48", "NAT64"},
		{"100::/64", "discard-only"},
		{"2001::/23", "IETF protocol assignments"},
		{"2001:db8::/32", "documentation"},
		{"2002::/16", "6to4"},
		{"3fff::/20", "documentation"},
		{"fc00::/7", "unique local (ULA)"},
		{"fe80::/10", "link-local"},
		{"fec0::/10", "site-local (deprecated)"},
		{"ff00::/8", "multicast"},
	}
	out := make([]addrClass, len(list))
	for i, c := range list {
		out[i] = addrClass{netip.MustParsePrefix(c.cidr), c.name}
	}
	return out
}()

// ClassOf names the never-reachable class of a ("" when a is an ordinary public address).
// IPv4-mapped IPv6 addresses are unwrapped first.
func ClassOf(a netip.Addr) string {
	a = a.Unmap().WithZone("")
	if !a.IsValid() {
		return "invalid address"
	}
	for _, c := range neverReachable {
		if c.prefix.Contains(a) {
			return c.name
		}
	}
	return ""
}

// refusedName names the class of a name that is never resolved nor dialed ("" if none).
func refusedName(name string) string {
	switch {
	case name == "localhost" || strings.HasSuffix(name, ".localhost"):
		return "localhost"
	case name == "metadata" || name == "metadata.google.internal" || name == "instance-data" ||
		strings.HasSuffix(name, ".internal"):
		return "internal name"
	case strings.HasSuffix(name, ".local"):
		return "mDNS name (.local)"
	case !strings.Contains(name, "."):
		return "single-label name"
	}
	return ""
}

// guard is the check every upstream address passes.
type guard struct {
	cfg      *Config
	mu       sync.Mutex
	hostAt   time.Time
	hostList []netip.Addr
}

func (g *guard) hostAddrs() []netip.Addr {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.hostList != nil && time.Since(g.hostAt) < hostAddrsTTL {
		return g.hostList
	}
	var list []netip.Addr
	if g.cfg.HostAddrs != nil {
		list = g.cfg.HostAddrs()
	} else if ifs, err := net.InterfaceAddrs(); err == nil {
		for _, ia := range ifs {
			if pn, ok := ia.(*net.IPNet); ok {
				if a, ok := netip.AddrFromSlice(pn.IP); ok {
					list = append(list, a.Unmap())
				}
			}
		}
	}
	if list == nil {
		list = []netip.Addr{}
	}
	g.hostList, g.hostAt = list, time.Now()
	return list
}

func (g *guard) opened(a netip.Addr) bool {
	for _, p := range g.cfg.AllowCIDRs {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// addrClass names why a may not be dialed ("" when it may): the host's own address (always:
// the server's own ports listen there, so no --egress-allow-cidr opens it), or a
// never-reachable class unless a range the server opened holds it. Loopback is a class of its
// own, not counted among the host's addresses, so that a lab can open 127.0.0.0/8 on purpose.
func (g *guard) addrClass(a netip.Addr) string {
	a = a.Unmap().WithZone("")
	if !a.IsLoopback() {
		for _, h := range g.hostAddrs() {
			if h.Unmap().WithZone("") == a {
				return "the host's own address"
			}
		}
	}
	if g.opened(a) {
		return ""
	}
	return ClassOf(a)
}

// checked is the outcome of the check of one destination.
type checked struct {
	host     string // normalised name or the IP literal
	port     int
	addrs    []netip.Addr // the addresses that passed, to dial in order
	decision string       // Allowed, Denied or Failed
	rule     string
	reason   string
}

func (c *checked) ok() bool { return c.decision == Allowed }

// check decides host:port under pol and, for a name, resolves it once and checks every
// answer: a name with any never-reachable answer is refused (a DNS rebinding guard).
// port 0 is a DNS lookup: any port of the rules; then only the passing answers are kept.
func (p *Proxy) check(ctx context.Context, pol *Compiled, host string, port int) checked {
	h := strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if a, err := netip.ParseAddr(h); err == nil {
		a = a.Unmap().WithZone("")
		out := checked{host: a.String(), port: port}
		// The address's class first, as for names: no rule opens it, so the refusal must not
		// tell the sandbox to add one.
		if cl := p.guard.addrClass(a); cl != "" {
			out.decision, out.rule = Denied, cl
			out.reason = fmt.Sprintf("%s is %s, never reachable", a, cl)
			return out
		}
		d := pol.DecideAddr(a, port)
		if !d.Allowed {
			out.decision, out.rule, out.reason = Denied, d.Rule, d.Reason
			return out
		}
		out.decision, out.rule, out.reason, out.addrs = Allowed, d.Rule, d.Reason, []netip.Addr{a}
		return out
	}
	name, ok := normalizeName(host)
	if !ok {
		return checked{host: clip(host, 253), port: port, decision: Denied, rule: "invalid name",
			reason: fmt.Sprintf("%q is not a valid host name", clip(host, 100))}
	}
	out := checked{host: name, port: port}
	if cl := refusedName(name); cl != "" {
		out.decision, out.rule = Denied, cl
		out.reason = fmt.Sprintf("%s is a %s, never reachable", name, cl)
		return out
	}
	d := pol.Decide(name, port)
	if !d.Allowed {
		out.decision, out.rule, out.reason = Denied, d.Rule, d.Reason
		return out
	}
	out.rule = d.Rule
	rctx, cancel := context.WithTimeout(ctx, ResolveTimeout)
	addrs, err := p.resolver.LookupNetIP(rctx, "ip", name)
	cancel()
	if err != nil || len(addrs) == 0 {
		if err == nil {
			err = errors.New("no addresses")
		}
		out.decision, out.reason = Failed, fmt.Sprintf("cannot resolve %s: %s", name, shortErr(err))
		return out
	}
	if len(addrs) > MaxAddrs {
		addrs = addrs[:MaxAddrs]
	}
	var v4, v6 []netip.Addr
	for _, a := range addrs {
		a = a.Unmap().WithZone("")
		why := p.guard.addrClass(a)
		if why == "" && port != 0 {
			if dd := pol.DecideAddr(a, port); !dd.Allowed && dd.Rule != "" {
				why = "denied by deny rule " + dd.Rule
				out.rule = dd.Rule
			}
		} else if why != "" {
			out.rule = why
		}
		if why != "" {
			if port == 0 {
				continue // DNS: answer only the addresses that pass
			}
			out.decision = Denied
			out.reason = fmt.Sprintf("%s resolves to %s (%s), never reachable", name, a, why)
			if strings.HasPrefix(why, "denied by") {
				out.reason = fmt.Sprintf("%s resolves to %s, %s", name, a, why)
			}
			return out
		}
		if a.Is4() {
			v4 = append(v4, a)
		} else {
			v6 = append(v6, a)
		}
	}
	out.addrs = append(v4, v6...)
	if len(out.addrs) == 0 {
		out.decision = Denied
		out.reason = fmt.Sprintf("%s resolves only to never-reachable addresses (%s)", name, out.rule)
		return out
	}
	out.rule = d.Rule
	out.decision, out.reason = Allowed, d.Reason
	return out
}

// dialChecked connects to the checked addresses in order (never to the name), within the
// dial timeout for all of them.
func (p *Proxy) dialChecked(ctx context.Context, c *checked) (net.Conn, netip.AddrPort, error) {
	ctx, cancel := context.WithTimeout(ctx, p.dialTimeout)
	defer cancel()
	var d net.Dialer
	var last error
	for _, a := range c.addrs {
		ap := netip.AddrPortFrom(a, uint16(c.port))
		conn, err := d.DialContext(ctx, "tcp", ap.String())
		if err == nil {
			return conn, ap, nil
		}
		last = err
		if ctx.Err() != nil {
			break
		}
	}
	if last == nil {
		last = errors.New("no address to dial")
	}
	return nil, netip.AddrPort{}, last
}

func shortErr(err error) string {
	var de *net.DNSError
	if errors.As(err, &de) {
		if de.IsNotFound {
			return "no such host"
		}
		if de.IsTimeout {
			return "timeout"
		}
		return de.Err
	}
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Err != nil {
		return clip(oe.Err.Error(), 200)
	}
	return clip(err.Error(), 200)
}
