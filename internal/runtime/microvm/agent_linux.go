package microvm

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/microvm/vminit"
)

// agentConn is the host's one connection to a VM's agent port (QEMU's chardev socket takes one
// client at a time): a handshake, then a yamux session whose streams are the dialer's
// connections. It is made by the first dial and made again once it breaks (QEMU died, or the
// guest's side ended).
type agentConn struct {
	mu   sync.Mutex
	sess *yamux.Session
	// connecting is closed when the current connect attempt ends.
	connecting chan struct{}
	err        error
}

// Agent returns a dialer of the VM's agent.
func (r *Runtime) Agent(ctx context.Context, id string) (runtime.Dialer, error) {
	if _, err := r.readRecord(id); err != nil {
		return nil, err
	}
	sock := filepath.Join(r.dir(id), "run", "agent.sock")
	return func(ctx context.Context) (net.Conn, error) {
		return r.dialAgent(ctx, id, sock)
	}, nil
}

func (r *Runtime) conn(id string) *agentConn {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := r.sessions[id]
	if c == nil {
		c = &agentConn{}
		r.sessions[id] = c
	}
	return c
}

// dropSession closes the host's connection to a VM's agent.
func (r *Runtime) dropSession(id string) {
	r.mu.Lock()
	c := r.sessions[id]
	delete(r.sessions, id)
	r.mu.Unlock()
	if c != nil {
		c.mu.Lock()
		if c.sess != nil {
			_ = c.sess.Close()
		}
		c.mu.Unlock()
	}
}

func (r *Runtime) dialAgent(ctx context.Context, id, sock string) (net.Conn, error) {
	for attempt := 0; ; attempt++ {
		sess, err := r.session(ctx, id, sock)
		if err != nil {
			return nil, err
		}
		st, err := sess.Open()
		if err == nil {
			return st, nil
		}
		if attempt > 0 {
			return nil, errcode.New(errcode.SandboxNotRunning, "sandbox %s: the VM's agent connection: %v", id, err)
		}
	}
}

// session returns the VM's live session, connecting (in the background, so that a dial whose
// context ends does not cut a guest's boot-long handshake short) when there is none.
func (r *Runtime) session(ctx context.Context, id, sock string) (*yamux.Session, error) {
	c := r.conn(id)
	c.mu.Lock()
	if c.sess != nil && !c.sess.IsClosed() {
		s := c.sess
		c.mu.Unlock()
		return s, nil
	}
	if c.connecting == nil {
		if _, err := os.Stat(sock); err != nil {
			c.mu.Unlock()
			return nil, errcode.New(errcode.SandboxNotRunning, "sandbox %s's VM is not running", id)
		}
		ch := make(chan struct{})
		c.connecting = ch
		go func() {
			sess, err := connect(sock)
			c.mu.Lock()
			c.sess, c.err, c.connecting = sess, err, nil
			c.mu.Unlock()
			close(ch)
		}()
	}
	ch := c.connecting
	c.mu.Unlock()
	select {
	case <-ch:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil || c.sess == nil {
		return nil, errcode.New(errcode.SandboxNotRunning, "sandbox %s: the VM's agent does not answer: %v", id, c.err)
	}
	return c.sess, nil
}

// connectTimeout bounds a handshake: a guest boots in seconds even under TCG.
const connectTimeout = 60 * time.Second

func connect(sock string) (*yamux.Session, error) {
	conn, err := net.DialTimeout("unix", sock, 5*time.Second)
	if err != nil {
		return nil, err
	}
	nonce := make([]byte, 8)
	_, _ = rand.Read(nonce)
	_ = conn.SetDeadline(time.Now().Add(connectTimeout))
	rest, err := vminit.HostHandshake(conn, hex.EncodeToString(nonce))
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("handshake: %w", err)
	}
	_ = conn.SetDeadline(time.Time{})
	sess, err := yamux.Client(vminit.ReadWriteCloser{Reader: rest, WriteCloser: conn}, vminit.YamuxConfig())
	if err != nil {
		conn.Close()
		return nil, err
	}
	return sess, nil
}
