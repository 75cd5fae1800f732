package watch

import (
	"context"
	"time"

	"github.com/agentbox/agentbox/internal/sandbox"
)

// JobLogReader pages a job's output: *sandbox.Service and the MCP server's Backend have it.
type JobLogReader interface {
	JobLogs(ctx context.Context, sandboxID, jobID string, req sandbox.JobLogsRequest) (sandbox.JobLogs, error)
}

// JobLogsOf is the logs stream's pager over r (nil if r is nil). A reply's state is read before
// its data, so a job reported ended has its whole log in the reply's range. The wait is
// sandbox.JobLogsRequest.Wait: the agent's long poll.
func JobLogsOf(r JobLogReader) JobLogPager {
	if r == nil {
		return nil
	}
	return func(ctx context.Context, sandboxID, jobID string, offset, max int64, wait time.Duration) (JobLogChunk, error) {
		// A stream never wakes a sleeping sandbox (it would keep it from sleeping).
		l, err := r.JobLogs(sandbox.WithoutAutoWake(ctx), sandboxID, jobID, sandbox.JobLogsRequest{Stream: "all", Offset: &offset, MaxBytes: &max, Wait: wait})
		if err != nil {
			return JobLogChunk{}, err
		}
		return JobLogChunk{Data: l.Data, Offset: l.Offset, NextOffset: l.NextOffset, TotalBytes: l.TotalBytes, Running: l.State.Active()}, nil
	}
}

// MetricsReader samples a sandbox's resource use: *metrics.Service in process, the REST
// client's Backend over a running server.
type MetricsReader interface {
	Metrics(ctx context.Context, id string) (sandbox.SandboxMetrics, error)
}

// MetricsOf is the metrics stream's source over r (nil if r is nil).
func MetricsOf(r MetricsReader) MetricsSource {
	if r == nil {
		return nil
	}
	return func(ctx context.Context, id string) (any, error) { return r.Metrics(ctx, id) }
}
