package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// The 100 MiB GET's two relay peers: what any proxy that terminates the client's TCP
// connection and opens its own to the upstream — as the egress proxy must, every byte crossing
// it — can reach on this host, measured beside the floor and the proxy in the same turns.
//
//   - bare: a TCP relay of five lines, io.Copy both ways (Go splices socket to socket), no
//     HTTP, no policy, no record: the user-space ceiling.
//   - kernel: the same relay with the upstream's bytes redirected to the client's socket inside
//     the kernel (a BPF sockmap verdict program: bpf_sk_redirect_hash from the upstream socket
//     to its peer, keyed by the upstream socket's cookie): no copy, no pipe, no wake-up of the
//     relay; what is left is the second TCP connection itself.

// kernelRelay is the BPF side of the kernel relay: sockets in attach get the verdict program,
// which redirects each of their skbs to the socket peers holds under their own cookie.
type kernelRelay struct {
	peers, attach *ebpf.Map
	prog          *ebpf.Program
}

func newKernelRelay() (*kernelRelay, error) {
	spec := &ebpf.MapSpec{Type: ebpf.SockHash, KeySize: 8, ValueSize: 4, MaxEntries: 1024}
	k := &kernelRelay{}
	var err error
	if k.peers, err = ebpf.NewMap(spec); err != nil {
		return nil, fmt.Errorf("sockhash: %w", err)
	}
	if k.attach, err = ebpf.NewMap(spec); err != nil {
		k.close()
		return nil, fmt.Errorf("sockhash: %w", err)
	}
	k.prog, err = ebpf.NewProgram(&ebpf.ProgramSpec{
		Type: ebpf.SkSKB, License: "GPL",
		Instructions: asm.Instructions{
			asm.Mov.Reg(asm.R6, asm.R1),
			asm.FnGetSocketCookie.Call(), // the receiving (upstream) socket's cookie
			asm.StoreMem(asm.RFP, -8, asm.R0, asm.DWord),
			asm.Mov.Reg(asm.R1, asm.R6),
			asm.LoadMapPtr(asm.R2, k.peers.FD()),
			asm.Mov.Reg(asm.R3, asm.RFP),
			asm.Add.Imm(asm.R3, -8),
			asm.Mov.Imm(asm.R4, 0), // to the peer's egress: it sends the bytes on
			asm.FnSkRedirectHash.Call(),
			asm.Return(),
		},
	})
	if err != nil {
		k.close()
		return nil, fmt.Errorf("verdict program: %w", err)
	}
	if err := link.RawAttachProgram(link.RawAttachProgramOptions{Target: k.attach.FD(), Program: k.prog, Attach: ebpf.AttachSkSKBStreamVerdict}); err != nil {
		k.close()
		return nil, fmt.Errorf("attach the verdict program: %w", err)
	}
	return k, nil
}

func (k *kernelRelay) close() {
	if k.prog != nil {
		k.prog.Close()
	}
	for _, m := range []*ebpf.Map{k.attach, k.peers} {
		if m != nil {
			m.Close()
		}
	}
}

// pair puts up (its bytes to be redirected) and its peer in the maps, before any byte of the
// upstream's answer can arrive (the request has not been relayed yet).
func (k *kernelRelay) pair(up, peer *net.TCPConn) error {
	var cookie uint64
	var upFD, peerFD int
	if err := control(up, func(fd int) error {
		upFD = fd
		var err error
		cookie, err = unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_COOKIE)
		return err
	}); err != nil {
		return err
	}
	if err := control(peer, func(fd int) error { peerFD = fd; return nil }); err != nil {
		return err
	}
	// The map takes its own reference to each socket; a socket leaves it when closed.
	if err := k.peers.Update(cookie, uint32(peerFD), ebpf.UpdateAny); err != nil {
		return fmt.Errorf("sockhash peers: %w", err)
	}
	return k.attach.Update(cookie, uint32(upFD), ebpf.UpdateAny)
}

func control(c *net.TCPConn, f func(fd int) error) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) { ferr = f(int(fd)) }); err != nil {
		return err
	}
	return ferr
}

// startRelay serves a relay to upstream on a loopback port; k non-nil makes it the kernel
// relay. It returns the relay's address and a stop func.
func startRelay(ctx context.Context, upstream string, k *kernelRelay) (string, func(), error) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	conns := map[net.Conn]bool{}
	track := func(c net.Conn, on bool) {
		mu.Lock()
		defer mu.Unlock()
		if on {
			conns[c] = true
		} else {
			delete(conns, c)
		}
	}
	acceptEach(ln, &wg, func(c net.Conn) {
		defer c.Close()
		track(c, true)
		defer track(c, false)
		var d net.Dialer
		u, err := d.DialContext(ctx, "tcp4", upstream)
		if err != nil {
			return
		}
		defer u.Close()
		if k != nil {
			if err := k.pair(u.(*net.TCPConn), c.(*net.TCPConn)); err != nil {
				return
			}
		}
		done := make(chan struct{})
		go func() { defer close(done); io.Copy(u, c) }()
		if k == nil {
			io.Copy(c, u)
			c.(*net.TCPConn).CloseWrite()
		}
		// The kernel relay's upstream bytes are in flight inside the kernel: the client's own
		// close (curl has its Content-Length) ends the pair, not the upstream's EOF, which
		// could pass bytes still queued for the client.
		<-done
	})
	stop := func() {
		ln.Close()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	}
	return ln.Addr().String(), stop, nil
}

// acceptEach serves each connection ln accepts with handle in a goroutine of its own, counted
// in wg (as is the accept loop), until ln is closed.
func acceptEach(ln net.Listener, wg *sync.WaitGroup, handle func(net.Conn)) {
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() { defer wg.Done(); handle(c) }()
		}
	}()
}
