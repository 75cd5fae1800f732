package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/egress"
	"github.com/agentbox/agentbox/internal/wire"
)

// Network: `agentbox network set|show`, `agentbox connections`, `agentbox
// secret-calls`, `agentbox expose`, `agentbox unexpose`, and sandbox create's --allow-host,
// --deny-host, --egress and --secret.

// listFlag collects a repeatable string flag.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }

func (l *listFlag) Set(s string) error {
	if strings.TrimSpace(s) == "" {
		return fmt.Errorf("must not be empty")
	}
	*l = append(*l, s)
	return nil
}

// secretFlag collects --secret NAME=env:VAR@host1,host2 (or NAME=file:/path@hosts).
type secretFlag map[string]wire.SecretSpec

func (f secretFlag) String() string { return "" }

func (f secretFlag) Set(s string) error {
	name, spec, err := parseSecret(s)
	if err != nil {
		return err
	}
	if _, dup := f[name]; dup {
		return fmt.Errorf("secret %s given twice", name)
	}
	f[name] = spec
	return nil
}

var secretNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// parseSecret parses NAME=SOURCE@HOST[,HOST...], SOURCE being env:VAR or file:/path. The last
// "@" separates the hosts (a path may hold one).
func parseSecret(s string) (string, wire.SecretSpec, error) {
	const form = "NAME=env:VAR@host1,host2 or NAME=file:/path@host"
	name, rest, ok := strings.Cut(s, "=")
	if !ok {
		return "", wire.SecretSpec{}, fmt.Errorf("%q must be %s", s, form)
	}
	if !secretNameRE.MatchString(name) {
		return "", wire.SecretSpec{}, fmt.Errorf("secret name %q must be an environment variable name (letters, digits, _; not starting with a digit)", name)
	}
	at := strings.LastIndex(rest, "@")
	if at < 0 {
		return "", wire.SecretSpec{}, fmt.Errorf("secret %s: %q names no hosts; write %s (the hosts whose requests get the value)", name, rest, form)
	}
	from, hostList := rest[:at], rest[at+1:]
	switch {
	case strings.HasPrefix(from, "env:") && len(from) > len("env:"):
	case strings.HasPrefix(from, "file:/"):
	default:
		return "", wire.SecretSpec{}, fmt.Errorf("secret %s: source %q must be env:VAR or file:/absolute/path", name, from)
	}
	var hosts []string
	for _, h := range strings.Split(hostList, ",") {
		h = strings.TrimSpace(h)
		if h == "" {
			return "", wire.SecretSpec{}, fmt.Errorf("secret %s: empty host in %q; write %s", name, hostList, form)
		}
		hosts = append(hosts, h)
	}
	return name, wire.SecretSpec{From: from, Hosts: hosts}, nil
}

// networkFlags are sandbox create's network flags.
type networkFlags struct {
	allow, deny listFlag
	egress      bool
	secrets     secretFlag
}

func (n *networkFlags) register(c *clientCmd) {
	n.secrets = secretFlag{}
	c.fs.Var(&n.allow, "allow-host", "a host the sandbox may reach: name, *.wildcard, :port, or CIDR (repeatable); gives the sandbox a network policy")
	c.fs.Var(&n.deny, "deny-host", "a host refused even when allowed (repeatable)")
	c.fs.BoolVar(&n.egress, "egress", false, "create with a network policy even without --allow-host (nothing reachable until `agentbox network set`)")
	c.fs.Var(n.secrets, "secret", "a secret swapped in by the egress proxy, never put in the sandbox: NAME=env:VAR@host1,host2 or NAME=file:/path@host (repeatable; the server must allow the source with --secret-env or --secret-dir)")
}

// apply sets req's network and secrets.
func (n *networkFlags) apply(req *wire.CreateRequest) {
	if len(n.allow) > 0 || len(n.deny) > 0 || n.egress || len(n.secrets) > 0 {
		req.Network = &wire.Network{Policy: &wire.Policy{Allow: nonNilStrings(n.allow), Deny: nonNilStrings(n.deny)}}
	}
	if len(n.secrets) > 0 {
		req.Secrets = n.secrets
	}
}

func nonNilStrings(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// cmdNetwork is `agentbox network set|show`.
func cmdNetwork(args []string) int {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, "usage: agentbox network set|show ...\n")
		return 2
	}
	switch args[0] {
	case "set":
		return networkSet(args[1:])
	case "show", "get":
		return networkShow(args[1:])
	}
	fmt.Fprintf(os.Stderr, "agentbox network: unknown subcommand %q (set, show)\n", args[0])
	return 2
}

func networkSet(args []string) int {
	c := newClientCmd("network set", "agentbox network set ID [--allow H]... [--deny H]...   (replaces the whole policy)")
	var allow, deny listFlag
	c.fs.Var(&allow, "allow", "a host the sandbox may reach (repeatable; the whole new allow list)")
	c.fs.Var(&deny, "deny", "a host refused even when allowed (repeatable; the whole new deny list)")
	return c.run(args, exactly(1), func(ctx context.Context, cl *client.Client, pos []string) int {
		p := wire.Policy{Allow: nonNilStrings(allow), Deny: nonNilStrings(deny)}
		sb, err := cl.UpdateNetwork(ctx, pos[0], p)
		if err != nil {
			return fail(err)
		}
		if c.json {
			printJSON(sb)
			return 0
		}
		fmt.Printf("%s: allow [%s] deny [%s]; applies to the next connection\n", sb.ID, strings.Join(p.Allow, ", "), strings.Join(p.Deny, ", "))
		return 0
	})
}

func networkShow(args []string) int {
	c := newClientCmd("network show", "agentbox network show [--json] ID")
	return c.run(args, exactly(1), func(ctx context.Context, cl *client.Client, pos []string) int {
		nw, err := cl.Network(ctx, pos[0])
		if err != nil {
			return fail(err)
		}
		exps, err := cl.Exposures(ctx, pos[0])
		if err != nil {
			return fail(err)
		}
		if c.json {
			printJSON(map[string]any{"sandbox_id": pos[0], "network": nw, "exposures": exps})
			return 0
		}
		var p wire.Policy
		if len(nw) == 0 || string(nw) == `"none"` || string(nw) == "null" || json.Unmarshal(nw, &p) != nil {
			fmt.Printf("network\tnone (created without a policy; it cannot be changed)\n")
		} else {
			fmt.Printf("allow\t%s\ndeny\t%s\n", strings.Join(p.Allow, " "), strings.Join(p.Deny, " "))
		}
		for _, e := range exps {
			access := "private"
			if e.Public {
				access = "public"
			}
			fmt.Printf("expose\t%d\t%s\t%s\n", e.Port, access, e.URL)
		}
		return 0
	})
}

// pageFlags are --after and --limit.
func pageFlags(c *clientCmd) (*int64, *int) {
	return c.fs.Int64("after", 0, "cursor: records after this one (the previous page's next); default the newest"),
		c.fs.Int("limit", 0, "most records, 1–1000 (default 100)")
}

func cmdConnections(args []string) int {
	c := newClientCmd("connections", "agentbox connections [--after N] [--limit N] [--json] ID")
	after, limit := pageFlags(c)
	return c.run(args, exactly(1), func(ctx context.Context, cl *client.Client, pos []string) int {
		l, err := cl.Connections(ctx, pos[0], *after, *limit)
		if err != nil {
			return fail(err)
		}
		if c.json {
			printJSON(l)
			return 0
		}
		tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "TIME\tKIND\tHOST\tPORT\tDECISION\tRULE\tOUT\tIN\tMS")
		for _, x := range l.Connections {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%d\t%d\t%d\n", x.Time.Local().Format(time.TimeOnly), x.Kind, x.Host, x.Port,
				x.Decision, x.Rule, x.BytesOut, x.BytesIn, x.DurationMS)
		}
		tw.Flush()
		for _, x := range l.Connections {
			if x.Decision != egress.Allowed && x.Reason != "" {
				fmt.Printf("%s %s:%d: %s\n", x.Time.Local().Format(time.TimeOnly), x.Host, x.Port, x.Reason)
			}
		}
		if l.Omitted > 0 {
			fmt.Printf("(%d older not shown; next cursor %d)\n", l.Omitted, l.Next)
		}
		return 0
	})
}

func cmdSecretCalls(args []string) int {
	c := newClientCmd("secret-calls", "agentbox secret-calls [--after N] [--limit N] [--json] ID")
	after, limit := pageFlags(c)
	return c.run(args, exactly(1), func(ctx context.Context, cl *client.Client, pos []string) int {
		l, err := cl.SecretCalls(ctx, pos[0], *after, *limit)
		if err != nil {
			return fail(err)
		}
		if c.json {
			printJSON(l)
			return 0
		}
		tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "TIME\tSECRET\tHOST\tMETHOD\tPATH\tREPLACED\tREASON")
		for _, x := range l.Calls {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%v\t%s\n", x.Time.Local().Format(time.TimeOnly), x.Secret, x.Host, x.Method, x.Path, x.Replaced, x.Reason)
		}
		tw.Flush()
		return 0
	})
}

func portArg(s string) (int, bool) {
	p, err := strconv.Atoi(s)
	if err != nil || p < 1 || p > 65535 {
		fmt.Fprintf(os.Stderr, "agentbox: PORT must be a number between 1 and 65535; got %q\n", s)
		return 0, false
	}
	return p, true
}

func cmdExpose(args []string) int {
	c := newClientCmd("expose", "agentbox expose [--public] [--json] ID PORT")
	public := c.fs.Bool("public", false, "no credential needed to open the URL (default: the bearer token or the access token)")
	return c.run(args, exactly(2), func(ctx context.Context, cl *client.Client, pos []string) int {
		port, ok := portArg(pos[1])
		if !ok {
			return 2
		}
		e, err := cl.Expose(ctx, pos[0], port, *public)
		if err != nil {
			return fail(err)
		}
		if c.json {
			printJSON(e)
			return 0
		}
		fmt.Println(e.URL)
		if e.AccessToken != "" {
			fmt.Printf("%s?agentbox_token=%s\n", e.URL, e.AccessToken)
		}
		return 0
	})
}

func cmdUnexpose(args []string) int {
	c := newClientCmd("unexpose", "agentbox unexpose ID PORT")
	return c.run(args, exactly(2), func(ctx context.Context, cl *client.Client, pos []string) int {
		port, ok := portArg(pos[1])
		if !ok {
			return 2
		}
		if err := cl.Unexpose(ctx, pos[0], port); err != nil {
			return fail(err)
		}
		return 0
	})
}
