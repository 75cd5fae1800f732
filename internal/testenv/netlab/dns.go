package netlab

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"strings"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// Special names of the lab's DNS server.
const (
	// EvilLoopback resolves to 127.0.0.1.
	EvilLoopback = "evil-loopback.lab"
	// EvilMetadata resolves to the cloud metadata address 169.254.169.254.
	EvilMetadata = "evil-metadata.lab"
	// Rebind resolves to the lab's address RebindFirst on its first A answer (after
	// ResetRebind) and to 127.0.0.1 on every later one; so does every "rebind-X.lab", each
	// name with its own count (tests sharing a lab use a name each).
	Rebind = "rebind.lab"
)

// maxQueries bounds the query log.
const maxQueries = 10000

// startDNS serves the lab's names on UDP and TCP port 53 of every lab address.
func (l *Lab) startDNS() error {
	pc, err := l.ListenPacket("udp4", "0.0.0.0:53")
	if err != nil {
		return err
	}
	ln, err := l.Listen("tcp4", "0.0.0.0:53")
	if err != nil {
		pc.Close()
		return err
	}
	l.closers = append(l.closers, func() { pc.Close(); ln.Close() })
	go func() {
		buf := make([]byte, 4096)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if out := l.answer(buf[:n], "udp"); out != nil {
				pc.WriteTo(out, from)
			}
		}
	}()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				for {
					c.SetDeadline(time.Now().Add(10 * time.Second))
					var hdr [2]byte
					if _, err := io.ReadFull(c, hdr[:]); err != nil {
						return
					}
					msg := make([]byte, binary.BigEndian.Uint16(hdr[:]))
					if _, err := io.ReadFull(c, msg); err != nil {
						return
					}
					out := l.answer(msg, "tcp")
					if out == nil {
						return
					}
					binary.BigEndian.PutUint16(hdr[:], uint16(len(out)))
					if _, err := c.Write(append(hdr[:], out...)); err != nil {
						return
					}
				}
			}()
		}
	}()
	return nil
}

// answer builds the reply to one DNS message (nil: unparseable, no reply).
func (l *Lab) answer(msg []byte, network string) []byte {
	var p dnsmessage.Parser
	h, err := p.Start(msg)
	if err != nil {
		return nil
	}
	q, err := p.Question()
	if err != nil {
		return nil
	}
	name := strings.ToLower(strings.TrimSuffix(q.Name.String(), "."))
	typ := strings.TrimPrefix(q.Type.String(), "Type")
	l.mu.Lock()
	if len(l.queries) < maxQueries {
		l.queries = append(l.queries, Query{Name: name, Type: typ, Net: network})
	}
	l.mu.Unlock()
	rh := dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RecursionDesired: h.RecursionDesired, RecursionAvailable: true}
	var addr [4]byte
	found := true
	ttl := uint32(5)
	switch {
	case name == EvilLoopback:
		addr = [4]byte{127, 0, 0, 1}
	case name == EvilMetadata:
		addr = [4]byte{169, 254, 169, 254}
	case name == Rebind || strings.HasPrefix(name, "rebind-") && strings.HasSuffix(name, ".lab"):
		l.mu.Lock()
		first := l.rebinds[name] == 0
		if q.Type == dnsmessage.TypeA && len(l.rebinds) < maxQueries {
			l.rebinds[name]++
		}
		l.mu.Unlock()
		addr, ttl = [4]byte{127, 0, 0, 1}, 0 // never cached
		if first {
			addr = l.Addr(RebindFirst).As4()
		}
	default:
		o, ok := names[name]
		found = ok
		addr = l.Addr(o).As4()
	}
	if !found && !strings.HasSuffix(name, ".lab") {
		rh.RCode = dnsmessage.RCodeRefused
	} else if !found {
		rh.RCode = dnsmessage.RCodeNameError
	}
	b := dnsmessage.NewBuilder(nil, rh)
	b.EnableCompression()
	b.StartQuestions()
	b.Question(q)
	b.StartAnswers()
	if found && q.Type == dnsmessage.TypeA && q.Class == dnsmessage.ClassINET {
		b.AResource(dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: ttl}, dnsmessage.AResource{A: addr})
	}
	out, err := b.Finish()
	if err != nil {
		return nil
	}
	return out
}

// Resolve asks the lab's DNS server (over UDP, from the host) for name's A records.
func (l *Lab) Resolve(name string) ([]net.IP, error) {
	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, l.DNSAddr())
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return r.LookupIP(ctx, "ip4", name)
}
