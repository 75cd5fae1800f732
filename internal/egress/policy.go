package egress

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"golang.org/x/net/idna"

	"github.com/agentbox/agentbox/internal/errcode"
)

// Bounds of a policy.
const (
	// MaxPolicyEntries bounds each of allow and deny.
	MaxPolicyEntries = 256
	// MaxEntryLen bounds one entry, in bytes.
	MaxEntryLen = 253
)

// Decision is what a policy says about one destination.
type Decision struct {
	Allowed bool
	// Rule is the (normalised) policy entry that decided, "" when no rule matched.
	Rule string
	// Reason says why, in words.
	Reason string
}

type ruleKind int

const (
	ruleHost     ruleKind = iota // exact name
	ruleWildcard                 // "*.name": subdomains of name, not name itself
	ruleAny                      // "*": any name (deny: anything at all)
	ruleCIDR                     // an address range (IP literals and resolved addresses)
)

type rule struct {
	text   string // normalised entry
	kind   ruleKind
	name   string // ruleHost: the name; ruleWildcard: the suffix without "*."
	prefix netip.Prefix
	port   int // 0: the default ports (allow: 80 and 443; deny: every port)
}

// Compiled is a validated Policy, ready to decide. It is immutable: safe for concurrent use.
type Compiled struct {
	allow, deny []rule
}

// ParsePolicy validates p: an INVALID_ARGUMENT error names the entry ("network.allow[2]")
// and what it must be. Names are lower-cased and converted to ASCII (IDNA); CIDRs are
// masked; exact duplicates are dropped.
func ParsePolicy(p Policy) (*Compiled, error) {
	allow, err := parseRules("network.allow", p.Allow)
	if err != nil {
		return nil, err
	}
	deny, err := parseRules("network.deny", p.Deny)
	if err != nil {
		return nil, err
	}
	return &Compiled{allow: allow, deny: deny}, nil
}

// MustParsePolicy is ParsePolicy for literals known to be valid (tests, defaults); it panics
// on an invalid policy.
func MustParsePolicy(p Policy) *Compiled {
	c, err := ParsePolicy(p)
	if err != nil {
		panic(err)
	}
	return c
}

// Policy returns the normalised policy (allow and deny are never nil).
func (c *Compiled) Policy() Policy {
	out := Policy{Allow: []string{}, Deny: []string{}}
	if c == nil {
		return out
	}
	for _, r := range c.allow {
		out.Allow = append(out.Allow, r.text)
	}
	for _, r := range c.deny {
		out.Deny = append(out.Deny, r.text)
	}
	return out
}

func parseRules(field string, entries []string) ([]rule, error) {
	if len(entries) > MaxPolicyEntries {
		return nil, errcode.New(errcode.InvalidArgument, "%s has %d entries; at most %d",
			field, len(entries), MaxPolicyEntries).With("field", field).With("count", len(entries))
	}
	out := make([]rule, 0, len(entries))
	seen := make(map[string]bool, len(entries))
	for i, e := range entries {
		r, err := parseRule(e)
		if err != nil {
			return nil, errcode.New(errcode.InvalidArgument, "%s[%d]: %q %s", field, i, clip(e, 300), err.Error()).
				With("field", field).With("index", i)
		}
		if !seen[r.text] {
			seen[r.text] = true
			out = append(out, r)
		}
	}
	return out, nil
}

type entryError string

func (e entryError) Error() string { return string(e) }

const notAnEntry = entryError("is not a host name, *.wildcard, CIDR or IP; write e.g. pypi.org, *.github.com:443 or 10.0.0.0/8")

func parseRule(e string) (rule, error) {
	e = strings.TrimSpace(e)
	if e == "" {
		return rule{}, entryError("is empty; write e.g. pypi.org, *.github.com:443 or 10.0.0.0/8")
	}
	if len(e) > MaxEntryLen {
		return rule{}, entryError(fmt.Sprintf("is %d bytes long; an entry is at most %d", len(e), MaxEntryLen))
	}
	if strings.Contains(e, "://") || strings.ContainsAny(e, " \t?#@") {
		return rule{}, notAnEntry
	}
	hostPart, port, err := splitEntryPort(e)
	if err != nil {
		return rule{}, err
	}
	// "[v6]" or "[v6/bits]".
	if strings.HasPrefix(hostPart, "[") {
		if !strings.HasSuffix(hostPart, "]") {
			return rule{}, notAnEntry
		}
		hostPart = hostPart[1 : len(hostPart)-1]
		if pr, ok := parseCIDROrIP(hostPart); ok && pr.Addr().Is6() {
			return cidrRule(pr, port), nil
		}
		return rule{}, notAnEntry
	}
	if pr, ok := parseCIDROrIP(hostPart); ok {
		return cidrRule(pr, port), nil
	}
	if hostPart == "*" {
		return rule{text: withPort("*", port), kind: ruleAny, port: port}, nil
	}
	kind := ruleHost
	name := hostPart
	if strings.HasPrefix(name, "*.") {
		kind, name = ruleWildcard, name[2:]
	}
	n, ok := normalizeName(name)
	if !ok {
		return rule{}, notAnEntry
	}
	text := n
	if kind == ruleWildcard {
		text = "*." + n
	}
	return rule{text: withPort(text, port), kind: kind, name: n, port: port}, nil
}

// splitEntryPort splits an optional ":port" off e. A bare IPv6 address or CIDR (more than
// one colon, no brackets) has no port.
func splitEntryPort(e string) (string, int, error) {
	if strings.HasPrefix(e, "[") {
		end := strings.IndexByte(e, ']')
		if end < 0 {
			return "", 0, notAnEntry
		}
		rest := e[end+1:]
		if rest == "" {
			return e, 0, nil
		}
		if rest[0] != ':' {
			return "", 0, notAnEntry
		}
		p, err := parsePort(rest[1:])
		return e[:end+1], p, err
	}
	if strings.Count(e, ":") == 1 {
		i := strings.IndexByte(e, ':')
		p, err := parsePort(e[i+1:])
		return e[:i], p, err
	}
	if slash := strings.IndexByte(e, '/'); slash >= 0 && strings.Count(e[slash:], ":") == 1 {
		// "fd00::/8:443": the port follows the prefix length.
		i := strings.LastIndexByte(e, ':')
		p, err := parsePort(e[i+1:])
		return e[:i], p, err
	}
	return e, 0, nil
}

func parsePort(s string) (int, error) {
	if s == "" || len(s) > 5 || strings.TrimLeft(s, "0123456789") != "" {
		return 0, entryError(fmt.Sprintf("has port %q; a port is a number 1-65535", clip(s, 20)))
	}
	n, _ := strconv.Atoi(s)
	if n < 1 || n > 65535 {
		return 0, entryError(fmt.Sprintf("has port %d; a port is 1-65535", n))
	}
	return n, nil
}

func parseCIDROrIP(s string) (netip.Prefix, bool) {
	if strings.Contains(s, "/") {
		pr, err := netip.ParsePrefix(s)
		if err != nil || pr.Addr().Zone() != "" {
			return netip.Prefix{}, false
		}
		if pr.Addr().Is4In6() {
			a := pr.Addr().Unmap()
			bits := pr.Bits() - 96
			if bits < 0 {
				return netip.Prefix{}, false
			}
			pr = netip.PrefixFrom(a, bits)
		}
		return pr.Masked(), true
	}
	a, err := netip.ParseAddr(s)
	if err != nil || a.Zone() != "" {
		return netip.Prefix{}, false
	}
	a = a.Unmap()
	return netip.PrefixFrom(a, a.BitLen()), true
}

func cidrRule(pr netip.Prefix, port int) rule {
	var text string
	if pr.IsSingleIP() {
		text = pr.Addr().String()
	} else {
		text = pr.String()
	}
	if port != 0 && pr.Addr().Is6() {
		text = "[" + text + "]"
	}
	return rule{text: withPort(text, port), kind: ruleCIDR, prefix: pr, port: port}
}

func withPort(s string, port int) string {
	if port == 0 {
		return s
	}
	return s + ":" + strconv.Itoa(port)
}

var idnaProfile = idna.New(idna.MapForLookup(), idna.Transitional(false), idna.BidiRule(),
	idna.ValidateLabels(true), idna.StrictDomainName(false))

// NormalizeName lower-cases name, drops one trailing dot, converts it to ASCII (IDNA) and
// validates it as a DNS name (labels of 1-63 letters, digits, '-' or '_', at most 253 bytes).
func NormalizeName(name string) (string, bool) { return normalizeName(name) }

func normalizeName(name string) (string, bool) {
	name = strings.TrimSuffix(strings.ToLower(name), ".")
	if name == "" || len(name) > 253 {
		return "", false
	}
	ascii := true
	for i := 0; i < len(name); i++ {
		if name[i] >= 0x80 {
			ascii = false
			break
		}
	}
	if !ascii {
		a, err := idnaProfile.ToASCII(name)
		if err != nil {
			return "", false
		}
		name = strings.ToLower(a)
	}
	if len(name) > 253 {
		return "", false
	}
	for _, label := range strings.Split(name, ".") {
		if len(label) == 0 || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return "", false
		}
		for i := 0; i < len(label); i++ {
			ch := label[i]
			if !(ch >= 'a' && ch <= 'z' || ch >= '0' && ch <= '9' || ch == '-' || ch == '_') {
				return "", false
			}
		}
	}
	// All-numeric last label: an IP-looking thing that did not parse as an IP.
	last := name[strings.LastIndexByte(name, '.')+1:]
	if strings.TrimLeft(last, "0123456789") == "" {
		return "", false
	}
	return name, true
}

// portMatches: port 0 asks "any port" (a DNS lookup): every rule matches it.
func (r *rule) portMatches(port int, deny bool) bool {
	if port == 0 {
		return !deny || r.port == 0
	}
	if r.port != 0 {
		return r.port == port
	}
	return deny || port == 80 || port == 443
}

func (r *rule) matchesName(name string) bool {
	switch r.kind {
	case ruleHost:
		return name == r.name
	case ruleWildcard:
		return len(name) > len(r.name)+1 && strings.HasSuffix(name, r.name) && name[len(name)-len(r.name)-1] == '.'
	case ruleAny:
		return true
	}
	return false
}

func (r *rule) matchesAddr(a netip.Addr, deny bool) bool {
	switch r.kind {
	case ruleCIDR:
		return r.prefix.Contains(a)
	case ruleAny:
		return deny // "*" in allow means any public host by name; in deny, anything
	}
	return false
}

// Decide decides a connection to host:port; host is a name or an IP literal (an IP
// literal is decided by CIDR rules only). Port 0 means "any port": a DNS lookup of host is
// allowed when an allow rule matches it on some port and no deny rule covers every port.
// Deny wins over allow; no matching allow rule denies.
func (c *Compiled) Decide(host string, port int) Decision {
	h := strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if a, err := netip.ParseAddr(h); err == nil {
		return c.DecideAddr(a, port)
	}
	name, ok := normalizeName(host)
	if !ok {
		return Decision{Reason: fmt.Sprintf("%q is not a valid host name", clip(host, 100))}
	}
	if c == nil {
		return Decision{Reason: "no allow rule matches"}
	}
	for i := range c.deny {
		r := &c.deny[i]
		if r.matchesName(name) && r.portMatches(port, true) {
			return Decision{Rule: r.text, Reason: fmt.Sprintf("denied by deny rule %q", r.text)}
		}
	}
	for i := range c.allow {
		r := &c.allow[i]
		if r.matchesName(name) && r.portMatches(port, false) {
			return Decision{Allowed: true, Rule: r.text, Reason: fmt.Sprintf("allowed by %q", r.text)}
		}
	}
	return Decision{Reason: "no allow rule matches"}
}

// DecideAddr decides a connection to an IP address (an IP literal, or a transparent
// connection without a name): only CIDR/IP rules allow it; deny "*" and deny CIDRs deny it.
func (c *Compiled) DecideAddr(a netip.Addr, port int) Decision {
	a = a.Unmap().WithZone("")
	if c == nil {
		return Decision{Reason: "no allow rule matches"}
	}
	for i := range c.deny {
		r := &c.deny[i]
		if r.matchesAddr(a, true) && r.portMatches(port, true) {
			return Decision{Rule: r.text, Reason: fmt.Sprintf("denied by deny rule %q", r.text)}
		}
	}
	for i := range c.allow {
		r := &c.allow[i]
		if r.matchesAddr(a, false) && r.portMatches(port, false) {
			return Decision{Allowed: true, Rule: r.text, Reason: fmt.Sprintf("allowed by %q", r.text)}
		}
	}
	return Decision{Reason: "no allow rule matches (an IP address needs a CIDR or IP rule)"}
}

// addrAllowedByCIDR reports whether an allow CIDR rule (not denied) names a, on port.
func (c *Compiled) addrAllowedByCIDR(a netip.Addr, port int) bool {
	d := c.DecideAddr(a, port)
	return d.Allowed
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
