package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/machine"
	"github.com/agentbox/agentbox/internal/wire"
)

// cmdMachine manages joined machines through the running server.
func cmdMachine(args []string) int {
	const subs = "ls, get, rm, alias, token, job, pull, push, exec, screenshot"
	if len(args) == 0 {
		fmt.Fprintf(os.Stderr, "usage: agentbox machine %s ...\n", strings.ReplaceAll(subs, ", ", "|"))
		return 2
	}
	sub := map[string]func([]string) int{"ls": machineList, "list": machineList, "get": machineGet, "rm": machineRemove,
		"alias": machineAlias, "token": cmdMachineToken,
		"job":  cmdMachineJob,                    // remote jobs (remotejobs.go)
		"pull": machinePull, "push": machinePush} // the file relay (machinefiles.go)
	for k, f := range remoteSubcommands { // exec, screenshot (remote.go)
		sub[k] = f
	}
	if f, ok := sub[args[0]]; ok {
		return f(args[1:])
	}
	fmt.Fprintf(os.Stderr, "agentbox machine: unknown subcommand %q (%s)\n", args[0], subs)
	return 2
}

func timeOrDash(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.Local().Format(time.DateTime)
}

func machineList(args []string) int {
	c := newClientCmd("machine ls", "agentbox machine ls [--json]")
	return c.run(args, exactly(0), func(ctx context.Context, cl *client.Client, _ []string) int {
		ms, err := cl.ListMachines(ctx)
		if err != nil {
			return fail(err)
		}
		if c.json {
			printJSON(map[string]any{"machines": ms})
			return 0
		}
		tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tNAME\tALIASES\tSTATE\tPLATFORM\tAGENT\tGPUS\tLAST SEEN")
		for _, m := range ms {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s/%s\t%s\t%d\t%s\n", m.ID, m.Name, dash(strings.Join(m.Aliases, ",")), onlineWord(m),
				m.Platform, m.Arch, m.AgentVersion, len(m.GPUs), timeOrDash(m.LastSeen))
		}
		tw.Flush()
		return 0
	})
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func onlineWord(m wire.Machine) string {
	if m.Online {
		return "online"
	}
	return "offline"
}

func printMachine(m wire.Machine) {
	fmt.Printf("id:            %s\nname:          %s\naliases:       %s\nstate:         %s\nplatform:      %s/%s\nagent version: %s\nlast seen:     %s\njoined:        %s\n",
		m.ID, m.Name, dash(strings.Join(m.Aliases, ", ")), onlineWord(m), m.Platform, m.Arch, m.AgentVersion, timeOrDash(m.LastSeen), m.CreatedAt.Local().Format(time.DateTime))
	for _, g := range m.GPUs {
		fmt.Printf("gpu %d:         %s, %d/%d MiB used, %d%% busy\n", g.Index, g.Name, g.MemoryUsedMB, g.MemoryTotalMB, g.UtilizationPct)
	}
}

func machineGet(args []string) int {
	c := newClientCmd("machine get", "agentbox machine get [--json] MACHINE")
	return c.run(args, exactly(1), func(ctx context.Context, cl *client.Client, pos []string) int {
		m, err := cl.GetMachine(ctx, pos[0])
		if err != nil {
			return fail(err)
		}
		if c.json {
			printJSON(m)
			return 0
		}
		printMachine(m)
		return 0
	})
}

func machineRemove(args []string) int {
	c := newClientCmd("machine rm", "agentbox machine rm [--json] MACHINE")
	return c.run(args, exactly(1), func(ctx context.Context, cl *client.Client, pos []string) int {
		m, err := cl.RemoveMachine(ctx, pos[0])
		if err != nil {
			return fail(err)
		}
		if c.json {
			printJSON(m)
			return 0
		}
		fmt.Fprintf(os.Stderr, "removed machine %s (%s); its connection is cut and its key refused\n", m.Name, m.ID)
		return 0
	})
}

func machineAlias(args []string) int {
	c := newClientCmd("machine alias", "agentbox machine alias [--rm] [--json] MACHINE ALIAS")
	rm := c.fs.Bool("rm", false, "remove the alias instead of adding it")
	return c.run(args, exactly(2), func(ctx context.Context, cl *client.Client, pos []string) int {
		var m wire.Machine
		var err error
		if *rm {
			m, err = cl.RemoveMachineAlias(ctx, pos[0], pos[1])
		} else {
			m, err = cl.AddMachineAlias(ctx, pos[0], pos[1])
		}
		if err != nil {
			return fail(err)
		}
		if c.json {
			printJSON(m)
			return 0
		}
		fmt.Printf("%s (%s) aliases: %s\n", m.Name, m.ID, dash(strings.Join(m.Aliases, ", ")))
		return 0
	})
}

func cmdMachineToken(args []string) int {
	const subs = "create, ls, revoke"
	if len(args) == 0 {
		fmt.Fprintf(os.Stderr, "usage: agentbox machine token %s ...\n", strings.ReplaceAll(subs, ", ", "|"))
		return 2
	}
	sub := map[string]func([]string) int{"create": joinTokenCreate, "ls": joinTokenList, "list": joinTokenList, "revoke": joinTokenRevoke}
	if f, ok := sub[args[0]]; ok {
		return f(args[1:])
	}
	fmt.Fprintf(os.Stderr, "agentbox machine token: unknown subcommand %q (%s)\n", args[0], subs)
	return 2
}

func joinTokenCreate(args []string) int {
	c := newClientCmd("machine token create", "agentbox machine token create [--expires DURATION] [--uses N] [--json]")
	expires := c.fs.Duration("expires", machine.DefaultTokenTTL, fmt.Sprintf("how long the token may be used (1m to %v)", machine.MaxTokenTTL))
	uses := c.fs.Int("uses", 1, fmt.Sprintf("how many machines it may join (1–%d)", machine.MaxTokenUses))
	return c.run(args, exactly(0), func(ctx context.Context, cl *client.Client, _ []string) int {
		t, err := cl.CreateJoinToken(ctx, wire.TokenRequest{Expires: expires.String(), Uses: *uses})
		if err != nil {
			return fail(err)
		}
		if c.json {
			printJSON(t)
			return 0
		}
		fmt.Fprintf(os.Stderr, "created join token %s: %d use(s), expires %s\nthe token is shown once, now; on the machine run:\n  agentbox join %s --token TOKEN\n",
			t.Token.ID, t.Token.Uses, t.Token.ExpiresAt.Local().Format(time.DateTime), cl.BaseURL())
		fmt.Println(t.Secret) // last, alone on stdout
		return 0
	})
}

func joinTokenList(args []string) int {
	c := newClientCmd("machine token ls", "agentbox machine token ls [--json]")
	return c.run(args, exactly(0), func(ctx context.Context, cl *client.Client, _ []string) int {
		ts, err := cl.ListJoinTokens(ctx)
		if err != nil {
			return fail(err)
		}
		if c.json {
			printJSON(map[string]any{"tokens": ts})
			return 0
		}
		tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tPREFIX\tCREATED\tEXPIRES\tUSES LEFT\tSTATE")
		now := time.Now()
		for _, t := range ts {
			state := "usable"
			switch {
			case t.RevokedAt != nil:
				state = "revoked"
			case !t.ExpiresAt.After(now):
				state = "expired"
			case t.UsesLeft <= 0:
				state = "used up"
			}
			fmt.Fprintf(tw, "%s\t%s…\t%s\t%s\t%d/%d\t%s\n", t.ID, t.Prefix, t.CreatedAt.Local().Format(time.DateTime),
				t.ExpiresAt.Local().Format(time.DateTime), t.UsesLeft, t.Uses, state)
		}
		tw.Flush()
		return 0
	})
}

func joinTokenRevoke(args []string) int {
	c := newClientCmd("machine token revoke", "agentbox machine token revoke [--json] TOKEN_ID")
	return c.run(args, exactly(1), func(ctx context.Context, cl *client.Client, pos []string) int {
		t, err := cl.RevokeJoinToken(ctx, pos[0])
		if err != nil {
			return fail(err)
		}
		if c.json {
			printJSON(t)
			return 0
		}
		fmt.Fprintf(os.Stderr, "revoked join token %s; machines it joined stay joined\n", t.ID)
		return 0
	})
}
