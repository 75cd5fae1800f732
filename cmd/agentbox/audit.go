package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/config"
	"github.com/agentbox/agentbox/internal/wire"
)

// The audit log: serve's retention flags and `agentbox audit ls`.

// registerAuditFlags adds the audit log's flags (serve, and mcp's in-process control plane).
func registerAuditFlags(fs *flag.FlagSet, cfg *config.Config) {
	fs.DurationVar(&cfg.AuditRetention, "audit-retention", cfg.AuditRetention, fmt.Sprintf("how long audit records are kept (at least %v; pruned hourly)", config.MinAuditRetention))
	fs.IntVar(&cfg.AuditMaxRows, "audit-max-rows", cfg.AuditMaxRows, fmt.Sprintf("most audit records kept; the oldest go first (%d–%d)", config.MinAuditMaxRows, config.MaxAuditMaxRows))
}

func cmdAudit(args []string) int {
	if len(args) == 0 || (args[0] != "ls" && args[0] != "list") {
		fmt.Fprintln(os.Stderr, "usage: agentbox audit ls [--after N] [--limit N] [--tool T] [--sandbox ID] [--json]")
		return 2
	}
	c := newClientCmd("audit ls", "agentbox audit ls [--after N] [--limit N] [--tool T] [--sandbox ID] [--json]")
	after, limit := pageFlags(c)
	tool := c.fs.String("tool", "", "only this MCP tool or REST route (exec matches both)")
	sb := c.fs.String("sandbox", "", "only calls naming this sandbox")
	return c.run(args[1:], exactly(0), func(ctx context.Context, cl *client.Client, pos []string) int {
		l, err := cl.Audit(ctx, *after, *limit, *tool, *sb)
		if err != nil {
			return fail(err)
		}
		if c.json {
			printJSON(l)
			return 0
		}
		printAudit(l)
		return 0
	})
}

func printAudit(l wire.AuditList) {
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SEQ\tTIME\tSURFACE\tCALLER\tTOOL\tSANDBOX\tOUTCOME\tMS")
	for _, r := range l.Records {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%.1f\n", r.Seq, r.Time.Local().Format(time.DateTime), r.Surface, r.CallerName,
			r.Tool, r.SandboxID, r.Outcome, r.DurationMS)
	}
	tw.Flush()
	if l.Omitted > 0 {
		fmt.Printf("(%d older not shown; --after to page)\n", l.Omitted)
	}
}
