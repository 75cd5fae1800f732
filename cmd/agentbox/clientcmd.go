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
}

func (c *clientFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&c.server, "server", "", "server URL (default: $AGENTBOX_URL, the local server, or http://"+config.DefaultListen+")")
	fs.StringVar(&c.token, "token", "", "bearer token (default: $AGENTBOX_TOKEN, $AGENTBOX_TOKEN_FILE or ~/.config/agentbox/token)")
	fs.BoolVar(&c.json, "json", false, "print JSON")
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
	return client.New(url, tok), nil
}

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
