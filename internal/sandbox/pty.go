package sandbox

import (
	"context"
	"strings"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/guest"
)

// Terminal bounds.
const (
	MaxPTYRows = guest.MaxPTYRows
	MaxPTYCols = guest.MaxPTYCols
	// MaxPTYData is the most terminal bytes one read returns or one message should carry.
	MaxPTYData = guest.MaxPTYData
)

// PTYRequest opens an interactive terminal in a sandbox.
type PTYRequest struct {
	// Argv is the command; empty runs the user's login shell.
	Argv []string
	Env  map[string]string
	Cwd  string
	// User is "" (the sandbox default) or "root".
	User string
	// Term is TERM (default xterm-256color).
	Term string
	// Rows and Cols are the initial size (1–1000 each; 0 × 0 is 24 × 80).
	Rows, Cols int
}

// PTYExit is how a terminal's command ended.
type PTYExit struct {
	ExitCode int    `json:"exit_code"`
	Signal   string `json:"signal,omitempty"`
}

// PTY is a command running on a pseudo-terminal in a sandbox. Next and Write may be called from
// different goroutines; nothing is buffered beyond one message on either side.
type PTY struct {
	g *guest.PTYSession
}

// Next returns the next terminal output (valid until the next call), or at the end (nil, exit).
func (p *PTY) Next() ([]byte, *PTYExit, error) {
	b, x, err := p.g.Next()
	if x != nil {
		return nil, &PTYExit{ExitCode: x.ExitCode, Signal: x.Signal}, nil
	}
	return b, nil, err
}

// Write sends keystrokes.
func (p *PTY) Write(b []byte) (int, error) { return p.g.Write(b) }

// Resize changes the terminal's size (1–1000 rows and columns).
func (p *PTY) Resize(rows, cols int) error { return p.g.Resize(rows, cols) }

// Close hangs the terminal up: a command still running gets SIGHUP, then its whole tree SIGKILL.
func (p *PTY) Close() error { return p.g.Close() }

// PTY starts a command (by default the user's login shell) on a pseudo-terminal in a running
// sandbox. It lives until the command ends, ctx ends or Close; nothing it started outlives it.
func (s *Service) PTY(ctx context.Context, id string, req PTYRequest) (*PTY, error) {
	for i, a := range req.Argv {
		if strings.ContainsRune(a, 0) {
			return nil, errcode.New(errcode.InvalidArgument, "command[%d] contains a NUL byte", i)
		}
	}
	if len(req.Argv) > 0 && req.Argv[0] == "" {
		return nil, errcode.New(errcode.InvalidArgument, "command[0] is empty: it must name the command to run (or give no command for the login shell)")
	}
	if err := ValidateEnv("env", req.Env); err != nil {
		return nil, err
	}
	if req.Rows < 0 || req.Rows > MaxPTYRows || req.Cols < 0 || req.Cols > MaxPTYCols || (req.Rows == 0) != (req.Cols == 0) {
		return nil, errcode.New(errcode.InvalidArgument, "rows must be between 1 and %d and cols between 1 and %d (or both 0 for 24 × 80); got %d × %d", MaxPTYRows, MaxPTYCols, req.Rows, req.Cols)
	}
	sb, gc, err := s.running(ctx, id)
	if err != nil {
		return nil, err
	}
	g, err := gc.PTY(ctx, guest.PTYRequest{Argv: req.Argv, Env: callEnv(sb, req.Env), Cwd: req.Cwd, User: req.User, Term: req.Term, Rows: req.Rows, Cols: req.Cols})
	if err != nil {
		return nil, s.guestFailed(ctx, sb, err)
	}
	return &PTY{g: g}, nil
}
