package client

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"sync"

	"github.com/coder/websocket"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/wire"
)

// PTY is an interactive terminal in a sandbox over the server's WebSocket.
type PTY struct {
	c    *websocket.Conn
	ctx  context.Context
	stop context.CancelFunc
	wmu  sync.Mutex
	exit *wire.PTYExit
}

// PTY opens a terminal in sandbox id running req.Argv (empty: the user's login shell).
func (c *Client) PTY(ctx context.Context, id string, req wire.PTYRequest) (*PTY, error) {
	u, err := url.Parse(c.base + "/v1/sandboxes/" + url.PathEscape(id) + "/pty")
	if err != nil {
		return nil, err
	}
	u.RawQuery = wire.PTYQuery(req).Encode()
	switch u.Scheme {
	case "http":
		u.Scheme = "ws"
	case "https":
		u.Scheme = "wss"
	}
	h := http.Header{}
	if c.token != "" {
		h.Set("Authorization", "Bearer "+c.token)
	}
	ctx, stop := context.WithCancel(ctx)
	ws, resp, err := websocket.Dial(ctx, u.String(), &websocket.DialOptions{HTTPHeader: h, HTTPClient: c.hc})
	if err != nil {
		defer stop()
		if resp != nil && resp.StatusCode >= 300 && resp.Body != nil {
			return nil, decodeError(resp)
		}
		return nil, fmt.Errorf("cannot open a terminal on the agentbox server at %s: %w", c.base, err)
	}
	// One server message is at most a data chunk or a small control message.
	ws.SetReadLimit(wire.MaxPTYMessage)
	return &PTY{c: ws, ctx: ctx, stop: stop}, nil
}

// Next returns the next terminal output (valid until the next call), or at the end (nil, exit).
func (p *PTY) Next() ([]byte, *wire.PTYExit, error) {
	if p.exit != nil {
		return nil, p.exit, nil
	}
	for {
		typ, data, err := p.c.Read(p.ctx)
		if err != nil {
			if p.ctx.Err() != nil {
				return nil, nil, p.ctx.Err()
			}
			return nil, nil, errcode.Wrap(errcode.SandboxNotRunning, err, "the terminal connection ended before the command did: %v", err)
		}
		if typ == websocket.MessageBinary {
			if len(data) == 0 {
				continue
			}
			return data, nil, nil
		}
		var m wire.PTYControl
		if err := json.Unmarshal(data, &m); err != nil {
			return nil, nil, errcode.New(errcode.Internal, "the server sent a malformed terminal control message")
		}
		switch {
		case m.Type == "exit" && m.ExitCode != nil:
			p.exit = &wire.PTYExit{ExitCode: *m.ExitCode, Signal: m.Signal}
			_ = p.c.Close(websocket.StatusNormalClosure, "")
			return nil, p.exit, nil
		case m.Type == "error" && m.Error != nil:
			return nil, nil, &errcode.Error{Code: m.Error.Code, Message: m.Error.Message, Details: m.Error.Details}
		}
		return nil, nil, errcode.New(errcode.Internal, "the server sent an unexpected terminal control message %q", m.Type)
	}
}

// Write sends keystrokes, in messages of at most wire.MaxPTYData bytes.
func (p *PTY) Write(b []byte) (int, error) {
	p.wmu.Lock()
	defer p.wmu.Unlock()
	n := 0
	for len(b) > 0 {
		chunk := b[:min(len(b), wire.MaxPTYData)]
		if err := p.c.Write(p.ctx, websocket.MessageBinary, chunk); err != nil {
			return n, err
		}
		n += len(chunk)
		b = b[len(chunk):]
	}
	return n, nil
}

// Resize tells the sandbox the terminal's new size.
func (p *PTY) Resize(rows, cols int) error {
	if rows < 1 || rows > wire.MaxPTYRows || cols < 1 || cols > wire.MaxPTYCols {
		return errcode.New(errcode.InvalidArgument, "rows must be between 1 and %d and cols between 1 and %d; got %d × %d", wire.MaxPTYRows, wire.MaxPTYCols, rows, cols)
	}
	b, _ := json.Marshal(wire.PTYControl{Type: "resize", Rows: rows, Cols: cols})
	p.wmu.Lock()
	defer p.wmu.Unlock()
	return p.c.Write(p.ctx, websocket.MessageText, b)
}

// Close hangs the terminal up: a command still running in the sandbox is killed, tree and all.
func (p *PTY) Close() error {
	defer p.stop()
	return p.c.CloseNow()
}
