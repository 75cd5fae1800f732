package mitm

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/agentbox/agentbox/internal/egress"
)

// The response goes to the sandbox in agentbox's own HTTP/1.1 framing, whatever upstream's was
// (HTTP/1.0, close-delimited, chunked with trailers): the header is written once, hop-by-hop
// fields dropped, and the body is framed for the sandbox's request —
//   - bodyless (HEAD, 1xx, 204, 304): the header alone, its Content-Length as upstream sent it;
//   - a known length and nothing to scrub: Content-Length and the bytes as they come;
//   - otherwise chunked (trailers after the last chunk), or, for an HTTP/1.0 request,
//     delimited by closing the connection.
// A body that is scrubbed is decoded first (its Content-Encoding dropped) and always framed
// chunked or close-delimited, since a value and its placeholder differ in length.

// hopHeaders are the response's hop-by-hop fields: they describe upstream's connection, not
// the sandbox's.
var hopHeaders = []string{"Connection", "Keep-Alive", "Proxy-Connection", "Transfer-Encoding", "Te", "Trailer", "Upgrade"}

type framing int

const (
	frameNone framing = iota
	frameLength
	frameChunked
	frameClose
)

var copyBufs = sync.Pool{New: func() any { b := make([]byte, bufSize); return &b }}

// bodyless reports whether the response to method with code has no body (RFC 9112 §6.3).
func bodyless(method string, code int) bool {
	return method == http.MethodHead || code/100 == 1 || code == http.StatusNoContent || code == http.StatusNotModified
}

// dropHop removes h's hop-by-hop fields and those its Connection field names.
func dropHop(h http.Header) {
	for _, v := range h["Connection"] {
		for _, name := range strings.Split(v, ",") {
			if name = strings.TrimSpace(name); name != "" {
				h.Del(name)
			}
		}
	}
	for _, k := range hopHeaders {
		h.Del(k)
	}
}

// scrubHeader replaces values in h's names and values (sc nil: nothing).
func scrubHeader(h http.Header, sc *scrubber) {
	if sc == nil {
		return
	}
	for k, vs := range h {
		for i, v := range vs {
			vs[i] = sc.String(v)
		}
		if nk := sc.String(k); nk != k {
			delete(h, k)
			h[textproto.CanonicalMIMEHeaderKey(nk)] = vs
		}
	}
}

// writeInterim relays a 1xx response (not 100 Continue, which the interceptor already
// answered, and not 101) to the sandbox, scrubbed; an HTTP/1.0 request gets none.
func (s *session) writeInterim(req *http.Request, resp *http.Response, sc *scrubber) error {
	if !req.ProtoAtLeast(1, 1) || resp.StatusCode == http.StatusContinue {
		return nil
	}
	h := resp.Header.Clone()
	dropHop(h)
	scrubHeader(h, sc)
	fmt.Fprintf(s.cbw, "HTTP/1.1 %s\r\n", statusLine(resp, sc))
	h.Write(s.cbw)
	io.WriteString(s.cbw, "\r\n")
	return s.cbw.Flush()
}

// statusLine is resp's status code and reason phrase, scrubbed.
func statusLine(resp *http.Response, sc *scrubber) string {
	code := strconv.Itoa(resp.StatusCode)
	reason := strings.TrimSpace(strings.TrimPrefix(resp.Status, code))
	if reason == "" {
		reason = http.StatusText(resp.StatusCode)
	}
	return code + " " + strings.NewReplacer("\r", " ", "\n", " ").Replace(sc.String(reason))
}

// relay writes resp (the answer to req) to the sandbox, its body scrubbed by sc when sc is
// not nil; keep says whether the sandbox's connection may carry another request.
func (s *session) relay(req *http.Request, resp *http.Response, sc *scrubber) (keep bool, err error) {
	client11 := req.ProtoAtLeast(1, 1)
	keep = client11 && !req.Close
	h := resp.Header.Clone()
	dropHop(h)
	fl := &relayFlusher{r: resp.Body, src: s.ubr, dst: s.cbw}
	var body io.Reader = fl
	mode := frameNone
	if !bodyless(req.Method, resp.StatusCode) {
		switch {
		case sc != nil:
			dec, closeDec, err := decoder(body, h.Values("Content-Encoding"))
			if err != nil {
				return s.refuseEncoding(req, resp, sc, err)
			}
			defer closeDec()
			body = dec
			h.Del("Content-Encoding")
			h.Del("Content-Length")
			// the bytes change: a digest of the representation would no longer hold
			h.Del("Content-Md5")
			h.Del("Digest")
			h.Del("Repr-Digest")
			h.Del("Content-Digest")
			mode = frameChunked
		case resp.ContentLength >= 0:
			h.Del("Content-Length")
			mode = frameLength
		default:
			h.Del("Content-Length")
			mode = frameChunked
		}
		if mode == frameChunked && !client11 {
			mode = frameClose
		}
	}
	if mode == frameClose {
		keep = false
	}
	var trailerNames []string
	if mode == frameChunked {
		for k := range resp.Trailer {
			trailerNames = append(trailerNames, sc.String(k))
		}
		if len(trailerNames) > 0 {
			h.Set("Trailer", strings.Join(trailerNames, ", "))
		}
	}
	scrubHeader(h, sc)
	w := s.cbw
	fmt.Fprintf(w, "HTTP/1.1 %s\r\n", statusLine(resp, sc))
	h.Write(w)
	switch mode {
	case frameLength:
		fmt.Fprintf(w, "Content-Length: %d\r\n", resp.ContentLength)
	case frameChunked:
		io.WriteString(w, "Transfer-Encoding: chunked\r\n")
	}
	if !keep {
		io.WriteString(w, "Connection: close\r\n")
	}
	io.WriteString(w, "\r\n")
	if mode == frameNone {
		return keep, w.Flush()
	}

	var dst io.Writer = fl
	var cw *chunkWriter
	if mode == frameChunked {
		cw = &chunkWriter{w: fl}
		dst = cw
	}
	var sw *scrubWriter
	if sc != nil {
		sw = &scrubWriter{s: sc, w: dst}
		dst = sw
	}
	bp := copyBufs.Get().(*[]byte)
	_, err = io.CopyBuffer(onlyWriter{dst}, body, *bp)
	copyBufs.Put(bp)
	if ferr := fl.stop(); err == nil && ferr != nil {
		err = ferr
	}
	if err != nil {
		return false, fmt.Errorf("egress: relaying the response body of %s: %w", s.host, s.scrub(err))
	}
	if sw != nil {
		if err := sw.Close(); err != nil {
			return false, err
		}
	}
	if cw != nil {
		io.WriteString(w, "0\r\n")
		if len(resp.Trailer) > 0 {
			t := resp.Trailer.Clone()
			scrubHeader(t, sc)
			t.Write(w)
		}
		io.WriteString(w, "\r\n")
	}
	return keep, w.Flush()
}

// refuseEncoding answers 502 for a response whose body cannot be decoded to be scrubbed,
// records it for each secret in sc, and drops the upstream connection (its body unread).
func (s *session) refuseEncoding(req *http.Request, resp *http.Response, sc *scrubber, why error) (bool, error) {
	s.closeUpstream()
	reason := fmt.Sprintf("the response was refused: its body is in a form the proxy cannot decode (%v), so a secret's value in it could not be replaced by its placeholder", why)
	for _, p := range sc.pairs {
		s.recordCall(req, p.secret, egress.SecretCall{Reason: reason})
	}
	s.i.log.Warn("egress: response refused", "sandbox", s.t.SandboxID, "host", s.host, "status", resp.StatusCode,
		"content_encoding", strings.Join(resp.Header.Values("Content-Encoding"), ", "), "reason", why.Error())
	s.reply(http.StatusBadGateway, fmt.Sprintf("agentbox egress: the response of %s (%d) was refused: %v cannot be decoded, so the proxy could not take secrets' values out of it. "+
		"Ask for an encoding the proxy reads (Accept-Encoding: gzip, deflate, zstd or identity).", s.host, resp.StatusCode, why))
	return false, nil
}

// recordCall records c for secret k of the request req (time, names, method and path filled).
func (s *session) recordCall(req *http.Request, k int, c egress.SecretCall) {
	sec := s.t.Secrets[k]
	c.SandboxID, c.Time, c.Secret, c.Host, c.Method, c.Path = s.t.SandboxID, time.Now().UTC(), sec.Name, s.host, req.Method, recordedPath(req)
	if s.i.cfg.Recorder != nil {
		s.i.cfg.Recorder.RecordSecretCall(c)
	}
	s.i.log.Debug("egress: secret call", "sandbox", s.t.SandboxID, "secret", c.Secret, "host", s.host,
		"method", c.Method, "path", c.Path, "replaced", c.Replaced, "scrubbed", c.Scrubbed, "reason", c.Reason)
}

// recordScrubs records, for each secret whose value the response carried, how many times it
// was replaced by its placeholder.
func (s *session) recordScrubs(req *http.Request, sc *scrubber) {
	if sc == nil {
		return
	}
	for i, n := range sc.counts {
		if n == 0 {
			continue
		}
		s.recordCall(req, sc.pairs[i].secret, egress.SecretCall{Scrubbed: n,
			Reason: fmt.Sprintf("the response carried the value %d time(s); the sandbox got the placeholder instead", n)})
		sc.counts[i] = 0
	}
}

func recordedPath(req *http.Request) string {
	path := req.URL.Path
	if len(path) > maxRecordedPath {
		path = path[:maxRecordedPath] + "…"
	}
	return path
}

// chunkWriter writes each Write as one HTTP/1.1 chunk.
type chunkWriter struct {
	w   io.Writer
	buf []byte
}

func (c *chunkWriter) Write(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	c.buf = strconv.AppendInt(c.buf[:0], int64(len(p)), 16)
	c.buf = append(c.buf, '\r', '\n')
	if _, err := c.w.Write(c.buf); err != nil {
		return 0, err
	}
	if _, err := c.w.Write(p); err != nil {
		return 0, err
	}
	if _, err := c.w.Write(crlf); err != nil {
		return 0, err
	}
	return len(p), nil
}

var crlf = []byte("\r\n")

// fullRead is the most one read of a TLS connection returns (a record's plaintext): a read
// that long most likely has more of the body right behind it.
const fullRead = 16 << 10

// flushDelay is how long a flush after a full read is put off: if the next read waits longer
// than that, what was written goes out.
const flushDelay = time.Millisecond

// relayFlusher is a response body's reader and, below the framing, its writer to the sandbox.
// What was written is flushed whenever the next read may wait for the network, so a streamed
// body (server-sent events) reaches the sandbox as it comes. After a full read (a bulk
// transfer) the flush is put off by flushDelay instead, and called off when the read returns
// sooner: a flush per read would send each read's bytes plus the chunk framing's few as one
// whole TLS record and one of a few bytes, a third of the records for nothing.
type relayFlusher struct {
	r    io.Reader
	src  *bufio.Reader // upstream's reader: bytes buffered there mean no wait
	full bool          // the last read was a full one

	mu    sync.Mutex // dst, err: the timer flushes while a read waits
	dst   *bufio.Writer
	timer *time.Timer
	err   error // the timer's flush failed
	done  bool  // stopped: a late timer does nothing
}

func (f *relayFlusher) Read(p []byte) (int, error) {
	if f.src.Buffered() == 0 {
		f.mu.Lock()
		if f.err == nil && f.dst.Buffered() > 0 {
			if !f.full {
				f.err = f.dst.Flush()
			} else if f.timer == nil {
				f.timer = time.AfterFunc(flushDelay, f.flushLater)
			} else {
				f.timer.Reset(flushDelay)
			}
		}
		err := f.err
		f.mu.Unlock()
		if err != nil {
			return 0, err
		}
	}
	n, err := f.r.Read(p)
	if f.timer != nil {
		f.timer.Stop()
	}
	f.full = n >= fullRead
	return n, err
}

func (f *relayFlusher) flushLater() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err == nil && !f.done {
		f.err = f.dst.Flush()
	}
}

func (f *relayFlusher) Write(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return 0, f.err
	}
	return f.dst.Write(p)
}

// stop ends the timer: what follows is written straight to dst. It returns a failed flush's error.
func (f *relayFlusher) stop() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.timer != nil {
		f.timer.Stop()
	}
	f.done = true
	return f.err
}

// onlyWriter hides a writer's ReadFrom, so io.CopyBuffer uses its buffer (and each read
// becomes one write: one chunk, one scrub pass).
type onlyWriter struct{ io.Writer }
