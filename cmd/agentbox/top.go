package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/wire"
)

// Bounds of agentbox top.
const (
	topMinInterval = 500 * time.Millisecond
	topMaxInterval = time.Hour
	// topFirstWindow is how long the first table waits between two samples, so that it has a
	// CPU percentage.
	topFirstWindow = time.Second
)

// cmdTop is `agentbox top`: a refreshing table of the fleet, like docker stats.
func cmdTop(args []string) int {
	c := newClientCmd("top", "agentbox top [--once] [--interval SECONDS] [--json]")
	once := c.fs.Bool("once", false, "print one table and exit (the default when stdout is not a terminal)")
	interval := c.fs.Float64("interval", 2, "seconds between refreshes (0.5 to 3600)")
	return c.run(args, exactly(0), func(ctx context.Context, cl *client.Client, _ []string) int {
		iv := time.Duration(*interval * float64(time.Second))
		if iv < topMinInterval || iv > topMaxInterval {
			return fail(errcode.New(errcode.InvalidArgument, "--interval must be between 0.5 and 3600 seconds; got %g", *interval))
		}
		live := !*once && !c.json && isTerminal(os.Stdout)
		// A first sample, so that the first table has CPU percentages.
		if _, err := cl.FleetMetrics(ctx); err != nil {
			return fail(err)
		}
		wait := topFirstWindow
		for {
			select {
			case <-ctx.Done():
				if live {
					fmt.Print("\x1b[?25h") // the cursor again
				}
				return 0
			case <-time.After(wait):
			}
			wait = iv
			sbs, fleet, err := topSample(ctx, cl)
			if err != nil {
				if ctx.Err() != nil {
					continue // interrupted: the loop's select returns
				}
				return fail(err)
			}
			if c.json {
				printJSON(fleet)
				return 0
			}
			var buf bytes.Buffer
			if live {
				buf.WriteString("\x1b[?25l\x1b[H\x1b[2J") // hide the cursor, home, clear
			}
			renderTop(&buf, sbs, fleet, time.Now())
			os.Stdout.Write(buf.Bytes())
			if !live {
				return 0
			}
		}
	})
}

// topSample lists the sandboxes that are not destroyed and samples the running ones.
func topSample(ctx context.Context, cl *client.Client) ([]wire.Sandbox, wire.FleetMetrics, error) {
	sbs, err := cl.List(ctx, nil, nil)
	if err != nil {
		return nil, wire.FleetMetrics{}, err
	}
	fleet, err := cl.FleetMetrics(ctx)
	return sbs, fleet, err
}

// renderTop writes the fleet's table: every sandbox that is not destroyed, sorted by id, with
// its metrics when it is running.
func renderTop(w io.Writer, sbs []wire.Sandbox, fleet wire.FleetMetrics, now time.Time) {
	byID := map[string]wire.SandboxMetrics{}
	for _, m := range fleet.Sandboxes {
		byID[m.SandboxID] = m
	}
	sort.Slice(sbs, func(i, j int) bool { return sbs[i].ID < sbs[j].ID })
	running := 0
	for _, sb := range sbs {
		if sb.State == wire.StateRunning {
			running++
		}
	}
	fmt.Fprintf(w, "%d sandboxes, %d running; sampled in %.0f ms", len(sbs), running, fleet.TookSeconds*1000)
	if fleet.Failed > 0 {
		fmt.Fprintf(w, "; %d could not be sampled", fleet.Failed)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SANDBOX\tSTATE\tRUNTIME\tCPU %\tMEM USAGE / LIMIT\tMEM %\tPIDS\tJOBS\tDISK USED / SIZE\tTTL LEFT")
	for _, sb := range sbs {
		cpu, mem, memPct, pids, jobs, disk := "-", "-", "-", "-", "-", "-"
		if m, ok := byID[sb.ID]; ok {
			if m.CPUPercent != nil {
				cpu = fmt.Sprintf("%.1f%%", *m.CPUPercent)
			}
			if m.Memory != nil {
				mem = tableBytes(m.Memory.UsedBytes) + " / " + limitBytes(m.Memory.LimitBytes)
			}
			if m.MemoryPercent != nil {
				memPct = fmt.Sprintf("%.1f%%", *m.MemoryPercent)
			}
			if m.Pids != nil {
				pids = fmt.Sprint(m.Pids.Current)
			}
			if m.RunningJobs != nil {
				jobs = fmt.Sprint(*m.RunningJobs)
			}
			if m.Disk != nil {
				disk = tableBytes(m.Disk.UsedBytes) + " / " + limitBytes(m.Disk.TotalBytes)
			}
		}
		ttl := "-"
		if sb.State.Live() {
			ttl = ttlLeft(sb.ExpiresAt.Sub(now))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", sb.ID, sb.State, sb.Runtime, cpu, mem, memPct, pids, jobs, disk, ttl)
	}
	tw.Flush()
}

// tableBytes is a compact size for a table cell (progress bars use humanBytes).
func tableBytes(b int64) string {
	switch {
	case b >= 1<<30:
		return fmt.Sprintf("%.2fGiB", float64(b)/(1<<30))
	case b >= 1<<20:
		return fmt.Sprintf("%.1fMiB", float64(b)/(1<<20))
	case b >= 1<<10:
		return fmt.Sprintf("%.1fKiB", float64(b)/(1<<10))
	}
	return fmt.Sprintf("%dB", b)
}

func limitBytes(b int64) string {
	if b <= 0 {
		return "unlimited"
	}
	return tableBytes(b)
}

func ttlLeft(d time.Duration) string {
	if d <= 0 {
		return "expired"
	}
	d = d.Round(time.Second)
	var b strings.Builder
	if h := d / time.Hour; h > 0 {
		fmt.Fprintf(&b, "%dh", h)
		d -= h * time.Hour
	}
	fmt.Fprintf(&b, "%dm%02ds", d/time.Minute, (d%time.Minute)/time.Second)
	return b.String()
}
