//go:build unix

package guest

import (
	"errors"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// A memory snapshot of a gVisor sandbox (runsc checkpoint) cannot save a socket bound to a host
// path: the agent's listener, and every connection the host made to it, are host sockets that
// the sandbox's gofer holds. Before a checkpoint the host therefore asks the agent to let go of
// them, and after it (in the sandbox that ran on, and in every sandbox restored from the image)
// to listen again. Both are signals to the agent (PID 1), which the runtime sends with the OCI
// runtime's kill command:
//
//   - SignalQuiesce (SIGUSR1): close the listener and every connection accepted on it (requests
//     in flight fail; upgraded streams, terminals and the egress session end), then remove the
//     socket file. The host waits for the file to vanish: that is the agent's "done".
//   - SignalRelisten (SIGUSR2): listen on the socket path again.
//
// The processes the agent started (commands, jobs) are untouched: they are saved with the rest.
//
// On gVisor the agent does not wait for SignalRelisten: at the quiesce it opens gVisor's
// checkpoint waiter (checkpointWaiter), whose read returns once the next checkpoint has ended —
// "restore" in a sandbox restored from it, "resume" in the one that ran on, "error" if it failed
// — and it listens again then, inside the sentry, as soon as the restored kernel runs. The host
// sends SignalRelisten only if the agent has not answered within a grace (an agent of an older
// version, or another runtime), and after a checkpoint that left the sandbox running; a
// relisten of a listening agent does nothing.
const (
	SignalQuiesce  = unix.SIGUSR1
	SignalRelisten = unix.SIGUSR2
)

// checkpointWaiter is gVisor's /proc/gvisor/checkpoint: a read of an open descriptor blocks
// until the first checkpoint after the open has ended, then returns "resume\n", "restore\n" or
// "error\n". It exists in every gVisor sandbox (read-only: nothing in the sandbox can trigger a
// checkpoint through it), and not elsewhere.
const checkpointWaiter = "/proc/gvisor/checkpoint"

// relistener is the agent's net.Listener across quiesces: Accept hands out the connections of
// whichever unix listener is current, and none while quiesced. It keeps every connection it
// accepted until it is closed, so that a quiesce can close them all (the HTTP server, upgraded
// handlers and hijackers included).
type relistener struct {
	path string
	log  *slog.Logger
	addr net.Addr

	conns  chan net.Conn
	closed chan struct{}
	once   sync.Once

	mu    sync.Mutex
	inner net.Listener // nil while quiesced
	// open are the connections accepted and not yet seen closed (the HTTP server's ConnState;
	// hijacked ones are checked for a closed descriptor when more arrive).
	open     map[net.Conn]bool
	hijacked map[net.Conn]bool
	// waiter is the checkpoint waiter opened at the last quiesce, nil once it fired or the
	// agent listens again.
	waiter *os.File
}

// newRelistener starts serving ln (a unix listener on path) through a relistener.
func newRelistener(ln net.Listener, path string, log *slog.Logger) *relistener {
	l := &relistener{path: path, log: log, addr: ln.Addr(), conns: make(chan net.Conn), closed: make(chan struct{}),
		open: map[net.Conn]bool{}, hijacked: map[net.Conn]bool{}}
	l.serve(ln)
	return l
}

func (l *relistener) serve(ln net.Listener) {
	l.inner = ln
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				l.mu.Lock()
				current := l.inner == ln
				l.mu.Unlock()
				if !current {
					return // closed: a quiesce or the agent's end
				}
				// Out of descriptors, say: as http.Server does, back off and accept again.
				time.Sleep(5 * time.Millisecond)
				continue
			}
			select {
			case l.conns <- c:
			case <-l.closed:
				_ = c.Close()
				return
			}
		}
	}()
}

// Accept returns the next connection of the current listener.
func (l *relistener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

// Close ends the relistener and its current listener.
func (l *relistener) Close() error {
	l.once.Do(func() { close(l.closed) })
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.waiter != nil {
		_ = l.waiter.Close()
		l.waiter = nil
	}
	if l.inner != nil {
		err := l.inner.Close()
		l.inner = nil
		return err
	}
	return nil
}

func (l *relistener) Addr() net.Addr { return l.addr }

// connState is the HTTP server's ConnState hook: it keeps the set of open connections.
func (l *relistener) connState(c net.Conn, st http.ConnState) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch st {
	case http.StateNew:
		l.open[c] = true
		for h := range l.hijacked {
			if connClosed(h) {
				delete(l.hijacked, h)
			}
		}
	case http.StateHijacked:
		delete(l.open, c)
		l.hijacked[c] = true
	case http.StateClosed:
		delete(l.open, c)
	}
}

// connClosed reports whether c's descriptor has been closed.
func connClosed(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	return err != nil || rc.Control(func(uintptr) {}) != nil
}

// quiesce closes the listener and every connection, then removes the socket file (the host's
// "done": the checkpoint may start then, so the checkpoint waiter is opened before it).
func (l *relistener) quiesce() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.watchCheckpointLocked()
	if l.inner != nil {
		_ = l.inner.Close()
		l.inner = nil
	}
	n := len(l.open) + len(l.hijacked)
	for c := range l.open {
		_ = c.Close()
	}
	for c := range l.hijacked {
		_ = c.Close()
	}
	clear(l.open)
	clear(l.hijacked)
	if err := os.Remove(l.path); err != nil && !errors.Is(err, os.ErrNotExist) {
		l.log.Warn("guest: quiesce: remove the socket", "err", err)
	}
	l.log.Info("guest: quiesced for a checkpoint", "closed_connections", n)
}

// watchCheckpointLocked opens the checkpoint waiter (closing the previous one) and relistens
// once the checkpoint after this quiesce has ended. Without a waiter (not gVisor) it does
// nothing: the host's SignalRelisten wakes the agent. The caller holds l.mu.
func (l *relistener) watchCheckpointLocked() {
	if l.waiter != nil {
		_ = l.waiter.Close()
		l.waiter = nil
	}
	f, err := os.Open(checkpointWaiter)
	if err != nil {
		return
	}
	l.waiter = f
	go func() {
		var buf [16]byte
		n, err := f.Read(buf[:])
		if err != nil {
			return // closed: a relisten or a later quiesce replaced it
		}
		l.log.Info("guest: the checkpoint ended", "result", strings.TrimSpace(string(buf[:n])))
		l.relisten()
	}()
}

// relisten listens on the socket path again (nothing if it already does).
func (l *relistener) relisten() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.waiter != nil {
		_ = l.waiter.Close()
		l.waiter = nil
	}
	select {
	case <-l.closed:
		return
	default:
	}
	if l.inner != nil {
		return
	}
	ln, err := listenUnix(l.path)
	if err != nil {
		l.log.Error("guest: listen again after a checkpoint", "err", err)
		return
	}
	l.serve(ln)
	l.log.Info("guest: listening again after a checkpoint", "socket", l.path)
}

// handleSignals quiesces and relistens on the agent's signals until done is closed.
func (l *relistener) handleSignals(done <-chan struct{}) {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, SignalQuiesce, SignalRelisten)
	go func() {
		defer signal.Stop(sigs)
		for {
			select {
			case <-done:
				return
			case s := <-sigs:
				if s == SignalQuiesce {
					l.quiesce()
				} else {
					l.relisten()
				}
			}
		}
	}()
}
