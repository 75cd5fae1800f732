package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"golang.org/x/term"

	"github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/wire"
)

// cmdShell opens an interactive terminal in a sandbox: the local terminal in raw mode, its size
// followed, and the process's exit code the remote command's.
func cmdShell(args []string) int {
	c := newClientCmd("shell", "agentbox shell [--user root] [--cwd DIR] [--env K=V]... [--detach] ID [-- CMD...]")
	detach := c.fs.Bool("detach", false, "run CMD as a detached job instead (no terminal): it outlives this command; prints the job id")
	user := c.fs.String("user", "", `run as "root" instead of the sandbox's default user`)
	cwd := c.fs.String("cwd", "", "working directory inside the sandbox (default /workspace)")
	env := kvFlag{}
	c.fs.Var(env, "env", "environment variable K=V (repeatable)")
	nargs := func(n int) bool { return n == 1 || n >= 3 }
	return c.run(args, nargs, func(ctx context.Context, cl *client.Client, pos []string) int {
		id := pos[0]
		var argv []string
		if len(pos) > 1 {
			if pos[1] != "--" {
				fmt.Fprintln(os.Stderr, "usage: "+c.usage)
				return 2
			}
			argv = pos[2:]
		}
		if *detach {
			if len(argv) == 0 {
				fmt.Fprintln(os.Stderr, "agentbox shell --detach needs a command after --: a detached job has no terminal to hold a login shell")
				return 2
			}
			code := startJob(ctx, cl, c.json, id, wire.ExecRequest{Command: argv, Cwd: *cwd, User: *user, Env: env})
			if code == 0 && !c.json {
				fmt.Fprintf(os.Stderr, "detached; follow it with: agentbox logs -f %s JOB\n", id)
			}
			return code
		}
		ctx, stop := signal.NotifyContext(ctx, syscall.SIGHUP) // the local terminal went away
		defer stop()
		return runShell(ctx, cl, id, wire.PTYRequest{Argv: argv, User: *user, Cwd: *cwd, Env: env})
	})
}

func runShell(ctx context.Context, cl *client.Client, id string, req wire.PTYRequest) int {
	inFd, outFd := int(os.Stdin.Fd()), int(os.Stdout.Fd())
	inTTY := term.IsTerminal(inFd)
	if w, h, err := termSize(inFd, outFd); err == nil {
		req.Rows, req.Cols = min(h, wire.MaxPTYRows), min(w, wire.MaxPTYCols)
	}
	req.Term = os.Getenv("TERM")
	if req.Term == "dumb" {
		req.Term = ""
	}
	p, err := cl.PTY(ctx, id, req)
	if err != nil {
		return fail(err)
	}
	defer p.Close()

	// Raw mode: every key (Ctrl-C included) goes to the sandbox as typed. It is undone on
	// every way out of here: the command's end, an error, a signal, a panic.
	restore := func() {}
	if inTTY {
		old, err := term.MakeRaw(inFd)
		if err != nil {
			return fail(fmt.Errorf("cannot put the terminal in raw mode: %w", err))
		}
		restore = sync.OnceFunc(func() { _ = term.Restore(inFd, old) })
	}
	defer restore()

	done := make(chan struct{})
	defer close(done)
	winch := make(chan os.Signal, 1)
	notifyResize(winch)
	defer signal.Stop(winch)
	go func() {
		for {
			select {
			case <-done:
				return
			case <-winch:
				if w, h, err := termSize(inFd, outFd); err == nil {
					_ = p.Resize(min(max(h, 1), wire.MaxPTYRows), min(max(w, 1), wire.MaxPTYCols))
				}
			}
		}
	}()
	go func() {
		buf := make([]byte, 32<<10)
		for {
			n, err := os.Stdin.Read(buf)
			if n > 0 {
				if _, werr := p.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				if errors.Is(err, io.EOF) && !inTTY {
					_, _ = p.Write([]byte{4}) // end of input: the terminal's EOF character (Ctrl-D)
				}
				return
			}
		}
	}()

	for {
		b, x, err := p.Next()
		if err != nil {
			restore()
			if ctx.Err() != nil {
				fmt.Fprintln(os.Stderr, "agentbox: hung up; the command in the sandbox was killed")
				return 129
			}
			return fail(err)
		}
		if x != nil {
			restore()
			return x.ExitCode
		}
		if _, err := os.Stdout.Write(b); err != nil {
			restore()
			return fail(err)
		}
	}
}

// termSize is the local terminal's size, from stdin or else stdout.
func termSize(fds ...int) (w, h int, err error) {
	for _, fd := range fds {
		if w, h, err = term.GetSize(fd); err == nil && w > 0 && h > 0 {
			return w, h, nil
		}
	}
	if err == nil {
		err = errors.New("no terminal size")
	}
	return 0, 0, err
}
