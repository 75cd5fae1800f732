// Package tunnel carries connections to a sandbox's guest agent over one byte stream: the
// stdin and stdout of a long-lived `agentbox guest-tunnel` exec in the sandbox's pod (through
// the Kubernetes API server), which works whatever the pod's network is (gVisor's netstack
// included). Both ends speak hashicorp/yamux: the server opens a stream per connection, and the
// pod side (Serve) dials the agent's unix socket for it, checks that the socket's peer is the
// agent (PID 1 of the container), and answers one status byte before any of the agent's bytes:
// Dial hands the caller a connection only after a StatusOK, so a dial fails rather than
// returning a connection that dies at its first read.
package tunnel

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/yamux"
)

// Status bytes the pod side writes first on every stream.
const (
	StatusOK byte = 0
	// StatusUnavailable: the agent's socket could not be dialled (not listening yet, gone),
	// or the tunnel holds MaxStreams streams already. A message follows.
	StatusUnavailable byte = 1
	// StatusPeer: the socket's peer is not the agent (another process listens on it). A
	// message follows.
	StatusPeer byte = 2
)

// Bounds.
const (
	// MaxStreams bounds the streams one tunnel bridges at once.
	MaxStreams = 512
	// maxMessage bounds a status message.
	maxMessage = 512
	// dialTimeout bounds the pod side's dial of the agent's socket.
	dialTimeout = 5 * time.Second
)

// Config is the yamux configuration of both sides: keepalives every 15 s (a dead exec is
// noticed), writes that stall 15 s end the session, a 256 KiB stream window so that one bulk
// transfer cannot starve the others, and a bounded accept backlog.
func Config() *yamux.Config {
	c := yamux.DefaultConfig()
	c.EnableKeepAlive = true
	c.KeepAliveInterval = 15 * time.Second
	c.ConnectionWriteTimeout = 15 * time.Second
	c.MaxStreamWindowSize = 256 << 10
	c.AcceptBacklog = 128
	c.StreamOpenTimeout = 30 * time.Second
	c.LogOutput = io.Discard
	return c
}

// PeerError is a StatusPeer answer: the agent's socket is held by another process.
type PeerError struct{ Msg string }

func (e *PeerError) Error() string { return "the agent's socket is held by another process: " + e.Msg }

// UnavailableError is a StatusUnavailable answer.
type UnavailableError struct{ Msg string }

func (e *UnavailableError) Error() string { return "the agent is not reachable: " + e.Msg }

// Dial opens a stream on sess and waits (bounded by ctx) for the pod side's status. On
// StatusOK the stream is the agent connection; otherwise the error is a *PeerError or an
// *UnavailableError, or the session's or ctx's.
func Dial(ctx context.Context, sess *yamux.Session) (net.Conn, error) {
	st, err := sess.OpenStream()
	if err != nil {
		return nil, err
	}
	done := make(chan struct{})
	stop := context.AfterFunc(ctx, func() { _ = st.SetReadDeadline(time.Unix(1, 0)); close(done) })
	var b [1]byte
	_, err = io.ReadFull(st, b[:])
	if !stop() {
		<-done
		_ = st.Close()
		return nil, ctx.Err()
	}
	if err != nil {
		_ = st.Close()
		return nil, fmt.Errorf("tunnel: read the stream's status: %w", err)
	}
	if b[0] == StatusOK {
		return st, nil
	}
	msg, _ := io.ReadAll(io.LimitReader(st, maxMessage))
	_ = st.Close()
	if b[0] == StatusPeer {
		return nil, &PeerError{Msg: string(msg)}
	}
	return nil, &UnavailableError{Msg: string(msg)}
}

// ServerConfig is the pod side's.
type ServerConfig struct {
	// Socket is the agent's unix socket.
	Socket string
	// PeerPID is the pid (in the tunnel's pid namespace) that must hold the socket's other
	// end: 1, the agent, in a sandbox's container. 0 skips the check.
	PeerPID int32
	Logger  *slog.Logger
}

// Serve runs the pod side on rw (the exec's stdin and stdout) until the session ends: each
// stream the server opens is bridged to a fresh connection to cfg.Socket.
func Serve(ctx context.Context, rw io.ReadWriteCloser, cfg ServerConfig) error {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	sess, err := yamux.Server(rw, Config())
	if err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, func() { _ = sess.Close() })
	defer stop()
	defer sess.Close()
	sem := make(chan struct{}, MaxStreams)
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		st, err := sess.AcceptStream()
		if err != nil {
			if errors.Is(err, yamux.ErrSessionShutdown) || errors.Is(err, io.EOF) || ctx.Err() != nil {
				return nil
			}
			return err
		}
		select {
		case sem <- struct{}{}:
		default:
			answer(st, StatusUnavailable, fmt.Sprintf("the tunnel bridges %d connections already", MaxStreams))
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			bridge(st, cfg, log)
		}()
	}
}

// answer writes a failure status and closes st.
func answer(st net.Conn, status byte, msg string) {
	_ = st.SetWriteDeadline(time.Now().Add(dialTimeout))
	_, _ = st.Write(append([]byte{status}, msg[:min(len(msg), maxMessage)]...))
	_ = st.Close()
}

func bridge(st net.Conn, cfg ServerConfig, log *slog.Logger) {
	c, err := net.DialTimeout("unix", cfg.Socket, dialTimeout)
	if err != nil {
		answer(st, StatusUnavailable, err.Error())
		return
	}
	uc := c.(*net.UnixConn)
	if cfg.PeerPID != 0 {
		pid, err := peerPID(uc)
		if err != nil {
			_ = c.Close()
			answer(st, StatusUnavailable, "read the socket's peer: "+err.Error())
			return
		}
		if pid != cfg.PeerPID {
			_ = c.Close()
			log.Warn("guest-tunnel: the agent's socket is held by another process", "pid", pid, "want", cfg.PeerPID)
			answer(st, StatusPeer, fmt.Sprintf("pid %d, not the agent's pid %d", pid, cfg.PeerPID))
			return
		}
	}
	if _, err := st.Write([]byte{StatusOK}); err != nil {
		_ = c.Close()
		_ = st.Close()
		return
	}
	Pipe(st, uc)
}

// Pipe copies both ways between a and b until both directions end; a direction's end is passed
// on as a half-close where the other side has one, and everything is closed at the end.
func Pipe(a, b net.Conn) {
	var wg sync.WaitGroup
	wg.Add(2)
	cp := func(dst, src net.Conn) {
		defer wg.Done()
		_, err := io.Copy(dst, src)
		if cw, ok := dst.(interface{ CloseWrite() error }); ok && err == nil {
			_ = cw.CloseWrite()
		} else {
			_ = dst.Close()
			_ = src.Close()
		}
	}
	go cp(a, b)
	go cp(b, a)
	wg.Wait()
	_ = a.Close()
	_ = b.Close()
}

// StdioConn is the pod side's end of the exec: stdin and stdout as one io.ReadWriteCloser.
type StdioConn struct {
	In  io.ReadCloser
	Out io.WriteCloser
}

func (s StdioConn) Read(p []byte) (int, error)  { return s.In.Read(p) }
func (s StdioConn) Write(p []byte) (int, error) { return s.Out.Write(p) }

// Close closes both.
func (s StdioConn) Close() error {
	err := s.In.Close()
	if err2 := s.Out.Close(); err == nil {
		err = err2
	}
	return err
}
