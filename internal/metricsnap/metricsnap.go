// Package metricsnap answers questions about a Prometheus registry as structured data a model
// can read: the current value of metric families by exact name or prefix (bounded), and, from an
// in-memory ring sampled every 10 s for the last hour, a time window of the counters and
// gauges. It knows nothing of HTTP or MCP: the server wires in its registry's gatherer (or, for
// a remote server, a scrape of its /metrics).
package metricsnap

import (
	"context"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/agentbox/agentbox/internal/errcode"
)

// Bounds.
const (
	// MaxSeries bounds the series (samples) one answer lists.
	MaxSeries = 200
	// Interval is the history's sampling period; Retention how far back it goes.
	Interval  = 10 * time.Second
	Retention = time.Hour
	// maxPoints bounds one series' ring (Retention / Interval); maxHistorySeries the series kept.
	maxPoints        = int(Retention / Interval)
	maxHistorySeries = 2000
	// MaxWindowPoints bounds the points one series returns in a window (evenly thinned).
	MaxWindowPoints = 60
	// MaxName bounds name and prefix.
	MaxName = 256
)

// MetricFamily is a gathered family (client_model's).
type MetricFamily = dto.MetricFamily

// GatherFunc returns the registry's current families.
type GatherFunc func(ctx context.Context) ([]*dto.MetricFamily, error)

// Sample is one series' value.
type Sample struct {
	// Series is the exposed series name: the family's name, or for histograms and summaries
	// name_bucket (with label le), name_sum, name_count.
	Series string            `json:"series"`
	Labels map[string]string `json:"labels"`
	Value  float64           `json:"value"`
}

// Family is one metric family.
type Family struct {
	Name    string   `json:"name"`
	Type    string   `json:"type"`
	Help    string   `json:"help"`
	Samples []Sample `json:"samples"`
}

// Point is one sampled value.
type Point struct {
	At    time.Time `json:"at"`
	Value float64   `json:"value"`
}

// SeriesHistory is one series over a window.
type SeriesHistory struct {
	Series string            `json:"series"`
	Labels map[string]string `json:"labels"`
	Type   string            `json:"type"`
	First  float64           `json:"first"`
	Last   float64           `json:"last"`
	Min    float64           `json:"min"`
	Max    float64           `json:"max"`
	// Delta is Last - First; for counters, the increase over the window (a reset counts from 0).
	Delta float64 `json:"delta"`
	// Points are the samples in the window, thinned evenly to at most MaxWindowPoints.
	Points []Point `json:"points"`
}

// History is a window's answer.
type History struct {
	WindowSeconds int64 `json:"window_seconds"`
	// Available: the window is at least partly covered; CoveredSeconds says how much.
	Available      bool            `json:"available"`
	CoveredSeconds int64           `json:"covered_seconds"`
	Note           string          `json:"note,omitempty"`
	Series         []SeriesHistory `json:"series"`
}

// Query selects families: exactly one of Name and Prefix; Labels keeps only samples with those
// label values (e.g. sandbox_id).
type Query struct {
	Name   string
	Prefix string
	Labels map[string]string
	// Sandboxes is who may see what: a series labelled sandbox_id is kept only when it
	// reports true for that id (authz.SandboxPredicate, from the caller's principal); nil
	// keeps every series (an admin's).
	Sandboxes Visible
}

// Visible reports whether a caller may see a sandbox's series; nil: every sandbox's.
type Visible func(sandboxID string) bool

// SandboxLabel is the label that names a sandbox: the series that carry it are the sandbox's
// principal's (Visible decides); every other series is the host's or the fleet's.
const SandboxLabel = "sandbox_id"

// Keeps reports whether v lets a series with labels ls through: a series without SandboxLabel
// always, one with it when v allows its sandbox.
func (v Visible) Keeps(ls map[string]string) bool {
	if v == nil {
		return true
	}
	id, ok := ls[SandboxLabel]
	return !ok || v(id)
}

// Filter returns mfs without the series v hides (families left with none are dropped), for a
// Prometheus exposition (GET /metrics) made for one caller: the same rule as Current's. mfs is
// not modified; nil v returns mfs as is.
func Filter(mfs []*dto.MetricFamily, v Visible) []*dto.MetricFamily {
	if v == nil {
		return mfs
	}
	out := make([]*dto.MetricFamily, 0, len(mfs))
	for _, mf := range mfs {
		var kept []*dto.Metric
		hidden := false
		for _, m := range mf.GetMetric() {
			ls := map[string]string{}
			for _, lp := range m.GetLabel() {
				ls[lp.GetName()] = lp.GetValue()
			}
			if v.Keeps(ls) {
				kept = append(kept, m)
			} else {
				hidden = true
			}
		}
		switch {
		case !hidden:
			out = append(out, mf)
		case len(kept) > 0:
			c := &dto.MetricFamily{Name: mf.Name, Help: mf.Help, Type: mf.Type, Unit: mf.Unit, Metric: kept}
			out = append(out, c)
		}
	}
	return out
}

// Check validates q.
func (q Query) Check() error {
	switch {
	case q.Name != "" && q.Prefix != "":
		return errcode.New(errcode.InvalidArgument, "give name or prefix, not both")
	case len(q.Name) > MaxName || len(q.Prefix) > MaxName:
		return errcode.New(errcode.InvalidArgument, "name and prefix are at most %d characters", MaxName)
	}
	return nil
}

func (q Query) family(name string) bool {
	if q.Name != "" {
		return name == q.Name
	}
	return strings.HasPrefix(name, q.Prefix)
}

func (q Query) labels(ls map[string]string) bool {
	if !q.Sandboxes.Keeps(ls) {
		return false
	}
	for k, v := range q.Labels {
		if ls[k] != v {
			return false
		}
	}
	return true
}

// Source answers queries over one registry.
type Source struct {
	gather  GatherFunc
	sampled GatherFunc // what the history samples (default gather)

	mu      sync.Mutex
	started bool // Run is sampling (else there is no history at all)
	series  map[string]*ring
	dropped int64 // series not kept for lack of room
	oldest  time.Time
}

// New returns a Source over gather.
func New(gather GatherFunc) *Source {
	return &Source{gather: gather, sampled: gather, series: map[string]*ring{}}
}

// SampleFrom makes the history sample g instead (e.g. a registry without series too costly, or
// too intrusive, to read every Interval); it returns s.
func (s *Source) SampleFrom(g GatherFunc) *Source {
	s.sampled = g
	return s
}

// Current returns the families q selects (at most MaxSeries samples in all; truncated says
// more matched), sorted by name.
func (s *Source) Current(ctx context.Context, q Query) (fams []Family, truncated bool, err error) {
	if err := q.Check(); err != nil {
		return nil, false, err
	}
	mfs, err := s.gather(ctx)
	if err != nil && len(mfs) == 0 {
		return nil, false, errcode.Wrap(errcode.Internal, err, "gather the server's metrics: %v", err)
	}
	fams = []Family{}
	n := 0
	for _, mf := range mfs {
		if !q.family(mf.GetName()) {
			continue
		}
		f := Family{Name: mf.GetName(), Type: strings.ToLower(mf.GetType().String()), Help: mf.GetHelp(), Samples: []Sample{}}
		for _, sm := range samples(mf) {
			if !q.labels(sm.Labels) {
				continue
			}
			if n >= MaxSeries {
				truncated = true
				break
			}
			f.Samples = append(f.Samples, sm)
			n++
		}
		if len(f.Samples) > 0 || (len(q.Labels) == 0 && !truncated) {
			fams = append(fams, f)
		}
	}
	sort.Slice(fams, func(i, j int) bool { return fams[i].Name < fams[j].Name })
	return fams, truncated, nil
}

// samples flattens a family into its exposed series.
func samples(mf *dto.MetricFamily) []Sample {
	var out []Sample
	name := mf.GetName()
	for _, m := range mf.GetMetric() {
		ls := map[string]string{}
		for _, lp := range m.GetLabel() {
			ls[lp.GetName()] = lp.GetValue()
		}
		with := func(k, v string) map[string]string {
			c := make(map[string]string, len(ls)+1)
			for a, b := range ls {
				c[a] = b
			}
			c[k] = v
			return c
		}
		switch {
		case m.Counter != nil:
			out = append(out, Sample{name, ls, m.Counter.GetValue()})
		case m.Gauge != nil:
			out = append(out, Sample{name, ls, m.Gauge.GetValue()})
		case m.Untyped != nil:
			out = append(out, Sample{name, ls, m.Untyped.GetValue()})
		case m.Histogram != nil:
			h := m.Histogram
			for _, b := range h.GetBucket() {
				out = append(out, Sample{name + "_bucket", with("le", fmtFloat(b.GetUpperBound())), float64(b.GetCumulativeCount())})
			}
			out = append(out, Sample{name + "_bucket", with("le", "+Inf"), float64(h.GetSampleCount())},
				Sample{name + "_sum", ls, h.GetSampleSum()}, Sample{name + "_count", ls, float64(h.GetSampleCount())})
		case m.Summary != nil:
			sm := m.Summary
			for _, q := range sm.GetQuantile() {
				out = append(out, Sample{name, with("quantile", fmtFloat(q.GetQuantile())), q.GetValue()})
			}
			out = append(out, Sample{name + "_sum", ls, sm.GetSampleSum()}, Sample{name + "_count", ls, float64(sm.GetSampleCount())})
		}
	}
	for i := range out { // JSON has no NaN or infinities
		if math.IsNaN(out[i].Value) || math.IsInf(out[i].Value, 0) {
			out[i].Value = 0
		}
	}
	return out
}

func fmtFloat(f float64) string {
	if math.IsInf(f, 1) {
		return "+Inf"
	}
	return strconv.FormatFloat(f, 'g', -1, 64)
}

// ring is one series' recent points.
type ring struct {
	series, typ string
	labels      map[string]string
	pts         []Point // oldest first, at most maxPoints
}

// Run samples the counters and gauges every Interval until ctx ends.
func (s *Source) Run(ctx context.Context) {
	s.mu.Lock()
	s.started = true
	s.mu.Unlock()
	t := time.NewTicker(Interval)
	defer t.Stop()
	s.Sample(ctx, time.Now())
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			s.Sample(ctx, now)
		}
	}
}

// Sample records one sample of the counters and gauges at now (Run calls it every Interval).
func (s *Source) Sample(ctx context.Context, now time.Time) {
	gctx, cancel := context.WithTimeout(ctx, Interval)
	defer cancel()
	mfs, _ := s.sampled(gctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.started = true
	if s.oldest.IsZero() {
		s.oldest = now
	}
	seen := map[string]bool{}
	for _, mf := range mfs {
		typ := mf.GetType()
		if typ != dto.MetricType_COUNTER && typ != dto.MetricType_GAUGE && typ != dto.MetricType_UNTYPED {
			continue
		}
		for _, sm := range samples(mf) {
			k := key(sm.Series, sm.Labels)
			r := s.series[k]
			if r == nil {
				if len(s.series) >= maxHistorySeries {
					s.dropped++
					continue
				}
				r = &ring{series: sm.Series, typ: strings.ToLower(typ.String()), labels: sm.Labels}
				s.series[k] = r
			}
			seen[k] = true
			r.pts = append(r.pts, Point{now, sm.Value})
			if len(r.pts) > maxPoints {
				r.pts = append(r.pts[:0], r.pts[len(r.pts)-maxPoints:]...)
			}
		}
	}
	cut := now.Add(-Retention)
	for k, r := range s.series { // forget series with nothing left in the last hour
		if !seen[k] && len(r.pts) > 0 && r.pts[len(r.pts)-1].At.Before(cut) {
			delete(s.series, k)
		}
	}
	if s.oldest.Before(cut) {
		s.oldest = cut
	}
}

func key(series string, ls map[string]string) string {
	ks := make([]string, 0, len(ls))
	for k := range ls {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	var b strings.Builder
	b.WriteString(series)
	for _, k := range ks {
		fmt.Fprintf(&b, "\x00%s=%s", k, ls[k])
	}
	return b.String()
}

// Window answers a window of the last window from the history (at most MaxSeries series). A
// window the history does not cover at all is Available false with a Note saying why.
func (s *Source) Window(q Query, window time.Duration, now time.Time) (History, bool, error) {
	if err := q.Check(); err != nil {
		return History{}, false, err
	}
	if window <= 0 || window > Retention {
		return History{}, false, errcode.New(errcode.InvalidArgument, "window_seconds must be between 1 and %d (the history keeps the last hour, sampled every %s); got %d", int(Retention.Seconds()), Interval, int64(window.Seconds()))
	}
	h := History{WindowSeconds: int64(window.Seconds()), Series: []SeriesHistory{}}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.started || s.oldest.IsZero() {
		h.Note = "no history: this server keeps none (history is sampled by the agentbox server process; an `agentbox mcp` bridge to a remote server has current values only)"
		return h, false, nil
	}
	from := now.Add(-window)
	start := s.oldest
	if start.Before(from) {
		start = from
	}
	h.CoveredSeconds = max(0, int64(now.Sub(start).Seconds()))
	keys := make([]string, 0, len(s.series))
	for k, r := range s.series {
		if q.family(r.series) && q.labels(r.labels) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	truncated := false
	for _, k := range keys {
		r := s.series[k]
		var pts []Point
		for _, p := range r.pts {
			if !p.At.Before(from) {
				pts = append(pts, p)
			}
		}
		if len(pts) == 0 {
			continue
		}
		if len(h.Series) >= MaxSeries {
			truncated = true
			break
		}
		sh := SeriesHistory{Series: r.series, Labels: r.labels, Type: r.typ, First: pts[0].Value, Last: pts[len(pts)-1].Value, Min: pts[0].Value, Max: pts[0].Value}
		inc := 0.0
		for i, p := range pts {
			sh.Min, sh.Max = math.Min(sh.Min, p.Value), math.Max(sh.Max, p.Value)
			if i > 0 {
				d := p.Value - pts[i-1].Value
				if r.typ == "counter" && d < 0 {
					d = p.Value // a reset
				}
				inc += d
			}
		}
		sh.Delta = inc
		sh.Points = thin(pts, MaxWindowPoints)
		h.Series = append(h.Series, sh)
	}
	h.Available = len(h.Series) > 0 || h.CoveredSeconds > 0
	switch {
	case h.CoveredSeconds == 0:
		h.Available = false
		h.Note = "no history for this window yet: sampling started " + now.Sub(s.oldest).Round(time.Second).String() + " ago"
	case h.CoveredSeconds+int64(Interval.Seconds()) < h.WindowSeconds:
		h.Note = fmt.Sprintf("history covers only the last %d s of the %d s asked (sampling started then)", h.CoveredSeconds, h.WindowSeconds)
	}
	return h, truncated, nil
}

// thin keeps at most n points, evenly spaced, the last always kept.
func thin(pts []Point, n int) []Point {
	if len(pts) <= n {
		return pts
	}
	out := make([]Point, 0, n)
	for i := 0; i < n; i++ {
		out = append(out, pts[i*(len(pts)-1)/(n-1)])
	}
	return out
}
