package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/watch"
	"github.com/agentbox/agentbox/internal/wire"
)

// watchRetries bounds how often `agentbox watch` reconnects a dropped events stream.
const watchRetries = 5

func cmdWatch(args []string) int {
	c := newClientCmd("watch", "agentbox watch [--stream lifecycle|events|logs|metrics|connections] [--job JOB] [--duration D] [--interval SECONDS] [--json] ID")
	var o client.WatchOptions
	var dur string
	c.fs.StringVar(&o.Stream, "stream", "lifecycle", "lifecycle (state transitions), events (every recorded event), logs (a job's output; needs --job), metrics or connections (each network connection record)")
	c.fs.StringVar(&o.JobID, "job", "", "the job whose output to follow (--stream logs)")
	c.fs.StringVar(&dur, "duration", "", "stop after this long: seconds or a duration such as 10m (default 60s, 1s to 1h)")
	c.fs.Int64Var(&o.IntervalSeconds, "interval", 0, "seconds between metrics samples (default 2, 1 to 60)")
	return c.run(args, exactly(1), func(ctx context.Context, cl *client.Client, pos []string) int {
		if dur != "" {
			secs, err := parseWatchDuration(dur)
			if err != nil {
				return fail(err)
			}
			o.DurationSeconds = secs
		}
		if o.Stream == "logs" && o.JobID == "" {
			return fail(errcode.New(errcode.InvalidArgument, "--stream logs needs --job JOB"))
		}
		if o.JobID != "" && o.Stream == "lifecycle" {
			o.Stream = "logs"
		}
		deadline := time.Time{}
		if o.DurationSeconds > 0 {
			deadline = time.Now().Add(time.Duration(o.DurationSeconds) * time.Second)
		}
		enc := json.NewEncoder(os.Stdout)
		print := func(m wire.WatchMessage) error {
			if m.Kind == wire.WatchHeartbeat {
				return nil
			}
			if c.json {
				return enc.Encode(m)
			}
			if m.Kind == wire.WatchLogs && o.Stream == "logs" {
				_, err := os.Stdout.Write(m.Data) // the job's output as it is, bytes and all
				return err
			}
			_, err := fmt.Printf("%s %s %s\n", m.At.Local().Format("15:04:05.000"), m.SandboxID, m.Text(0))
			return err
		}
		for attempt := 0; ; attempt++ {
			last, err := cl.Watch(ctx, pos[0], o, print)
			if err == nil || ctx.Err() != nil {
				return 0
			}
			// A dropped events (or connections) stream resumes where it stopped (Last-Event-ID):
			// nothing is lost.
			var ec *errcode.Error
			if (o.Stream != "events" && o.Stream != "connections") || errors.As(err, &ec) || attempt >= watchRetries || (!deadline.IsZero() && time.Until(deadline) < time.Second) {
				return fail(err)
			}
			fmt.Fprintf(os.Stderr, "agentbox watch: %v; reconnecting\n", err)
			o.LastEventID = last
			if !deadline.IsZero() {
				o.DurationSeconds = int64(time.Until(deadline).Seconds())
			}
			select {
			case <-ctx.Done():
				return 0
			case <-time.After(time.Duration(attempt+1) * 500 * time.Millisecond):
			}
		}
	})
}

// parseWatchDuration reads --duration: whole seconds ("90") or a Go duration ("10m"), 1 s to 1 h.
func parseWatchDuration(v string) (int64, error) {
	var d time.Duration
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		d = time.Duration(n) * time.Second
	} else if d, err = time.ParseDuration(v); err != nil {
		return 0, errcode.New(errcode.InvalidArgument, "--duration must be seconds or a duration such as 10m, between 1s and 1h; got %q", v)
	}
	if d < time.Second || d > time.Duration(watch.MaxDurationSeconds)*time.Second || d%time.Second != 0 {
		return 0, errcode.New(errcode.InvalidArgument, "--duration must be whole seconds between 1s and 1h; got %q", v)
	}
	return int64(d / time.Second), nil
}
