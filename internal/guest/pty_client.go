package guest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"sync"

	"github.com/agentbox/agentbox/internal/errcode"
)

// PTYSession is the host's end of a command running on a pseudo-terminal in the sandbox. Read
// and Write may be used from different goroutines; Resize and Write are serialised.
type PTYSession struct {
	conn io.ReadWriteCloser
	r    *bufio.Reader
	buf  []byte
	wmu  sync.Mutex
	// exit is set once the exit frame arrives.
	exit *PTYExit
	stop func() bool
}

// Next returns the next piece of terminal output (valid until the next call), or, at the end,
// (nil, exit, nil) with how the command ended. A connection that ends without an exit frame is
// SANDBOX_NOT_RUNNING; an error frame is the agent's typed error.
func (p *PTYSession) Next() ([]byte, *PTYExit, error) {
	if p.exit != nil {
		return nil, p.exit, nil
	}
	for {
		typ, payload, err := readFrame(p.r, p.buf)
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.ErrClosedPipe) {
				return nil, nil, errcode.New(errcode.SandboxNotRunning, "the guest agent closed the terminal before the command finished (the sandbox may have stopped)")
			}
			return nil, nil, errcode.Wrap(errcode.Internal, err, "reading the terminal from the sandbox's agent: %v", err).With("origin", agent.Origin)
		}
		switch typ {
		case ptyData:
			if len(payload) == 0 {
				continue
			}
			return payload, nil, nil
		case ptyExit:
			var x PTYExit
			if err := json.Unmarshal(payload, &x); err != nil {
				return nil, nil, errcode.New(errcode.Internal, "the sandbox's agent sent a malformed exit frame").With("origin", agent.Origin)
			}
			p.exit = &x
			return nil, p.exit, nil
		case ptyError:
			var eb ErrorBody
			if err := json.Unmarshal(payload, &eb); err != nil || eb.Code == "" {
				return nil, nil, errcode.New(errcode.Internal, "the sandbox's agent sent a malformed error frame").With("origin", agent.Origin)
			}
			return nil, nil, agent.Error(eb, "", execCodes)
		default:
			return nil, nil, errcode.New(errcode.Internal, "the sandbox's agent sent an unexpected frame %q", typ).With("origin", agent.Origin)
		}
	}
}

// Write sends terminal input (keystrokes), in frames of at most MaxPTYData.
func (p *PTYSession) Write(b []byte) (int, error) {
	p.wmu.Lock()
	defer p.wmu.Unlock()
	n := 0
	for len(b) > 0 {
		c := b[:min(len(b), MaxPTYData)]
		if err := writeFrame(p.conn, ptyData, c); err != nil {
			return n, err
		}
		n += len(c)
		b = b[len(c):]
	}
	return n, nil
}

// Resize changes the terminal's size (the command gets SIGWINCH).
func (p *PTYSession) Resize(rows, cols int) error {
	if err := checkPTYSize(rows, cols); err != nil || rows == 0 {
		if err == nil {
			err = errcode.New(errcode.InvalidArgument, "rows and cols must be at least 1")
		}
		return err
	}
	var b [4]byte
	binary.BigEndian.PutUint16(b[0:], uint16(rows))
	binary.BigEndian.PutUint16(b[2:], uint16(cols))
	p.wmu.Lock()
	defer p.wmu.Unlock()
	return writeFrame(p.conn, ptyResize, b[:])
}

// Close drops the connection; a command still running is hung up and its whole tree killed.
func (p *PTYSession) Close() error {
	p.stop()
	return p.conn.Close()
}

// PTY starts a command on a pseudo-terminal in the sandbox. The session ends when the command
// does (Next returns its exit) or when ctx ends or Close is called (the agent then kills it).
func (c *Client) PTY(ctx context.Context, req PTYRequest) (*PTYSession, error) {
	if err := checkPTYSize(req.Rows, req.Cols); err != nil {
		return nil, err
	}
	conn, err := c.upgradeJSON(ctx, "/pty", PTYUpgrade, req, "a terminal request")
	if err != nil {
		return nil, err
	}
	// The session lives as long as ctx: its end closes the connection, which hangs the
	// command up.
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	return &PTYSession{conn: conn, r: bufio.NewReaderSize(conn, 64<<10), buf: make([]byte, MaxPTYData+maxPTYControl), stop: stop}, nil
}

// upgradeJSON sends body to path asking to switch the connection to proto, and returns the
// connection once the agent has (what names the request in errors).
func (c *Client) upgradeJSON(ctx context.Context, path, proto string, body any, what string) (io.ReadWriteCloser, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return nil, errcode.Wrap(errcode.InvalidArgument, err, "cannot encode request")
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, base+path, bytes.NewReader(b))
	if err != nil {
		return nil, errcode.Wrap(errcode.InvalidArgument, err, "bad request to the guest agent")
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Connection", "Upgrade")
	hreq.Header.Set("Upgrade", proto)
	resp, err := c.hc.Do(hreq)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, errcode.Wrap(errcode.SandboxNotRunning, err, "the sandbox's agent is not reachable")
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		defer resp.Body.Close()
		if resp.StatusCode >= 300 {
			return nil, ctxErr(ctx, agent.ReadError(resp, what, execCodes...))
		}
		return nil, errcode.New(errcode.Internal, "the sandbox's agent answered HTTP %d to %s instead of switching protocols", resp.StatusCode, what).With("origin", agent.Origin)
	}
	conn, ok := resp.Body.(io.ReadWriteCloser)
	if !ok {
		resp.Body.Close()
		return nil, errcode.New(errcode.Internal, "the upgraded connection to the agent is not writable")
	}
	return conn, nil
}
