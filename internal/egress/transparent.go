package egress

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"time"
)

// peekReader reads from r and keeps every byte it read, at most max.
type peekReader struct {
	r   io.Reader
	max int
	buf bytes.Buffer
}

var errPeekTooLong = errors.New("more than 16 KiB without a complete TLS ClientHello or HTTP request header")

func (pr *peekReader) Read(p []byte) (int, error) {
	room := pr.max - pr.buf.Len()
	if room <= 0 {
		return 0, errPeekTooLong
	}
	if len(p) > room {
		p = p[:room]
	}
	n, err := pr.r.Read(p)
	pr.buf.Write(p[:n])
	return n, err
}

// helloConn is what crypto/tls reads a ClientHello from: reads come from the peekReader,
// writes (an alert) are dropped, Close does nothing.
type helloConn struct {
	net.Conn
	r io.Reader
}

func (h helloConn) Read(p []byte) (int, error)  { return h.r.Read(p) }
func (h helloConn) Write(p []byte) (int, error) { return len(p), nil }
func (h helloConn) Close() error                { return nil }

var errHelloRead = errors.New("client hello read")

// ClientHelloSNI reads one TLS ClientHello from r with crypto/tls's own parser and returns
// its server name ("" when it has none). r should be bounded (a peekReader is).
func ClientHelloSNI(ctx context.Context, r io.Reader) (string, error) {
	var name string
	var got bool
	cfg := &tls.Config{GetConfigForClient: func(chi *tls.ClientHelloInfo) (*tls.Config, error) {
		name, got = chi.ServerName, true
		return nil, errHelloRead
	}}
	err := tls.Server(helloConn{Conn: nopConn{}, r: r}, cfg).HandshakeContext(ctx)
	if got {
		return name, nil
	}
	if err == nil {
		err = errors.New("no client hello")
	}
	return "", err
}

// nopConn is a net.Conn that does nothing: helloConn's base for the methods tls calls on
// it (deadlines, addresses).
type nopConn struct{}

func (nopConn) Read([]byte) (int, error)         { return 0, io.EOF }
func (nopConn) Write(p []byte) (int, error)      { return len(p), nil }
func (nopConn) Close() error                     { return nil }
func (nopConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (nopConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (nopConn) SetDeadline(time.Time) error      { return nil }
func (nopConn) SetReadDeadline(time.Time) error  { return nil }
func (nopConn) SetWriteDeadline(time.Time) error { return nil }

// RequestHost reads one HTTP request header from r and returns its Host without a port.
func RequestHost(r io.Reader) (string, error) {
	req, err := http.ReadRequest(bufio.NewReaderSize(r, 4096))
	if err != nil {
		return "", err
	}
	host := req.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	if host == "" {
		return "", errors.New("the request has no Host")
	}
	return host, nil
}

func (p *Proxy) serveTransparent(ctx context.Context, t *Target, c net.Conn, origDst netip.AddrPort) {
	start := time.Now()
	port := int(origDst.Port())
	rec := Connection{SandboxID: t.SandboxID, Kind: KindTransparent, Host: origDst.Addr().String(), Port: port,
		Decision: Denied}
	if !origDst.IsValid() || port == 0 {
		rec.Reason = "no original destination"
		p.record(rec, start)
		return
	}
	c.SetReadDeadline(time.Now().Add(PeekTimeout))
	peek := &peekReader{r: c, max: MaxPeek}
	var first [1]byte
	if _, err := io.ReadFull(peek, first[:]); err != nil {
		rec.Reason = "the program sent nothing within " + PeekTimeout.String()
		if !isEOFOrTimeout(err) {
			rec.Reason = "reading the first byte: " + shortErr(err)
		}
		p.record(rec, start)
		return
	}
	isTLS := first[0] == 0x16
	rest := io.MultiReader(bytes.NewReader(first[:]), peek)
	var name string
	var perr error
	if isTLS {
		name, perr = ClientHelloSNI(ctx, rest)
	} else {
		name, perr = RequestHost(rest)
	}
	c.SetReadDeadline(time.Time{})
	what := "HTTP Host"
	if isTLS {
		what = "TLS SNI"
	}
	var ck checked
	if name != "" {
		ck = p.check(ctx, policyOf(t), name, port)
		if !ck.ok() {
			ck.reason = what + " " + ck.host + ": " + ck.reason
		}
	} else {
		ck = p.check(ctx, policyOf(t), origDst.Addr().String(), port)
		why := "no " + what
		if perr != nil {
			why = "no " + what + " (" + clip(perr.Error(), 120) + ")"
		}
		if !ck.ok() {
			ck.reason = why + ", so only a CIDR rule could allow " + origDst.String() + ": " + ck.reason
		} else {
			ck.reason = why + "; " + ck.reason
		}
	}
	rec = ck.connection(t, KindTransparent)
	if !ck.ok() {
		p.record(rec, start)
		return
	}
	up, ap, err := p.dialChecked(ctx, &ck)
	if err != nil {
		rec.Decision, rec.Reason = Failed, "cannot connect to "+net.JoinHostPort(ck.host, strconv.Itoa(port))+": "+shortErr(err)
		p.record(rec, start)
		return
	}
	rec.Addr = ap.String()
	sc := &bufConn{Conn: c, pre: peek.buf.Bytes()}
	p.relay(ctx, t, sc, up, ck.host, port, isTLS, name != "", &rec)
	p.record(rec, start)
}
