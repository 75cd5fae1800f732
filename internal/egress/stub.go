package egress

// This file is the skeleton's: the egress engineer replaces it with policy.go and proxy.go.

import (
	"context"
	"net"
	"net/netip"

	"github.com/agentbox/agentbox/internal/errcode"
)

// Compiled is a validated Policy, ready to decide.
type Compiled struct{ p Policy }

// ParsePolicy validates p: an INVALID_ARGUMENT error names the entry ("allow[2]") and what
// it must be.
func ParsePolicy(p Policy) (*Compiled, error) { return &Compiled{p: p}, nil }

// Policy returns the policy as written (normalised).
func (c *Compiled) Policy() Policy { return c.p }

// Proxy serves the egress streams of every sandbox of a server.
type Proxy struct{ cfg Config }

// New returns a Proxy.
func New(cfg Config) (*Proxy, error) { return &Proxy{cfg: cfg}, nil }

// Serve handles one stream from a sandbox's agent and closes c: kind says how it came;
// origDst is the original destination of a transparent connection.
func (p *Proxy) Serve(ctx context.Context, t *Target, c net.Conn, kind Kind, origDst netip.AddrPort) {
	c.Close()
}

var _ = errcode.InvalidArgument
