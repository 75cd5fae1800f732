package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/wire"
)

// Joined machines: `agentbox machine exec` and `agentbox machine screenshot`.

// remoteSubcommands are the `agentbox machine` subcommands of remote exec and screenshots.
var remoteSubcommands = map[string]func([]string) int{"exec": machineExec, "screenshot": machineScreenshot}

// exit statuses of a remote exec cut short: its outcome is unknown.
const (
	exitRemoteTimeout      = 124 // as timeout(1)
	exitRemoteDisconnected = 125
)

func machineExec(args []string) int {
	c := newClientCmd("machine exec", "agentbox machine exec NAME [--shell sh|bash|cmd|powershell] [--timeout-ms N] [--elevated] [--env K=V]... [--cwd DIR] -- 'SCRIPT'")
	shell := c.fs.String("shell", "", "sh or bash (Linux, macOS), cmd or powershell (Windows); default the machine's: sh, powershell on Windows")
	timeout := c.fs.Int64("timeout-ms", -1, "kill the command's process tree after this many ms: 1000–3600000 (default 300000)")
	elevated := c.fs.Bool("elevated", false, "run as root (sudo -n unless the agent is root); not with --env")
	cwd := c.fs.String("cwd", "", "absolute working directory on the machine (default the agent's)")
	env := kvFlag{}
	c.fs.Var(env, "env", "environment variable K=V (repeatable)")
	return c.run(args, func(n int) bool { return n >= 2 }, func(ctx context.Context, cl *client.Client, pos []string) int {
		// NAME, then the script after "--" (which the flag parser consumes when flags come
		// between them); several words are joined with spaces, as ssh does.
		script := pos[1:]
		if script[0] == "--" {
			script = script[1:]
		}
		if len(script) == 0 {
			fmt.Fprintln(os.Stderr, "usage: "+c.usage)
			return 2
		}
		req := wire.RemoteExecRequest{Command: strings.Join(script, " "), Shell: *shell, Cwd: *cwd, Elevated: *elevated}
		if *timeout != -1 {
			req.TimeoutMS = timeout // 0 and out-of-range values go to the server, which refuses them
		}
		if len(env) > 0 {
			req.Env = env
		}
		res, err := cl.RemoteExec(ctx, pos[0], req)
		if err != nil {
			return fail(err)
		}
		if c.json {
			printJSON(res)
		} else {
			os.Stdout.WriteString(res.Stdout)
			os.Stderr.WriteString(res.Stderr)
		}
		if res.Truncated {
			fmt.Fprintf(os.Stderr, "agentbox: output truncated: the command wrote %d bytes; 1 MiB kept\n", res.TotalBytes)
		}
		if res.Partial {
			if res.Reason == wire.RemoteExecTimeout {
				fmt.Fprintf(os.Stderr, "agentbox: the command timed out after %d ms; its process tree was killed and its outcome is unknown\n", res.DurationMS)
				return exitRemoteTimeout
			}
			fmt.Fprintln(os.Stderr, "agentbox: the connection to the machine was lost; the output above is what arrived and the outcome is unknown")
			return exitRemoteDisconnected
		}
		if res.ExitCode == nil {
			return exitRemoteDisconnected
		}
		return *res.ExitCode & 0xff
	})
}

func machineScreenshot(args []string) int {
	c := newClientCmd("machine screenshot", "agentbox machine screenshot NAME [--display N] -o FILE.png")
	display := c.fs.Int("display", -1, "display index (X11 :N on Linux; the Nth screen on macOS/Windows); default the machine's")
	out := c.fs.String("o", "", "write the PNG to this file (required)")
	return c.run(args, exactly(1), func(ctx context.Context, cl *client.Client, pos []string) int {
		if *out == "" {
			fmt.Fprintln(os.Stderr, "usage: "+c.usage)
			return 2
		}
		var d *int
		if flagSet(c.fs, "display") {
			d = display
		}
		shot, err := cl.RemoteScreenshot(ctx, pos[0], d)
		if err != nil {
			return fail(err)
		}
		if err := os.WriteFile(*out, shot.PNG, 0o600); err != nil {
			return fail(err)
		}
		if c.json {
			printJSON(map[string]any{"file": *out, "caption": shot.Caption, "display": shot.Display, "screen": shot.Screen,
				"screens": shot.Screens, "width": shot.Width, "height": shot.Height, "taken_at": shot.TakenAt, "platform": shot.Platform})
		} else {
			fmt.Printf("%s: %s\n", *out, shot.Caption)
		}
		return 0
	})
}

// flagSet reports whether the flag name was given.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}
