package egress

import (
	"bufio"
	"context"
	"encoding/binary"
	"io"
	"net"
	"strings"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// DNS bounds.
const (
	// DNSTTL is the TTL of every answer: a policy change reaches the sandbox's cache soon.
	DNSTTL = 30
	// maxDNSReply keeps replies within what a UDP client takes without truncation.
	maxDNSReply = 512
)

func (p *Proxy) serveDNS(ctx context.Context, t *Target, c net.Conn) {
	br := bufio.NewReaderSize(c, 4096)
	buf := make([]byte, 65535)
	var lb [2]byte
	for ctx.Err() == nil {
		c.SetReadDeadline(time.Now().Add(IdleTimeout))
		if _, err := io.ReadFull(br, lb[:]); err != nil {
			return
		}
		n := int(binary.BigEndian.Uint16(lb[:]))
		if _, err := io.ReadFull(br, buf[:n]); err != nil {
			return
		}
		c.SetReadDeadline(time.Time{})
		start := time.Now()
		reply, rec := p.answerDNS(ctx, t, buf[:n])
		if rec != nil {
			p.record(*rec, start)
		}
		if reply == nil {
			return
		}
		out := make([]byte, 2+len(reply))
		binary.BigEndian.PutUint16(out, uint16(len(reply)))
		copy(out[2:], reply)
		c.SetWriteDeadline(time.Now().Add(IdleTimeout))
		if _, err := c.Write(out); err != nil {
			return
		}
	}
}

// answerDNS answers one DNS message. A nil reply closes the stream (nothing to answer to).
func (p *Proxy) answerDNS(ctx context.Context, t *Target, msg []byte) ([]byte, *Connection) {
	var ps dnsmessage.Parser
	h, err := ps.Start(msg)
	if err != nil {
		if len(msg) < 2 {
			return nil, nil
		}
		return dnsError(binary.BigEndian.Uint16(msg), false, nil, dnsmessage.RCodeFormatError), nil
	}
	if h.Response {
		return dnsError(h.ID, h.RecursionDesired, nil, dnsmessage.RCodeFormatError), nil
	}
	qs, err := ps.AllQuestions()
	if err != nil || len(qs) != 1 {
		return dnsError(h.ID, h.RecursionDesired, nil, dnsmessage.RCodeFormatError), nil
	}
	q := qs[0]
	rawName := strings.TrimSuffix(q.Name.String(), ".")
	rec := &Connection{SandboxID: t.SandboxID, Kind: KindDNS, Host: clip(rawName, 253), Port: 53, Decision: Denied}
	if h.OpCode != 0 {
		rec.Reason = "only standard queries are answered"
		return dnsError(h.ID, h.RecursionDesired, &q, dnsmessage.RCodeNotImplemented), rec
	}
	if q.Class != dnsmessage.ClassINET {
		rec.Reason = "query class " + q.Class.String() + " is not answered"
		return dnsError(h.ID, h.RecursionDesired, &q, dnsmessage.RCodeRefused), rec
	}
	switch q.Type {
	case dnsmessage.TypeAAAA:
		rec.Decision, rec.Reason = Allowed, "AAAA is answered empty: sandboxes reach the network over IPv4"
		return dnsReply(h.ID, h.RecursionDesired, q, nil), rec
	case dnsmessage.TypeA:
	default:
		rec.Reason = "query type " + strings.TrimPrefix(q.Type.String(), "Type") + " is not answered (only A and AAAA)"
		return dnsError(h.ID, h.RecursionDesired, &q, dnsmessage.RCodeRefused), rec
	}
	ck := p.check(ctx, policyOf(t), rawName, 0)
	rec.Host, rec.Decision, rec.Rule, rec.Reason = ck.host, ck.decision, ck.rule, ck.reason
	var v4 [][4]byte
	var addrs []string
	for _, a := range ck.addrs {
		if a.Is4() && len(v4) < MaxAddrs {
			v4 = append(v4, a.As4())
			addrs = append(addrs, a.String())
		}
	}
	if !ck.ok() || len(v4) == 0 {
		if ck.ok() {
			rec.Decision, rec.Reason = Denied, ck.host+" has no reachable IPv4 address"
		}
		return dnsError(h.ID, h.RecursionDesired, &q, dnsmessage.RCodeRefused), rec
	}
	rec.Addr = strings.Join(addrs, ",")
	return dnsReply(h.ID, h.RecursionDesired, q, v4), rec
}

func dnsHeader(id uint16, rd bool, rcode dnsmessage.RCode) dnsmessage.Header {
	return dnsmessage.Header{ID: id, Response: true, RecursionDesired: rd, RecursionAvailable: true, RCode: rcode}
}

func dnsError(id uint16, rd bool, q *dnsmessage.Question, rcode dnsmessage.RCode) []byte {
	b := dnsmessage.NewBuilder(make([]byte, 0, 512), dnsHeader(id, rd, rcode))
	b.EnableCompression()
	if q != nil {
		if b.StartQuestions() == nil && b.Question(*q) != nil {
			b = dnsmessage.NewBuilder(make([]byte, 0, 512), dnsHeader(id, rd, rcode))
		}
	}
	out, err := b.Finish()
	if err != nil {
		// The header alone always builds.
		hb := dnsmessage.NewBuilder(make([]byte, 0, 12), dnsHeader(id, rd, rcode))
		out, _ = hb.Finish()
	}
	return out
}

func dnsReply(id uint16, rd bool, q dnsmessage.Question, v4 [][4]byte) []byte {
	b := dnsmessage.NewBuilder(make([]byte, 0, 512), dnsHeader(id, rd, dnsmessage.RCodeSuccess))
	b.EnableCompression()
	if b.StartQuestions() != nil || b.Question(q) != nil || b.StartAnswers() != nil {
		return dnsError(id, rd, nil, dnsmessage.RCodeServerFailure)
	}
	for _, a := range v4 {
		rh := dnsmessage.ResourceHeader{Name: q.Name, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET, TTL: DNSTTL}
		if b.AResource(rh, dnsmessage.AResource{A: a}) != nil {
			return dnsError(id, rd, nil, dnsmessage.RCodeServerFailure)
		}
	}
	out, err := b.Finish()
	if err != nil {
		return dnsError(id, rd, nil, dnsmessage.RCodeServerFailure)
	}
	if len(out) > maxDNSReply {
		h := dnsHeader(id, rd, dnsmessage.RCodeSuccess)
		h.Truncated = true
		tb := dnsmessage.NewBuilder(make([]byte, 0, 512), h)
		tb.StartQuestions()
		tb.Question(q)
		if out, err = tb.Finish(); err != nil {
			return dnsError(id, rd, nil, dnsmessage.RCodeServerFailure)
		}
	}
	return out
}
