// Package mitm keeps a sandbox's secrets out of the sandbox: the sandbox holds a placeholder,
// and the egress proxy hands the connections to a secret's hosts to this package's
// Interceptor, which terminates the sandbox's TLS with a leaf certificate of the server's own
// CA (which the sandbox trusts through its CA bundle), swaps each placeholder for the value
// its source gives now (request headers; the body when the secret opts in), and forwards the
// request to the real host over TLS it verifies. Every request that carried a placeholder is
// recorded (egress.SecretCall) without the value; the value is never logged, recorded,
// written into the sandbox or put in an error.
package mitm

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/net/http2"

	"github.com/agentbox/agentbox/internal/egress"
	"github.com/agentbox/agentbox/internal/errcode"
)

// Bounds of an intercepted connection.
const (
	// MaxHeaderBytes bounds a request's header (from the sandbox) and a response's header
	// (from upstream).
	MaxHeaderBytes = 64 << 10
	// MaxScannedBody is how much of a request body is buffered to swap placeholders in it
	// (secrets with Body only); a longer body is streamed unchanged and the call says so.
	MaxScannedBody = 1 << 20
	// maxRecordedPath bounds the path a SecretCall keeps.
	maxRecordedPath = 1024
	bufSize         = 32 << 10
)

// Config configures an Interceptor.
type Config struct {
	// CA issues the leaf certificates shown to sandboxes.
	CA *CA
	// Sources resolves secrets' values at request time.
	Sources Sources
	// UpstreamRoots verify upstream servers (nil: the system's roots). Tests add their own
	// CA (serve --egress-upstream-ca).
	UpstreamRoots *x509.CertPool
	// Recorder keeps the SecretCalls (nil: none kept).
	Recorder egress.Recorder
	Logger   *slog.Logger
	// IdleTimeout bounds the wait for a sandbox's next request header (0: 2 min).
	IdleTimeout time.Duration
	// HandshakeTimeout bounds each TLS handshake, with the sandbox and upstream (0: 10 s).
	HandshakeTimeout time.Duration
}

// Interceptor is egress.Interceptor for secrets.
type Interceptor struct {
	cfg Config
	log *slog.Logger
}

var _ egress.Interceptor = (*Interceptor)(nil)

// New returns an Interceptor.
func New(cfg Config) *Interceptor {
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = 2 * time.Minute
	}
	if cfg.HandshakeTimeout <= 0 {
		cfg.HandshakeTimeout = 10 * time.Second
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Interceptor{cfg: cfg, log: log}
}

// Wants reports whether any of t's secrets lists host (exactly or under a "*." entry).
func (i *Interceptor) Wants(t *egress.Target, host string) bool {
	if t == nil || i.cfg.CA == nil {
		return false
	}
	for _, s := range t.Secrets {
		if HostListed(s.Hosts, host) {
			return true
		}
	}
	return false
}

// Intercept serves c, the sandbox's side of a connection to host:port, and closes it. When
// useTLS it terminates TLS with a leaf for host (ALPN http/1.1; a client's SNI must be host
// or absent) and speaks TLS to upstream (ServerName host, verified against UpstreamRoots);
// otherwise both sides are plain HTTP and no placeholder is swapped (a secret is only ever
// sent over TLS; the call is recorded as not replaced). Requests are read one after another
// (keep-alive) and forwarded over one upstream connection from dial, redialled when upstream
// closes it. A request whose Host is not host gets 421. It returns the bytes read from and
// written to c.
func (i *Interceptor) Intercept(ctx context.Context, t *egress.Target, c net.Conn, host string, port int, useTLS bool,
	dial func(context.Context) (net.Conn, error)) (out, in int64, err error) {
	if t == nil {
		t = &egress.Target{}
	}
	cc := &egress.CountingConn{Conn: c}
	defer func() { out, in = cc.In.Load(), cc.Out.Load() }()
	s := &session{i: i, t: t, host: NormalizeHost(host), port: port, tls: useTLS, dial: dial}
	stop := context.AfterFunc(ctx, func() { c.Close(); s.closeUpstream() })
	defer stop()
	defer s.closeUpstream()
	defer c.Close()

	var conn net.Conn = cc
	if useTLS {
		if i.cfg.CA == nil {
			return 0, 0, errors.New("egress: interception has no CA")
		}
		tc := tls.Server(cc, &tls.Config{
			MinVersion: tls.VersionTLS12,
			NextProtos: []string{"http/1.1"},
			GetCertificate: func(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
				if hello.ServerName != "" && NormalizeHost(hello.ServerName) != s.host {
					return nil, fmt.Errorf("SNI %q is not %s, the host this connection was allowed for", trunc(hello.ServerName), s.host)
				}
				return i.cfg.CA.Leaf(s.host)
			},
		})
		hctx, cancel := context.WithTimeout(ctx, i.cfg.HandshakeTimeout)
		err := tc.HandshakeContext(hctx)
		cancel()
		if err != nil {
			return 0, 0, fmt.Errorf("egress: TLS handshake with the sandbox for %s: %w", s.host, err)
		}
		conn = tc
		defer tc.Close()
	}
	s.conn = conn
	s.clim = &io.LimitedReader{R: conn}
	s.cbr = bufio.NewReaderSize(s.clim, bufSize)
	s.cbw = bufio.NewWriterSize(conn, bufSize)
	return 0, 0, s.scrub(s.serve(ctx))
}

// session is one intercepted connection.
type session struct {
	i    *Interceptor
	t    *egress.Target
	host string
	port int
	tls  bool
	dial func(context.Context) (net.Conn, error)

	conn net.Conn // the sandbox's side (plain or TLS)
	clim *io.LimitedReader
	cbr  *bufio.Reader
	cbw  *bufio.Writer

	mu sync.Mutex // guards up and h2 against closeUpstream from ctx's AfterFunc
	up net.Conn
	h2 *http2.ClientConn // up speaks HTTP/2 (h2.go)
	// reqBody is the current request's body when it went over HTTP/2, read by the
	// ClientConn's own goroutine: until it has been read to its end, the sandbox's connection
	// cannot carry another request.
	reqBody *doneBody
	ulim    *io.LimitedReader
	ubr     *bufio.Reader
	ubw     *bufio.Writer
	used    bool // up has carried a request

	// values are those resolved on this connection (a value rotated since is still taken
	// out of responses and errors).
	values []scrubPair
}

func (s *session) serve(ctx context.Context) error {
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		s.clim.N = MaxHeaderBytes
		s.conn.SetReadDeadline(time.Now().Add(s.i.cfg.IdleTimeout))
		req, err := http.ReadRequest(s.cbr)
		if err != nil {
			switch {
			case s.clim.N <= 0:
				s.reply(http.StatusRequestHeaderFieldsTooLarge, fmt.Sprintf("agentbox egress: the request header is over %d KiB", MaxHeaderBytes>>10))
				return errors.New("egress: request header over 64 KiB")
			case errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || errors.Is(err, os.ErrDeadlineExceeded) ||
				errors.Is(err, syscall.ECONNRESET):
				return nil // the sandbox closed, or kept the connection idle too long
			case errors.Is(err, io.ErrUnexpectedEOF):
				return nil
			default:
				s.reply(http.StatusBadRequest, "agentbox egress: malformed HTTP/1.1 request")
				return fmt.Errorf("egress: malformed request from the sandbox: %w", err)
			}
		}
		s.conn.SetReadDeadline(time.Time{})
		s.clim.N = math.MaxInt64
		keep, err := s.handle(ctx, req)
		if err != nil || !keep {
			return err
		}
	}
}

type secretState struct {
	found    bool
	replaced bool
	reasons  []string
}

// handle forwards one request and its response; keep says whether to read another.
func (s *session) handle(ctx context.Context, req *http.Request) (keep bool, err error) {
	defer req.Body.Close()
	if req.Method == http.MethodConnect {
		s.reply(http.StatusMethodNotAllowed, "agentbox egress: CONNECT inside an intercepted connection is not supported")
		return false, nil
	}
	if !s.hostOK(req) {
		s.reply(http.StatusMisdirectedRequest, fmt.Sprintf("agentbox egress: this connection is for %s; a request for %q must use its own connection",
			s.host, trunc(req.Host)))
		return false, nil
	}
	if req.Host == "" {
		req.Host = s.host
	}
	secrets := s.t.Secrets
	states := make([]secretState, len(secrets))
	values := make([]string, len(secrets))
	resolved := make([]bool, len(secrets))
	listed := make([]bool, len(secrets))
	for k := range secrets {
		listed[k] = HostListed(secrets[k].Hosts, s.host)
	}
	path := req.URL.Path
	if len(path) > maxRecordedPath {
		path = path[:maxRecordedPath] + "…"
	}
	record := func() {
		for k, st := range states {
			if !st.found {
				continue
			}
			call := egress.SecretCall{SandboxID: s.t.SandboxID, Time: time.Now().UTC(), Secret: secrets[k].Name,
				Host: s.host, Method: req.Method, Path: path, Replaced: st.replaced, Reason: strings.Join(st.reasons, "; ")}
			if s.i.cfg.Recorder != nil {
				s.i.cfg.Recorder.RecordSecretCall(call)
			}
			s.i.log.Debug("egress: secret placeholder", "sandbox", s.t.SandboxID, "secret", call.Secret, "host", s.host,
				"method", call.Method, "path", call.Path, "replaced", call.Replaced, "reason", call.Reason)
		}
	}
	// swap returns v with secret k's placeholder replaced when it may be; ok false when its
	// value could not be resolved (the request is refused).
	swap := func(k int, v, where string) (string, bool) {
		st := &states[k]
		st.found = true
		switch {
		case !listed[k]:
			st.add("host not listed for this secret")
			return v, true
		case !s.tls:
			st.add("plain HTTP: a secret is only sent over TLS (use https://)")
			return v, true
		case where == "body" && !secrets[k].Body:
			st.add(`found in the body; the secret does not swap bodies (create it with "body": true)`)
			return v, true
		}
		if !resolved[k] {
			val, err := s.i.cfg.Sources.Resolve(secrets[k].From)
			if err != nil {
				st.add("the value could not be resolved: " + errMessage(err))
				return v, false
			}
			values[k], resolved[k] = val, true
			s.remember(k, val)
		}
		st.replaced = true
		return strings.ReplaceAll(v, secrets[k].Placeholder, values[k]), true
	}
	// basic swaps the placeholders inside v when it is HTTP Basic credentials ("Basic " +
	// base64(user ":" password), as git sends a token): the credentials are decoded, each
	// placeholder in them swapped like a header's, and the result encoded again. A value that
	// would put a CR, LF or NUL into the credentials, or a ':' into the user name (moving the
	// user/password boundary), is refused like an unresolvable one: ok false, k the secret.
	// v comes back unchanged when it is not Basic credentials or holds no placeholder.
	basic := func(v string) (out string, k int, ok bool) {
		scheme, cred, found := strings.Cut(strings.TrimLeft(v, " "), " ")
		if !found || !strings.EqualFold(scheme, "Basic") {
			return v, 0, true
		}
		raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(cred))
		if err != nil || !bytes.Contains(raw, []byte(PlaceholderPrefix)) {
			return v, 0, true
		}
		dec := string(raw)
		changed, last := false, 0
		for k := range secrets {
			ph := secrets[k].Placeholder
			if ph == "" || !strings.Contains(dec, ph) {
				continue
			}
			user, _, _ := strings.Cut(dec, ":")
			nd, ok := swap(k, dec, "header")
			if !ok {
				return v, k, false
			}
			if nd == dec {
				continue
			}
			reason := ""
			switch {
			case strings.ContainsAny(nd, "\r\n\x00"):
				reason = "the value would put a line break or a NUL byte into the Basic credentials"
			case strings.Contains(user, ph) && strings.Count(nd, ":") != strings.Count(dec, ":"):
				reason = "the value holds ':' and the placeholder is in the Basic credentials' user name"
			}
			if reason != "" {
				states[k].replaced = false
				states[k].add(reason)
				return v, k, false
			}
			dec, changed, last = nd, true, k
		}
		if !changed {
			return v, 0, true
		}
		enc := base64.StdEncoding.EncodeToString([]byte(dec))
		// an echo of the header would carry the value encoded: the encoded credentials sent
		// upstream are scrubbed back to those the sandbox sent
		s.rememberPair(scrubPair{secret: last, value: []byte(enc), placeholder: []byte(strings.TrimSpace(cred))})
		return scheme + " " + enc, 0, true
	}
	fail := func(k int) (bool, error) {
		record()
		msg := fmt.Sprintf("agentbox egress: secret %s could not be resolved for %s, so the request was not sent: %s",
			secrets[k].Name, s.host, strings.Join(states[k].reasons, "; "))
		s.i.log.Warn("egress: secret not resolved", "sandbox", s.t.SandboxID, "secret", secrets[k].Name, "host", s.host,
			"reason", strings.Join(states[k].reasons, "; "))
		s.reply(http.StatusBadGateway, msg)
		return false, nil
	}

	// headers
	for key, vals := range req.Header {
		for j, v := range vals {
			if key == "Authorization" {
				nv, k, ok := basic(v)
				if !ok {
					return fail(k)
				}
				v = nv
			}
			if !strings.Contains(v, PlaceholderPrefix) {
				vals[j] = v
				continue
			}
			for k := range secrets {
				if secrets[k].Placeholder == "" || !strings.Contains(v, secrets[k].Placeholder) {
					continue
				}
				var ok bool
				if v, ok = swap(k, v, "header"); !ok {
					return fail(k)
				}
			}
			vals[j] = v
		}
	}

	// The client waits for "100 Continue" before sending a body: say it here (upstream is
	// not asked), so the body can be read now.
	if strings.EqualFold(req.Header.Get("Expect"), "100-continue") {
		req.Header.Del("Expect")
		if req.ContentLength != 0 {
			io.WriteString(s.cbw, "HTTP/1.1 100 Continue\r\n\r\n")
			if err := s.cbw.Flush(); err != nil {
				return false, err
			}
		}
	}

	// body, when a secret listed for this host swaps bodies
	scan := false
	for k := range secrets {
		scan = scan || listed[k] && secrets[k].Body && s.tls
	}
	if scan && req.ContentLength != 0 && req.Body != http.NoBody {
		buf, err := io.ReadAll(io.LimitReader(req.Body, MaxScannedBody+1))
		if err != nil {
			return false, fmt.Errorf("egress: reading the request body from the sandbox: %w", err)
		}
		if len(buf) <= MaxScannedBody {
			body := string(buf)
			for k := range secrets {
				if secrets[k].Placeholder == "" || !strings.Contains(body, secrets[k].Placeholder) {
					continue
				}
				var ok bool
				if body, ok = swap(k, body, "body"); !ok {
					return fail(k)
				}
			}
			req.Body = io.NopCloser(strings.NewReader(body))
			req.ContentLength = int64(len(body))
			req.TransferEncoding = nil
		} else {
			req.Body = readCloser{io.MultiReader(bytes.NewReader(buf), req.Body), req.Body}
			for k := range secrets {
				if listed[k] && secrets[k].Body {
					states[k].found = true
					states[k].add(fmt.Sprintf("the request body is over %d MiB and was not scanned", MaxScannedBody>>20))
				}
			}
		}
	}
	record()

	// The values the response must not carry back: every secret listing this host (the host
	// has, or may have had, its value), resolved now, and those resolved earlier on this
	// connection. A value that cannot be resolved was not sent either.
	for k := range secrets {
		if !listed[k] || resolved[k] {
			continue
		}
		if val, err := s.i.cfg.Sources.Resolve(secrets[k].From); err == nil {
			values[k], resolved[k] = val, true
			s.remember(k, val)
		}
	}
	sc := newScrubber(s.values)
	if sc != nil && isUpgrade(req) && isWebSocket(req.Header) {
		// frames are scrubbed (ws.go): no extension may hide their payload
		req.Header.Del("Sec-WebSocket-Extensions")
	}
	if sc != nil {
		// upstream answers in a coding the scrubber reads, or none
		if v, ok := narrowAcceptEncoding(req.Header.Values("Accept-Encoding")); ok {
			req.Header.Set("Accept-Encoding", v)
		}
		// Whole bodies only: two ranges could each hold a part of a value, neither part
		// scrubbed (a server may always answer a range request with the whole body).
		req.Header.Del("Range")
		req.Header.Del("If-Range")
	}

	if _, ok := req.Header["User-Agent"]; !ok {
		req.Header["User-Agent"] = []string{""} // Request.Write adds Go's own otherwise
	}
	resp, err := s.roundTrip(ctx, req, sc)
	if err != nil {
		s.recordScrubs(req, sc)
		s.i.log.Info("egress: upstream failed", "sandbox", s.t.SandboxID, "host", s.host, "error", s.scrub(err))
		s.reply(http.StatusBadGateway, fmt.Sprintf("agentbox egress: %s:%d could not be reached through the interceptor: %v", s.host, s.port, s.scrub(err)))
		return false, err
	}
	defer resp.Body.Close()
	defer s.recordScrubs(req, sc)
	if resp.StatusCode == http.StatusSwitchingProtocols {
		if sc != nil && isWebSocket(req.Header) && resp.Header.Get("Sec-WebSocket-Extensions") != "" {
			s.i.log.Info("egress: upstream WebSocket negotiated an extension it was not offered", "sandbox", s.t.SandboxID, "host", s.host)
			s.reply(http.StatusBadGateway, fmt.Sprintf("agentbox egress: %s answered the WebSocket upgrade with an extension (Sec-WebSocket-Extensions) it was not offered; frames from a host that receives secrets are scrubbed and cannot be under an extension", s.host))
			return false, nil
		}
		scrubHeader(resp.Header, sc)
		resp.Status = statusLine(resp, sc)
		return false, s.upgrade(resp, sc, isWebSocket(req.Header))
	}
	keep, err = s.relay(req, resp, sc)
	if err != nil || !keep {
		return false, err
	}
	if s.reqBody != nil && !s.reqBody.done.Load() {
		return false, nil // upstream answered before the whole body was sent: the rest is on the connection
	}
	if resp.Close {
		s.closeUpstream()
	}
	return true, nil
}

// remember adds secret k's value val to those taken out of this connection's responses and
// errors.
func (s *session) remember(k int, val string) {
	s.rememberPair(scrubPair{secret: k, value: []byte(val), placeholder: []byte(s.t.Secrets[k].Placeholder)})
}

// rememberPair adds p to the pairs taken out of this connection's responses and errors.
func (s *session) rememberPair(p scrubPair) {
	for _, q := range s.values {
		if bytes.Equal(q.value, p.value) {
			return
		}
	}
	s.values = append(s.values, p)
}

func (st *secretState) add(reason string) {
	for _, r := range st.reasons {
		if r == reason {
			return
		}
	}
	st.reasons = append(st.reasons, reason)
}

// roundTrip writes req upstream and reads the response's header (1xx interim responses
// other than 101 are relayed to the sandbox). A bodiless request on a reused connection that
// upstream had closed is sent again on a new one.
func (s *session) roundTrip(ctx context.Context, req *http.Request, sc *scrubber) (*http.Response, error) {
	s.reqBody = nil
	for attempt := 0; ; attempt++ {
		if err := s.ensureUpstream(ctx, isUpgrade(req)); err != nil {
			return nil, err
		}
		s.mu.Lock()
		cc := s.h2
		s.mu.Unlock()
		if cc != nil {
			resp, body, err := s.roundTripH2(ctx, cc, req, sc)
			s.reqBody = body
			if err != nil {
				s.closeUpstream()
				return nil, err
			}
			return resp, nil
		}
		reused := s.used
		s.used = true
		body := req.Body
		if body != nil && body != http.NoBody {
			req.Body = flushBeforeRead{r: body, src: s.cbr, dst: s.ubw}
		}
		err := req.Write(s.ubw)
		if err == nil {
			err = s.ubw.Flush()
		}
		req.Body = body
		var resp *http.Response
		if err == nil {
			for {
				s.ulim.N = MaxHeaderBytes
				resp, err = http.ReadResponse(s.ubr, req)
				if err != nil && s.ulim.N <= 0 {
					err = fmt.Errorf("the response header is over %d KiB", MaxHeaderBytes>>10)
				}
				s.ulim.N = math.MaxInt64
				if err != nil || resp.StatusCode >= 200 || resp.StatusCode == http.StatusSwitchingProtocols {
					break
				}
				if err = s.writeInterim(req, resp, sc); err != nil {
					return nil, err
				}
			}
		}
		if err == nil {
			return resp, nil
		}
		s.closeUpstream()
		bodiless := req.ContentLength == 0 && (req.Body == nil || req.Body == http.NoBody)
		if !reused || !bodiless || attempt > 0 || !(errors.Is(err, io.EOF) || errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET)) {
			return nil, err
		}
	}
}

// isUpgrade reports whether req asks to switch protocols (a WebSocket, say), which only
// HTTP/1.1 carries.
func isUpgrade(req *http.Request) bool {
	if req.Header.Get("Upgrade") == "" {
		return false
	}
	for _, v := range req.Header.Values("Connection") {
		for _, t := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), "upgrade") {
				return true
			}
		}
	}
	return false
}

// ensureUpstream dials upstream when there is no connection, or when the one there speaks
// HTTP/2 and the request is an upgrade or the connection takes no new request. Upstream is
// offered h2 and http/1.1 (http/1.1 alone for an upgrade).
func (s *session) ensureUpstream(ctx context.Context, upgrade bool) error {
	s.mu.Lock()
	up, cc := s.up, s.h2
	s.mu.Unlock()
	if up != nil && cc != nil && (upgrade || !cc.CanTakeNewRequest()) {
		s.closeUpstream()
		up = nil
	}
	if up != nil {
		return nil
	}
	cc = nil
	protos := []string{"h2", "http/1.1"}
	if upgrade {
		protos = []string{"http/1.1"}
	}
	raw, err := s.dial(ctx)
	if err != nil {
		return err
	}
	conn := raw
	if s.tls {
		tc := tls.Client(raw, &tls.Config{ServerName: s.host, RootCAs: s.i.cfg.UpstreamRoots, MinVersion: tls.VersionTLS12,
			NextProtos: protos})
		hctx, cancel := context.WithTimeout(ctx, s.i.cfg.HandshakeTimeout)
		err := tc.HandshakeContext(hctx)
		cancel()
		if err != nil {
			raw.Close()
			return fmt.Errorf("TLS with %s: %w", s.host, err)
		}
		conn = tc
		if tc.ConnectionState().NegotiatedProtocol == "h2" {
			cc, err = h2Transport.NewClientConn(tc)
			if err != nil {
				raw.Close()
				return fmt.Errorf("HTTP/2 with %s: %w", s.host, err)
			}
		}
	}
	s.mu.Lock()
	s.up, s.h2 = conn, cc
	s.mu.Unlock()
	if ctx.Err() != nil { // the AfterFunc may have run before up was set
		s.closeUpstream()
		return ctx.Err()
	}
	s.used = false
	s.ulim = &io.LimitedReader{R: conn, N: math.MaxInt64}
	s.ubr = bufio.NewReaderSize(s.ulim, bufSize)
	s.ubw = bufio.NewWriterSize(conn, bufSize)
	return nil
}

func (s *session) closeUpstream() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.h2 != nil {
		s.h2.Close()
		s.h2 = nil
	}
	if s.up != nil {
		s.up.Close()
		s.up = nil
	}
}

// upgrade relays a 101 response and then the bytes both ways until either side ends; with sc,
// what upstream sends is scrubbed: a WebSocket's frames (ws.go), any other protocol as a
// stream.
func (s *session) upgrade(resp *http.Response, sc *scrubber, websocket bool) error {
	if err := resp.Write(s.cbw); err != nil {
		return err
	}
	if err := s.cbw.Flush(); err != nil {
		return err
	}
	s.mu.Lock()
	up := s.up
	s.mu.Unlock()
	if up == nil {
		return net.ErrClosed
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		io.Copy(up, s.cbr)
		up.Close()
		s.conn.Close()
	}()
	var err error
	switch {
	case sc == nil:
		io.Copy(s.conn, s.ubr)
	case websocket:
		err = newWSScrubber(sc, s.ubr, s.conn).run()
	default:
		sw := &scrubWriter{s: sc, w: s.conn}
		io.Copy(sw, s.ubr)
		sw.Close()
	}
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) && !errors.Is(err, io.ErrUnexpectedEOF) {
		s.i.log.Info("egress: WebSocket from upstream cut off", "sandbox", s.t.SandboxID, "host", s.host, "error", s.scrub(err))
	}
	up.Close()
	s.conn.Close()
	<-done
	return nil
}

// hostOK reports whether req is for the connection's host (and port, when it names one): a
// secret's host is decided per connection, so a request may not name another (a fronted
// host behind the same address must not receive the value).
func (s *session) hostOK(req *http.Request) bool {
	h := req.Host
	if h == "" {
		return true
	}
	name, port, err := net.SplitHostPort(h)
	if err != nil {
		name, port = h, ""
	}
	name = NormalizeHost(strings.TrimSuffix(strings.TrimPrefix(name, "["), "]"))
	return name == s.host && (port == "" || port == strconv.Itoa(s.port))
}

// reply writes a text/plain response with Connection: close.
func (s *session) reply(code int, msg string) {
	msg += "\n"
	fmt.Fprintf(s.cbw, "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		code, http.StatusText(code), len(msg), msg)
	s.cbw.Flush()
}

// scrub removes the values resolved on this connection from err's text (an upstream could
// echo a header into a malformed status line); the result does not wrap err.
func (s *session) scrub(err error) error {
	if err == nil || len(s.values) == 0 {
		return err
	}
	msg := err.Error()
	changed := false
	for _, p := range s.values {
		if v := string(p.value); v != "" && strings.Contains(msg, v) {
			msg, changed = strings.ReplaceAll(msg, v, "[secret]"), true
		}
	}
	if !changed {
		return err
	}
	return errors.New(msg)
}

// errMessage is err's caller-safe message (Sources' errors are typed and name the source,
// never the value).
func errMessage(err error) string { return errcode.Message(err) }

// flushBeforeRead flushes dst whenever reading from r would wait for the network (src has
// nothing buffered), so a streamed body (server-sent events, say) reaches the other side as
// it comes, while bursts still go out in large writes.
type flushBeforeRead struct {
	r   io.ReadCloser
	src *bufio.Reader
	dst *bufio.Writer
}

func (f flushBeforeRead) Read(p []byte) (int, error) {
	if f.src.Buffered() == 0 && f.dst.Buffered() > 0 {
		if err := f.dst.Flush(); err != nil {
			return 0, err
		}
	}
	return f.r.Read(p)
}

func (f flushBeforeRead) Close() error { return f.r.Close() }

type readCloser struct {
	io.Reader
	io.Closer
}
