package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/wire"
)

func cmdSandbox(args []string) int {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, "usage: agentbox sandbox create|ls|get|rm|extend|events|commit ...\n")
		return 2
	}
	sub := map[string]func([]string) int{
		"create": sandboxCreate, "ls": sandboxList, "list": sandboxList, "get": sandboxGet,
		"rm": sandboxRm, "destroy": sandboxRm, "extend": sandboxExtend, "events": sandboxEvents,
		"commit": sandboxCommit, // images (images.go)
	}
	if f, ok := sub[args[0]]; ok {
		return f(args[1:])
	}
	fmt.Fprintf(os.Stderr, "agentbox sandbox: unknown subcommand %q (create, ls, get, rm, extend, events, commit)\n", args[0])
	return 2
}

func sandboxCreate(args []string) int {
	c := newClientCmd("sandbox create", "agentbox sandbox create [--image I] [--runtime R] [--isolation process|kernel|vm] [--cpu N] [--memory-mb N] [--disk-mb N] [--ttl SECONDS] [--env K=V]... [--label K=V]... [--idempotency-key K] [--allow-host H]... [--deny-host H]... [--egress] [--secret NAME=env:VAR@host,...]... [--snapshot SNAP] [--auto-wake] [--ttl-while-sleeping] [--on-expiry sleep]")
	var req wire.CreateRequest
	env, labels := kvFlag{}, kvFlag{}
	c.fs.StringVar(&req.Image, "image", "", "image: host (the default: the host's /usr) or an OCI image reference (python:3.12-slim, ghcr.io/org/img:tag, name@sha256:…, a committed NAME:TAG), pulled by the server if not cached")
	c.fs.StringVar(&req.Runtime, "runtime", "", "runtime: runc, crun, gvisor or vm (default: the server's, or one that gives --isolation)")
	c.fs.StringVar(&req.Requirements.Isolation, "isolation", "", "the weakest isolation acceptable: process (runc, crun), kernel (gvisor) or vm (a microVM); never less")
	c.fs.Float64Var(&req.CPU, "cpu", 0, "cpu cores, fractions allowed (default 1)")
	c.fs.Int64Var(&req.MemoryMB, "memory-mb", 0, "memory limit in MiB (default 512)")
	c.fs.Int64Var(&req.DiskMB, "disk-mb", 0, "disk limit in MiB (default 1024)")
	c.fs.Int64Var(&req.TTLSeconds, "ttl", 0, "time to live in seconds (default 1800)")
	c.fs.Var(env, "env", "environment variable K=V (repeatable)")
	c.fs.Var(labels, "label", "label K=V (repeatable)")
	c.fs.StringVar(&req.IdempotencyKey, "idempotency-key", "", "a key that makes retrying safe: a create with a key this caller already used returns that sandbox instead of a new one")
	// snapshots and sleep (snapshots.go)
	c.fs.StringVar(&req.Snapshot, "snapshot", "", "start from this snapshot (agentbox snapshots ls) instead of an image: its files, and its processes when it holds memory")
	c.fs.BoolVar(&req.AutoWake, "auto-wake", false, "an exec or file call on the sandbox while it sleeps wakes it first")
	c.fs.BoolVar(&req.TTLWhileSleeping, "ttl-while-sleeping", false, "the TTL keeps running while the sandbox sleeps (default: sleeping time does not count)")
	c.fs.StringVar(&req.OnExpiry, "on-expiry", "", "what happens when the TTL runs out: destroy (the default) or sleep (a wake gives it its TTL again)")
	var nw networkFlags // network (network.go)
	nw.register(c)
	return c.run(args, exactly(0), func(ctx context.Context, cl *client.Client, _ []string) int {
		nw.apply(&req)
		if len(env) > 0 {
			req.Env = env
		}
		if len(labels) > 0 {
			req.Labels = labels
		}
		// Images: a pull the create needs shows its bars on a terminal.
		v := newProgressView(os.Stderr, c.json)
		var progress func(wire.ImageProgress)
		if v.tty {
			progress = v.report
		}
		sb, err := cl.CreateWithProgress(ctx, req, progress)
		v.finish(err == nil)
		if err != nil {
			return fail(err)
		}
		if c.json {
			printJSON(sb)
		} else {
			fmt.Println(sb.ID)
		}
		return 0
	})
}

func sandboxList(args []string) int {
	c := newClientCmd("sandbox ls", "agentbox sandbox ls [--json] [--state S,...] [--label K=V]...")
	state := c.fs.String("state", "", "only these states, comma-separated (default: all but destroyed)")
	labels := kvFlag{}
	c.fs.Var(labels, "label", "only sandboxes with label K=V (repeatable)")
	return c.run(args, exactly(0), func(ctx context.Context, cl *client.Client, _ []string) int {
		var states []string
		if *state != "" {
			states = strings.Split(*state, ",")
		}
		list, err := cl.List(ctx, states, labels)
		if err != nil {
			return fail(err)
		}
		if c.json {
			printJSON(list)
			return 0
		}
		tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tSTATE\tRUNTIME\tCPU\tMEMORY\tAGE\tEXPIRES IN\tLABELS")
		now := time.Now()
		for _, sb := range list {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%g\t%dMiB\t%s\t%s\t%s\n", sb.ID, sb.State, sb.Runtime, sb.CPU, sb.MemoryMB,
				now.Sub(sb.CreatedAt).Round(time.Second), sb.ExpiresAt.Sub(now).Round(time.Second), formatLabels(sb.Labels))
		}
		tw.Flush()
		return 0
	})
}

func formatLabels(l map[string]string) string {
	var parts []string
	for k, v := range l {
		parts = append(parts, k+"="+v)
	}
	return strings.Join(parts, ",")
}

func sandboxGet(args []string) int {
	c := newClientCmd("sandbox get", "agentbox sandbox get [--json] ID")
	return c.run(args, exactly(1), func(ctx context.Context, cl *client.Client, pos []string) int {
		sb, err := cl.Get(ctx, pos[0])
		if err != nil {
			return fail(err)
		}
		if c.json {
			printJSON(sb)
			return 0
		}
		tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		img := sb.Image
		if sb.ImageDigest != "" {
			img += " (" + sb.ImageDigest + ")"
		}
		fmt.Fprintf(tw, "id\t%s\nstate\t%s\nimage\t%s\nruntime\t%s (%s isolation)\ncpu\t%g\nmemory\t%d MiB\ndisk\t%d MiB\npids\t%d\ncreated\t%s\nexpires\t%s\n",
			sb.ID, sb.State, img, sb.Runtime, sb.Isolation, sb.CPU, sb.MemoryMB, sb.DiskMB, sb.PidsLimit,
			sb.CreatedAt.Local().Format(time.RFC3339), sb.ExpiresAt.Local().Format(time.RFC3339))
		if len(sb.Hardening) > 0 {
			fmt.Fprintf(tw, "hardening\t%s\n", strings.Join(sb.Hardening, " "))
		}
		if len(sb.Labels) > 0 {
			fmt.Fprintf(tw, "labels\t%s\n", formatLabels(sb.Labels))
		}
		if sb.Error != "" {
			fmt.Fprintf(tw, "error\t%s\n", sb.Error)
		}
		tw.Flush()
		return 0
	})
}

func sandboxRm(args []string) int {
	c := newClientCmd("sandbox rm", "agentbox sandbox rm ID...")
	return c.run(args, atLeast(1), func(ctx context.Context, cl *client.Client, pos []string) int {
		code := 0
		for _, id := range pos {
			sb, err := cl.Destroy(ctx, id)
			if err != nil {
				code = fail(err)
				continue
			}
			if c.json {
				printJSON(sb)
			} else {
				fmt.Println(sb.ID)
			}
		}
		return code
	})
}

func sandboxExtend(args []string) int {
	c := newClientCmd("sandbox extend", "agentbox sandbox extend --ttl SECONDS ID")
	ttl := c.fs.Int64("ttl", 0, "seconds to add to the sandbox's expiry (required)")
	return c.run(args, exactly(1), func(ctx context.Context, cl *client.Client, pos []string) int {
		sb, err := cl.Extend(ctx, pos[0], *ttl)
		if err != nil {
			return fail(err)
		}
		if c.json {
			printJSON(sb)
		} else {
			fmt.Printf("%s expires at %s\n", sb.ID, sb.ExpiresAt.Local().Format(time.RFC3339))
		}
		return 0
	})
}

func sandboxEvents(args []string) int {
	c := newClientCmd("sandbox events", "agentbox sandbox events [--json] [ID]")
	return c.run(args, func(n int) bool { return n <= 1 }, func(ctx context.Context, cl *client.Client, pos []string) int {
		id := ""
		if len(pos) == 1 {
			id = pos[0]
		}
		evs, err := cl.Events(ctx, id)
		if err != nil {
			return fail(err)
		}
		if c.json {
			printJSON(evs)
			return 0
		}
		tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "SEQ\tTIME\tSANDBOX\tFROM\tTO\tREASON")
		for _, e := range evs {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", e.Seq, e.At.Local().Format(time.RFC3339), e.SandboxID, e.From, e.To, e.Reason)
		}
		tw.Flush()
		return 0
	})
}
