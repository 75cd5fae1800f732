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

// Remote jobs on joined machines: agentbox machine job start|ls|status|logs|cancel.

func cmdMachineJob(args []string) int {
	const subs = "start, ls, status, logs, cancel"
	if len(args) == 0 {
		fmt.Fprintf(os.Stderr, "usage: agentbox machine job %s ...\n", strings.ReplaceAll(subs, ", ", "|"))
		return 2
	}
	sub := map[string]func([]string) int{"start": machineJobStart, "ls": machineJobList, "list": machineJobList,
		"status": machineJobStatus, "logs": machineJobLogs, "cancel": machineJobCancel}
	if f, ok := sub[args[0]]; ok {
		return f(args[1:])
	}
	fmt.Fprintf(os.Stderr, "agentbox machine job: unknown subcommand %q (%s)\n", args[0], subs)
	return 2
}

func printRemoteJob(j wire.RemoteJob) {
	fmt.Printf("job:      %s\nmachine:  %s\nstate:    %s — %s\ncommand:  (%s) %s\nstarted:  %s\n", j.JobID, j.MachineID, j.State, j.Message,
		j.Shell, j.Command, j.StartedAt.Local().Format(time.DateTime))
	if j.GPUIndex != nil {
		fmt.Printf("gpu:      %d\n", *j.GPUIndex)
	}
	if j.FinishedAt != nil {
		fmt.Printf("finished: %s\n", j.FinishedAt.Local().Format(time.DateTime))
	}
	fmt.Printf("output:   %d bytes\n", j.LogBytes)
}

func machineJobStart(args []string) int {
	c := newClientCmd("machine job start", "agentbox machine job start [--shell sh|bash|cmd|powershell] [--env K=V]... [--cwd DIR] [--gpu N] [--json] MACHINE -- COMMAND...")
	shell := c.fs.String("shell", "", "the command's dialect (default: sh on POSIX, powershell on Windows)")
	cwd := c.fs.String("cwd", "", "absolute working directory on the machine")
	gpu := c.fs.Int("gpu", -1, "reserve this GPU for the job (CUDA_VISIBLE_DEVICES)")
	env := kvFlag{}
	c.fs.Var(env, "env", "environment variable K=V (repeatable)")
	return c.run(args, atLeast(3), func(ctx context.Context, cl *client.Client, pos []string) int {
		if pos[1] != "--" {
			fmt.Fprintln(os.Stderr, "usage: "+c.usage)
			return 2
		}
		// The words after -- are joined with spaces into the one command string the shell reads.
		req := wire.RemoteJobStart{Command: strings.Join(pos[2:], " "), Shell: *shell, Cwd: *cwd, Env: env}
		if *gpu >= 0 {
			req.GPUIndex = gpu
		}
		j, err := cl.StartRemoteJob(ctx, pos[0], req)
		if err != nil {
			return fail(err)
		}
		if c.json {
			printJSON(j)
			return 0
		}
		fmt.Println(j.JobID)
		return 0
	})
}

func machineJobList(args []string) int {
	c := newClientCmd("machine job ls", "agentbox machine job ls [--limit N] [--json] MACHINE")
	limit := c.fs.Int("limit", 0, "the newest N jobs (1-1000, default 20)")
	return c.run(args, exactly(1), func(ctx context.Context, cl *client.Client, pos []string) int {
		l, err := cl.ListRemoteJobs(ctx, pos[0], *limit)
		if err != nil {
			return fail(err)
		}
		if c.json {
			printJSON(l)
			return 0
		}
		tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "JOB\tSTATE\tEXIT\tGPU\tSTARTED\tCOMMAND")
		for _, j := range l.Jobs {
			exit, gpu := "-", "-"
			if j.ExitCode != nil {
				exit = fmt.Sprint(*j.ExitCode)
			}
			if j.GPUIndex != nil {
				gpu = fmt.Sprint(*j.GPUIndex)
			}
			cmd := j.Command
			if len(cmd) > 60 {
				cmd = cmd[:57] + "..."
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", j.JobID, j.State, exit, gpu, j.StartedAt.Local().Format(time.DateTime), cmd)
		}
		tw.Flush()
		if l.Omitted > 0 {
			fmt.Fprintf(os.Stderr, "(%d older jobs omitted: --limit)\n", l.Omitted)
		}
		return 0
	})
}

// remoteJobExit is a status command's exit code: the job's own when it exited, 3 while it
// runs, 1 otherwise (canceled, failed, unknown: never a success).
func remoteJobExit(j wire.RemoteJob) int {
	switch {
	case j.State == "exited" && j.ExitCode != nil:
		return min(max(*j.ExitCode, 0), 255)
	case j.State == "running" || j.State == "starting":
		return 3
	}
	return 1
}

func machineJobStatus(args []string) int {
	c := newClientCmd("machine job status", "agentbox machine job status [--json] MACHINE JOB")
	return c.run(args, exactly(2), func(ctx context.Context, cl *client.Client, pos []string) int {
		j, err := cl.RemoteJobStatus(ctx, pos[0], pos[1])
		if err != nil {
			return fail(err)
		}
		if c.json {
			printJSON(j)
		} else {
			printRemoteJob(j)
		}
		return remoteJobExit(j)
	})
}

func machineJobLogs(args []string) int {
	c := newClientCmd("machine job logs", "agentbox machine job logs [--tail N | --offset N [--max-bytes N]] [--json] MACHINE JOB")
	tail := c.fs.Int("tail", 0, "the last N lines (1-10000; default 200)")
	offset := c.fs.Int64("offset", -1, "page from this byte instead")
	maxBytes := c.fs.Int("max-bytes", 0, "bytes per page with --offset (1-262144, default 65536)")
	return c.run(args, exactly(2), func(ctx context.Context, cl *client.Client, pos []string) int {
		req := wire.RemoteJobLogsRequest{TailLines: *tail, MaxBytes: *maxBytes}
		if *offset >= 0 {
			req.Offset = offset
		}
		l, err := cl.RemoteJobLogs(ctx, pos[0], pos[1], req)
		if err != nil {
			return fail(err)
		}
		if c.json {
			printJSON(l)
			return 0
		}
		os.Stdout.Write(l.Data)
		return 0
	})
}

func machineJobCancel(args []string) int {
	c := newClientCmd("machine job cancel", "agentbox machine job cancel [--grace SECONDS] [--json] MACHINE JOB")
	grace := c.fs.Int("grace", 10, "seconds between SIGTERM and SIGKILL (0-600)")
	return c.run(args, exactly(2), func(ctx context.Context, cl *client.Client, pos []string) int {
		j, err := cl.CancelRemoteJob(ctx, pos[0], pos[1], time.Duration(*grace)*time.Second)
		if err != nil {
			return fail(err)
		}
		if c.json {
			printJSON(j)
			return 0
		}
		printRemoteJob(j)
		return 0
	})
}
