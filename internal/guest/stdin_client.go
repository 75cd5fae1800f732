package guest

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"sync"

	"github.com/agentbox/agentbox/internal/errcode"
)

// The open-stdin exec. POST /v1/exec/stdin carries an ExecRequest (stdin empty; stream and
// max_output_bytes ignored) with "Connection: Upgrade" and "Upgrade: agentbox-stdin/1". A
// request the agent refuses gets an ordinary JSON error reply; one it accepts gets 101 Switching
// Protocols, and the command runs as POST /v1/exec runs it (its user, cwd, timeout; at its end
// or the host's leaving, its whole tree killed), its stdin a pipe the host writes to. The
// connection then carries frames in the PTY endpoint's format (pty.go):
//
//	'd' data    host → agent: stdin bytes; agent → host: stdout bytes
//	's' stderr  agent → host: stderr bytes
//	'c' close   host → agent: close the command's stdin (it reads EOF); no payload
//	'x' exit    agent → host: the ExecResult as JSON (no output kept in it), the last frame
//	'e' error   agent → host: ErrorBody as JSON, the last frame
//
// An agent older than this endpoint answers UNSUPPORTED_OP (no such endpoint).
const StdinUpgrade = "agentbox-stdin/1"

// StdinSession is the host's end of a command whose stdin stays open. Next and Write may be
// used from different goroutines; Write and CloseStdin are serialised.
type StdinSession struct {
	conn   io.ReadWriteCloser
	r      *bufio.Reader
	buf    []byte
	wmu    sync.Mutex
	result *ExecResult
	stop   func() bool
}

// Next returns the next output ("stdout" or "stderr" and its bytes, valid until the next call),
// or, at the end, the command's result. A connection that ends without a result is
// SANDBOX_NOT_RUNNING; an error frame is the agent's typed error.
func (p *StdinSession) Next() (string, []byte, *ExecResult, error) {
	if p.result != nil {
		return "", nil, p.result, nil
	}
	for {
		typ, payload, err := readFrame(p.r, p.buf)
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.ErrClosedPipe) {
				return "", nil, nil, errcode.New(errcode.SandboxNotRunning, "the guest agent closed the command's connection before it finished (the sandbox may have stopped)")
			}
			return "", nil, nil, errcode.Wrap(errcode.Internal, err, "reading a command's output from the sandbox's agent: %v", err).With("origin", agent.Origin)
		}
		switch typ {
		case ptyData, pipeStderr:
			if len(payload) == 0 {
				continue
			}
			if typ == pipeStderr {
				return "stderr", payload, nil, nil
			}
			return "stdout", payload, nil, nil
		case ptyExit:
			var res ExecResult
			if err := json.Unmarshal(payload, &res); err != nil {
				return "", nil, nil, errcode.New(errcode.Internal, "the sandbox's agent sent a malformed exit frame").With("origin", agent.Origin)
			}
			p.result = &res
			return "", nil, p.result, nil
		case ptyError:
			var eb ErrorBody
			if err := json.Unmarshal(payload, &eb); err != nil || eb.Code == "" {
				return "", nil, nil, errcode.New(errcode.Internal, "the sandbox's agent sent a malformed error frame").With("origin", agent.Origin)
			}
			return "", nil, nil, agent.Error(eb, "", execCodes)
		default:
			return "", nil, nil, errcode.New(errcode.Internal, "the sandbox's agent sent an unexpected frame %q", typ).With("origin", agent.Origin)
		}
	}
}

// Write sends b to the command's stdin, in frames of at most MaxPTYData.
func (p *StdinSession) Write(b []byte) (int, error) {
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

// CloseStdin closes the command's stdin: it reads EOF once it has read what was written.
func (p *StdinSession) CloseStdin() error {
	p.wmu.Lock()
	defer p.wmu.Unlock()
	return writeFrame(p.conn, pipeCloseIn, nil)
}

// Close drops the connection; a command still running is killed with its whole tree.
func (p *StdinSession) Close() error {
	p.stop()
	return p.conn.Close()
}

// ExecStdin starts a command whose stdin stays open to the caller (StdinSession.Write,
// CloseStdin) and whose output streams as it comes. The session ends when the command does
// (Next returns its result) or when ctx ends or Close is called (the agent then kills it).
func (c *Client) ExecStdin(ctx context.Context, req ExecRequest) (*StdinSession, error) {
	if len(req.Stdin) > 0 {
		return nil, errcode.New(errcode.InvalidArgument, "stdin must be empty: write it to the session")
	}
	req.Stream = false
	conn, err := c.upgradeJSON(ctx, "/exec/stdin", StdinUpgrade, req, "a command with open stdin")
	if err != nil {
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	return &StdinSession{conn: conn, r: bufio.NewReaderSize(conn, 64<<10), buf: make([]byte, MaxPTYData+maxPTYControl), stop: stop}, nil
}
