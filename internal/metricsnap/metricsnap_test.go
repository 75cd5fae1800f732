package metricsnap_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/metricsnap"
)

func source(reg *prometheus.Registry) *metricsnap.Source {
	return metricsnap.New(func(context.Context) ([]*metricsnap.MetricFamily, error) { return reg.Gather() })
}

// TestCurrentBoundsAndFilters: exact name, prefix, a label filter, the 200-series bound, and a
// histogram flattened into its series.
func TestCurrentBoundsAndFilters(t *testing.T) {
	reg := prometheus.NewRegistry()
	many := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "t_many", Help: "many"}, []string{"i"})
	hist := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "t_lat_seconds", Help: "lat", Buckets: []float64{0.1, 1}})
	reg.MustRegister(many, hist)
	for i := range 250 {
		many.WithLabelValues(strconv.Itoa(i)).Set(float64(i))
	}
	hist.Observe(0.5)
	src := source(reg)
	ctx := context.Background()

	fams, trunc, err := src.Current(ctx, metricsnap.Query{Name: "t_lat_seconds"})
	if err != nil || trunc || len(fams) != 1 || fams[0].Type != "histogram" {
		t.Fatalf("histogram: %+v %v %v", fams, trunc, err)
	}
	got := map[string]float64{}
	for _, s := range fams[0].Samples {
		got[s.Series+"/"+s.Labels["le"]] = s.Value
	}
	if got["t_lat_seconds_bucket/0.1"] != 0 || got["t_lat_seconds_bucket/1"] != 1 || got["t_lat_seconds_bucket/+Inf"] != 1 || got["t_lat_seconds_count/"] != 1 || got["t_lat_seconds_sum/"] != 0.5 {
		t.Fatalf("histogram series: %v", got)
	}

	fams, trunc, err = src.Current(ctx, metricsnap.Query{Prefix: "t_"})
	n := 0
	for _, f := range fams {
		n += len(f.Samples)
	}
	if err != nil || !trunc || n != metricsnap.MaxSeries {
		t.Fatalf("bound: %d samples, truncated %v, %v", n, trunc, err)
	}

	fams, _, _ = src.Current(ctx, metricsnap.Query{Prefix: "t_", Labels: map[string]string{"i": "7"}})
	if len(fams) != 1 || fams[0].Name != "t_many" || len(fams[0].Samples) != 1 || fams[0].Samples[0].Value != 7 {
		t.Fatalf("label filter: %+v", fams)
	}
	if fams, _, _ = src.Current(ctx, metricsnap.Query{Name: "t_"}); len(fams) != 0 {
		t.Fatalf("a name is exact: %+v", fams)
	}
	if _, _, err := src.Current(ctx, metricsnap.Query{Name: "a", Prefix: "b"}); errcode.Of(err) != errcode.InvalidArgument {
		t.Fatalf("name and prefix: %v", err)
	}
}

// TestWindow: no history before sampling; then a counter with a reset, a partly covered window,
// the retention bound.
func TestWindow(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "t_total", Help: "c"})
	reg.MustRegister(c)
	cur := reg
	src := metricsnap.New(func(context.Context) ([]*metricsnap.MetricFamily, error) { return cur.Gather() })
	now := time.Now()
	h, _, err := src.Window(metricsnap.Query{Name: "t_total"}, time.Minute, now)
	if err != nil || h.Available || !strings.HasPrefix(h.Note, "no history") {
		t.Fatalf("before sampling: %+v %v", h, err)
	}
	ctx := context.Background()
	c.Add(5)
	src.Sample(ctx, now.Add(-30*time.Second))
	c.Add(3)
	src.Sample(ctx, now.Add(-20*time.Second))
	// A new registry's counter starts over (a restart): the reset counts from 0.
	reg2 := prometheus.NewRegistry()
	c2 := prometheus.NewCounter(prometheus.CounterOpts{Name: "t_total", Help: "c"})
	reg2.MustRegister(c2)
	c2.Add(2)
	cur = reg2
	src.Sample(ctx, now.Add(-10*time.Second))
	h, _, err = src.Window(metricsnap.Query{Name: "t_total"}, 10*time.Minute, now)
	if err != nil || !h.Available || len(h.Series) != 1 || h.CoveredSeconds != 30 || !strings.Contains(h.Note, "covers only") {
		t.Fatalf("window: %+v %v", h, err)
	}
	if s := h.Series[0]; s.First != 5 || s.Last != 2 || s.Min != 2 || s.Max != 8 || s.Delta != 3+2 || s.Type != "counter" || len(s.Points) != 3 {
		t.Fatalf("series: %+v", s)
	}
	// The last 5 s hold no point.
	h, _, _ = src.Window(metricsnap.Query{Name: "t_total"}, 5*time.Second, now)
	if len(h.Series) != 0 {
		t.Fatalf("a window with no point: %+v", h)
	}
	if _, _, err := src.Window(metricsnap.Query{}, 2*time.Hour, now); errcode.Of(err) != errcode.InvalidArgument {
		t.Fatalf("past retention: %v", err)
	}
}

// TestVisibleHidesOtherSandboxes: with Query.Sandboxes, a series labelled with a sandbox the
// caller may not see is gone from Current, Window and Filter alike; the series without a
// sandbox_id (the host's) stay; nil shows everything.
func TestVisibleHidesOtherSandboxes(t *testing.T) {
	reg := prometheus.NewRegistry()
	per := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "t_sandbox_mem", Help: "m"}, []string{"sandbox_id"})
	host := prometheus.NewGauge(prometheus.GaugeOpts{Name: "t_capacity", Help: "c"})
	reg.MustRegister(per, host)
	per.WithLabelValues("sb-mine").Set(1)
	per.WithLabelValues("sb-theirs").Set(2)
	host.Set(3)
	mine := metricsnap.Visible(func(id string) bool { return id == "sb-mine" })
	src := source(reg)
	ctx := context.Background()
	ids := func(fams []metricsnap.Family) []string {
		var out []string
		for _, f := range fams {
			for _, s := range f.Samples {
				out = append(out, f.Name+":"+s.Labels["sandbox_id"])
			}
		}
		return out
	}
	fams, _, err := src.Current(ctx, metricsnap.Query{Prefix: "t_", Sandboxes: mine})
	if got := strings.Join(ids(fams), ","); err != nil || got != "t_capacity:,t_sandbox_mem:sb-mine" {
		t.Errorf("Current(mine) = %s, %v", got, err)
	}
	fams, _, _ = src.Current(ctx, metricsnap.Query{Prefix: "t_", Labels: map[string]string{"sandbox_id": "sb-theirs"}, Sandboxes: mine})
	if len(ids(fams)) != 0 {
		t.Errorf("Current(theirs by label) = %v, want nothing", ids(fams))
	}
	fams, _, _ = src.Current(ctx, metricsnap.Query{Prefix: "t_"})
	if got := strings.Join(ids(fams), ","); got != "t_capacity:,t_sandbox_mem:sb-mine,t_sandbox_mem:sb-theirs" {
		t.Errorf("Current(all) = %s", got)
	}
	now := time.Now()
	src.Sample(ctx, now)
	h, _, err := src.Window(metricsnap.Query{Prefix: "t_", Sandboxes: mine}, time.Minute, now.Add(time.Second))
	var hs []string
	for _, s := range h.Series {
		hs = append(hs, s.Series+":"+s.Labels["sandbox_id"])
	}
	if got := strings.Join(hs, ","); err != nil || got != "t_capacity:,t_sandbox_mem:sb-mine" {
		t.Errorf("Window(mine) = %s, %v", got, err)
	}
	mfs, _ := reg.Gather()
	var fs []string
	for _, mf := range metricsnap.Filter(mfs, mine) {
		for _, m := range mf.GetMetric() {
			l := ""
			for _, lp := range m.GetLabel() {
				l += lp.GetValue()
			}
			fs = append(fs, mf.GetName()+":"+l)
		}
	}
	if got := strings.Join(fs, ","); got != "t_capacity:,t_sandbox_mem:sb-mine" {
		t.Errorf("Filter(mine) = %s", got)
	}
	if len(metricsnap.Filter(mfs, func(string) bool { return false })) != 1 {
		t.Errorf("Filter(none) kept a family of sandbox series only")
	}
}
