package egress

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"
)

// benchProxy serves KindProxy streams on a loopback listener, as the agent's relay would
// hand them over, and returns its address.
func benchProxy(b *testing.B, allow string) string {
	res := newResolver()
	res.set("bench.test", "127.0.0.1")
	p, err := New(Config{Resolver: res, AllowCIDRs: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
		HostAddrs: func() []netip.Addr { return nil }})
	if err != nil {
		b.Fatal(err)
	}
	pol := MustParsePolicy(Policy{Allow: []string{allow}})
	tg := &Target{SandboxID: "sb-bench", Policy: func() *Compiled { return pol }}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() { defer wg.Done(); p.Serve(ctx, tg, c, KindProxy, netip.AddrPort{}) }()
		}
	}()
	b.Cleanup(func() { ln.Close(); cancel(); wg.Wait() })
	return ln.Addr().String()
}

func benchConnect(b *testing.B, proxy, target string) (net.Conn, *bufio.Reader) {
	c, err := net.Dial("tcp", proxy)
	if err != nil {
		b.Fatal(err)
	}
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil || resp.StatusCode != 200 {
		b.Fatalf("CONNECT: %v %v", resp, err)
	}
	return c, br
}

// BenchmarkProxyThroughput is a 100 MiB GET from a loopback server, directly and through
// CONNECT; compare the two MB/s.
func BenchmarkProxyThroughput(b *testing.B) {
	const size = 100 << 20
	chunk := make([]byte, 1<<20)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(size))
		for i := 0; i < size/len(chunk); i++ {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go srv.Serve(ln)
	defer srv.Close()
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	get := func(b *testing.B, c net.Conn, br *bufio.Reader) {
		fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: bench.test\r\n\r\n")
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			b.Fatal(err)
		}
		n, err := io.Copy(io.Discard, resp.Body)
		if err != nil || n != size {
			b.Fatalf("read %d: %v", n, err)
		}
	}
	b.Run("direct", func(b *testing.B) {
		b.SetBytes(size)
		for i := 0; i < b.N; i++ {
			c, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				b.Fatal(err)
			}
			get(b, c, bufio.NewReaderSize(c, 64<<10))
			c.Close()
		}
	})
	b.Run("forward", func(b *testing.B) { // absolute-form: the body of known length is spliced
		proxy := benchProxy(b, "bench.test:"+port)
		b.SetBytes(size)
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			c, err := net.Dial("tcp", proxy)
			if err != nil {
				b.Fatal(err)
			}
			fmt.Fprintf(c, "GET http://bench.test:%s/ HTTP/1.1\r\nHost: bench.test:%s\r\n\r\n", port, port)
			resp, err := http.ReadResponse(bufio.NewReaderSize(c, 64<<10), nil)
			if err != nil {
				b.Fatal(err)
			}
			if n, err := io.Copy(io.Discard, resp.Body); err != nil || n != size {
				b.Fatalf("read %d: %v", n, err)
			}
			c.Close()
		}
	})
	b.Run("connect", func(b *testing.B) {
		proxy := benchProxy(b, "bench.test:"+port)
		b.SetBytes(size)
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			c, br := benchConnect(b, proxy, "bench.test:"+port)
			get(b, c, br)
			c.Close()
		}
	})
}

// BenchmarkProxyConnect is the per-connection overhead: CONNECT, the 200, and the first
// byte echoed back, with p50 and p99.
func BenchmarkProxyConnect(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); io.Copy(c, c) }()
		}
	}()
	defer func() { ln.Close(); wg.Wait() }()
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	proxy := benchProxy(b, "bench.test:"+port)
	lat := make([]time.Duration, 0, b.N)
	one := []byte{'x'}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		c, br := benchConnect(b, proxy, "bench.test:"+port)
		c.Write(one)
		if _, err := br.ReadByte(); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(start))
		c.Close()
	}
	b.StopTimer()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
}
