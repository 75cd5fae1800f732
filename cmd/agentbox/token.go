package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/auth"
	"github.com/agentbox/agentbox/internal/wire"
)

// cmdToken manages named API keys through the running server (admin scope: the
// server's own token is the admin key).
func cmdToken(args []string) int {
	const subs = "create, ls, revoke"
	if len(args) == 0 {
		fmt.Fprintf(os.Stderr, "usage: agentbox token %s ...\n", strings.ReplaceAll(subs, ", ", "|"))
		return 2
	}
	sub := map[string]func([]string) int{"create": tokenCreate, "ls": tokenList, "list": tokenList, "revoke": tokenRevoke}
	if f, ok := sub[args[0]]; ok {
		return f(args[1:])
	}
	fmt.Fprintf(os.Stderr, "agentbox token: unknown subcommand %q (%s)\n", args[0], subs)
	return 2
}

func tokenCreate(args []string) int {
	c := newClientCmd("token create", "agentbox token create [--scope read|operate|admin] [--expires DURATION] [--json] NAME")
	scope := c.fs.String("scope", auth.ScopeRead, "read (gets, lists, logs), operate (creates, execs, writes, deletes), or admin (keys, approvals, the server)")
	expires := c.fs.Duration("expires", 0, fmt.Sprintf("how long the key lasts (%v to %v; 0: until revoked)", auth.MinTTL, auth.MaxTTL))
	return c.run(args, exactly(1), func(ctx context.Context, cl *client.Client, pos []string) int {
		req := wire.KeyCreateRequest{Name: pos[0], Scope: *scope}
		if *expires != 0 {
			req.TTL = expires.String()
		}
		k, err := cl.CreateKey(ctx, req)
		if err != nil {
			return fail(err)
		}
		if c.json {
			printJSON(k)
			return 0
		}
		exp := "never"
		if k.Key.ExpiresAt != nil {
			exp = k.Key.ExpiresAt.Format(time.RFC3339)
		}
		fmt.Fprintf(os.Stderr, "created API key %s (%s), scope %s, expires %s\nthe key is shown once, now; keep it secret (send it as \"Authorization: Bearer KEY\" or \"X-Api-Key: KEY\"; AGENTBOX_TOKEN=KEY for the CLI):\n",
			k.Key.Name, k.Key.ID, k.Key.Scope, exp)
		fmt.Println(k.Secret) // last, alone on stdout
		return 0
	})
}

func tokenList(args []string) int {
	c := newClientCmd("token ls", "agentbox token ls [--json]")
	return c.run(args, exactly(0), func(ctx context.Context, cl *client.Client, _ []string) int {
		keys, err := cl.ListKeys(ctx)
		if err != nil {
			return fail(err)
		}
		if c.json {
			printJSON(keys)
			return 0
		}
		tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tNAME\tSCOPE\tPREFIX\tCREATED\tEXPIRES\tLAST USED\tSTATE")
		t := func(p *time.Time) string {
			if p == nil {
				return "-"
			}
			return p.Local().Format(time.DateTime)
		}
		now := time.Now()
		for _, k := range keys {
			state := "active"
			switch {
			case k.RevokedAt != nil:
				state = "revoked " + t(k.RevokedAt)
			case k.ExpiresAt != nil && !now.Before(*k.ExpiresAt):
				state = "expired"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s…\t%s\t%s\t%s\t%s\n", k.ID, k.Name, k.Scope, k.Prefix, t(&k.CreatedAt), t(k.ExpiresAt), t(k.LastUsedAt), state)
		}
		tw.Flush()
		return 0
	})
}

func tokenRevoke(args []string) int {
	c := newClientCmd("token revoke", "agentbox token revoke [--json] NAME|ID")
	return c.run(args, exactly(1), func(ctx context.Context, cl *client.Client, pos []string) int {
		k, err := cl.RevokeKey(ctx, pos[0])
		if err != nil {
			return fail(err)
		}
		if c.json {
			printJSON(k)
			return 0
		}
		fmt.Printf("revoked API key %s (%s)\n", k.Name, k.ID)
		return 0
	})
}
