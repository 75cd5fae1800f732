package egress

import (
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// fuzzConn reads from r and drops what is written.
type fuzzConn struct{ r io.Reader }

func (f fuzzConn) Read(p []byte) (int, error)     { return f.r.Read(p) }
func (fuzzConn) Write(p []byte) (int, error)      { return len(p), nil }
func (fuzzConn) Close() error                     { return nil }
func (fuzzConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (fuzzConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (fuzzConn) SetDeadline(time.Time) error      { return nil }
func (fuzzConn) SetReadDeadline(time.Time) error  { return nil }
func (fuzzConn) SetWriteDeadline(time.Time) error { return nil }

// captureConn records what a TLS client writes and fails its reads.
type captureConn struct {
	fuzzConn
	buf bytes.Buffer
}

func (c *captureConn) Write(p []byte) (int, error) { return c.buf.Write(p) }
func (c *captureConn) Read([]byte) (int, error)    { return 0, io.EOF }

func clientHello(t testing.TB, sni string) []byte {
	c := &captureConn{}
	tls.Client(c, &tls.Config{ServerName: sni, InsecureSkipVerify: true}).Handshake()
	if c.buf.Len() == 0 {
		t.Fatal("no client hello captured")
	}
	return c.buf.Bytes()
}

func TestClientHelloSNI(t *testing.T) {
	for _, sni := range []string{"pypi.org", ""} {
		got, err := ClientHelloSNI(context.Background(), bytes.NewReader(clientHello(t, sni)))
		if err != nil || got != sni {
			t.Fatalf("SNI %q: got %q %v", sni, got, err)
		}
	}
	if _, err := ClientHelloSNI(context.Background(), bytes.NewReader([]byte("GET / HTTP/1.1\r\n\r\n"))); err == nil {
		t.Fatal("HTTP read as a client hello")
	}
	// A peek bound stops a hello that never ends.
	big := append([]byte{0x16, 0x03, 0x01, 0xff, 0xff}, bytes.Repeat([]byte{1}, 70000)...)
	if _, err := ClientHelloSNI(context.Background(), &peekReader{r: bytes.NewReader(big), max: MaxPeek}); err == nil {
		t.Fatal("an endless hello was accepted")
	}
}

func FuzzClientHelloAndHost(f *testing.F) {
	f.Add(clientHello(f, "pypi.org"))
	f.Add(clientHello(f, ""))
	f.Add([]byte("GET / HTTP/1.1\r\nHost: a.test:80\r\n\r\n"))
	f.Add([]byte{0x16, 0x03, 0x01, 0x00, 0x05, 0x01, 0x00, 0x00, 0x01, 0x00})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		ClientHelloSNI(context.Background(), &peekReader{r: bytes.NewReader(data), max: MaxPeek})
		RequestHost(&peekReader{r: bytes.NewReader(data), max: MaxPeek})
	})
}

func FuzzProxyRequest(f *testing.F) {
	f.Add([]byte("CONNECT a.test:443 HTTP/1.1\r\nHost: a.test:443\r\n\r\n"))
	f.Add([]byte("GET http://a.test/x HTTP/1.1\r\nHost: a.test\r\nContent-Length: 3\r\n\r\nabcGET / HTTP/1.1\r\n\r\n"))
	f.Add([]byte("CONNECT [::1]:0 HTTP/1.1\r\n\r\n"))
	f.Add([]byte("GET https://x/ HTTP/1.0\r\n\r\n"))
	f.Add([]byte("POST http://127.0.0.1:1/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab"))
	f.Add([]byte("\x00\xff\r\n\r\n"))
	p, err := New(Config{Resolver: newResolver(), AllowCIDRs: nil, HostAddrs: func() []netip.Addr { return nil },
		DialTimeout: 100 * time.Millisecond})
	if err != nil {
		f.Fatal(err)
	}
	pol := MustParsePolicy(Policy{Allow: []string{"*", "127.0.0.1/32:1"}, Deny: []string{"b.test"}})
	tg := &Target{SandboxID: "sb", Policy: func() *Compiled { return pol },
		Secrets: []Secret{{Name: "S", Placeholder: "agentbox-secret-x1234567", Hosts: []string{"*.a.test"}}}}
	f.Fuzz(func(t *testing.T, data []byte) {
		// serveProxy itself (Serve would recover a panic and hide it).
		p.serveProxy(context.Background(), tg, fuzzConn{r: bytes.NewReader(data)})
	})
}

func FuzzDNSMessage(f *testing.F) {
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: 9})
	b.StartQuestions()
	b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName("a.test."), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET})
	msg, _ := b.Finish()
	f.Add(msg)
	f.Add([]byte{0, 1})
	f.Add([]byte{})
	res := newResolver()
	res.set("a.test", "8.8.8.8", "127.0.0.1")
	p, _ := New(Config{Resolver: res, HostAddrs: func() []netip.Addr { return nil }})
	pol := MustParsePolicy(Policy{Allow: []string{"*"}})
	tg := &Target{Policy: func() *Compiled { return pol }}
	f.Fuzz(func(t *testing.T, data []byte) {
		reply, _ := p.answerDNS(context.Background(), tg, data)
		if reply == nil && len(data) >= 2 {
			t.Fatal("a message with an ID got no reply")
		}
		if reply != nil {
			var m dnsmessage.Message
			if err := m.Unpack(reply); err != nil {
				t.Fatalf("the reply does not parse: %v", err)
			}
			if len(reply) > maxDNSReply {
				t.Fatalf("reply of %d bytes", len(reply))
			}
		}
	})
}
