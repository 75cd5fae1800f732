package mitm

import (
	"bufio"
	"bytes"
	"compress/zlib"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"

	"github.com/agentbox/agentbox/internal/egress"
)

const echoValue = "sk-live-echoed-secret-value-0123456789"

// waitScrubbed waits for the records of scrubbed responses (they are written once the
// response has gone to the sandbox, which may be just after the client read its end) and
// returns the total per secret.
func (e *env) waitScrubbed(t *testing.T, want map[string]int64) []egress.SecretCall {
	t.Helper()
	var all []egress.SecretCall
	got := map[string]int64{}
	deadline := time.Now().Add(5 * time.Second)
	for {
		for _, c := range e.rec.take() {
			all = append(all, c)
			got[c.Secret] += c.Scrubbed
		}
		same := len(got) >= len(want)
		for k, v := range want {
			same = same && got[k] == v
		}
		if same || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("scrubbed %s: %d, want %d (calls %+v)", k, got[k], v, all)
		}
	}
	return all
}

// echoHandler answers with the request's Authorization in a header and in the body, in the
// coding the test names: identity with a length, gzip, deflate (zlib), zstd, or chunked with
// the value split across two chunks written apart.
func echoHandler(t *testing.T, coding string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		auth := r.Header.Get("Authorization")
		body := []byte("you sent: " + auth + "\nand again: " + auth + "\n")
		w.Header().Set("X-Echo", auth)
		w.Header().Set("X-Accept-Encoding", r.Header.Get("Accept-Encoding"))
		switch coding {
		case "identity":
			w.Write(body)
		case "gzip", "deflate", "zstd":
			var buf bytes.Buffer
			var zw io.WriteCloser
			switch coding {
			case "gzip":
				zw = gzip.NewWriter(&buf)
			case "deflate":
				zw = zlib.NewWriter(&buf)
			default:
				zw, _ = zstd.NewWriter(&buf)
			}
			zw.Write(body)
			zw.Close()
			w.Header().Set("Content-Encoding", coding)
			w.Write(buf.Bytes())
		case "chunked":
			half := strings.Index(string(body), auth) + len(auth)/2
			io.WriteString(w, string(body[:half]))
			w.(http.Flusher).Flush()
			time.Sleep(20 * time.Millisecond) // the interceptor reads the first half alone
			w.Write(body[half:])
		default:
			t.Errorf("coding %q", coding)
		}
	}
}

// TestScrubEchoedValue: a secret's host that echoes the request's headers gives the value
// back; the sandbox gets the placeholder in its place, in the header and the body, whatever
// the body's coding or framing, and each response's scrub is recorded.
func TestScrubEchoedValue(t *testing.T) {
	for _, coding := range []string{"identity", "gzip", "deflate", "zstd", "chunked"} {
		t.Run(coding, func(t *testing.T) {
			e := newEnv(t, secretsAB(false), false)
			e.setVar("TEST_OPENAI", echoValue)
			e.handler.Store(echoHandler(t, coding))
			c := e.client("api.example.com", nil)
			hdr := map[string]string{"Authorization": "Bearer " + phA}
			if coding != "identity" && coding != "chunked" {
				hdr["Accept-Encoding"] = coding // so the client gets what it asked for, decoded by the proxy
			}
			resp, body := do(t, c, "GET", "https://api.example.com/echo", nil, hdr)
			if resp.StatusCode != 200 {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			want := "you sent: Bearer " + phA + "\nand again: Bearer " + phA + "\n"
			if body != want {
				t.Fatalf("body %q, want %q", body, want)
			}
			if got := resp.Header.Get("X-Echo"); got != "Bearer "+phA {
				t.Fatalf("X-Echo %q", got)
			}
			if ce := resp.Header.Get("Content-Encoding"); ce != "" {
				t.Fatalf("Content-Encoding %q reached the sandbox over a decoded body", ce)
			}
			calls := e.waitScrubbed(t, map[string]int64{"OPENAI_API_KEY": 3})
			e.assertNoValue(t, calls, echoValue)
			var scrubs []egress.SecretCall
			for _, c := range calls {
				if c.Scrubbed > 0 {
					scrubs = append(scrubs, c)
				}
			}
			if len(scrubs) != 1 || scrubs[0].Path != "/echo" || scrubs[0].Method != "GET" || scrubs[0].Host != "api.example.com" ||
				scrubs[0].SandboxID != "sb-test" || !strings.Contains(scrubs[0].Reason, "3 time(s)") {
				t.Fatalf("scrub records %+v", scrubs)
			}
		})
	}
}

// TestScrubPlainHTTP: over plain HTTP the value is never sent, but a host that has it (from an
// earlier HTTPS request) and shows it gets it scrubbed all the same.
func TestScrubPlainHTTP(t *testing.T) {
	e := newEnv(t, secretsAB(false), true)
	e.setVar("TEST_OPENAI", echoValue)
	e.handler.Store(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Last-Key", echoValue)
		io.WriteString(w, "last key seen: "+echoValue)
	}))
	c := e.client("api.example.com", nil)
	resp, body := do(t, c, "GET", "http://api.example.com/debug", nil, nil)
	if body != "last key seen: "+phA || resp.Header.Get("X-Last-Key") != phA {
		t.Fatalf("%q %v", body, resp.Header)
	}
	e.waitScrubbed(t, map[string]int64{"OPENAI_API_KEY": 2})
}

// TestScrubNarrowsAcceptEncoding: upstream is asked only for codings the proxy decodes; a
// response in another one is refused with 502 and a reason, never passed through.
func TestScrubNarrowsAcceptEncoding(t *testing.T) {
	e := newEnv(t, secretsAB(false), false)
	e.setVar("TEST_OPENAI", echoValue)
	var asked []string
	var mu sync.Mutex
	e.handler.Store(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		asked = append(asked, r.Header.Get("Accept-Encoding"))
		mu.Unlock()
		w.Header().Set("Content-Encoding", "br") // whatever it was asked
		w.Write([]byte("\x1b\x0b\x00\xf8" + r.Header.Get("Authorization")))
	}))
	c := e.client("api.example.com", nil)
	resp, body := do(t, c, "GET", "https://api.example.com/br", nil,
		map[string]string{"Authorization": "Bearer " + phA, "Accept-Encoding": "br, gzip;q=0.8, zstd"})
	if resp.StatusCode != http.StatusBadGateway || !strings.Contains(body, `content coding "br"`) || !strings.Contains(body, "cannot be decoded") {
		t.Fatalf("status %d, body %q", resp.StatusCode, body)
	}
	if strings.Contains(body, echoValue) {
		t.Fatal("the value reached the sandbox")
	}
	mu.Lock()
	if len(asked) != 1 || asked[0] != "gzip;q=0.8, zstd" {
		t.Fatalf("upstream was asked Accept-Encoding %q", asked)
	}
	mu.Unlock()
	// a request offering only codings the proxy cannot read asks for identity
	resp, _ = do(t, c, "GET", "https://api.example.com/br", nil, map[string]string{"Accept-Encoding": "br"})
	if resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("status %d", resp.StatusCode)
	}
	mu.Lock()
	if len(asked) != 2 || asked[1] != "identity" {
		t.Fatalf("upstream was asked Accept-Encoding %q", asked)
	}
	mu.Unlock()
	var refused bool
	for _, call := range e.rec.take() {
		refused = refused || strings.Contains(call.Reason, "the response was refused")
	}
	if !refused {
		t.Fatal("the refusal was not recorded")
	}
}

// TestScrubValueAcrossBoundaries: a large body with values at every offset around the
// interceptor's read size, scrubbed whole.
func TestScrubValueAcrossBoundaries(t *testing.T) {
	e := newEnv(t, secretsAB(false), false)
	e.setVar("TEST_OPENAI", echoValue)
	var src bytes.Buffer
	n := 0
	for i := 0; src.Len() < 3*bufSize; i++ {
		src.WriteString(strings.Repeat("x", i%97))
		src.WriteString(echoValue)
		n++
	}
	e.handler.Store(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b := src.Bytes()
		for len(b) > 0 { // writes of odd sizes, flushed: chunks that split the values
			k := min(len(b), 1000+len(b)%777)
			w.Write(b[:k])
			w.(http.Flusher).Flush()
			b = b[k:]
		}
	}))
	c := e.client("api.example.com", nil)
	_, body := do(t, c, "GET", "https://api.example.com/big", nil, nil)
	if want := strings.ReplaceAll(src.String(), echoValue, phA); body != want {
		t.Fatalf("body differs (%d bytes, want %d)", len(body), len(want))
	}
	e.waitScrubbed(t, map[string]int64{"OPENAI_API_KEY": int64(n)})
}

// rawTLS serves conns on a loopback TLS listener with a leaf of e's upstream CA, each with
// serve; e's interceptor dials it instead of the httptest server.
func (e *env) rawTLS(t *testing.T, serve func(c net.Conn, br *bufio.Reader)) {
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{NextProtos: []string{"http/1.1"},
		GetCertificate: func(h *tls.ClientHelloInfo) (*tls.Certificate, error) { return e.upCA.Leaf(h.ServerName) }})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { e.close(); ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				c.SetDeadline(time.Now().Add(10 * time.Second))
				serve(c, bufio.NewReader(c))
			}()
		}
	}()
	e.dialTo.Store(ln.Addr().String())
}

// readReq reads one request's header (and a body with a length) and returns it.
func readReq(br *bufio.Reader) (*http.Request, error) {
	req, err := http.ReadRequest(br)
	if err != nil {
		return nil, err
	}
	io.Copy(io.Discard, req.Body)
	return req, nil
}

// TestFramingHTTP10Upstream: an HTTP/1.0 server's close-delimited answer reaches the sandbox
// whole and once (not its status line and headers again as the body), scrubbed, and the
// sandbox's connection carries the next request (upstream redialled).
func TestFramingHTTP10Upstream(t *testing.T) {
	for _, tc := range []struct{ name, status string }{
		{"http10", "HTTP/1.0 200 OK"},
		{"http11-close-delimited", "HTTP/1.1 200 OK\r\nConnection: close"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, secretsAB(false), false)
			e.setVar("TEST_OPENAI", echoValue)
			e.rawTLS(t, func(c net.Conn, br *bufio.Reader) {
				req, err := readReq(br)
				if err != nil {
					return
				}
				io.WriteString(c, tc.status+"\r\nContent-Type: text/plain\r\nX-Echo: "+req.Header.Get("Authorization")+"\r\n\r\n")
				io.WriteString(c, "hello from an old server; you sent "+req.Header.Get("Authorization"))
				time.Sleep(10 * time.Millisecond)
				io.WriteString(c, " and that is all")
			})
			c := e.client("api.example.com", nil)
			for i := 0; i < 3; i++ {
				resp, body := do(t, c, "GET", "https://api.example.com/old", nil, map[string]string{"Authorization": phA})
				if want := "hello from an old server; you sent " + phA + " and that is all"; resp.StatusCode != 200 || body != want {
					t.Fatalf("request %d: %d %q, want %q", i, resp.StatusCode, body, want)
				}
				if resp.Header.Get("X-Echo") != phA || resp.Header.Get("Content-Type") != "text/plain" {
					t.Fatalf("header %v", resp.Header)
				}
			}
			if n := e.accepted.Load(); n != 1 {
				t.Fatalf("%d sandbox connections for 3 requests: not kept alive", n)
			}
			e.waitScrubbed(t, map[string]int64{"OPENAI_API_KEY": 6})
		})
	}
}

// TestFramingHTTP10Client: a sandbox speaking HTTP/1.0 gets a close-delimited body (no
// chunks) and no 1xx.
func TestFramingHTTP10Client(t *testing.T) {
	e := newEnv(t, secretsAB(false), false)
	e.setVar("TEST_OPENAI", echoValue)
	e.handler.Store(echoHandler(t, "chunked"))
	conn := e.dialSandbox(t)
	io.WriteString(conn, "GET /x HTTP/1.0\r\nHost: api.example.com\r\nAuthorization: "+phA+"\r\n\r\n")
	all, err := io.ReadAll(conn)
	if err != nil {
		t.Fatal(err)
	}
	head, body, _ := strings.Cut(string(all), "\r\n\r\n")
	if !strings.HasPrefix(head, "HTTP/1.1 200 OK\r\n") || strings.Contains(head, "chunked") || !strings.Contains(head, "Connection: close") {
		t.Fatalf("head %q", head)
	}
	if want := "you sent: " + phA + "\nand again: " + phA + "\n"; body != want {
		t.Fatalf("body %q, want %q", body, want)
	}
}

// dialSandbox opens a sandbox-side TLS connection to the interceptor for api.example.com.
func (e *env) dialSandbox(t *testing.T) *tls.Conn {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(e.ca.CertPEM())
	conn, err := tls.Dial("tcp", e.listen("api.example.com"), &tls.Config{RootCAs: pool, ServerName: "api.example.com"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	return conn
}

// TestFramingInterimAndTrailers: 103 Early Hints reach the sandbox (scrubbed) before the
// response; 100-continue lets the body through; trailers arrive after the body (scrubbed).
func TestFramingInterimAndTrailers(t *testing.T) {
	e := newEnv(t, secretsAB(false), false)
	e.setVar("TEST_OPENAI", echoValue)
	e.handler.Store(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth := r.Header.Get("Authorization")
		switch r.URL.Path {
		case "/hints":
			w.Header().Set("Link", "</style.css?k="+auth+">; rel=preload")
			w.WriteHeader(http.StatusEarlyHints)
			w.Header().Del("Link")
			io.WriteString(w, "page")
		case "/upload":
			b, _ := io.ReadAll(r.Body)
			io.WriteString(w, "got "+string(b))
		case "/trailers":
			w.Header().Set("Trailer", "X-Checksum")
			io.WriteString(w, "body first")
			w.Header().Set("X-Checksum", "sum-"+auth)
		}
	}))
	c := e.client("api.example.com", nil)

	var hints []http.Header
	trace := &httptrace.ClientTrace{Got1xxResponse: func(code int, h textproto.MIMEHeader) error {
		if code == http.StatusEarlyHints {
			hints = append(hints, http.Header(h))
		}
		return nil
	}}
	req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), "GET", "https://api.example.com/hints", nil)
	req.Header.Set("Authorization", phA)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "page" || len(hints) != 1 || hints[0].Get("Link") != "</style.css?k="+phA+">; rel=preload" {
		t.Fatalf("body %q, hints %v", b, hints)
	}

	req, _ = http.NewRequest("POST", "https://api.example.com/upload", strings.NewReader("the payload"))
	req.Header.Set("Expect", "100-continue")
	resp, err = c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != "got the payload" {
		t.Fatalf("100-continue: %d %q", resp.StatusCode, b)
	}

	req, _ = http.NewRequest("GET", "https://api.example.com/trailers", nil)
	req.Header.Set("Authorization", phA)
	resp, err = c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "body first" || resp.Trailer.Get("X-Checksum") != "sum-"+phA {
		t.Fatalf("body %q, trailer %v", b, resp.Trailer)
	}
	if n := e.accepted.Load(); n != 1 {
		t.Fatalf("%d sandbox connections: not kept alive", n)
	}
	e.waitScrubbed(t, map[string]int64{"OPENAI_API_KEY": 2})
}

// TestScrubberStream checks the streaming scrubber against a plain replace over random
// splits, with values that overlap themselves and each other, and that what it holds back
// stays under the longest value.
func TestScrubberStream(t *testing.T) {
	values := []string{"abab", "abac", "aaab", "zz", "xyzxyzxyq"}
	phs := []string{"<1>", "<second>", "<3>", "<4>", "<5--------------->"}
	var pairs []scrubPair
	for i, v := range values {
		pairs = append(pairs, scrubPair{secret: i, value: []byte(v), placeholder: []byte(phs[i])})
	}
	ref := func(s string) string { return refScrub(s, values, phs) }
	rng := rand.New(rand.NewPCG(1, 2))
	for round := 0; round < 2000; round++ {
		var in strings.Builder
		for in.Len() < rng.IntN(400) {
			if rng.IntN(4) == 0 {
				in.WriteString(values[rng.IntN(len(values))])
			} else {
				in.WriteByte("abcxyzq"[rng.IntN(7)])
			}
		}
		s := in.String()
		var out bytes.Buffer
		sw := &scrubWriter{s: newScrubber(pairs), w: &out}
		for rest := s; len(rest) > 0; {
			k := min(len(rest), 1+rng.IntN(9))
			sw.Write([]byte(rest[:k]))
			if len(sw.pend) >= len("xyzxyzxyq") {
				t.Fatalf("held back %d bytes", len(sw.pend))
			}
			rest = rest[k:]
		}
		sw.Close()
		if want := ref(s); out.String() != want {
			t.Fatalf("in %q:\n got %q\nwant %q", s, out.String(), want)
		}
	}
}

// BenchmarkScrubWriter: one and three secrets over 32 KiB writes of random bytes (a
// download) and of text.
func BenchmarkScrubWriter(b *testing.B) {
	random := make([]byte, bufSize)
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range random {
		random[i] = byte(rng.Uint32())
	}
	text := make([]byte, bufSize)
	for i := range text {
		text[i] = "the quick brown fox jumps over the lazy dog sk- "[i%48]
	}
	for _, n := range []int{1, 3} {
		var pairs []scrubPair
		for i := range n {
			pairs = append(pairs, scrubPair{secret: i, value: []byte(fmt.Sprint(echoValue, i)), placeholder: []byte(phA)})
		}
		for name, buf := range map[string][]byte{"random": random, "text": text} {
			b.Run(fmt.Sprintf("%s/%d-secrets", name, n), func(b *testing.B) {
				sw := &scrubWriter{s: newScrubber(pairs), w: io.Discard}
				b.SetBytes(int64(len(buf)))
				for b.Loop() {
					sw.Write(buf)
				}
			})
		}
	}
}

// TestFramingUpstreamHTTP2: an upstream that offers HTTP/2 (beside HTTP/1.1, or alone) is
// spoken to in HTTP/2 over one connection across several requests, bodies, trailers and 103s
// included, scrubbed like any other; an upgrade goes over an HTTP/1.1 connection of its own.
func TestFramingUpstreamHTTP2(t *testing.T) {
	for _, h1 := range []bool{true, false} {
		t.Run(fmt.Sprintf("http1-too=%v", h1), func(t *testing.T) {
			e := newEnv(t, secretsAB(false), false)
			e.setVar("TEST_OPENAI", echoValue)
			srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				auth := r.Header.Get("Authorization")
				switch r.URL.Path {
				case "/upload":
					b, _ := io.ReadAll(r.Body)
					io.WriteString(w, r.Proto+" got "+string(b))
				case "/trailers":
					w.Header().Set("Trailer", "X-Checksum")
					w.Header().Set("Link", "</a.css>")
					w.WriteHeader(http.StatusEarlyHints)
					io.WriteString(w, r.Proto+" body")
					w.Header().Set("X-Checksum", "sum-"+auth)
				case "/ws":
					if r.ProtoMajor != 1 {
						http.Error(w, "upgrade over "+r.Proto, 400)
						return
					}
					c, brw, err := http.NewResponseController(w).Hijack()
					if err != nil {
						return
					}
					defer c.Close()
					io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n")
					line, _ := brw.ReadString('\n')
					io.WriteString(c, "echo: "+line)
				default:
					io.WriteString(w, "proto "+r.Proto+" auth "+auth)
				}
			})}
			var upConns atomic.Int64
			srv.ConnState = func(_ net.Conn, st http.ConnState) {
				if st == http.StateNew {
					upConns.Add(1)
				}
			}
			srv.Protocols = new(http.Protocols)
			srv.Protocols.SetHTTP1(h1)
			srv.Protocols.SetHTTP2(true)
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			srv.TLSConfig = &tls.Config{GetCertificate: func(h *tls.ClientHelloInfo) (*tls.Certificate, error) { return e.upCA.Leaf(h.ServerName) }}
			done := make(chan struct{})
			go func() { defer close(done); srv.ServeTLS(ln, "", "") }()
			t.Cleanup(func() { e.close(); srv.Close(); <-done })
			e.dialTo.Store(ln.Addr().String())
			c := e.client("api.example.com", nil)
			for i := 0; i < 3; i++ {
				resp, body := do(t, c, "GET", "https://api.example.com/h2", nil, map[string]string{"Authorization": phA})
				if resp.StatusCode != 200 || body != "proto HTTP/2.0 auth "+phA {
					t.Fatalf("%d %q", resp.StatusCode, body)
				}
			}
			resp, body := do(t, c, "POST", "https://api.example.com/upload", strings.NewReader("the payload"), nil)
			if resp.StatusCode != 200 || body != "HTTP/2.0 got the payload" {
				t.Fatalf("upload: %d %q", resp.StatusCode, body)
			}
			var hints int
			trace := &httptrace.ClientTrace{Got1xxResponse: func(code int, h textproto.MIMEHeader) error {
				if code == http.StatusEarlyHints && h.Get("Link") == "</a.css>" {
					hints++
				}
				return nil
			}}
			req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), "GET", "https://api.example.com/trailers", nil)
			req.Header.Set("Authorization", phA)
			tr, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(tr.Body)
			tr.Body.Close()
			if string(b) != "HTTP/2.0 body" || tr.Trailer.Get("X-Checksum") != "sum-"+phA || hints != 1 {
				t.Fatalf("body %q, trailer %v, hints %d", b, tr.Trailer, hints)
			}
			if n := upConns.Load(); n != 1 || e.accepted.Load() != 1 {
				t.Fatalf("%d upstream connections, %d sandbox connections", n, e.accepted.Load())
			}
			e.waitScrubbed(t, map[string]int64{"OPENAI_API_KEY": 4})

			// an upgrade: a connection of its own, in HTTP/1.1 (refused where upstream has none)
			conn := e.dialSandbox(t)
			fmt.Fprintf(conn, "GET /ws HTTP/1.1\r\nHost: api.example.com\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n")
			br := bufio.NewReader(conn)
			up, err := http.ReadResponse(br, nil)
			if !h1 {
				if err != nil || up.StatusCode != http.StatusBadGateway {
					t.Fatalf("upgrade to an HTTP/2-only upstream: %v %v", up, err)
				}
				return
			}
			if err != nil || up.StatusCode != http.StatusSwitchingProtocols {
				t.Fatalf("upgrade: %v %v", up, err)
			}
			io.WriteString(conn, "ping\n")
			if line, err := br.ReadString('\n'); err != nil || line != "echo: ping\n" {
				t.Fatalf("after the upgrade: %q %v", line, err)
			}
		})
	}
}

// BenchmarkInterceptDownload: a 16 MiB GET of random bytes through the interceptor with a
// secret (the body scanned) and without one.
func BenchmarkInterceptDownload(b *testing.B) {
	const size = 16 << 20
	block := make([]byte, 1<<20)
	rng := rand.New(rand.NewPCG(5, 6))
	for i := range block {
		block[i] = byte(rng.Uint32())
	}
	for _, name := range []string{"secret", "none"} {
		b.Run(name, func(b *testing.B) {
			var secrets []egress.Secret
			if name == "secret" {
				secrets = secretsAB(false)
			}
			e := newEnv(b, secrets, false)
			e.setVar("TEST_OPENAI", echoValue)
			e.handler.Store(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Length", fmt.Sprint(size))
				for range size / len(block) {
					w.Write(block)
				}
			}))
			c := e.client("api.example.com", nil)
			b.SetBytes(size)
			cpu0 := processCPU()
			for b.Loop() {
				resp, err := c.Get("https://api.example.com/bytes")
				if err != nil {
					b.Fatal(err)
				}
				n, _ := io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if n != size {
					b.Fatalf("%d bytes", n)
				}
			}
			b.ReportMetric(float64((processCPU()-cpu0).Milliseconds())/float64(b.N), "cpu-ms/op")
		})
	}
}

// processCPU is the CPU time (user and system) this process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestScrubEchoedBasicCredentials: a host echoing HTTP Basic credentials (as git sends a
// token) returns the value base64-encoded; the sandbox gets back the credentials it sent.
// A range request is sent for the whole body, so no two ranges split a value between them.
func TestScrubEchoedBasicCredentials(t *testing.T) {
	e := newEnv(t, secretsAB(false), false)
	e.setVar("TEST_OPENAI", echoValue)
	var ranges []string
	var mu sync.Mutex
	e.handler.Store(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		ranges = append(ranges, r.Header.Get("Range"))
		mu.Unlock()
		io.WriteString(w, "you sent "+r.Header.Get("Authorization"))
	}))
	c := e.client("api.example.com", nil)
	sent := basicAuth("x-access-token", phA)
	_, body := do(t, c, "GET", "https://api.example.com/info/refs", nil, map[string]string{"Authorization": sent, "Range": "bytes=10-20"})
	if body != "you sent "+sent {
		t.Fatalf("body %q, want %q", body, "you sent "+sent)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(ranges) != 1 || ranges[0] != "" {
		t.Fatalf("upstream saw Range %q", ranges)
	}
	e.waitScrubbed(t, map[string]int64{"OPENAI_API_KEY": 1})
}

// refScrub is the scrubber's meaning, written plainly: at each position the longest value that
// starts there is replaced, else the byte is kept.
func refScrub(s string, values, phs []string) string {
	var out strings.Builder
	for i := 0; i < len(s); {
		best := -1
		for k, v := range values {
			if v != "" && strings.HasPrefix(s[i:], v) && (best < 0 || len(v) > len(values[best])) {
				best = k
			}
		}
		if best < 0 {
			out.WriteByte(s[i])
			i++
			continue
		}
		out.WriteString(phs[best])
		i += len(values[best])
	}
	return out.String()
}

// FuzzScrubWriter: two values (any bytes) and a body written in pieces of the sizes the
// fuzzer picks come out as refScrub says, and what is held back stays under the longest value.
func FuzzScrubWriter(f *testing.F) {
	f.Add("abab", "ba", []byte("xxababababa bab"), uint8(3))
	f.Add("aaa", "aab", []byte("aaaaaabaaab"), uint8(1))
	f.Add(echoValue, "sk-", []byte("sk-sk-live-"+echoValue+"sk-li"), uint8(7))
	f.Fuzz(func(t *testing.T, v1, v2 string, body []byte, step uint8) {
		if v1 == "" || v2 == "" || len(v1) > 64 || len(v2) > 64 {
			return
		}
		values := []string{v1, v2}
		phs := []string{"<P1>", "<P2>"}
		if v1 == v2 {
			values, phs = values[:1], phs[:1]
		}
		var pairs []scrubPair
		for i := range values {
			pairs = append(pairs, scrubPair{secret: i, value: []byte(values[i]), placeholder: []byte(phs[i])})
		}
		var out bytes.Buffer
		sw := &scrubWriter{s: newScrubber(pairs), w: &out}
		n := int(step%16) + 1
		for rest := body; len(rest) > 0; {
			k := min(len(rest), n)
			sw.Write(rest[:k])
			if len(sw.pend) >= max(len(v1), len(v2)) {
				t.Fatalf("held back %d bytes", len(sw.pend))
			}
			rest = rest[k:]
		}
		sw.Close()
		if want := refScrub(string(body), values, phs); out.String() != want {
			t.Fatalf("values %q %q, body %q:\n got %q\nwant %q", v1, v2, body, out.String(), want)
		}
	})
}
