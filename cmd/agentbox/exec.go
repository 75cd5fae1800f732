package main

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"os"
	"unicode/utf8"

	"github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/wire"
)

func cmdExec(args []string) int {
	c := newClientCmd("exec", "agentbox exec [--timeout SECONDS] [--env K=V]... [--cwd DIR] [--user root] [--changes] [--checkpoint] ID -- ARGV...")
	timeout := c.fs.Float64("timeout", 0, "seconds before the command's process group is killed (default 300)")
	cwd := c.fs.String("cwd", "", "working directory inside the sandbox (default /workspace)")
	user := c.fs.String("user", "", `run as "root" instead of the sandbox's default user`)
	env := kvFlag{}
	c.fs.Var(env, "env", "environment variable K=V (repeatable)")
	noStdin := c.fs.Bool("no-stdin", false, "do not forward this process's standard input")
	background := c.fs.Bool("background", false, "start the command as a detached job and print its id (see agentbox job, agentbox logs)")
	// the paths the command changed, a snapshot after it (both on stderr)
	changes := c.fs.Bool("changes", false, "after the command, list the paths it changed on stderr (A/M/D MODE TYPE SIZE PATH)")
	checkpoint := c.fs.Bool("checkpoint", false, "snapshot the sandbox after the command; its id goes to stderr")
	hasArgv := func(n int) bool { return n >= 3 }
	return c.run(args, hasArgv, func(ctx context.Context, cl *client.Client, pos []string) int {
		if pos[1] != "--" {
			fmt.Fprintln(os.Stderr, "usage: "+c.usage)
			return 2
		}
		id, argv := pos[0], pos[2:]
		req := wire.ExecRequest{Command: argv, Cwd: *cwd, TimeoutSeconds: *timeout, User: *user, Changes: *changes, Checkpoint: *checkpoint}
		if len(env) > 0 {
			req.Env = env
		}
		if *background {
			return startJob(ctx, cl, c.json, id, req)
		}
		if !*noStdin && !isTerminal(os.Stdin) {
			b, err := io.ReadAll(io.LimitReader(os.Stdin, sandbox.MaxStdinBytes+1))
			if err != nil {
				return fail(err)
			}
			if len(b) > sandbox.MaxStdinBytes {
				return fail(fmt.Errorf("standard input is over %d bytes; copy large input in with `agentbox cp` and redirect from the file", sandbox.MaxStdinBytes))
			}
			req.Stdin = string(b)
			if !utf8.Valid(b) {
				req.Stdin, req.StdinBase64 = "", base64.StdEncoding.EncodeToString(b)
			}
		}
		res, err := cl.Exec(ctx, id, req, func(stream string, data []byte) {
			if stream == "stderr" {
				os.Stderr.Write(data)
			} else {
				os.Stdout.Write(data)
			}
		})
		if err != nil {
			if ctx.Err() != nil {
				fmt.Fprintln(os.Stderr, "agentbox: interrupted; the command was killed")
				return 130
			}
			return fail(err)
		}
		if c.json {
			printJSON(res)
		} else {
			printExecChanges(res)
		}
		if res.TimedOut {
			fmt.Fprintf(os.Stderr, "agentbox: the command timed out after %d ms and its process group was killed\n", res.DurationMs)
		}
		if res.OOMKilled {
			fmt.Fprintln(os.Stderr, "agentbox: the sandbox ran out of memory and the command was killed (ask for more --memory-mb, or use less)")
		}
		return res.ExitCode
	})
}

func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
