package sandbox

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/guest"
)

// ExecSession is a command running in a sandbox whose stdin stays open to the caller: its
// output streams as it comes (Next), its input is written while it runs (Write) and ends with
// CloseStdin. Next and Write may be called from different goroutines.
type ExecSession struct {
	g *guest.StdinSession
}

// Next returns the next output ("stdout" or "stderr" and its bytes, valid until the next
// call), or at the end the command's result (its output is not kept in it: it was streamed).
func (e *ExecSession) Next() (string, []byte, *ExecResult, error) {
	stream, b, gres, err := e.g.Next()
	if gres != nil {
		res := execResultFrom(*gres)
		return "", nil, &res, nil
	}
	return stream, b, nil, err
}

// Write sends b to the command's stdin.
func (e *ExecSession) Write(b []byte) (int, error) { return e.g.Write(b) }

// CloseStdin closes the command's stdin: it reads EOF after what was written.
func (e *ExecSession) CloseStdin() error { return e.g.CloseStdin() }

// Close ends the session; a command still running is killed with its whole tree.
func (e *ExecSession) Close() error { return e.g.Close() }

// ExecStdin starts a command in a running sandbox as Exec does (the same checks, user, cwd,
// timeout and whole-tree kill), but with its stdin open to the caller: req.Stdin must be empty,
// and the feature hooks' extras (changes, checkpoint) are not offered. The command lives until
// it ends, ctx ends or Close.
func (s *Service) ExecStdin(ctx context.Context, id string, req ExecRequest) (_ *ExecSession, err error) {
	ctx, span := s.tracer.Start(ctx, SpanExec, trace.WithAttributes(attribute.String(AttrSandbox, id)))
	defer func() { endSpan(span, err) }()
	if err := checkExec(req); err != nil {
		return nil, err
	}
	if len(req.Stdin) > 0 {
		return nil, errcode.New(errcode.InvalidArgument, "stdin must be empty when it stays open: write it to the session")
	}
	if req.Changes || req.Checkpoint {
		return nil, errcode.New(errcode.UnsupportedOp, "changes and checkpoint are not offered for a command with open stdin")
	}
	if req.Timeout == 0 {
		req.Timeout = guest.DefaultTimeout
	}
	sb, gc, err := s.running(ctx, id)
	if err != nil {
		return nil, err
	}
	g, err := gc.ExecStdin(ctx, guest.ExecRequest{Argv: req.Argv, Env: callEnv(sb, req.Env), Cwd: req.Cwd,
		TimeoutMs: req.Timeout.Milliseconds(), User: req.User})
	if err != nil {
		if errcode.Of(err) == errcode.UnsupportedOp {
			return nil, errcode.New(errcode.UnsupportedOp, "sandbox %s's agent is older than this server and cannot keep a command's stdin open; recreate the sandbox", id)
		}
		return nil, s.guestFailed(ctx, sb, err)
	}
	return &ExecSession{g: g}, nil
}
