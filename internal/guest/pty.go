package guest

import (
	"encoding/binary"
	"fmt"
	"io"

	"github.com/agentbox/agentbox/internal/errcode"
)

// The PTY endpoint. POST /v1/pty carries a PTYRequest as its JSON body with "Connection:
// Upgrade" and "Upgrade: agentbox-pty/1": a request the agent refuses gets an ordinary JSON
// error reply; one it accepts gets 101 Switching Protocols, after which the connection carries
// PTY frames both ways until the command ends (an Exit frame, then the agent closes) or the
// host closes it (the agent then hangs up the command: SIGHUP, then SIGKILL, to its whole tree).
//
// A frame is a 1-byte type, a 4-byte big-endian payload length and the payload:
//
//	'd' data    both ways: terminal bytes (at most MaxPTYData per frame)
//	'r' resize  host → agent: rows, cols as two big-endian uint16
//	'x' exit    agent → host: PTYExit as JSON, the last frame
//	'e' error   agent → host: ErrorBody as JSON, the last frame
//
// Nothing is buffered beyond one frame on either side: a reader that stops reading stops the
// writer, and so the command once the terminal's own buffer is full.
const (
	PTYUpgrade = "agentbox-pty/1"
	// MaxPTYData bounds the payload of one data frame.
	MaxPTYData = 32 << 10
	// maxPTYControl bounds the payload of an exit or error frame.
	maxPTYControl = 8 << 10
	// MaxPTYRows and MaxPTYCols bound a terminal's size.
	MaxPTYRows = 1000
	MaxPTYCols = 1000
	// DefaultTerm is TERM when the request names none.
	DefaultTerm = "xterm-256color"

	ptyData   = 'd'
	ptyResize = 'r'
	ptyExit   = 'x'
	ptyError  = 'e'
	// The frames only a command with open stdin uses (stdin.go).
	pipeStderr  = 's' // agent → host: stderr bytes ('d' carries stdout)
	pipeCloseIn = 'c' // host → agent: close the command's stdin (EOF); no payload
)

// PTYRequest starts a command on a pseudo-terminal.
type PTYRequest struct {
	// Argv is the command; empty runs the user's login shell (from /etc/passwd, else /bin/sh).
	Argv []string          `json:"argv,omitempty"`
	Env  map[string]string `json:"env,omitempty"`
	Cwd  string            `json:"cwd,omitempty"`
	// User is "" (the sandbox default) or "root".
	User string `json:"user,omitempty"`
	// Term is TERM (default xterm-256color).
	Term string `json:"term,omitempty"`
	// Rows and Cols are the terminal's size (1–1000; 0: 24 × 80).
	Rows int `json:"rows,omitempty"`
	Cols int `json:"cols,omitempty"`
}

// PTYExit is how a PTY command ended.
type PTYExit struct {
	// ExitCode is the exit status, or 128+signal number when killed by a signal.
	ExitCode int `json:"exit_code"`
	// Signal names the signal that killed the command, or "".
	Signal string `json:"signal,omitempty"`
}

// checkPTYSize validates a terminal size; 0 × 0 is the default.
func checkPTYSize(rows, cols int) error {
	if rows < 0 || rows > MaxPTYRows || cols < 0 || cols > MaxPTYCols || (rows == 0) != (cols == 0) {
		return errcode.New(errcode.InvalidArgument, "rows and cols must each be between 1 and %d and %d (or both 0 for 24 × 80); got %d × %d", MaxPTYRows, MaxPTYCols, rows, cols)
	}
	return nil
}

// writeFrame writes one frame.
func writeFrame(w io.Writer, typ byte, payload []byte) error {
	var h [5]byte
	h[0] = typ
	binary.BigEndian.PutUint32(h[1:], uint32(len(payload)))
	if _, err := w.Write(h[:]); err != nil {
		return err
	}
	if len(payload) == 0 {
		return nil
	}
	_, err := w.Write(payload)
	return err
}

// readFrame reads one frame into buf (reused; at least MaxPTYData+maxPTYControl long), refusing
// payloads longer than the frame type allows.
func readFrame(r io.Reader, buf []byte) (byte, []byte, error) {
	var h [5]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(h[1:])
	limit := uint32(0)
	switch h[0] {
	case ptyData:
		limit = MaxPTYData
	case ptyResize:
		limit = 4
	case pipeStderr:
		limit = MaxPTYData
	case pipeCloseIn:
		limit = 0
	case ptyExit, ptyError:
		limit = maxPTYControl
	default:
		return 0, nil, fmt.Errorf("unknown PTY frame type %#x", h[0])
	}
	if n > limit {
		return 0, nil, fmt.Errorf("PTY frame of type %q is %d bytes; at most %d are allowed", h[0], n, limit)
	}
	p := buf[:n]
	if _, err := io.ReadFull(r, p); err != nil {
		return 0, nil, err
	}
	return h[0], p, nil
}
