package main

import (
	"context"
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/wire"
)

// Snapshots, fork, sleep, wake and diff: agentbox snapshot, snapshots ls|get|rm,
// fork, sleep, wake, diff.

func cmdSnapshot(args []string) int {
	c := newClientCmd("snapshot", "agentbox snapshot [--memory] [--label K=V]... [--json] ID")
	memory := c.fs.Bool("memory", false, "also capture memory and processes (gVisor; runc with a working CRIU); refused, never downgraded, where the runtime cannot")
	labels := kvFlag{}
	c.fs.Var(labels, "label", "label K=V for the snapshot (repeatable)")
	return c.run(args, exactly(1), func(ctx context.Context, cl *client.Client, pos []string) int {
		req := wire.SnapshotRequest{Memory: *memory}
		if len(labels) > 0 {
			req.Labels = labels
		}
		sn, err := cl.Snapshot(ctx, pos[0], req)
		if err != nil {
			return fail(err)
		}
		if c.json {
			printJSON(sn)
		} else {
			fmt.Println(sn.ID)
			fmt.Fprintf(os.Stderr, "%s of %s: %s, %s, %s\n", sn.ID, sn.SandboxID, sn.Kind, sn.State, humanBytes(sn.SizeBytes))
		}
		return 0
	})
}

func cmdSnapshots(args []string) int {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, "usage: agentbox snapshots ls|get|rm ...\n")
		return 2
	}
	sub := map[string]func([]string) int{"ls": snapshotsList, "list": snapshotsList, "get": snapshotsGet, "rm": snapshotsRm, "delete": snapshotsRm}
	if f, ok := sub[args[0]]; ok {
		return f(args[1:])
	}
	fmt.Fprintf(os.Stderr, "agentbox snapshots: unknown subcommand %q (ls, get, rm)\n", args[0])
	return 2
}

func snapshotsList(args []string) int {
	c := newClientCmd("snapshots ls", "agentbox snapshots ls [--sandbox ID] [--cursor SNAP] [--limit N] [--json]")
	var f wire.SnapshotFilter
	c.fs.StringVar(&f.SandboxID, "sandbox", "", "only this sandbox's snapshots")
	c.fs.StringVar(&f.After, "cursor", "", "continue after this snapshot (the next cursor a previous page printed)")
	c.fs.IntVar(&f.Limit, "limit", 0, "at most this many snapshots, 1-1000 (default 100)")
	return c.run(args, exactly(0), func(ctx context.Context, cl *client.Client, _ []string) int {
		l, err := cl.ListSnapshots(ctx, f)
		if err != nil {
			return fail(err)
		}
		if c.json {
			printJSON(l)
			return 0
		}
		tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tSANDBOX\tKIND\tSTATE\tSIZE\tAGE\tLABELS")
		now := time.Now()
		for _, sn := range l.Snapshots {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", sn.ID, sn.SandboxID, sn.Kind, sn.State, humanBytes(sn.SizeBytes),
				now.Sub(sn.CreatedAt).Round(time.Second), formatLabels(sn.Labels))
		}
		tw.Flush()
		if l.NextCursor != "" {
			fmt.Fprintf(os.Stderr, "more may follow: agentbox snapshots ls --cursor %s\n", l.NextCursor)
		}
		return 0
	})
}

func snapshotsGet(args []string) int {
	c := newClientCmd("snapshots get", "agentbox snapshots get SNAP")
	return c.run(args, exactly(1), func(ctx context.Context, cl *client.Client, pos []string) int {
		sn, err := cl.GetSnapshot(ctx, pos[0])
		if err != nil {
			return fail(err)
		}
		printJSON(sn)
		return 0
	})
}

func snapshotsRm(args []string) int {
	c := newClientCmd("snapshots rm", "agentbox snapshots rm SNAP...")
	return c.run(args, atLeast(1), func(ctx context.Context, cl *client.Client, pos []string) int {
		code := 0
		for _, id := range pos {
			if err := cl.DeleteSnapshot(ctx, id); err != nil {
				code = fail(err)
				continue
			}
			fmt.Println(id)
		}
		return code
	})
}

func cmdFork(args []string) int {
	c := newClientCmd("fork", "agentbox fork [--count N] [--snapshot SNAP | --memory] [--ttl SECONDS] [--label K=V]... [--json] ID")
	var req wire.ForkRequest
	c.fs.IntVar(&req.Count, "count", 1, fmt.Sprintf("how many sandboxes to make, 1-%d", sandbox.MaxForkCount))
	c.fs.StringVar(&req.SnapshotID, "snapshot", "", "fork from this existing snapshot of the sandbox (default: one taken now)")
	c.fs.BoolVar(&req.Memory, "memory", false, "the snapshot taken now captures memory and processes too (they continue in each fork)")
	c.fs.Int64Var(&req.TTLSeconds, "ttl", 0, "each fork's time to live in seconds (default the server's)")
	labels := kvFlag{}
	c.fs.Var(labels, "label", "label K=V for the forks, over the source's (repeatable)")
	return c.run(args, exactly(1), func(ctx context.Context, cl *client.Client, pos []string) int {
		if req.Count < 1 || req.Count > sandbox.MaxForkCount {
			fmt.Fprintf(os.Stderr, "agentbox fork: --count must be between 1 and %d; got %d\n", sandbox.MaxForkCount, req.Count)
			return 2
		}
		if len(labels) > 0 {
			req.Labels = labels
		}
		res, err := cl.Fork(ctx, pos[0], req)
		if err != nil {
			return fail(err)
		}
		if c.json {
			printJSON(res)
			return 0
		}
		for _, sb := range res.Sandboxes {
			fmt.Println(sb.ID)
		}
		fmt.Fprintf(os.Stderr, "%d fork(s) of %s from %s (%s)\n", len(res.Sandboxes), pos[0], res.SnapshotID, res.Kind)
		return 0
	})
}

func cmdSleep(args []string) int { return sleepWake("sleep", args) }

func cmdWake(args []string) int { return sleepWake("wake", args) }

func sleepWake(verb string, args []string) int {
	c := newClientCmd(verb, "agentbox "+verb+" [--json] ID")
	return c.run(args, exactly(1), func(ctx context.Context, cl *client.Client, pos []string) int {
		op := cl.Sleep
		if verb == "wake" {
			op = cl.Wake
		}
		sb, err := op(ctx, pos[0])
		if err != nil {
			return fail(err)
		}
		if c.json {
			printJSON(sb)
		} else {
			fmt.Printf("%s %s\n", sb.ID, sb.State)
		}
		return 0
	})
}

func cmdDiff(args []string) int {
	c := newClientCmd("diff", "agentbox diff [--with OTHER | --snapshot SNAP] [--cursor C] [--limit N] [--max-diff-bytes N] [--no-unified] [--json] ID")
	var req wire.DiffRequest
	c.fs.StringVar(&req.OtherSandboxID, "with", "", "compare with this sandbox (default: the sandbox's image)")
	c.fs.StringVar(&req.SnapshotID, "snapshot", "", "compare with this snapshot")
	c.fs.StringVar(&req.Cursor, "cursor", "", "continue a paged diff (the next cursor a previous page printed)")
	c.fs.IntVar(&req.Limit, "limit", 0, "at most this many changes, 1-10000 (default 1000)")
	c.fs.Int64Var(&req.MaxDiffBytes, "max-diff-bytes", 0, "bound of the unified diff, 1-1048576 (default 65536)")
	c.fs.BoolVar(&req.NoUnified, "no-unified", false, "only the list of changes")
	return c.run(args, exactly(1), func(ctx context.Context, cl *client.Client, pos []string) int {
		if req.OtherSandboxID != "" && req.SnapshotID != "" {
			fmt.Fprintln(os.Stderr, "agentbox diff: give --with or --snapshot, not both")
			return 2
		}
		res, err := cl.Diff(ctx, pos[0], req)
		if err != nil {
			return fail(err)
		}
		if c.json {
			printJSON(res)
			return 0
		}
		for _, ch := range res.Changes {
			fmt.Println(changeLine(ch))
		}
		if res.Diff != "" {
			fmt.Println()
			fmt.Print(res.Diff)
			if res.Diff[len(res.Diff)-1] != '\n' {
				fmt.Println()
			}
		}
		if res.DiffTruncated {
			fmt.Fprintf(os.Stderr, "diff truncated (binary or large files left out: %v)\n", res.Skipped)
		}
		fmt.Fprintf(os.Stderr, "%d change(s) against %s\n", len(res.Changes), res.Against)
		if res.NextCursor != "" {
			fmt.Fprintf(os.Stderr, "more changes: agentbox diff --cursor %s %s\n", res.NextCursor, pos[0])
		}
		return 0
	})
}

// changeLine renders one change: A/M/D MODE TYPE SIZE PATH [-> TARGET].
func changeLine(ch wire.DiffChange) string {
	sign := map[string]string{sandbox.ChangeAdded: "A", sandbox.ChangeModified: "M", sandbox.ChangeDeleted: "D"}[ch.Change]
	line := fmt.Sprintf("%s %s %s %d %s", sign, ch.Mode, ch.Type, ch.Size, ch.Path)
	if ch.Target != "" {
		line += " -> " + ch.Target
	}
	return line
}

// printExecChanges writes exec --changes and --checkpoint's results to stderr (stdout is the
// command's).
func printExecChanges(res wire.ExecResult) {
	for _, ch := range res.Changes {
		fmt.Fprintln(os.Stderr, changeLine(ch))
	}
	if res.ChangesTruncated {
		fmt.Fprintln(os.Stderr, "agentbox: more paths changed than listed (agentbox diff --snapshot lists them all)")
	}
	if res.SnapshotID != "" {
		fmt.Fprintf(os.Stderr, "agentbox: checkpoint %s\n", res.SnapshotID)
	}
	if res.CheckpointError != "" {
		fmt.Fprintf(os.Stderr, "agentbox: checkpoint failed: %s\n", res.CheckpointError)
	}
}
