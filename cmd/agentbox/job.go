package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/text"
	"github.com/agentbox/agentbox/internal/wire"
)

// cmdJob is `agentbox job start|ls|status|wait|cancel`.
func cmdJob(args []string) int {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, "usage: agentbox job start|ls|status|wait|cancel ...\n")
		return 2
	}
	sub := map[string]func([]string) int{
		"start": jobStart, "ls": jobList, "list": jobList, "status": jobStatus, "get": jobStatus,
		"wait": jobWait, "cancel": jobCancel,
	}
	if f, ok := sub[args[0]]; ok {
		return f(args[1:])
	}
	fmt.Fprintf(os.Stderr, "agentbox job: unknown subcommand %q (start, ls, status, wait, cancel)\n", args[0])
	return 2
}

func jobStart(args []string) int {
	c := newClientCmd("job start", "agentbox job start [--env K=V]... [--cwd DIR] [--user root] ID -- ARGV...")
	cwd := c.fs.String("cwd", "", "working directory inside the sandbox (default /workspace)")
	user := c.fs.String("user", "", `run as "root" instead of the sandbox's default user`)
	env := kvFlag{}
	c.fs.Var(env, "env", "environment variable K=V (repeatable)")
	return c.run(args, atLeast(3), func(ctx context.Context, cl *client.Client, pos []string) int {
		if pos[1] != "--" {
			fmt.Fprintln(os.Stderr, "usage: "+c.usage)
			return 2
		}
		return startJob(ctx, cl, c.json, pos[0], wire.ExecRequest{Command: pos[2:], Cwd: *cwd, User: *user, Env: env})
	})
}

// startJob starts a job and prints its id (or the job as JSON).
func startJob(ctx context.Context, cl *client.Client, asJSON bool, id string, req wire.ExecRequest) int {
	if len(req.Env) == 0 {
		req.Env = nil
	}
	j, err := cl.StartJob(ctx, id, req)
	if err != nil {
		return fail(err)
	}
	if asJSON {
		printJSON(j)
	} else {
		fmt.Println(j.ID)
	}
	return 0
}

func jobList(args []string) int {
	c := newClientCmd("job ls", "agentbox job ls [--json] [--limit N] ID")
	limit := c.fs.Int("limit", 0, "the newest N jobs (1-1000, default 20)")
	return c.run(args, exactly(1), func(ctx context.Context, cl *client.Client, pos []string) int {
		l, err := cl.ListJobs(ctx, pos[0], *limit)
		if err != nil {
			return fail(err)
		}
		if c.json {
			printJSON(l)
			return 0
		}
		tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "JOB\tSTATE\tEXIT\tSTARTED\tLOG\tCPU\tCOMMAND")
		for _, j := range l.Jobs {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%.2fs\t%s\n", j.ID, j.State, exitText(j), j.StartedAt.Local().Format(time.DateTime),
				j.LogBytes, j.CPUSeconds, text.Truncate(strings.Join(j.Argv, " "), 60))
		}
		tw.Flush()
		if l.Omitted > 0 {
			fmt.Printf("(%d older jobs omitted; --limit shows more)\n", l.Omitted)
		}
		return 0
	})
}

func exitText(j wire.Job) string {
	switch {
	case j.ExitCode != nil:
		return fmt.Sprint(*j.ExitCode)
	case j.Signal != "":
		return j.Signal
	}
	return "-"
}

// jobExit is the CLI's exit code for a job's status: 0 only for exited 0; the job's own exit
// code when it exited; 1 otherwise (killed, canceled, failed, unknown); 3 while it runs.
func jobExit(j wire.Job) int {
	switch {
	case j.State.Active():
		return 3
	case j.State == wire.JobExited && j.ExitCode != nil:
		return *j.ExitCode
	}
	return 1
}

func printJob(j wire.Job, asJSON bool) {
	if asJSON {
		printJSON(j)
		return
	}
	fmt.Printf("%s %s %s cpu %.2fs\n", j.ID, j.State, exitText(j), j.CPUSeconds)
	fmt.Fprintln(os.Stderr, j.Message)
}

func jobStatus(args []string) int {
	c := newClientCmd("job status", "agentbox job status [--json] ID JOB")
	return c.run(args, exactly(2), func(ctx context.Context, cl *client.Client, pos []string) int {
		j, err := cl.JobStatus(ctx, pos[0], pos[1])
		if err != nil {
			return fail(err)
		}
		printJob(j, c.json)
		return 0
	})
}

func jobWait(args []string) int {
	c := newClientCmd("job wait", "agentbox job wait [--json] [--timeout SECONDS] ID JOB   (exit code: the job's; 3 if still running)")
	timeout := c.fs.Int("timeout", 0, "give up after this many seconds (0: wait for the end)")
	return c.run(args, exactly(2), func(ctx context.Context, cl *client.Client, pos []string) int {
		var deadline time.Time
		if *timeout < 0 {
			return fail(errcode.New(errcode.InvalidArgument, "--timeout must not be negative"))
		}
		if *timeout > 0 {
			deadline = time.Now().Add(time.Duration(*timeout) * time.Second)
		}
		for {
			slice := time.Hour
			if !deadline.IsZero() {
				slice = min(slice, time.Until(deadline).Truncate(time.Second))
			}
			j, err := cl.WaitJob(ctx, pos[0], pos[1], max(slice, 0))
			if err != nil {
				return fail(err)
			}
			if !j.State.Active() || (!deadline.IsZero() && time.Until(deadline) <= 0) {
				printJob(j, c.json)
				return jobExit(j)
			}
		}
	})
}

func jobCancel(args []string) int {
	c := newClientCmd("job cancel", "agentbox job cancel [--json] [--grace SECONDS] ID JOB")
	grace := c.fs.Float64("grace", -1, "seconds between SIGTERM and SIGKILL (0-600, default 10)")
	return c.run(args, exactly(2), func(ctx context.Context, cl *client.Client, pos []string) int {
		var g *time.Duration
		if *grace >= 0 {
			d := time.Duration(*grace * float64(time.Second))
			g = &d
		}
		j, err := cl.CancelJob(ctx, pos[0], pos[1], g)
		if err != nil {
			return fail(err)
		}
		printJob(j, c.json)
		return 0
	})
}

// cmdLogs is `agentbox logs [-f] ID JOB`: the job's output; -f follows it, paging by offset
// until the job ends.
func cmdLogs(args []string) int {
	c := newClientCmd("logs", "agentbox logs [-f] [--tail N] [--stream all|stdout|stderr] ID JOB")
	follow := c.fs.Bool("f", false, "follow: print the output as it is written until the job ends")
	tail := c.fs.Int("tail", 0, "print only the last N lines first (default: the whole log)")
	stream := c.fs.String("stream", "all", "all (interleaved), stdout or stderr")
	return c.run(args, exactly(2), func(ctx context.Context, cl *client.Client, pos []string) int {
		id, job := pos[0], pos[1]
		var off int64
		if *tail > 0 {
			n := *tail
			l, err := cl.JobLogs(ctx, id, job, wire.JobLogsRequest{Stream: *stream, TailLines: &n})
			if err != nil {
				return fail(err)
			}
			os.Stdout.Write(l.Data)
			off = l.NextOffset
		}
		page := int64(sandbox.MaxJobLogBytes)
		for {
			o := off
			l, err := cl.JobLogs(ctx, id, job, wire.JobLogsRequest{Stream: *stream, Offset: &o, MaxBytes: &page})
			if err != nil {
				if ctx.Err() != nil {
					return 130
				}
				return fail(err)
			}
			if l.Message != "" {
				fmt.Fprintln(os.Stderr, "agentbox: "+l.Message)
			}
			if _, err := os.Stdout.Write(l.Data); err != nil {
				return fail(err)
			}
			off = l.NextOffset
			if l.NextOffset < l.TotalBytes {
				continue // more is there already
			}
			if !*follow || !l.State.Active() {
				// The state was read with the page: one more read catches what was written
				// between the page and the job's end.
				if *follow {
					if j, err := cl.JobStatus(ctx, id, job); err == nil && j.LogBytes > off {
						continue
					}
				}
				return 0
			}
			// Wait for more output or the end, a second at most.
			if _, err := cl.WaitJob(ctx, id, job, time.Second); err != nil && !errors.Is(err, context.Canceled) {
				return fail(err)
			}
			if ctx.Err() != nil {
				return 130
			}
		}
	})
}
