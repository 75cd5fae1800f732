//go:build linux

package guest_test

import (
	"context"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/guest"
)

const benchBytes = 100 << 20

// benchChunk is what the sender writes at a time.
var benchChunk = make([]byte, 256<<10)

func sendN(w io.Writer, n int) error {
	for n > 0 {
		c := benchChunk[:min(n, len(benchChunk))]
		if _, err := w.Write(c); err != nil {
			return err
		}
		n -= len(c)
	}
	return nil
}

// BenchmarkNetSessionThroughput: 100 MiB from the host to a connection inside the sandbox
// through one stream of a session (the download direction of the egress proxy). Compare with
// BenchmarkLoopbackDirect.
func BenchmarkNetSessionThroughput(b *testing.B) {
	a := startAgentWith(b, b.TempDir(), nil)
	s := openSession(b, a, noDNS)
	go func() {
		for {
			st, err := s.Accept()
			if err != nil {
				return
			}
			go func() {
				defer st.Close()
				var one [1]byte
				if _, err := io.ReadFull(st, one[:]); err != nil {
					return
				}
				_ = sendN(st, benchBytes)
			}()
		}
	}()
	b.SetBytes(benchBytes)
	b.ResetTimer()
	for range b.N {
		c, err := net.Dial("tcp", s.Reply.ProxyAddr)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := c.Write([]byte{1}); err != nil {
			b.Fatal(err)
		}
		n, err := io.Copy(io.Discard, c)
		c.Close()
		if err != nil || n != benchBytes {
			b.Fatalf("got %d bytes, %v", n, err)
		}
	}
}

// BenchmarkLoopbackDirect is BenchmarkNetSessionThroughput's transfer over one loopback TCP
// connection, nothing between.
func BenchmarkLoopbackDirect(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				var one [1]byte
				if _, err := io.ReadFull(c, one[:]); err != nil {
					return
				}
				_ = sendN(c, benchBytes)
			}()
		}
	}()
	b.SetBytes(benchBytes)
	b.ResetTimer()
	for range b.N {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			b.Fatal(err)
		}
		if _, err := c.Write([]byte{1}); err != nil {
			b.Fatal(err)
		}
		n, err := io.Copy(io.Discard, c)
		c.Close()
		if err != nil || n != benchBytes {
			b.Fatalf("got %d bytes, %v", n, err)
		}
	}
}

// BenchmarkNetSessionConnect: a connection to the agent's proxy listener, its stream and
// header to the host, one byte each way.
func BenchmarkNetSessionConnect(b *testing.B) {
	a := startAgentWith(b, b.TempDir(), nil)
	s := openSession(b, a, noDNS)
	go func() {
		for {
			st, err := s.Accept()
			if err != nil {
				return
			}
			go func(st *guest.NetStream) {
				defer st.Close()
				var one [1]byte
				if _, err := io.ReadFull(st, one[:]); err == nil {
					_, _ = st.Write(one[:])
				}
			}(st)
		}
	}()
	b.ResetTimer()
	for range b.N {
		c, err := net.Dial("tcp", s.Reply.ProxyAddr)
		if err != nil {
			b.Fatal(err)
		}
		var one [1]byte
		if _, err := c.Write(one[:]); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(c, one[:]); err != nil {
			b.Fatal(err)
		}
		c.Close()
	}
}

// BenchmarkNetSessionOpen is what opening an egress session adds to a create (runc, crun):
// from NetSession until the host accepts on all 4 of the agent's listeners (the proxy, the
// resolver's TCP side, ports 80 and 443), and the CPU both sides spent (the agent runs in
// this process) per session, including the parked connections dialed in the background,
// counted once they settle. The listeners come with the reply, or over parked connections
// (what an older host asks for). Each session replaces the one before.
func BenchmarkNetSessionOpen(b *testing.B) {
	for _, mode := range []string{"in-reply", "parked"} {
		b.Run(mode, func(b *testing.B) {
			a := startAgentWith(b, b.TempDir(), nil)
			if mode == "parked" {
				guest.ListenersOverParked(a.c)
			}
			req := guest.NetSessionRequest{DNSPort: 0, TransparentPorts: []int{0, 0}, PassFDs: true, PassListeners: true}
			var prev *guest.NetSession
			cpu := func() time.Duration {
				var ru syscall.Rusage
				_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
				return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
			}
			var cpuTotal time.Duration
			b.ResetTimer()
			for range b.N {
				c0 := cpu()
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				s, err := a.c.NetSession(ctx, req)
				cancel()
				if err != nil {
					b.Fatal(err)
				}
				for s.Listeners() < 4 {
					time.Sleep(50 * time.Microsecond)
				}
				b.StopTimer()
				time.Sleep(20 * time.Millisecond) // the parked connections settle
				cpuTotal += cpu() - c0
				if prev != nil {
					prev.Close()
				}
				prev = s
				b.StartTimer()
			}
			b.StopTimer()
			if prev != nil {
				prev.Close()
			}
			b.ReportMetric(float64(cpuTotal.Microseconds())/float64(b.N), "cpu-µs/op")
		})
	}
}
