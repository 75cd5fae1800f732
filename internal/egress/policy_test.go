package egress

import (
	"fmt"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/errcode"
)

func TestParsePolicyErrors(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("a", 250) + ".com"
	many := make([]string, MaxPolicyEntries+1)
	for i := range many {
		many[i] = fmt.Sprintf("h%d.example.com", i)
	}
	cases := []struct {
		name  string
		p     Policy
		field string
		index int
		want  string
	}{
		{"scheme", Policy{Allow: []string{"a.com", "b.com", "htp://x"}}, "network.allow", 2,
			`network.allow[2]: "htp://x" is not a host name, *.wildcard, CIDR or IP; write e.g. pypi.org, *.github.com:443 or 10.0.0.0/8`},
		{"empty", Policy{Allow: []string{""}}, "network.allow", 0, "is empty"},
		{"too long", Policy{Allow: []string{long}}, "network.allow", 0, "at most 253"},
		{"port 0", Policy{Allow: []string{"a.com:0"}}, "network.allow", 0, "port is 1-65535"},
		{"port big", Policy{Deny: []string{"a.com:99999"}}, "network.deny", 0, "a port is"},
		{"port word", Policy{Allow: []string{"a.com:https"}}, "network.allow", 0, "a port is a number 1-65535"},
		{"bare star dot", Policy{Allow: []string{"*."}}, "network.allow", 0, "is not a host name"},
		{"double dot", Policy{Allow: []string{"a..com"}}, "network.allow", 0, "is not a host name"},
		{"hyphen", Policy{Allow: []string{"-a.com"}}, "network.allow", 0, "is not a host name"},
		{"bad cidr", Policy{Allow: []string{"1.2.3.4/33"}}, "network.allow", 0, "is not a host name"},
		{"open bracket", Policy{Allow: []string{"[fd00::/8"}}, "network.allow", 0, "is not a host name"},
		{"v4 in brackets", Policy{Allow: []string{"[1.2.3.4]:80"}}, "network.allow", 0, "is not a host name"},
		{"mid wildcard", Policy{Allow: []string{"a.*.com"}}, "network.allow", 0, "is not a host name"},
		{"numeric tld", Policy{Allow: []string{"1.2.3.999"}}, "network.allow", 0, "is not a host name"},
		{"space inside", Policy{Allow: []string{"a b.com"}}, "network.allow", 0, "is not a host name"},
		{"path", Policy{Allow: []string{"a.com/x"}}, "network.allow", 0, "is not a host name"},
		{"too many", Policy{Allow: many}, "network.allow", -1, "has 257 entries; at most 256"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParsePolicy(tc.p)
			e, ok := errcode.As(err)
			if !ok || e.Code != errcode.InvalidArgument {
				t.Fatalf("err = %v, want INVALID_ARGUMENT", err)
			}
			if !strings.Contains(e.Message, tc.want) {
				t.Fatalf("message %q does not contain %q", e.Message, tc.want)
			}
			if e.Details["field"] != tc.field {
				t.Fatalf("details = %v", e.Details)
			}
			if tc.index >= 0 && e.Details["index"] != tc.index {
				t.Fatalf("details = %v", e.Details)
			}
		})
	}
}

func TestParsePolicyNormalises(t *testing.T) {
	t.Parallel()
	c, err := ParsePolicy(Policy{
		Allow: []string{" PyPI.org. ", "bücher.de", "*.GitHub.com:443", "10.1.2.3/8", "[FD00::/8]:443",
			"1.2.3.4", "1.2.3.4/32:5432", "fd00::1", "::ffff:8.8.8.8", "pypi.org", "*", "*:8080"},
		Deny: nil,
	})
	if err != nil {
		t.Fatal(err)
	}
	want := Policy{
		Allow: []string{"pypi.org", "xn--bcher-kva.de", "*.github.com:443", "10.0.0.0/8", "[fd00::/8]:443",
			"1.2.3.4", "1.2.3.4:5432", "fd00::1", "8.8.8.8", "*", "*:8080"},
		Deny: []string{},
	}
	if got := c.Policy(); !reflect.DeepEqual(got, want) {
		t.Fatalf("Policy() = %#v\nwant %#v", got, want)
	}
	// The normalised policy parses to itself.
	c2, err := ParsePolicy(c.Policy())
	if err != nil || !reflect.DeepEqual(c2.Policy(), want) {
		t.Fatalf("round trip: %v %#v", err, c2.Policy())
	}
}

func TestDecide(t *testing.T) {
	t.Parallel()
	pol := MustParsePolicy(Policy{
		Allow: []string{"pypi.org", "*.github.com", "api.example.com:8443", "bücher.de", "10.0.0.0/8", "[fd00::/8]:443",
			"1.2.3.4/32:5432", "evil.com", "*.deny-sub.com"},
		Deny: []string{"evil.com", "x.deny-sub.com:443", "10.9.0.0/16"},
	})
	cases := []struct {
		host    string
		port    int
		allowed bool
		rule    string
	}{
		{"pypi.org", 443, true, "pypi.org"},
		{"PYPI.ORG.", 80, true, "pypi.org"},
		{"pypi.org", 8080, false, ""},    // default ports only
		{"www.pypi.org", 443, false, ""}, // exact name only
		{"github.com", 443, false, ""},   // wildcard: not the apex
		{"api.github.com", 443, true, "*.github.com"},
		{"a.b.github.com", 80, true, "*.github.com"},
		{"xgithub.com", 443, false, ""},
		{"api.example.com", 8443, true, "api.example.com:8443"},
		{"api.example.com", 443, false, ""},
		{"xn--bcher-kva.de", 443, true, "xn--bcher-kva.de"},
		{"BÜCHER.de", 443, true, "xn--bcher-kva.de"},
		{"evil.com", 443, false, "evil.com"}, // deny wins
		{"evil.com", 9999, false, "evil.com"},
		{"x.deny-sub.com", 443, false, "x.deny-sub.com:443"},
		{"x.deny-sub.com", 80, true, "*.deny-sub.com"}, // deny port-specific
		{"10.1.2.3", 443, true, "10.0.0.0/8"},
		{"10.9.1.1", 443, false, "10.9.0.0/16"},
		{"10.1.2.3", 22, false, ""},
		{"[fd00::5]", 443, true, "[fd00::/8]:443"},
		{"fd00::5", 80, false, ""},
		{"1.2.3.4", 5432, true, "1.2.3.4:5432"},
		{"1.2.3.4", 443, false, ""},
		{"::ffff:1.2.3.4", 5432, true, "1.2.3.4:5432"},
		{"8.8.8.8", 443, false, ""}, // IP literal: only CIDR rules
		{"not a name", 443, false, ""},
		// port 0: a DNS lookup, any port of the rules.
		{"api.example.com", 0, true, "api.example.com:8443"},
		{"x.deny-sub.com", 0, true, "*.deny-sub.com"},
		{"evil.com", 0, false, "evil.com"},
		{"nope.org", 0, false, ""},
	}
	for _, tc := range cases {
		d := pol.Decide(tc.host, tc.port)
		if d.Allowed != tc.allowed || d.Rule != tc.rule {
			t.Errorf("Decide(%q, %d) = %+v, want allowed=%v rule=%q", tc.host, tc.port, d, tc.allowed, tc.rule)
		}
		if !d.Allowed && d.Rule == "" && !strings.Contains(d.Reason, "no allow rule matches") && !strings.Contains(d.Reason, "not a valid host") {
			t.Errorf("Decide(%q, %d) reason = %q", tc.host, tc.port, d.Reason)
		}
	}

	star := MustParsePolicy(Policy{Allow: []string{"*"}})
	if d := star.Decide("anything.example", 443); !d.Allowed || d.Rule != "*" {
		t.Fatalf("allow * = %+v", d)
	}
	if d := star.Decide("anything.example", 22); d.Allowed {
		t.Fatalf("allow * on port 22 = %+v", d)
	}
	if d := star.DecideAddr(netip.MustParseAddr("8.8.8.8"), 443); d.Allowed {
		t.Fatalf("allow * must not allow IP literals: %+v", d)
	}
	denyAll := MustParsePolicy(Policy{Allow: []string{"pypi.org", "0.0.0.0/0"}, Deny: []string{"*"}})
	for _, h := range []string{"pypi.org", "8.8.8.8"} {
		if d := denyAll.Decide(h, 443); d.Allowed || d.Rule != "*" {
			t.Fatalf("deny * on %s = %+v", h, d)
		}
	}
	var none *Compiled
	if d := none.Decide("pypi.org", 443); d.Allowed {
		t.Fatal("a nil policy allows nothing")
	}
	empty := MustParsePolicy(Policy{})
	if d := empty.Decide("pypi.org", 443); d.Allowed || d.Reason != "no allow rule matches" {
		t.Fatalf("empty policy = %+v", d)
	}
}

func TestClassOf(t *testing.T) {
	t.Parallel()
	for addr, want := range map[string]string{
		"127.0.0.1": "loopback", "10.1.1.1": "private (RFC 1918)", "172.16.0.1": "private (RFC 1918)",
		"192.168.1.1": "private (RFC 1918)", "100.64.0.1": "shared address space (CGNAT)",
		"169.254.169.254": "cloud metadata", "169.254.1.1": "link-local", "0.0.0.0": "this network",
		"224.0.0.1": "multicast", "255.255.255.255": "broadcast", "240.0.0.1": "reserved",
		"192.0.2.1": "documentation", "::1": "loopback", "::": "unspecified", "fd00:ec2::254": "cloud metadata",
		"fc00::1": "unique local (ULA)", "fe80::1": "link-local", "ff02::1": "multicast",
		"::ffff:127.0.0.1": "loopback", "::ffff:10.0.0.1": "private (RFC 1918)", "2001:db8::1": "documentation",
		"64:ff9b::a00:1": "NAT64", "8.8.8.8": "", "2606:4700::1111": "", "93.184.216.34": "",
	} {
		if got := ClassOf(netip.MustParseAddr(addr)); got != want {
			t.Errorf("ClassOf(%s) = %q, want %q", addr, got, want)
		}
	}
}
