package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/approval"
	"github.com/agentbox/agentbox/internal/config"
	"github.com/agentbox/agentbox/internal/wire"
)

// Approvals: agentbox approvals ls|show|approve|deny.

func cmdApprovals(args []string) int {
	sub := map[string]func([]string) int{
		"ls": approvalsList, "list": approvalsList, "show": approvalsShow, "get": approvalsShow,
		"approve": func(a []string) int { return approvalsDecide(a, true) },
		"deny":    func(a []string) int { return approvalsDecide(a, false) },
	}
	if len(args) > 0 {
		if f, ok := sub[args[0]]; ok {
			return f(args[1:])
		}
	}
	fmt.Fprint(os.Stderr, "usage: agentbox approvals ls [--state S] [--limit N] [--json] | show ID | approve ID [--reason R] | deny ID [--reason R]\n")
	return 2
}

func approvalsList(args []string) int {
	c := newClientCmd("approvals ls", "agentbox approvals ls [--json] [--state pending|approved|denied|expired|used] [--limit N]")
	state := c.fs.String("state", "", "only approvals in this state")
	limit := c.fs.Int("limit", 0, fmt.Sprintf("at most this many, newest first (1-%d, default %d)", approval.MaxListLimit, approval.DefaultListLimit))
	return c.run(args, exactly(0), func(ctx context.Context, cl *client.Client, _ []string) int {
		l, err := cl.ListApprovals(ctx, wire.ApprovalState(*state), *limit)
		if err != nil {
			return fail(err)
		}
		if c.json {
			printJSON(map[string]any{"approvals": l})
			return 0
		}
		tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tSTATE\tTOOL\tSANDBOX\tCALLER\tCREATED\tDIGEST")
		for _, a := range l {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%.16s\n", a.ID, a.State, a.Tool, a.SandboxID, a.CallerName,
				a.CreatedAt.Local().Format(time.DateTime), a.Digest)
		}
		tw.Flush()
		return 0
	})
}

func approvalsShow(args []string) int {
	c := newClientCmd("approvals show", "agentbox approvals show ID")
	return c.run(args, exactly(1), func(ctx context.Context, cl *client.Client, pos []string) int {
		a, err := cl.GetApproval(ctx, pos[0])
		if err != nil {
			return fail(err)
		}
		printApproval(a)
		return 0
	})
}

func approvalsDecide(args []string, approve bool) int {
	verb := "deny"
	if approve {
		verb = "approve"
	}
	c := newClientCmd("approvals "+verb, "agentbox approvals "+verb+" [--reason TEXT] ID")
	reason := c.fs.String("reason", "", "why (shown to the caller; at most 1024 bytes)")
	return c.run(args, exactly(1), func(ctx context.Context, cl *client.Client, pos []string) int {
		a, err := cl.DecideApproval(ctx, pos[0], approve, *reason)
		if err != nil {
			return fail(err)
		}
		if c.json {
			printApproval(a)
		} else {
			fmt.Printf("%s %s\n", a.ID, a.State)
		}
		return 0
	})
}

// printApproval prints a as indented JSON (its summary included as an object).
func printApproval(a wire.Approval) {
	b, err := json.MarshalIndent(a, "", "  ")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return
	}
	fmt.Println(string(b))
}

// registerApprovalFlags adds the approval flags (serve, and mcp's in-process control plane).
func registerApprovalFlags(fs *flag.FlagSet, cfg *config.Config) {
	fs.BoolVar(&cfg.ApprovalRequired, "approval-required", cfg.ApprovalRequired, "every call that acts (not reads) waits for an operator's decision: agentbox approvals approve|deny ID (or AGENTBOX_APPROVAL_REQUIRED=1)")
	fs.Func("approval-tools", "only these MCP tools (and their REST routes) wait for a decision, comma-separated: exec,file_write,…", func(v string) error {
		for _, t := range strings.Split(v, ",") {
			if t = strings.TrimSpace(t); t != "" {
				cfg.ApprovalTools = append(cfg.ApprovalTools, t)
			}
		}
		return nil
	})
	fs.DurationVar(&cfg.ApprovalTimeout, "approval-timeout", cfg.ApprovalTimeout, "how long a gated call waits for a decision before APPROVAL_REFUSED (unreachable); 1s-24h")
	fs.BoolVar(&cfg.ApprovalElicit, "approval-elicit", false, "let the MCP client itself approve or deny its gated calls (elicitation), besides operators; off: the model's own client never approves its own calls")
}
