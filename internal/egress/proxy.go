package egress

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/netip"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
)

// Bounds of the proxy.
const (
	// MaxRequestHeader bounds a request's line and headers read from a sandbox, and a
	// response's status line and headers read from upstream.
	MaxRequestHeader = 64 << 10
	// IdleTimeout bounds the wait for a request's line and headers (each request of a
	// keep-alive connection) and for each DNS message.
	IdleTimeout = 30 * time.Second
	// MaxPeek bounds the bytes read to find a transparent connection's TLS SNI or HTTP Host.
	MaxPeek = 16 << 10
	// PeekTimeout bounds the wait for them.
	PeekTimeout = 10 * time.Second
	// maxDrain bounds the body of a refused request read to keep the connection alive.
	maxDrain = 1 << 20
	// maxListed bounds the allow entries a 403 body quotes.
	maxListed = 20
)

// Proxy serves the egress streams of every sandbox of a server. It is safe for concurrent
// use; it holds no per-sandbox state (Target carries it).
type Proxy struct {
	cfg         Config
	log         *slog.Logger
	resolver    Resolver
	dialTimeout time.Duration
	guard       *guard
}

// New returns a Proxy. An AllowCIDRs entry that is not a valid prefix is INVALID_ARGUMENT;
// every opened range is logged at WARN.
func New(cfg Config) (*Proxy, error) {
	p := &Proxy{cfg: cfg, log: cfg.Logger, resolver: cfg.Resolver, dialTimeout: cfg.DialTimeout}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	if p.resolver == nil {
		p.resolver = net.DefaultResolver
	}
	if p.dialTimeout <= 0 {
		p.dialTimeout = DefaultDialTimeout
	}
	opened := make([]netip.Prefix, 0, len(cfg.AllowCIDRs))
	for i, pr := range cfg.AllowCIDRs {
		if !pr.IsValid() {
			return nil, errcode.New(errcode.InvalidArgument,
				"--egress-allow-cidr[%d] is not a valid CIDR; write e.g. 10.200.0.0/16", i).
				With("field", "egress-allow-cidr").With("index", i)
		}
		if pr.Addr().Is4In6() {
			pr = netip.PrefixFrom(pr.Addr().Unmap(), max(pr.Bits()-96, 0))
		}
		pr = pr.Masked()
		opened = append(opened, pr)
		p.log.Warn("egress: a never-reachable range is OPEN to sandboxes whose policy allows it (--egress-allow-cidr); use this for labs and tests only",
			"cidr", pr.String())
	}
	p.cfg.AllowCIDRs = opened
	p.guard = &guard{cfg: &p.cfg}
	return p, nil
}

// Serve handles one stream from a sandbox's agent and closes c: kind says how it came;
// origDst is the original destination of a transparent connection. It never panics;
// cancelling ctx closes both sides.
func (p *Proxy) Serve(ctx context.Context, t *Target, c net.Conn, kind Kind, origDst netip.AddrPort) {
	defer c.Close()
	defer func() {
		if r := recover(); r != nil {
			p.log.Error("egress: panic serving a stream", "kind", kind, "panic", fmt.Sprint(r),
				"stack", string(debug.Stack()))
		}
	}()
	if t == nil {
		return
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	switch kind {
	case KindProxy:
		p.serveProxy(ctx, t, c)
	case KindTransparent:
		p.serveTransparent(ctx, t, c, origDst)
	case KindDNS:
		p.serveDNS(ctx, t, c)
	default:
		p.log.Warn("egress: a stream of an unknown kind", "sandbox", t.SandboxID, "kind", clip(string(kind), 40))
	}
}

func policyOf(t *Target) *Compiled {
	if t.Policy == nil {
		return nil
	}
	return t.Policy()
}

func (p *Proxy) record(c Connection, start time.Time) {
	if p.cfg.Recorder == nil {
		return
	}
	c.Time = start.UTC()
	c.DurationMS = time.Since(start).Milliseconds()
	p.cfg.Recorder.RecordConnection(c)
}

func (p *Proxy) recordSecret(s SecretCall) {
	if p.cfg.Recorder == nil {
		return
	}
	s.Time = time.Now().UTC()
	p.cfg.Recorder.RecordSecretCall(s)
}

func (ck *checked) connection(t *Target, kind Kind) Connection {
	return Connection{SandboxID: t.SandboxID, Kind: kind, Host: ck.host, Port: ck.port,
		Decision: ck.decision, Rule: ck.rule, Reason: ck.reason}
}

// bufConn is a net.Conn whose reads come first from pre (bytes already buffered or peeked),
// then from the connection itself; or, when r is set, from r alone (what the connection's
// reads were wrapped in).
type bufConn struct {
	net.Conn
	pre []byte
	r   io.Reader
}

func (b *bufConn) Read(p []byte) (int, error) {
	if b.r != nil {
		return b.r.Read(p)
	}
	if len(b.pre) > 0 {
		n := copy(p, b.pre)
		b.pre = b.pre[n:]
		return n, nil
	}
	return b.Conn.Read(p)
}

// WriteTo writes pre, then copies the connection itself, so that io.Copy from a bufConn to a
// TCP connection still moves the bytes with splice(2) (a wrapper without it would copy them
// through user space for the connection's life).
func (b *bufConn) WriteTo(w io.Writer) (int64, error) {
	if b.r != nil {
		return io.Copy(w, struct{ io.Reader }{b.r})
	}
	var n int64
	for len(b.pre) > 0 {
		m, err := w.Write(b.pre)
		b.pre = b.pre[m:]
		n += int64(m)
		if err != nil {
			return n, err
		}
	}
	m, err := io.Copy(w, b.Conn)
	return n + m, err
}

// CloseWrite half-closes when the underlying connection can.
func (b *bufConn) CloseWrite() error { return closeWrite(b.Conn) }

func closeWrite(c net.Conn) error {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Close()
}

// spliceLinger bounds how long the sandbox's side may keep sending after the upstream's
// side ended.
const spliceLinger = 5 * time.Second

// splice copies both ways until both are done (or ctx ends, which closes both). When the
// sandbox's side ends first its end is passed on (a half-close) and the upstream's answer
// still flows; when the upstream's side ends, the sandbox's write side is closed and the
// connection ends within spliceLinger. It returns the bytes each way.
func splice(ctx context.Context, sandbox net.Conn, up net.Conn) (out, in int64) {
	stop := context.AfterFunc(ctx, func() { up.Close(); sandbox.Close() })
	defer stop()
	outDone := make(chan int64, 1)
	go func() {
		n, _ := io.Copy(up, sandbox)
		closeWrite(up)
		outDone <- n
	}()
	// Write to the sandbox's connection itself (a TCP connection can then take the bytes
	// with splice(2)); only its reads replay what was peeked or buffered.
	var dst io.Writer = sandbox
	if bc, ok := sandbox.(*bufConn); ok {
		dst = bc.Conn
	}
	in, _ = io.Copy(dst, up)
	if closeWrite(sandbox) != nil {
		up.Close()
	}
	t := time.NewTimer(spliceLinger)
	defer t.Stop()
	select {
	case out = <-outDone:
	case <-t.C:
		up.Close()
		sandbox.Close()
		out = <-outDone
	}
	return out, in
}

// ---- the HTTP proxy ----

func (p *Proxy) serveProxy(ctx context.Context, t *Target, c net.Conn) {
	lr := &io.LimitedReader{R: c, N: MaxRequestHeader}
	br := bufio.NewReaderSize(lr, 16<<10)
	for ctx.Err() == nil {
		lr.N = MaxRequestHeader
		c.SetReadDeadline(time.Now().Add(IdleTimeout))
		req, err := http.ReadRequest(br)
		if err != nil {
			if lr.N <= 0 {
				writePlain(c, http.StatusRequestHeaderFieldsTooLarge, nil,
					fmt.Sprintf("agentbox egress: the request line and headers exceed %d KiB\n", MaxRequestHeader>>10))
			} else if !isEOFOrTimeout(err) {
				writePlain(c, http.StatusBadRequest, nil, "agentbox egress: malformed request: "+clip(err.Error(), 200)+"\n")
			}
			return
		}
		lr.N = math.MaxInt64
		c.SetReadDeadline(time.Time{})
		if req.Method == http.MethodConnect {
			if !p.serveConnect(ctx, t, c, br, req) {
				return
			}
			continue
		}
		if !req.URL.IsAbs() || req.URL.Host == "" {
			writePlain(c, http.StatusBadRequest, nil, "agentbox egress: this is an HTTP proxy: send CONNECT host:port, "+
				"or an absolute-form request such as GET http://host/path\n")
			return
		}
		if req.URL.Scheme != "http" {
			writePlain(c, http.StatusBadRequest, nil, fmt.Sprintf("agentbox egress: scheme %q is not proxied as a plain request; "+
				"use CONNECT for https\n", clip(req.URL.Scheme, 20)))
			return
		}
		if !p.serveForward(ctx, t, c, br, req) {
			return
		}
	}
}

func isEOFOrTimeout(err error) bool {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func writePlain(w io.Writer, code int, h http.Header, body string) error {
	var b strings.Builder
	fmt.Fprintf(&b, "HTTP/1.1 %d %s\r\n", code, http.StatusText(code))
	for k, vs := range h {
		for _, v := range vs {
			fmt.Fprintf(&b, "%s: %s\r\n", k, v)
		}
	}
	fmt.Fprintf(&b, "Content-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	_, err := io.WriteString(w, b.String())
	return err
}

func parsePortString(s string) (int, bool) {
	if s == "" || len(s) > 5 || strings.TrimLeft(s, "0123456789") != "" {
		return 0, false
	}
	n, _ := strconv.Atoi(s)
	return n, n >= 1 && n <= 65535
}

// refuse writes the 403 (or 502 when the name could not be resolved) for ck.
func (p *Proxy) refuse(w io.Writer, pol *Compiled, ck *checked) error {
	code := http.StatusForbidden
	if ck.decision == Failed {
		code = http.StatusBadGateway
	}
	rule := ck.rule
	if rule == "" {
		rule = "no allow rule matches"
	}
	h := http.Header{"X-Agentbox-Egress-Rule": {headerSafe(rule)}}
	return writePlain(w, code, h, RefusalText(pol, ck.host, ck.port, ck.decision, ck.rule, ck.reason))
}

func headerSafe(s string) string {
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f || r > 0x7e {
			return '?'
		}
		return r
	}, clip(s, 200))
}

// RefusalText is what a refused request reads: the destination, the rule that refused it
// (or "no allow rule matches"), the current allow list, and how to change it.
func RefusalText(pol *Compiled, host string, port int, decision, rule, reason string) string {
	var b strings.Builder
	hp := net.JoinHostPort(host, strconv.Itoa(port))
	if decision == Failed {
		fmt.Fprintf(&b, "agentbox egress: %s: %s\n", hp, reason)
		return b.String()
	}
	fmt.Fprintf(&b, "agentbox egress: %s refused: %s", hp, reason)
	if rule != "" && !strings.Contains(reason, rule) {
		fmt.Fprintf(&b, " (rule %q)", rule)
	}
	b.WriteString(".\n")
	cur := pol.Policy()
	allow := cur.Allow
	more := ""
	if len(allow) > maxListed {
		more = fmt.Sprintf(", … %d more", len(allow)-maxListed)
		allow = allow[:maxListed]
	}
	fmt.Fprintf(&b, "Network policy allow: [%s%s]", strings.Join(allow, ", "), more)
	if len(cur.Deny) > 0 {
		deny := cur.Deny
		dmore := ""
		if len(deny) > maxListed {
			dmore = fmt.Sprintf(", … %d more", len(deny)-maxListed)
			deny = deny[:maxListed]
		}
		fmt.Fprintf(&b, ", deny: [%s%s]", strings.Join(deny, ", "), dmore)
	}
	b.WriteString(".\n")
	entry := host
	if a, err := netip.ParseAddr(host); err == nil && a.Is6() && port != 80 && port != 443 {
		entry = "[" + host + "]"
	}
	if port != 80 && port != 443 {
		entry += ":" + strconv.Itoa(port)
	}
	switch {
	case rule == "" || strings.HasPrefix(reason, "no allow rule"):
		fmt.Fprintf(&b, "Allow it: sandbox_network_update (MCP) with allow: [..., %q]; "+
			"REST PATCH /v1/sandboxes/{id}/network with {\"allow\": [..., %q]}; "+
			"CLI agentbox network set {id} --allow %s\n", entry, entry, entry)
	case strings.HasPrefix(reason, "denied by deny rule"):
		fmt.Fprintf(&b, "Remove %q from deny: sandbox_network_update (MCP); "+
			"REST PATCH /v1/sandboxes/{id}/network; CLI agentbox network set {id} --deny ...\n", rule)
	default:
		b.WriteString("This address class is never reachable from a sandbox, whatever the policy says.\n")
	}
	return b.String()
}

// serveConnect serves one CONNECT; it reports whether the connection may serve another
// request (only after a refusal).
func (p *Proxy) serveConnect(ctx context.Context, t *Target, c net.Conn, br *bufio.Reader, req *http.Request) bool {
	start := time.Now()
	host, portStr, err := net.SplitHostPort(req.RequestURI)
	port, ok := parsePortString(portStr)
	if err != nil || !ok || host == "" {
		writePlain(c, http.StatusBadRequest, nil, fmt.Sprintf("agentbox egress: CONNECT needs host:port with a port 1-65535, not %q\n",
			clip(req.RequestURI, 100)))
		return false
	}
	pol := policyOf(t)
	ck := p.check(ctx, pol, host, port)
	rec := ck.connection(t, KindProxy)
	if !ck.ok() {
		p.record(rec, start) // stored before the refusal reaches the sandbox
		p.refuse(c, pol, &ck)
		return true
	}
	up, ap, err := p.dialChecked(ctx, &ck)
	if err != nil {
		rec.Decision, rec.Reason = Failed, fmt.Sprintf("cannot connect to %s: %s", net.JoinHostPort(ck.host, portStr), shortErr(err))
		p.record(rec, start)
		writePlain(c, http.StatusBadGateway, nil, "agentbox egress: "+rec.Reason+"\n")
		return true
	}
	rec.Addr = ap.String()
	if _, err := io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		up.Close()
		rec.Decision, rec.Reason = Failed, "the sandbox side closed"
		p.record(rec, start)
		return false
	}
	var sc net.Conn = c
	if k := br.Buffered(); k > 0 { // bytes sent before the 200: read them first
		pre, _ := br.Peek(k)
		sc = &bufConn{Conn: c, pre: bytes.Clone(pre)}
	}
	p.relay(ctx, t, sc, up, ck.host, port, true, true, &rec)
	p.record(rec, start)
	return false
}

// relay carries an allowed connection of the sandbox (sc) to its checked upstream (up): through
// the Interceptor when a secret of t names host (and may, when named), else spliced both ways;
// the bytes and the interception's end go on rec.
func (p *Proxy) relay(ctx context.Context, t *Target, sc net.Conn, up net.Conn, host string, port int, tls, named bool, rec *Connection) {
	if ic := p.cfg.Interceptor; ic != nil && named && ic.Wants(t, host) {
		dial := p.dialOnce(t, host, port, up)
		out, in, err := ic.Intercept(ctx, t, sc, host, port, tls, dial.dial)
		dial.close()
		rec.Intercepted, rec.BytesOut, rec.BytesIn = true, out, in
		if err != nil && ctx.Err() == nil {
			rec.Reason = clip(rec.Reason+"; interception ended: "+err.Error(), 500)
		}
		return
	}
	rec.BytesOut, rec.BytesIn = splice(ctx, sc, up)
}

// onceDialer hands an Interceptor the connection already made first, then new guarded
// connections, each checked under the policy of the moment.
type onceDialer struct {
	p     *Proxy
	t     *Target
	host  string
	port  int
	mu    sync.Mutex
	first net.Conn
}

func (p *Proxy) dialOnce(t *Target, host string, port int, first net.Conn) *onceDialer {
	return &onceDialer{p: p, t: t, host: host, port: port, first: first}
}

func (d *onceDialer) dial(ctx context.Context) (net.Conn, error) {
	d.mu.Lock()
	if c := d.first; c != nil {
		d.first = nil
		d.mu.Unlock()
		return c, nil
	}
	d.mu.Unlock()
	return d.p.DialGuarded(ctx, policyOf(d.t), d.host, d.port)
}

func (d *onceDialer) close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.first != nil {
		d.first.Close()
		d.first = nil
	}
}

// DialGuarded checks host:port under pol (the policy and the never-reachable classes),
// resolves a name once, and connects to a checked address. A refusal is a *RefusedError.
func (p *Proxy) DialGuarded(ctx context.Context, pol *Compiled, host string, port int) (net.Conn, error) {
	ck := p.check(ctx, pol, host, port)
	if !ck.ok() {
		return nil, &RefusedError{Host: ck.host, Port: port, Decision: ck.decision, Rule: ck.rule, Reason: ck.reason}
	}
	c, _, err := p.dialChecked(ctx, &ck)
	return c, err
}

// RefusedError is DialGuarded's refusal.
type RefusedError struct {
	Host     string
	Port     int
	Decision string
	Rule     string
	Reason   string
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("egress to %s refused: %s", net.JoinHostPort(e.Host, strconv.Itoa(e.Port)), e.Reason)
}

// hopHeaders are removed from forwarded requests and responses, with every Proxy-* header
// and the headers Connection names.
var hopHeaders = []string{"Connection", "Keep-Alive", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

func removeHop(h http.Header) {
	for _, v := range h.Values("Connection") {
		for _, f := range strings.Split(v, ",") {
			if f = strings.TrimSpace(f); f != "" {
				h.Del(f)
			}
		}
	}
	for _, k := range hopHeaders {
		h.Del(k)
	}
	for k := range h {
		if strings.HasPrefix(k, "Proxy-") {
			delete(h, k)
		}
	}
}

// CountingConn counts the bytes read from (In) and written to (Out) a connection; the proxy and
// its interceptor record them.
type CountingConn struct {
	net.Conn
	Out, In atomic.Int64
}

func (c *CountingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.In.Add(int64(n))
	return n, err
}

func (c *CountingConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.Out.Add(int64(n))
	return n, err
}

// serveForward serves one absolute-form request; it reports whether the connection may
// serve another.
func (p *Proxy) serveForward(ctx context.Context, t *Target, c net.Conn, br *bufio.Reader, req *http.Request) bool {
	start := time.Now()
	port := 80
	if ps := req.URL.Port(); ps != "" {
		n, ok := parsePortString(ps)
		if !ok {
			writePlain(c, http.StatusBadRequest, nil, fmt.Sprintf("agentbox egress: port %q is not 1-65535\n", clip(ps, 20)))
			return false
		}
		port = n
	}
	host := req.URL.Hostname()
	pol := policyOf(t)
	ck := p.check(ctx, pol, host, port)
	rec := ck.connection(t, KindProxy)
	if !ck.ok() {
		keep := drain(req)
		p.record(rec, start) // stored before the refusal reaches the sandbox
		p.refuse(c, pol, &ck)
		return keep
	}
	if ic := p.cfg.Interceptor; ic != nil && ic.Wants(t, ck.host) {
		// The rest of the connection, this request first, goes to the Interceptor.
		pr, pw := io.Pipe()
		done := make(chan struct{})
		go func() {
			defer close(done)
			pw.CloseWithError(req.Write(pw))
		}()
		sc := &bufConn{Conn: c, r: io.MultiReader(pr, br)}
		d := &lazyDialer{p: p, t: t, host: ck.host, port: port}
		out, in, err := ic.Intercept(ctx, t, sc, ck.host, port, false, d.dial)
		pr.Close()
		c.Close()
		<-done
		rec.Intercepted, rec.BytesOut, rec.BytesIn, rec.Addr = true, out, in, d.addr()
		if err != nil && ctx.Err() == nil {
			rec.Reason = clip(rec.Reason+"; interception ended: "+err.Error(), 500)
		}
		p.record(rec, start)
		return false
	}
	p.checkPlaceholders(t, ck.host, req)
	raw, ap, err := p.dialChecked(ctx, &ck)
	if err != nil {
		keep := drain(req)
		rec.Decision, rec.Reason = Failed, fmt.Sprintf("cannot connect to %s: %s", net.JoinHostPort(ck.host, strconv.Itoa(port)), shortErr(err))
		p.record(rec, start)
		writePlain(c, http.StatusBadGateway, nil, "agentbox egress: "+rec.Reason+"\n")
		return keep
	}
	rec.Addr = ap.String()
	up := &CountingConn{Conn: raw}
	stop := context.AfterFunc(ctx, func() { up.Close() })
	defer stop()
	defer up.Close()
	keep := !req.Close
	removeHop(req.Header)
	if _, ok := req.Header["User-Agent"]; !ok {
		req.Header["User-Agent"] = []string{""} // Request.Write would add Go's
	}
	req.Close = true // one upstream connection per request
	wdone := make(chan error, 1)
	if req.Body == nil || req.Body == http.NoBody {
		// Nothing to stream: the line and headers (at most MaxRequestHeader) are written here
		// in one write rather than by a goroutine of their own, within IdleTimeout.
		up.SetWriteDeadline(time.Now().Add(IdleTimeout))
		err := req.Write(up)
		up.SetWriteDeadline(time.Time{})
		wdone <- err
	} else {
		go func() { wdone <- req.Write(up) }()
	}
	ulr := &io.LimitedReader{R: up, N: MaxRequestHeader}
	ubr := bufio.NewReaderSize(ulr, 16<<10)
	var resp *http.Response
	for {
		ulr.N = MaxRequestHeader
		resp, err = http.ReadResponse(ubr, req)
		if err != nil {
			break
		}
		ulr.N = math.MaxInt64
		if resp.StatusCode >= 100 && resp.StatusCode < 200 && resp.StatusCode != http.StatusSwitchingProtocols {
			removeHop(resp.Header)
			writeResponse(c, resp)
			continue
		}
		break
	}
	if err != nil {
		up.Close()
		werr := <-wdone
		rec.Decision = Failed
		rec.Reason = fmt.Sprintf("upstream %s: no valid response: %s", rec.Addr, shortErr(err))
		if werr != nil && !errors.Is(werr, net.ErrClosed) {
			rec.Reason += "; sending the request: " + shortErr(werr)
			keep = false
		}
		writePlain(c, http.StatusBadGateway, nil, "agentbox egress: "+rec.Reason+"\n")
		rec.BytesOut, rec.BytesIn = up.Out.Load(), up.In.Load()
		p.record(rec, start)
		return false
	}
	if resp.StatusCode == http.StatusSwitchingProtocols {
		keep = false
	}
	removeHop(resp.Header)
	resp.Close = !keep
	var werr error
	if spliceBody(req, resp) {
		werr = p.writeSpliced(c, resp, ubr, raw, up)
	} else if bodyBuffered(req, resp, ubr) {
		werr = writeResponse(c, resp)
		resp.Body.Close()
	} else {
		werr = resp.Write(c) // a body still arriving goes on as it comes
		resp.Body.Close()
	}
	grace := time.NewTimer(time.Second)
	defer grace.Stop()
	select {
	case err := <-wdone:
		if err != nil {
			keep = false
		}
	case <-grace.C:
		// The upstream answered before the request body was sent: this connection cannot
		// serve another request.
		up.Close()
		c.Close()
		<-wdone
		keep = false
	}
	if werr != nil {
		keep = false
	}
	rec.BytesOut, rec.BytesIn = up.Out.Load(), up.In.Load()
	p.record(rec, start)
	return keep && !resp.Close
}

// respWriters are the buffers whole responses are written through: Response.Write writes its
// status line and each header's parts separately, and unbuffered each would be a segment of
// its own to the sandbox (TCP_NODELAY), waking its reader for a fraction of the header.
var respWriters = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, 16<<10) }}

// bodyBuffered reports whether resp's body (of a known length, no transfer coding) was read
// whole with its header, so that writing it waits for nothing.
func bodyBuffered(req *http.Request, resp *http.Response, ubr *bufio.Reader) bool {
	if req.Method == http.MethodHead || resp.StatusCode == http.StatusNoContent || resp.StatusCode == http.StatusNotModified {
		return true
	}
	return resp.ContentLength >= 0 && resp.ContentLength <= int64(ubr.Buffered()) &&
		len(resp.TransferEncoding) == 0 && len(resp.Trailer) == 0 && !resp.Uncompressed
}

// writeResponse writes resp, whose body waits for nothing (a 1xx, or bodyBuffered), to c
// through a pooled buffer: in one write when it fits 16 KiB.
func writeResponse(c io.Writer, resp *http.Response) error {
	bw := respWriters.Get().(*bufio.Writer)
	bw.Reset(c)
	err := resp.Write(bw)
	if ferr := bw.Flush(); err == nil {
		err = ferr
	}
	bw.Reset(nil)
	respWriters.Put(bw)
	return err
}

// spliceMin is the smallest response body moved with splice(2) (a pipe's cost pays off).
const spliceMin = 256 << 10

// spliceBody reports whether resp's body can be sent with writeSpliced: a plain body of a
// known length, large enough.
func spliceBody(req *http.Request, resp *http.Response) bool {
	return req.Method != http.MethodHead && resp.ContentLength >= spliceMin && len(resp.TransferEncoding) == 0 &&
		len(resp.Trailer) == 0 && !resp.Uncompressed && resp.StatusCode >= 200 &&
		resp.StatusCode != http.StatusNoContent && resp.StatusCode != http.StatusNotModified
}

// writeSpliced writes resp's header to c, then its body: what ubr holds of it, then the rest
// straight from the upstream connection raw with splice(2) (exactly the body's length; the
// bytes are counted on up). Where splice cannot be used the rest is copied.
func (p *Proxy) writeSpliced(c net.Conn, resp *http.Response, ubr *bufio.Reader, raw net.Conn, up *CountingConn) error {
	h := resp.Header.Clone()
	for _, k := range []string{"Content-Length", "Transfer-Encoding", "Connection"} {
		h.Del(k)
	}
	var b bytes.Buffer
	text := strings.TrimPrefix(resp.Status, strconv.Itoa(resp.StatusCode)+" ")
	if text == "" {
		text = http.StatusText(resp.StatusCode)
	}
	fmt.Fprintf(&b, "HTTP/1.1 %03d %s\r\n", resp.StatusCode, text)
	if err := h.Write(&b); err != nil {
		return err
	}
	fmt.Fprintf(&b, "Content-Length: %d\r\n", resp.ContentLength)
	if resp.Close {
		b.WriteString("Connection: close\r\n")
	}
	b.WriteString("\r\n")
	n := resp.ContentLength
	if k := min(int64(ubr.Buffered()), n); k > 0 { // the body's first bytes, read with the header
		head, _ := ubr.Peek(int(k))
		b.Write(head)
		ubr.Discard(int(k))
		n -= k
	}
	if _, err := c.Write(b.Bytes()); err != nil {
		return err
	}
	if n == 0 {
		return nil
	}
	m, ok, err := spliceN(c, raw, n)
	up.In.Add(m)
	if ok {
		return err
	}
	_, err = io.CopyN(c, up, n)
	return err
}

// lazyDialer dials host:port (checked under the policy of the moment) on demand.
type lazyDialer struct {
	p    *Proxy
	t    *Target
	host string
	port int
	mu   sync.Mutex
	last string
}

func (d *lazyDialer) dial(ctx context.Context) (net.Conn, error) {
	ck := d.p.check(ctx, policyOf(d.t), d.host, d.port)
	if !ck.ok() {
		return nil, &RefusedError{Host: ck.host, Port: d.port, Decision: ck.decision, Rule: ck.rule, Reason: ck.reason}
	}
	c, ap, err := d.p.dialChecked(ctx, &ck)
	if err == nil {
		d.mu.Lock()
		d.last = ap.String()
		d.mu.Unlock()
	}
	return c, err
}

func (d *lazyDialer) addr() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.last
}

// drain reads what is left of a refused request's body (at most 1 MiB) and reports whether
// the connection can serve another request.
func drain(req *http.Request) bool {
	if req.Body == nil || req.Body == http.NoBody {
		return !req.Close
	}
	n, err := io.Copy(io.Discard, io.LimitReader(req.Body, maxDrain+1))
	return err == nil && n <= maxDrain && !req.Close
}

// checkPlaceholders records a SecretCall for each secret whose placeholder a request that
// is not intercepted carries: it is forwarded unchanged.
func (p *Proxy) checkPlaceholders(t *Target, host string, req *http.Request) {
	for _, s := range t.Secrets {
		if len(s.Placeholder) < 8 || !requestCarries(req, s.Placeholder) {
			continue
		}
		reason := "host not listed for this secret"
		if HostListed(s.Hosts, host) {
			reason = "not intercepted (plain HTTP without an interceptor); the placeholder was sent as it was"
		}
		p.recordSecret(SecretCall{SandboxID: t.SandboxID, Secret: s.Name, Host: host, Method: req.Method,
			Path: clip(req.URL.Path, 500), Replaced: false, Reason: reason})
	}
}

func requestCarries(req *http.Request, placeholder string) bool {
	if strings.Contains(req.URL.RawQuery, placeholder) || strings.Contains(req.URL.Path, placeholder) {
		return true
	}
	for _, vs := range req.Header {
		for _, v := range vs {
			if strings.Contains(v, placeholder) {
				return true
			}
		}
	}
	return false
}

// HostListed reports whether host matches one of hosts (names, "*.suffix" wildcards; case
// and a trailing dot ignored).
func HostListed(hosts []string, host string) bool {
	h, ok := normalizeName(host)
	if !ok {
		h = strings.ToLower(host)
	}
	for _, e := range hosts {
		e = strings.TrimSuffix(strings.ToLower(strings.TrimSpace(e)), ".")
		if e == h {
			return true
		}
		if strings.HasPrefix(e, "*.") && strings.HasSuffix(h, e[1:]) && len(h) > len(e)-1 {
			return true
		}
	}
	return false
}
