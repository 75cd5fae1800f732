package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/agentbox/agentbox/internal/sandbox"
)

func cmdSandbox(args []string) int {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, "usage: agentbox sandbox create|ls|get|rm|extend|events ...\n")
		return 2
	}
	sub := map[string]func([]string) int{
		"create": sandboxCreate, "ls": sandboxList, "list": sandboxList, "get": sandboxGet,
		"rm": sandboxRm, "destroy": sandboxRm, "extend": sandboxExtend, "events": sandboxEvents,
	}
	if f, ok := sub[args[0]]; ok {
		return f(args[1:])
	}
	fmt.Fprintf(os.Stderr, "agentbox sandbox: unknown subcommand %q (create, ls, get, rm, extend, events)\n", args[0])
	return 2
}

func sandboxCreate(args []string) int {
	fs := flag.NewFlagSet("sandbox create", flag.ContinueOnError)
	var cf clientFlags
	cf.register(fs)
	var req sandbox.CreateRequest
	env, labels := kvFlag{}, kvFlag{}
	fs.StringVar(&req.Image, "image", "", "image (default host)")
	fs.StringVar(&req.Runtime, "runtime", "", "runtime (default: the server's)")
	fs.Float64Var(&req.CPU, "cpu", 0, "cpu cores, fractions allowed (default 1)")
	fs.Int64Var(&req.MemoryMB, "memory-mb", 0, "memory limit in MiB (default 512)")
	fs.Int64Var(&req.DiskMB, "disk-mb", 0, "disk limit in MiB (default 1024)")
	fs.Int64Var(&req.TTLSeconds, "ttl", 0, "time to live in seconds (default 1800)")
	fs.Var(env, "env", "environment variable K=V (repeatable)")
	fs.Var(labels, "label", "label K=V (repeatable)")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return 2
	}
	if len(pos) > 0 {
		fmt.Fprintf(os.Stderr, "agentbox sandbox create: unexpected argument %q\n", pos[0])
		return 2
	}
	if len(env) > 0 {
		req.Env = env
	}
	if len(labels) > 0 {
		req.Labels = labels
	}
	c, err := cf.client()
	if err != nil {
		return fail(err)
	}
	ctx, cancel := signalContext()
	defer cancel()
	sb, err := c.Create(ctx, req)
	if err != nil {
		return fail(err)
	}
	if cf.json {
		printJSON(sb)
	} else {
		fmt.Println(sb.ID)
	}
	return 0
}

func sandboxList(args []string) int {
	fs := flag.NewFlagSet("sandbox ls", flag.ContinueOnError)
	var cf clientFlags
	cf.register(fs)
	state := fs.String("state", "", "only these states, comma-separated (default: all but destroyed)")
	labels := kvFlag{}
	fs.Var(labels, "label", "only sandboxes with label K=V (repeatable)")
	if _, err := parseInterleaved(fs, args); err != nil {
		return 2
	}
	c, err := cf.client()
	if err != nil {
		return fail(err)
	}
	ctx, cancel := signalContext()
	defer cancel()
	var states []string
	if *state != "" {
		states = strings.Split(*state, ",")
	}
	list, err := c.List(ctx, states, labels)
	if err != nil {
		return fail(err)
	}
	if cf.json {
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
}

func formatLabels(l map[string]string) string {
	var parts []string
	for k, v := range l {
		parts = append(parts, k+"="+v)
	}
	return strings.Join(parts, ",")
}

func sandboxGet(args []string) int {
	fs := flag.NewFlagSet("sandbox get", flag.ContinueOnError)
	var cf clientFlags
	cf.register(fs)
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return 2
	}
	if len(pos) != 1 {
		fmt.Fprintln(os.Stderr, "usage: agentbox sandbox get [--json] ID")
		return 2
	}
	c, err := cf.client()
	if err != nil {
		return fail(err)
	}
	ctx, cancel := signalContext()
	defer cancel()
	sb, err := c.Get(ctx, pos[0])
	if err != nil {
		return fail(err)
	}
	if cf.json {
		printJSON(sb)
		return 0
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "id\t%s\nstate\t%s\nimage\t%s\nruntime\t%s (%s isolation)\ncpu\t%g\nmemory\t%d MiB\ndisk\t%d MiB\npids\t%d\ncreated\t%s\nexpires\t%s\n",
		sb.ID, sb.State, sb.Image, sb.Runtime, sb.Isolation, sb.CPU, sb.MemoryMB, sb.DiskMB, sb.PidsLimit,
		sb.CreatedAt.Local().Format(time.RFC3339), sb.ExpiresAt.Local().Format(time.RFC3339))
	if len(sb.Labels) > 0 {
		fmt.Fprintf(tw, "labels\t%s\n", formatLabels(sb.Labels))
	}
	if sb.Error != "" {
		fmt.Fprintf(tw, "error\t%s\n", sb.Error)
	}
	tw.Flush()
	return 0
}

func sandboxRm(args []string) int {
	fs := flag.NewFlagSet("sandbox rm", flag.ContinueOnError)
	var cf clientFlags
	cf.register(fs)
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return 2
	}
	if len(pos) == 0 {
		fmt.Fprintln(os.Stderr, "usage: agentbox sandbox rm ID...")
		return 2
	}
	c, err := cf.client()
	if err != nil {
		return fail(err)
	}
	ctx, cancel := signalContext()
	defer cancel()
	code := 0
	for _, id := range pos {
		sb, err := c.Destroy(ctx, id)
		if err != nil {
			code = fail(err)
			continue
		}
		if cf.json {
			printJSON(sb)
		} else {
			fmt.Println(sb.ID)
		}
	}
	return code
}

func sandboxExtend(args []string) int {
	fs := flag.NewFlagSet("sandbox extend", flag.ContinueOnError)
	var cf clientFlags
	cf.register(fs)
	ttl := fs.Int64("ttl", 0, "seconds to add to the sandbox's expiry (required)")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return 2
	}
	if len(pos) != 1 || *ttl <= 0 {
		fmt.Fprintln(os.Stderr, "usage: agentbox sandbox extend --ttl SECONDS ID")
		return 2
	}
	c, err := cf.client()
	if err != nil {
		return fail(err)
	}
	ctx, cancel := signalContext()
	defer cancel()
	sb, err := c.Extend(ctx, pos[0], *ttl)
	if err != nil {
		return fail(err)
	}
	if cf.json {
		printJSON(sb)
	} else {
		fmt.Printf("%s expires at %s\n", sb.ID, sb.ExpiresAt.Local().Format(time.RFC3339))
	}
	return 0
}

func sandboxEvents(args []string) int {
	fs := flag.NewFlagSet("sandbox events", flag.ContinueOnError)
	var cf clientFlags
	cf.register(fs)
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return 2
	}
	if len(pos) > 1 {
		fmt.Fprintln(os.Stderr, "usage: agentbox sandbox events [--json] [ID]")
		return 2
	}
	c, err := cf.client()
	if err != nil {
		return fail(err)
	}
	ctx, cancel := signalContext()
	defer cancel()
	id := ""
	if len(pos) == 1 {
		id = pos[0]
	}
	evs, err := c.Events(ctx, id)
	if err != nil {
		return fail(err)
	}
	if cf.json {
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
}
