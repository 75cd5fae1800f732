package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/config"
	"github.com/agentbox/agentbox/internal/errcode"
)

// clientFlags are the flags every client subcommand takes.
type clientFlags struct {
	server string
	token  string
	json   bool
	tls    clientTLS // https trust (tls.go)
}

func (c *clientFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&c.server, "server", "", "server URL (default: $AGENTBOX_URL, the local server, or http://"+config.DefaultListen+")")
	fs.StringVar(&c.token, "token", "", "bearer token or API key (default: $AGENTBOX_TOKEN, $AGENTBOX_TOKEN_FILE or ~/.config/agentbox/token)")
	fs.BoolVar(&c.json, "json", false, "print JSON")
	c.tls.register(fs)
}

func (c *clientFlags) client() (*client.Client, error) {
	url := c.server
	if url == "" {
		url = config.ServerURL()
	}
	tok := c.token
	if tok == "" {
		var err error
		if tok, err = config.ReadToken(); err != nil {
			return nil, err
		}
	}
	return client.NewTLS(url, tok, c.tls.forURL(url))
}

// clientCmd is the shape every subcommand that talks to a server shares: its flags (plus the
// common ones), positional-argument check, a client and a context cancelled on SIGINT/SIGTERM.
type clientCmd struct {
	clientFlags
	fs    *flag.FlagSet
	usage string
}

func newClientCmd(name, usage string) *clientCmd {
	c := &clientCmd{fs: flag.NewFlagSet(name, flag.ContinueOnError), usage: usage}
	c.register(c.fs)
	return c
}

// run parses args; if nargs accepts the number of positional arguments it calls f with a
// connected client. It returns the process exit code.
func (c *clientCmd) run(args []string, nargs func(n int) bool, f func(ctx context.Context, cl *client.Client, pos []string) int) int {
	pos, err := parseInterleaved(c.fs, args)
	if err != nil {
		return 2
	}
	if !nargs(len(pos)) {
		fmt.Fprintln(os.Stderr, "usage: "+c.usage)
		return 2
	}
	cl, err := c.client()
	if err != nil {
		return fail(err)
	}
	ctx, cancel := signalContext()
	defer cancel()
	return f(ctx, cl, pos)
}

func exactly(k int) func(int) bool { return func(n int) bool { return n == k } }

func atLeast(k int) func(int) bool { return func(n int) bool { return n >= k } }

// signalContext is cancelled on SIGINT/SIGTERM.
func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}

// fail prints an error the way every subcommand does and returns the exit code 1.
func fail(err error) int {
	if e, ok := errcode.As(err); ok {
		fmt.Fprintf(os.Stderr, "agentbox: %s: %s\n", e.Code, e.Message)
	} else {
		fmt.Fprintf(os.Stderr, "agentbox: %v\n", err)
	}
	return 1
}

func printJSON(v any) {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// kvFlag collects repeated K=V flags.
type kvFlag map[string]string

func (kv kvFlag) String() string { return "" }

func (kv kvFlag) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return fmt.Errorf("%q must be KEY=VALUE", s)
	}
	kv[k] = v
	return nil
}

// parseInterleaved parses flags that may appear before or after positional arguments (up to a
// "--", after which everything is positional).
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if len(args) > 0 && args[0] == "--" {
			return append(pos, args...), nil
		}
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if rest[0] == "--" {
			return append(pos, rest...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}
