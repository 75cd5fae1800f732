package mcpserver

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	dto "github.com/prometheus/client_model/go"

	"github.com/agentbox/agentbox/internal/authz"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/metricsnap"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// FetchMetricsIn are fetch_metrics' arguments.
type FetchMetricsIn struct {
	Name          string `json:"name,omitempty" jsonschema:"A metric family's exact name, e.g. agentbox_sandboxes."`
	Prefix        string `json:"prefix,omitempty" jsonschema:"Every family whose name starts with this, e.g. agentbox_capacity_. Omit name and prefix for all (bounded)."`
	SandboxID     string `json:"sandbox_id,omitempty" jsonschema:"One sandbox: its resource sample now (as sandbox_metrics), and only the server's series labelled with it."`
	WindowSeconds int64  `json:"window_seconds,omitempty" jsonschema:"Also return the last this many seconds of the counters and gauges selected, from the server's in-memory history (sampled every 10 s for the last hour); at most 3600."`
}

// FetchMetricsOut is fetch_metrics' reply.
type FetchMetricsOut struct {
	Metrics   []metricsnap.Family     `json:"metrics" jsonschema:"Metric families now: {name, type (counter, gauge, histogram, summary, untyped), help, samples: [{series, labels, value}]}; histograms as series name_bucket (label le), name_sum and name_count."`
	Truncated bool                    `json:"truncated" jsonschema:"True when more than 200 series matched: narrow name or prefix."`
	Sandbox   *sandbox.SandboxMetrics `json:"sandbox,omitempty" jsonschema:"With sandbox_id: the sandbox's resource sample now."`
	History   *metricsnap.History     `json:"history,omitempty" jsonschema:"With window_seconds: {window_seconds, available, covered_seconds, note, series: [{series, labels, type, first, last, min, max, delta, points: [{at, value}]}]}; available false and a note when there is no history for the window."`
	Note      string                  `json:"note,omitempty" jsonschema:"What is missing and why."`
}

// metricsGatherer is a Backend that can read the server's registry (the REST client's scrapes
// GET /metrics).
type metricsGatherer interface {
	GatherMetrics(ctx context.Context) ([]*dto.MetricFamily, error)
}

// metricsSource is where fetch_metrics reads the server's metrics: Options.Metrics, else the
// Backend's scrape (current values only), else none.
func (s *Server) metricsSource() *metricsnap.Source {
	if s.opts.Metrics != nil {
		return s.opts.Metrics
	}
	if g, ok := s.b.(metricsGatherer); ok {
		return metricsnap.New(g.GatherMetrics)
	}
	return nil
}

func (s *Server) addFetchMetrics() {
	src := s.metricsSource()
	addTool(s, &mcp.Tool{
		Name:  "fetch_metrics",
		Title: "Read the server's metrics",
		Description: `Read agentbox's own metrics (the Prometheus series of GET /metrics) as structured data, and one sandbox's resource use. Arguments (all optional): name (one family exactly) or prefix (e.g. "agentbox_capacity_", "agentbox_sandbox_"), sandbox_id (that sandbox's sample now, and only the series labelled with it), window_seconds (up to 3600: the counters and gauges over that window from the server's in-memory history, sampled every 10 s).
Reply: {metrics: [{name, type, help, samples: [{series, labels, value}]}], truncated (more than 200 series matched), sandbox (with sandbox_id: {cpu, memory, pids, disk, …} as sandbox_metrics), history (with window_seconds: {available, covered_seconds, note, series: [{series, labels, first, last, min, max, delta, points}]})}.
Useful families: agentbox_sandboxes (by state), agentbox_capacity_* (used and limit), agentbox_sandbox_* (per sandbox), agentbox_exec_duration_seconds and agentbox_sandbox_create_duration_seconds (histograms), agentbox_http_requests_total. When the history does not cover the window (the server started recently, or this is a bridge to a remote server), history says so: available false and a note.
` + errorsDoc(errNotFound, errNotRunning, errInvalid, "UNSUPPORTED_OPERATION (this server exposes no metrics registry here)"),
		Annotations: &mcp.ToolAnnotations{Title: "Read the server's metrics", ReadOnlyHint: true, IdempotentHint: false, OpenWorldHint: ptr(false)},
	}, func(in *jsonschema.Schema) {
		in.Properties["name"].MaxLength = ptr(metricsnap.MaxName)
		in.Properties["prefix"].MaxLength = ptr(metricsnap.MaxName)
		in.Properties["window_seconds"].Minimum = ptr(0.0)
		in.Properties["window_seconds"].Maximum = ptr(metricsnap.Retention.Seconds())
	}, func(ctx context.Context, _ *mcp.CallToolRequest, in FetchMetricsIn) (FetchMetricsOut, string, error) {
		return s.fetchMetrics(ctx, src, in)
	})
}

func (s *Server) fetchMetrics(ctx context.Context, src *metricsnap.Source, in FetchMetricsIn) (FetchMetricsOut, string, error) {
	q := metricsnap.Query{Name: in.Name, Prefix: in.Prefix}
	if err := q.Check(); err != nil {
		return FetchMetricsOut{}, "", err
	}
	if in.WindowSeconds < 0 || in.WindowSeconds > int64(metricsnap.Retention.Seconds()) {
		return FetchMetricsOut{}, "", errcode.New(errcode.InvalidArgument, "window_seconds must be between 1 and %d (the history keeps the last hour); got %d", int(metricsnap.Retention.Seconds()), in.WindowSeconds)
	}
	// The caller's principal's sandboxes' series only (an admin's: all), as GET /metrics.
	vis, err := authz.SandboxPredicate(ctx, authz.PrincipalSandboxes(s.b))
	if err != nil {
		return FetchMetricsOut{}, "", err
	}
	q.Sandboxes = vis
	out := FetchMetricsOut{Metrics: []metricsnap.Family{}}
	if in.SandboxID != "" {
		m, err := s.sample(ctx, in.SandboxID)
		if err != nil {
			return FetchMetricsOut{}, "", err
		}
		out.Sandbox = &m
		q.Labels = map[string]string{"sandbox_id": in.SandboxID}
	}
	if src == nil {
		if in.SandboxID == "" {
			return FetchMetricsOut{}, "", errcode.New(errcode.UnsupportedOp, "this MCP server has no access to the agentbox server's metrics registry; sandbox_id still works (or use sandbox_metrics)")
		}
		out.Note = "the server's series are not available here; only the sandbox's sample"
	} else {
		fams, trunc, err := src.Current(ctx, q)
		if err != nil {
			return FetchMetricsOut{}, "", err
		}
		out.Metrics, out.Truncated = fams, trunc
		if in.WindowSeconds > 0 {
			h, htrunc, err := src.Window(q, time.Duration(in.WindowSeconds)*time.Second, time.Now())
			if err != nil {
				return FetchMetricsOut{}, "", err
			}
			if in.SandboxID != "" && len(h.Series) == 0 {
				h.Available = false
				h.Note = "no history for a sandbox's series: the history samples the server-wide series only (sampling every sandbox every 10 s would shorten cpu_percent's window for every caller); sandbox and metrics are its current values"
			}
			out.History = &h
			out.Truncated = out.Truncated || htrunc
		}
	}
	return out, renderFetchMetrics(out), nil
}

func renderFetchMetrics(o FetchMetricsOut) string {
	var b strings.Builder
	for _, f := range o.Metrics {
		fmt.Fprintf(&b, "%s (%s): %s\n", f.Name, f.Type, f.Help)
		for _, sm := range f.Samples {
			fmt.Fprintf(&b, "  %s%s %g\n", sm.Series, labelText(sm.Labels), sm.Value)
		}
	}
	if len(o.Metrics) == 0 && o.Sandbox == nil {
		b.WriteString("No metric matched.\n")
	}
	if o.Truncated {
		fmt.Fprintf(&b, "[cut at %d series: narrow name or prefix]\n", metricsnap.MaxSeries)
	}
	if o.Sandbox != nil {
		b.WriteString(MetricsLine(*o.Sandbox) + "\n")
	}
	if h := o.History; h != nil {
		if !h.Available {
			fmt.Fprintf(&b, "History: %s\n", h.Note)
		} else {
			fmt.Fprintf(&b, "History over %d s (covered %d s):\n", h.WindowSeconds, h.CoveredSeconds)
			if h.Note != "" {
				b.WriteString("  " + h.Note + "\n")
			}
			for _, sh := range h.Series {
				fmt.Fprintf(&b, "  %s%s first %g last %g min %g max %g delta %g\n", sh.Series, labelText(sh.Labels), sh.First, sh.Last, sh.Min, sh.Max, sh.Delta)
			}
		}
	}
	if o.Note != "" {
		b.WriteString(o.Note + "\n")
	}
	return strings.TrimRight(b.String(), "\n")
}

func labelText(ls map[string]string) string {
	if len(ls) == 0 {
		return ""
	}
	keys := make([]string, 0, len(ls))
	for k := range ls {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%q", k, ls[k])
	}
	return "{" + strings.Join(parts, ",") + "}"
}
