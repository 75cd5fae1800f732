package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/agentbox/agentbox/internal/api"
	"github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/config"
	"github.com/agentbox/agentbox/internal/runs"
	"github.com/agentbox/agentbox/internal/text"
	"github.com/agentbox/agentbox/internal/wire"
)

// Durable runs: agentbox run, runs, batch, agent; and serve's run flags.

// registerRunFlags adds the run service's flags (serve, and mcp's in-process control plane).
func registerRunFlags(fs *flag.FlagSet, cfg *config.Config) {
	fs.IntVar(&cfg.RunWorkers, "run-workers", 0, fmt.Sprintf("most durable runs this server executes at once (1-%d; default %d)", config.MaxRunWorkers, runs.DefaultWorkers))
	fs.Var((*listFlag)(&cfg.CheckoutDirs), "checkout-dir", "a host directory whose repositories a run's file:// repo_url may name (repeatable; none: file:// is refused)")
	fs.Int64Var(&cfg.ArtifactMB, "artifact-mb", 0, fmt.Sprintf("budget of the runs' blob store (<state>/runs: logs and artifacts) in MiB; past it the oldest settled runs' blobs go first (default %d)", int64(runs.DefaultArtifactBudgetBytes>>20)))
	fs.DurationVar(&cfg.RunRetention, "run-retention", cfg.RunRetention, "how long settled runs, their logs and artifacts are kept (at least 1h)")
}

// argvFlag collects repeated argv values: a JSON array of strings, or whitespace-separated
// words.
type argvFlag [][]string

func (a *argvFlag) String() string { return "" }

func (a *argvFlag) Set(s string) error {
	argv, err := parseArgv(s)
	if err != nil {
		return err
	}
	*a = append(*a, argv)
	return nil
}

// parseArgv reads an argv: a JSON array of strings (`["sh", "-c", "make test"]`) or words split
// on white space (`make test`); never a shell.
func parseArgv(s string) ([]string, error) {
	t := strings.TrimSpace(s)
	if strings.HasPrefix(t, "[") {
		var argv []string
		if err := json.Unmarshal([]byte(t), &argv); err != nil {
			return nil, fmt.Errorf("%q is not a JSON array of strings: %v", s, err)
		}
		if len(argv) == 0 {
			return nil, fmt.Errorf("%q is an empty argv", s)
		}
		return argv, nil
	}
	argv := strings.Fields(t)
	if len(argv) == 0 {
		return nil, fmt.Errorf("an argv must not be empty: give words (make test) or a JSON array ([\"sh\", \"-c\", \"make test\"])")
	}
	return argv, nil
}

// fileFlag collects --file LOCAL:PATH (the local file's content written at PATH, relative to
// the run's dir).
type fileFlag map[string]string

func (f fileFlag) String() string { return "" }

func (f fileFlag) Set(s string) error {
	local, dst, ok := strings.Cut(s, ":")
	if !ok || local == "" || dst == "" {
		return fmt.Errorf("%q must be LOCAL:PATH (PATH relative to the run's dir)", s)
	}
	st, err := os.Stat(local)
	if err != nil {
		return err
	}
	if !st.Mode().IsRegular() || st.Size() > runs.MaxFilesBytes {
		return fmt.Errorf("%s must be a regular file of at most %d bytes", local, runs.MaxFilesBytes)
	}
	b, err := os.ReadFile(local)
	if err != nil {
		return err
	}
	if !utf8.Valid(b) {
		return fmt.Errorf("%s is not UTF-8 text (a run's files are text; bring binaries in through the repository or an image)", local)
	}
	if _, dup := f[dst]; dup {
		return fmt.Errorf("file %s given twice", dst)
	}
	f[dst] = string(b)
	return nil
}

// runArgs is `agentbox run`'s parsed command line.
type runArgs struct {
	spec   wire.RunSpec
	detach bool
	json   bool
}

const runUsage = "agentbox run [--repo URL [--ref REF] [--repo-secret NAME]] [--dir DIR] [--setup ARGV] [--validate ARGV]... [--artifact GLOB]... [--file LOCAL:PATH]... [--env K=V]... [--secret NAME=env:VAR@host]... [--image I] [--runtime R] [--cpu N] [--memory-mb N] [--disk-mb N] [--allow-host H]... [--keep [--keep-ttl SECONDS]] [--timeout SECONDS] [--label K=V]... [--idempotency-key K] [--detach] [--json] -- CMD ARGS..."

// splitCommand splits `agentbox run`'s arguments at the first "--": the flags before it, the
// command after (the flag package would swallow a "--" that directly follows flags).
func splitCommand(args []string) (flags, command []string) {
	for i, a := range args {
		if a == "--" {
			return args[:i], append([]string{"--"}, args[i+1:]...)
		}
	}
	return args, nil
}

// newRunCmd is `agentbox run`'s flag set; parse turns the positional arguments (then "--" and
// the command) into runArgs.
func newRunCmd() (*clientCmd, func(pos []string) (runArgs, error)) {
	c := newClientCmd("run", runUsage)
	var ra runArgs
	sp := &ra.spec
	var setup, validate argvFlag
	var artifacts listFlag
	files, env, labels := fileFlag{}, kvFlag{}, kvFlag{}
	var keep bool
	c.fs.StringVar(&sp.RepoURL, "repo", "", "repository to check out (http(s)://…, or file:// under a server --checkout-dir)")
	c.fs.StringVar(&sp.Ref, "ref", "", "branch, tag or commit of --repo (default: its HEAD)")
	c.fs.StringVar(&sp.RepoSecret, "repo-secret", "", "the --secret that authenticates the checkout")
	c.fs.StringVar(&sp.Dir, "dir", "", "working directory of every phase and the checkout's target (default /workspace)")
	c.fs.Var(&setup, "setup", `setup argv, run before the command: words (pip install -e .) or a JSON array (["sh", "-c", "…"])`)
	c.fs.Var(&validate, "validate", "a validation argv, run after the command (repeatable; words or a JSON array)")
	c.fs.Var(&artifacts, "artifact", "a path or glob (relative to --dir) collected as an artifact (repeatable)")
	c.fs.Var(files, "file", "LOCAL:PATH: write a local text file at PATH (relative to --dir) before setup (repeatable)")
	c.fs.Var(env, "env", "environment variable K=V for every phase (repeatable)")
	c.fs.Var(labels, "label", "label K=V (repeatable)")
	c.fs.StringVar(&sp.Image, "image", "", "image: host (default) or an OCI reference")
	c.fs.StringVar(&sp.Runtime, "runtime", "", "runtime: runc, crun or gvisor (default: the server's)")
	c.fs.Float64Var(&sp.CPU, "cpu", 0, "cpu cores (default 1)")
	c.fs.Int64Var(&sp.MemoryMB, "memory-mb", 0, "memory limit in MiB (default 512)")
	c.fs.Int64Var(&sp.DiskMB, "disk-mb", 0, "disk limit in MiB (default 1024)")
	c.fs.BoolVar(&keep, "keep", false, "keep the sandbox after the run (for debugging; its id is in the summary)")
	c.fs.Int64Var(&sp.KeepTTLSeconds, "keep-ttl", 0, "with --keep: how long the sandbox is kept, in seconds (default 1800)")
	c.fs.Int64Var(&sp.TimeoutSeconds, "timeout", 0, "bound of the whole run in seconds (default 3600)")
	c.fs.StringVar(&sp.IdempotencyKey, "idempotency-key", "", "a key that makes retrying safe: the same key returns the existing run")
	c.fs.BoolVar(&ra.detach, "detach", false, "print the run id and return at once (the run goes on in the server)")
	var nw networkFlags
	nw.register(c)
	parse := func(pos []string) (runArgs, error) {
		if len(pos) > 0 {
			if pos[0] != "--" {
				return runArgs{}, fmt.Errorf("unexpected argument %q: the command goes after --", pos[0])
			}
			sp.Command = slices.Clone(pos[1:])
		}
		if len(sp.Command) == 0 && len(validate) == 0 {
			return runArgs{}, errors.New("nothing to run: give the command after -- (or --validate)")
		}
		if len(setup) > 1 {
			return runArgs{}, errors.New("--setup is one argv: give it once (use [\"sh\", \"-c\", \"a && b\"] for several steps)")
		}
		if len(setup) == 1 {
			sp.Setup = setup[0]
		}
		sp.ValidationCommands = validate
		sp.Artifacts = artifacts
		if len(files) > 0 {
			sp.Files = files
		}
		if len(env) > 0 {
			sp.Env = env
		}
		if len(labels) > 0 {
			sp.Labels = labels
		}
		if keep {
			sp.Retention = runs.RetentionKeep
		} else if sp.KeepTTLSeconds != 0 {
			return runArgs{}, errors.New("--keep-ttl needs --keep")
		}
		var req wire.CreateRequest
		nw.apply(&req)
		sp.Network, sp.Secrets = req.Network, req.Secrets
		ra.json = c.json
		return ra, nil
	}
	return c, parse
}

// cmdRun is `agentbox run`: start a run, follow its phases on stderr, print its summary.
func cmdRun(args []string) int {
	c, parse := newRunCmd()
	flags, command := splitCommand(args)
	return c.run(flags, func(int) bool { return true }, func(ctx context.Context, cl *client.Client, pos []string) int {
		ra, err := parse(append(pos, command...))
		if err != nil {
			fmt.Fprintf(os.Stderr, "agentbox run: %v\nusage: %s\n", err, runUsage)
			return 2
		}
		r, err := cl.StartRun(ctx, ra.spec)
		if err != nil {
			return fail(err)
		}
		if ra.detach {
			if ra.json {
				printJSON(r)
			} else {
				fmt.Println(r.ID)
			}
			return 0
		}
		fmt.Fprintf(os.Stderr, "run %s queued\n", r.ID)
		r, err = followRun(ctx, cl, r.ID, os.Stderr)
		if err != nil {
			if ctx.Err() != nil {
				fmt.Fprintf(os.Stderr, "agentbox: stopped waiting; run %s goes on in the server (agentbox runs get %s)\n", r.ID, r.ID)
				return 130
			}
			return fail(err)
		}
		if ra.json {
			printJSON(r)
		} else {
			printRun(os.Stdout, r)
		}
		return runExit(r)
	})
}

// followRun prints a run's events as they happen until it settles (or ctx ends).
func followRun(ctx context.Context, cl *client.Client, id string, w io.Writer) (wire.Run, error) {
	var after int64
	for {
		l, err := cl.RunEvents(ctx, id, after, runs.MaxEventsPage)
		if err != nil {
			return wire.Run{ID: id}, err
		}
		for _, ev := range l.Events {
			fmt.Fprintf(w, "  %s %s", ev.Time.Local().Format("15:04:05.000"), ev.To)
			if ev.Phase != "" {
				fmt.Fprintf(w, " [%s]", ev.Phase)
			}
			if ev.Reason != "" {
				fmt.Fprintf(w, ": %s", ev.Reason)
			}
			fmt.Fprintln(w)
			after = ev.Seq
		}
		if l.Next > after {
			after = l.Next
		}
		r, err := cl.GetRun(ctx, id)
		if err != nil {
			return wire.Run{ID: id}, err
		}
		if r.State.Settled() {
			return r, nil
		}
		select {
		case <-ctx.Done():
			return r, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// runExit is the CLI's exit code for a settled run: 0 succeeded, 1 failed, 2 otherwise
// (errored, timed_out, canceled).
func runExit(r wire.Run) int {
	switch r.State {
	case wire.RunSucceeded:
		return 0
	case wire.RunFailed:
		return 1
	}
	return 2
}

func msText(ms *int64) string {
	if ms == nil {
		return "-"
	}
	return (time.Duration(*ms) * time.Millisecond).Round(time.Millisecond).String()
}

func codeText(c *int) string {
	if c == nil {
		return "-"
	}
	return fmt.Sprint(*c)
}

// printRun is a run's readable summary: state, phases with exit codes and durations, changed
// files, artifacts with URLs.
func printRun(w io.Writer, r wire.Run) {
	fmt.Fprintf(w, "run %s: %s", r.ID, r.State)
	if r.Reason != "" {
		fmt.Fprintf(w, " (%s)", r.Reason)
	}
	fmt.Fprintf(w, ", %s\n", msText(r.DurationMs))
	if r.Commit != "" {
		fmt.Fprintf(w, "commit %s\n", r.Commit)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PHASE\tSTATE\tEXIT\tDURATION\tNOTE")
	for _, p := range r.Phases {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", p.Name, p.State, codeText(p.ExitCode), msText(p.DurationMs), p.Error)
	}
	tw.Flush()
	if len(r.ChangedFiles) > 0 {
		fmt.Fprintf(w, "changed files (%d):\n", len(r.ChangedFiles))
		for _, f := range r.ChangedFiles {
			if f.From != "" {
				fmt.Fprintf(w, "  %-8s %s -> %s\n", f.Status, f.From, f.Path)
			} else {
				fmt.Fprintf(w, "  %-8s %s\n", f.Status, f.Path)
			}
		}
	}
	if r.DiffStat != "" {
		fmt.Fprintln(w, strings.TrimRight(r.DiffStat, "\n"))
	}
	for _, a := range r.Artifacts {
		fmt.Fprintf(w, "artifact %s (%d bytes): %s\n", a.Path, a.Size, a.URL)
	}
	for _, e := range r.ArtifactErrors {
		fmt.Fprintf(w, "artifact error: %s\n", e)
	}
	if r.SandboxKept && r.KeptUntil != nil {
		fmt.Fprintf(w, "sandbox %s kept until %s\n", r.SandboxID, r.KeptUntil.Local().Format(time.DateTime))
	}
	if r.CleanupFailed {
		fmt.Fprintf(w, "CLEANUP FAILED for sandbox %s: %s\n", r.SandboxID, r.CleanupError)
	}
	// The failing phase's output tail, to see why without another command.
	for _, p := range r.Phases {
		if p.State != wire.PhaseSucceeded && p.State != wire.PhasePending && p.State != wire.PhaseSkipped && (p.Stderr != "" || p.Stdout != "") {
			out := p.Stderr
			if out == "" {
				out = p.Stdout
			}
			fmt.Fprintf(w, "--- %s output (tail; agentbox runs logs %s --phase %s) ---\n%s\n", p.Name, r.ID, p.Name, tail(out, 20))
			break
		}
	}
}

// tail is the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// cmdRuns is `agentbox runs ls|get|cancel|events|logs|artifact`.
func cmdRuns(args []string) int {
	sub := map[string]func([]string) int{
		"ls": runsList, "list": runsList, "get": runsGet, "cancel": runsCancel, "events": runsEvents,
		"logs": runsLogs, "artifact": runsArtifact,
	}
	if len(args) > 0 {
		if f, ok := sub[args[0]]; ok {
			return f(args[1:])
		}
	}
	fmt.Fprint(os.Stderr, "usage: agentbox runs ls|get|cancel|events|logs|artifact ...\n")
	return 2
}

func runsList(args []string) int {
	c := newClientCmd("runs ls", "agentbox runs ls [--json] [--state S,...] [--batch ID] [--label K=V]... [--limit N] [--before RUN]")
	state := c.fs.String("state", "", "only these states, comma-separated")
	batch := c.fs.String("batch", "", "only the runs of this batch")
	limit := c.fs.Int("limit", 0, "runs per page (1-1000, default 20)")
	before := c.fs.String("before", "", "page: the runs created before this one (the previous page's next)")
	labels := kvFlag{}
	c.fs.Var(labels, "label", "only runs with label K=V (repeatable)")
	return c.run(args, exactly(0), func(ctx context.Context, cl *client.Client, _ []string) int {
		f := wire.RunFilter{BatchID: *batch, Labels: labels, Before: *before, Limit: *limit}
		if *state != "" {
			for _, s := range strings.Split(*state, ",") {
				f.States = append(f.States, wire.RunState(s))
			}
		}
		l, err := cl.ListRuns(ctx, f)
		if err != nil {
			return fail(err)
		}
		if c.json {
			printJSON(l)
			return 0
		}
		tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "RUN\tSTATE\tCREATED\tDURATION\tBATCH\tCOMMAND")
		for _, r := range l.Runs {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", r.ID, r.State, r.CreatedAt.Local().Format(time.DateTime), msText(r.DurationMs),
				r.BatchID, text.Truncate(strings.Join(r.Spec.Command, " "), 60))
		}
		tw.Flush()
		if l.Next != "" {
			fmt.Printf("(more: --before %s)\n", l.Next)
		}
		return 0
	})
}

func runsGet(args []string) int {
	c := newClientCmd("runs get", "agentbox runs get [--json] RUN")
	return c.run(args, exactly(1), func(ctx context.Context, cl *client.Client, pos []string) int {
		r, err := cl.GetRun(ctx, pos[0])
		if err != nil {
			return fail(err)
		}
		if c.json {
			printJSON(r)
		} else {
			printRun(os.Stdout, r)
		}
		return 0
	})
}

func runsCancel(args []string) int {
	c := newClientCmd("runs cancel", "agentbox runs cancel [--json] RUN")
	return c.run(args, exactly(1), func(ctx context.Context, cl *client.Client, pos []string) int {
		r, err := cl.CancelRun(ctx, pos[0])
		if err != nil {
			return fail(err)
		}
		if c.json {
			printJSON(r)
		} else {
			fmt.Printf("%s %s (cancel requested)\n", r.ID, r.State)
		}
		return 0
	})
}

func runsEvents(args []string) int {
	c := newClientCmd("runs events", "agentbox runs events [--json] [--after SEQ] [--limit N] RUN")
	after := c.fs.Int64("after", 0, "the events after this seq")
	limit := c.fs.Int("limit", 0, "events per page (1-1000, default 100)")
	return c.run(args, exactly(1), func(ctx context.Context, cl *client.Client, pos []string) int {
		l, err := cl.RunEvents(ctx, pos[0], *after, *limit)
		if err != nil {
			return fail(err)
		}
		if c.json {
			printJSON(l)
			return 0
		}
		tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "SEQ\tTIME\tFROM\tTO\tPHASE\tREASON")
		for _, ev := range l.Events {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", ev.Seq, ev.Time.Local().Format("2006-01-02 15:04:05.000"), ev.From, ev.To, ev.Phase, ev.Reason)
		}
		tw.Flush()
		return 0
	})
}

// maxCLILogBytes bounds what `runs logs` prints (the server keeps at most runs.MaxLogBytes of a
// phase's stream).
const maxCLILogBytes = runs.MaxLogBytes

func runsLogs(args []string) int {
	c := newClientCmd("runs logs", "agentbox runs logs [--phase P] [--stream stdout|stderr] RUN")
	phase := c.fs.String("phase", "", "the phase (default command; setup, validation[0], checkout, agent_build, …)")
	stream := c.fs.String("stream", "stdout", "stdout or stderr")
	return c.run(args, exactly(1), func(ctx context.Context, cl *client.Client, pos []string) int {
		var off int64
		for off < maxCLILogBytes {
			l, err := cl.RunLogs(ctx, pos[0], wire.RunLogsRequest{Phase: *phase, Stream: *stream, Offset: off, MaxBytes: runs.MaxLogPage})
			if err != nil {
				return fail(err)
			}
			os.Stdout.Write(l.Data)
			if l.NextOffset <= off || l.NextOffset >= l.TotalBytes {
				if l.Truncated {
					fmt.Fprintln(os.Stderr, "agentbox: the phase wrote more than the server keeps; the rest was not kept")
				}
				return 0
			}
			off = l.NextOffset
		}
		return 0
	})
}

func runsArtifact(args []string) int {
	c := newClientCmd("runs artifact", "agentbox runs artifact [-o FILE|-] RUN PATH")
	out := c.fs.String("o", "", "where to write it (default: the artifact's base name in this directory; - for stdout)")
	return c.run(args, exactly(2), func(ctx context.Context, cl *client.Client, pos []string) int {
		rc, size, err := cl.DownloadArtifact(ctx, pos[0], pos[1])
		if err != nil {
			return fail(err)
		}
		defer rc.Close()
		dst := *out
		if dst == "" {
			dst = path.Base(pos[1])
		}
		var w io.Writer = os.Stdout
		if dst != "-" {
			f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
			if err != nil {
				return fail(fmt.Errorf("%w (use -o to choose another file)", err))
			}
			defer f.Close()
			w = f
		}
		n, err := io.Copy(w, io.LimitReader(rc, max(size, 0)+1))
		if err == nil && size >= 0 && n != size {
			err = fmt.Errorf("the download ended after %d of %d bytes", n, size)
		}
		if err != nil {
			if dst != "-" {
				os.Remove(dst)
			}
			return fail(err)
		}
		if dst != "-" {
			abs, _ := filepath.Abs(dst)
			fmt.Fprintf(os.Stderr, "%s: %d bytes\n", abs, n)
		}
		return 0
	})
}

// readRequest decodes a JSON request file strictly (unknown fields refused) into v.
func readRequest(file string, v any) error {
	var r io.Reader = os.Stdin
	if file != "-" {
		f, err := os.Open(file)
		if err != nil {
			return err
		}
		defer f.Close()
		r = f
	}
	dec := json.NewDecoder(io.LimitReader(r, api.MaxJSONBody+1))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%s: %v", file, err)
	}
	if dec.More() {
		return fmt.Errorf("%s: data after the JSON object", file)
	}
	return nil
}

// batchCmd is a subcommand that submits a FILE.json as a batch.
func batchCmd(name string, args []string, start func(ctx context.Context, cl *client.Client, file string, wait time.Duration) (wire.Batch, error)) int {
	c := newClientCmd(name, "agentbox "+name+" [--wait] [--wait-timeout D] [--json] FILE.json")
	wait := c.fs.Bool("wait", false, "wait for every run to settle, then print the batch (exit 0 only if every run succeeded)")
	waitFor := c.fs.Duration("wait-timeout", runs.MaxWait, "with --wait: how long to wait (at most 1h)")
	return c.run(args, exactly(1), func(ctx context.Context, cl *client.Client, pos []string) int {
		var d time.Duration
		if *wait {
			if *waitFor <= 0 || *waitFor > runs.MaxWait {
				fmt.Fprintf(os.Stderr, "agentbox %s: --wait-timeout must be between 1s and %v\n", name, runs.MaxWait)
				return 2
			}
			d = *waitFor
		}
		b, err := start(ctx, cl, pos[0], d)
		if err != nil {
			return fail(err)
		}
		if c.json {
			printJSON(b)
		} else {
			printBatch(os.Stdout, b)
		}
		if *wait {
			return batchExit(b)
		}
		return 0
	})
}

// batchExit: 0 when every run succeeded (and nothing was refused), 1 when some failed, 2 when
// some errored, timed out, were canceled or are still unsettled.
func batchExit(b wire.Batch) int {
	code := 0
	if len(b.SubmissionFailures) > 0 {
		code = 1
	}
	for _, r := range b.Runs {
		switch {
		case r.State == wire.RunSucceeded:
		case r.State == wire.RunFailed:
			code = max(code, 1)
		default:
			code = 2
		}
	}
	return code
}

func printBatch(w io.Writer, b wire.Batch) {
	fmt.Fprintf(w, "batch %s (%s, max_parallel %d): %d runs, settled %v\n", b.ID, b.Kind, b.MaxParallel, len(b.Runs), b.Settled)
	var counts []string
	for st, n := range b.Counts {
		counts = append(counts, fmt.Sprintf("%s %d", st, n))
	}
	slices.Sort(counts)
	if len(counts) > 0 {
		fmt.Fprintf(w, "counts: %s\n", strings.Join(counts, ", "))
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if len(b.Matrix) > 0 {
		fmt.Fprintf(tw, "%s\tRUN\tSTATE\n", strings.ToUpper(strings.Join(b.Axes, "\t")))
		for _, cell := range b.Matrix {
			var vals []string
			for _, a := range b.Axes {
				vals = append(vals, string(cell.Values[a]))
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\n", strings.Join(vals, "\t"), cell.RunID, cell.State)
		}
	} else {
		fmt.Fprintln(tw, "INDEX\tRUN\tSTATE\tREASON")
		for _, r := range b.Runs {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\n", r.Index, r.RunID, r.State, r.Reason)
		}
	}
	tw.Flush()
	for _, f := range b.SubmissionFailures {
		fmt.Fprintf(w, "refused [%d] %s: %s\n", f.Index, f.Code, f.Error)
	}
	if cmp := b.Compare; cmp != nil {
		fmt.Fprintf(w, "task: %s\ninvocation: %q\n", cmp.Task, cmp.Invocation)
		for _, s := range cmp.Sides {
			fmt.Fprintf(w, "%s %s@%s: passed %d of %d, median task %s\n", s.Side, s.RepoURL, s.Ref, s.Passed, len(s.Repetitions), msText(s.MedianTaskMs))
			for _, r := range s.Repetitions {
				task := "-"
				if r.Task != nil {
					task = codeText(r.Task.ExitCode) + " in " + msText(r.Task.DurationMs)
				}
				fmt.Fprintf(w, "  %s %s agent %s target %s task %s changed %d\n", r.RunID, r.State, short(r.AgentCommit), short(r.TargetCommit), task, r.ChangedFiles)
			}
		}
	}
}

func short(c string) string {
	if len(c) > 12 {
		return c[:12]
	}
	if c == "" {
		return "-"
	}
	return c
}

// cmdBatch is `agentbox batch submit|matrix|get|ls|cancel`.
func cmdBatch(args []string) int {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, "usage: agentbox batch submit FILE.json | matrix FILE.json | get ID | ls | cancel ID\n")
		return 2
	}
	switch args[0] {
	case "submit":
		return batchCmd("batch submit", args[1:], startFrom((*client.Client).StartBatch))
	case "matrix":
		return batchCmd("batch matrix", args[1:], startFrom((*client.Client).StartMatrix))
	case "get":
		c := newClientCmd("batch get", "agentbox batch get [--json] ID")
		return c.run(args[1:], exactly(1), func(ctx context.Context, cl *client.Client, pos []string) int {
			b, err := cl.GetBatch(ctx, pos[0])
			return printBatchOr(c.json, b, err)
		})
	case "cancel":
		c := newClientCmd("batch cancel", "agentbox batch cancel [--json] ID")
		return c.run(args[1:], exactly(1), func(ctx context.Context, cl *client.Client, pos []string) int {
			b, err := cl.CancelBatch(ctx, pos[0])
			return printBatchOr(c.json, b, err)
		})
	case "ls", "list":
		c := newClientCmd("batch ls", "agentbox batch ls [--json] [--limit N] [--before ID]")
		limit := c.fs.Int("limit", 0, "batches per page (1-1000, default 20)")
		before := c.fs.String("before", "", "page: the previous page's next")
		return c.run(args[1:], exactly(0), func(ctx context.Context, cl *client.Client, _ []string) int {
			l, err := cl.ListBatches(ctx, *before, *limit)
			if err != nil {
				return fail(err)
			}
			if c.json {
				printJSON(l)
				return 0
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "BATCH\tKIND\tRUNS\tREFUSED\tSETTLED\tCREATED")
			for _, b := range l.Batches {
				fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%v\t%s\n", b.ID, b.Kind, len(b.Runs), len(b.SubmissionFailures), b.Settled, b.CreatedAt.Local().Format(time.DateTime))
			}
			tw.Flush()
			if l.Next != "" {
				fmt.Printf("(more: --before %s)\n", l.Next)
			}
			return 0
		})
	}
	fmt.Fprintf(os.Stderr, "agentbox batch: unknown subcommand %q (submit, matrix, get, ls, cancel)\n", args[0])
	return 2
}

// startFrom is a batchCmd start that reads FILE (or stdin for -) as a T and calls start with it.
func startFrom[T any](start func(*client.Client, context.Context, T, time.Duration) (wire.Batch, error)) func(context.Context, *client.Client, string, time.Duration) (wire.Batch, error) {
	return func(ctx context.Context, cl *client.Client, file string, wait time.Duration) (wire.Batch, error) {
		var req T
		if err := readRequest(file, &req); err != nil {
			return wire.Batch{}, err
		}
		return start(cl, ctx, req, wait)
	}
}

func printBatchOr(asJSON bool, b wire.Batch, err error) int {
	if err != nil {
		return fail(err)
	}
	if asJSON {
		printJSON(b)
	} else {
		printBatch(os.Stdout, b)
	}
	return 0
}

// cmdAgent is `agentbox agent compare FILE.json | test FILE.json`.
func cmdAgent(args []string) int {
	if len(args) > 0 {
		switch args[0] {
		case "compare":
			return batchCmd("agent compare", args[1:], startFrom((*client.Client).AgentCompare))
		case "test":
			return batchCmd("agent test", args[1:], startFrom((*client.Client).AgentTest))
		}
	}
	fmt.Fprint(os.Stderr, "usage: agentbox agent compare FILE.json | test FILE.json\n")
	return 2
}
