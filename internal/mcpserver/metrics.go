package mcpserver

import (
	"context"
	"fmt"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/sandbox"
)

func (s *Server) addMetricsTools() {
	addTool(s, &mcp.Tool{
		Name:  "sandbox_metrics",
		Title: "A sandbox's resource use",
		Description: `Sample a running sandbox's resource use now. Arguments: sandbox_id (required).
Reply: {sandbox_id, state, runtime, sampled_at, cpu: {usage_seconds, limit_cores}, cpu_percent (percent of its cpu limit since the previous sample of this sandbox, with cpu_percent_window_seconds; absent on the first sample: call again to get it), memory: {used_bytes, limit_bytes, cache_bytes, oom_events}, memory_percent, pids: {current, limit}, disk: {used_bytes, total_bytes}, expires_at, unsupported (groups this runtime cannot measure)}. A limit of 0 means unlimited.
Use it to see whether a command is CPU-bound, close to the memory limit (oom_events counts processes the kernel killed for memory) or filling the disk.
` + errorsDoc(errNotFound, errNotRunning, "UNSUPPORTED_OPERATION (this sandbox's runtime cannot measure it)", errInvalid),
		Annotations: &mcp.ToolAnnotations{Title: "A sandbox's resource use", ReadOnlyHint: true, IdempotentHint: false, OpenWorldHint: ptr(false)},
	}, nil, s.sandboxMetrics)
}

// MetricsBackend samples a running sandbox's resource use (sandbox_metrics).
type MetricsBackend interface {
	Metrics(ctx context.Context, id string) (sandbox.SandboxMetrics, error)
}

// sample is Options.Samples' sample of sandbox id, or UNSUPPORTED_OPERATION without one.
func (s *Server) sample(ctx context.Context, id string) (sandbox.SandboxMetrics, error) {
	if s.opts.Samples == nil {
		return sandbox.SandboxMetrics{}, errcode.New(errcode.UnsupportedOp, "this MCP server samples no sandbox metrics")
	}
	return s.opts.Samples.Metrics(ctx, id)
}

func (s *Server) sandboxMetrics(ctx context.Context, _ *mcp.CallToolRequest, in SandboxIDIn) (sandbox.SandboxMetrics, string, error) {
	m, err := s.sample(ctx, in.SandboxID)
	if err != nil {
		return sandbox.SandboxMetrics{}, "", err
	}
	return m, MetricsLine(m), nil
}

// MetricsLine renders a sample in one line.
func MetricsLine(m sandbox.SandboxMetrics) string {
	parts := []string{m.SandboxID}
	if m.CPU != nil {
		c := fmt.Sprintf("cpu %.2fs", m.CPU.UsageSeconds)
		if m.CPUPercent != nil {
			c += fmt.Sprintf(" (%.1f%% of its limit over %.1fs)", *m.CPUPercent, m.CPUPercentWindowSeconds)
		}
		parts = append(parts, c)
	}
	if m.Memory != nil {
		parts = append(parts, fmt.Sprintf("memory %s of %s, %d OOM kills", mib(m.Memory.UsedBytes), limitMiB(m.Memory.LimitBytes), m.Memory.OOMEvents))
	}
	if m.Pids != nil {
		parts = append(parts, fmt.Sprintf("%d tasks (limit %s)", m.Pids.Current, limitN(m.Pids.Limit)))
	}
	if m.Disk != nil {
		parts = append(parts, fmt.Sprintf("disk %s of %s", mib(m.Disk.UsedBytes), limitMiB(m.Disk.TotalBytes)))
	}
	if len(m.Unsupported) > 0 {
		parts = append(parts, "not measured: "+strings.Join(m.Unsupported, ", "))
	}
	return strings.Join(parts, "; ")
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

func limitMiB(b int64) string {
	if b <= 0 {
		return "unlimited"
	}
	return mib(b)
}

func limitN(n int64) string {
	if n <= 0 {
		return "unlimited"
	}
	return fmt.Sprint(n)
}
