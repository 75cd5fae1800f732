package api

import (
	"bufio"
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"

	"github.com/agentbox/agentbox/internal/metricsnap"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/sandbox/metrics"
	"github.com/agentbox/agentbox/internal/sandbox/pools"
)

// JobCounter reports how many jobs are in each state (running, exited, killed, canceled,
// unknown), for agentbox_jobs. The jobs service implements it; nil leaves the series out.
type JobCounter interface {
	JobsByState(ctx context.Context) (map[string]int, error)
}

// collectTimeout bounds what one scrape waits for the store and the sandboxes' samples.
const collectTimeout = 10 * time.Second

// Prometheus is the server's Prometheus exporter, served at GET /metrics behind the token. It is
// a sandbox.Observer (create and exec latency, observed in the service so that REST and MCP
// calls both count) and a collector that reads the store and samples live sandboxes at scrape
// time (so a destroyed sandbox's series are gone at the next scrape). Series are listed in
// README.md ("Prometheus metrics").
type Prometheus struct {
	reg      *prometheus.Registry
	httpReqs *prometheus.CounterVec
	httpDur  *prometheus.HistogramVec
	create   *prometheus.HistogramVec
	exec     *prometheus.HistogramVec
	// lease is 1 while this replica holds its node's lifecycle lease (ObserveLease).
	lease prometheus.Gauge
	// hist is the registry fetch_metrics' history samples: the same series but the
	// per-sandbox ones, whose sampling would move every caller's cpu_percent window.
	hist *prometheus.Registry

	once sync.Once
}

var (
	_ sandbox.Observer = (*Prometheus)(nil)
)

// NewPrometheus returns an exporter; pass it as sandbox.Config.Observer and Options.Prometheus.
func NewPrometheus() *Prometheus {
	p := &Prometheus{reg: prometheus.NewRegistry()}
	p.httpReqs = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "agentbox_http_requests_total",
		Help: "HTTP requests by route (the ServeMux pattern; \"unmatched\" for none) and status code.",
	}, []string{"route", "code"})
	p.httpDur = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "agentbox_http_request_duration_seconds",
		Help:    "HTTP request latency by route (the ServeMux pattern) and status code, until the handler returned.",
		Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
	}, []string{"route", "code"})
	p.create = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "agentbox_sandbox_create_duration_seconds",
		Help:    "Sandbox create latency (request to agent answering) by runtime and outcome (ok or the error code).",
		Buckets: []float64{.05, .1, .25, .5, 1, 2, 4, 8, 15, 30, 60},
	}, []string{"runtime", "outcome"})
	p.exec = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "agentbox_exec_duration_seconds",
		Help:    "Exec latency (request to the command's end) by runtime and outcome (ok, a non-zero exit included, or the error code).",
		Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 10, 60, 300},
	}, []string{"runtime", "outcome"})
	p.lease = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "agentbox_lifecycle_lease_held",
		Help: "1 while this replica holds its node's lifecycle lease and so runs the node's lifecycle work (TTLs, reconcile, pool refill, run workers); 0 otherwise.",
	})
	p.reg.MustRegister(p.httpReqs, p.httpDur, p.create, p.exec, p.lease)
	p.hist = prometheus.NewRegistry()
	p.hist.MustRegister(p.httpReqs, p.httpDur, p.create, p.exec, p.lease)
	return p
}

// ObserveLease records whether this replica holds its node's lifecycle lease
// (lease.Config.OnChange).
func (p *Prometheus) ObserveLease(held bool) {
	v := 0.0
	if held {
		v = 1
	}
	p.lease.Set(v)
}

// ObserveCreate records one create.
func (p *Prometheus) ObserveCreate(runtime, outcome string, d time.Duration) {
	p.create.WithLabelValues(runtime, outcome).Observe(d.Seconds())
}

// ObserveExec records one exec.
func (p *Prometheus) ObserveExec(runtime, outcome string, d time.Duration) {
	p.exec.WithLabelValues(runtime, outcome).Observe(d.Seconds())
}

// attach registers the collector of svc's state (once: one exporter serves one service).
func (p *Prometheus) attach(svc *sandbox.Service, m *metrics.Service, pl *pools.Service, jobs JobCounter, log *slog.Logger) {
	p.once.Do(func() {
		p.reg.MustRegister(&stateCollector{svc: svc, samples: m, jobs: jobs, log: log})
		p.hist.MustRegister(&stateCollector{svc: svc, samples: m, jobs: jobs, log: log, noSandboxes: true})
		if pl != nil {
			p.reg.MustRegister(poolCollector{pl}) // warm pools (prometheus_pools.go)
			p.hist.MustRegister(poolCollector{pl})
		}
	})
}

// Attach registers the collector of svc's state (the sandboxes, capacity and per-sandbox
// series, sampled by m; the warm pools of svc's core) without a REST server: `agentbox mcp` in
// process, for fetch_metrics. api.New does it itself; once is all it takes.
func (p *Prometheus) Attach(svc *sandbox.Service, m *metrics.Service, jobs JobCounter, log *slog.Logger) {
	p.attach(svc, m, pools.New(svc.Core(), svc.Core().Store()), jobs, log)
}

// Gatherer is the registry, for fetch_metrics: what GET /metrics serves.
func (p *Prometheus) Gatherer() prometheus.Gatherer { return p.reg }

// HistoryGatherer is what fetch_metrics' history samples every 10 s: every series but the
// per-sandbox ones (sampling sandboxes that often would shorten cpu_percent's window for every
// other caller).
func (p *Prometheus) HistoryGatherer() prometheus.Gatherer { return p.hist }

// handler serves the registry in the text exposition format, as the caller may see it: visible
// is the caller's predicate on sandbox_id (authz.SandboxPredicate; nil: every series), applied
// by metricsnap.Filter as fetch_metrics applies it.
func (p *Prometheus) handler(log *slog.Logger, visible func(ctx context.Context) (metricsnap.Visible, error)) http.Handler {
	opts := promhttp.HandlerOpts{ErrorLog: slogPromLogger{log}, ErrorHandling: promhttp.ContinueOnError, Timeout: collectTimeout + 5*time.Second}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v, err := visible(r.Context())
		if err != nil {
			http.Error(w, "cannot decide which sandboxes' series to show: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		g := prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
			mfs, err := p.reg.Gather()
			return metricsnap.Filter(mfs, v), err
		})
		promhttp.HandlerFor(g, opts).ServeHTTP(w, r)
	})
}

// observeHTTP records one request under its route pattern.
func (p *Prometheus) observeHTTP(route string, code int, d time.Duration) {
	if route == "" {
		route = "unmatched"
	}
	c := strconv.Itoa(code)
	p.httpReqs.WithLabelValues(route, c).Inc()
	p.httpDur.WithLabelValues(route, c).Observe(d.Seconds())
}

type slogPromLogger struct{ log *slog.Logger }

func (l slogPromLogger) Println(v ...any) { l.log.Warn("prometheus", "err", v) }

// statusRecorder remembers a response's status for the request metrics. It keeps what handlers
// use of the ResponseWriter: Flush (streamed exec, SSE), Hijack (WebSockets) and Unwrap (for
// http.ResponseController).
type statusRecorder struct {
	http.ResponseWriter
	code int
}

func (w *statusRecorder) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusRecorder) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusRecorder) Flush() {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

func (w *statusRecorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	if w.code == 0 {
		w.code = http.StatusSwitchingProtocols
	}
	return http.NewResponseController(w.ResponseWriter).Hijack()
}

func (w *statusRecorder) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *statusRecorder) status() int {
	if w.code == 0 {
		return http.StatusOK
	}
	return w.code
}

// Per-sandbox and fleet series, read at scrape time.
var (
	descSandboxes = prometheus.NewDesc("agentbox_sandboxes", "Sandboxes that are not destroyed, by state and runtime.", []string{"state", "runtime"}, nil)

	descCapSandboxesUsed  = prometheus.NewDesc("agentbox_capacity_sandboxes_used", "Live sandboxes.", nil, nil)
	descCapSandboxesLimit = prometheus.NewDesc("agentbox_capacity_sandboxes_limit", "Most live sandboxes the server admits.", nil, nil)
	descCapCPUUsed        = prometheus.NewDesc("agentbox_capacity_cpu_cores_used", "Sum of live sandboxes' CPU limits, in cores.", nil, nil)
	descCapCPULimit       = prometheus.NewDesc("agentbox_capacity_cpu_cores_limit", "CPU budget in cores (0: unbounded).", nil, nil)
	descCapMemUsed        = prometheus.NewDesc("agentbox_capacity_memory_bytes_used", "Sum of live sandboxes' memory limits.", nil, nil)
	descCapMemLimit       = prometheus.NewDesc("agentbox_capacity_memory_bytes_limit", "Memory budget (0: unbounded).", nil, nil)
	descCapDiskUsed       = prometheus.NewDesc("agentbox_capacity_disk_bytes_used", "Sum of live sandboxes' disk sizes.", nil, nil)
	descCapDiskLimit      = prometheus.NewDesc("agentbox_capacity_disk_bytes_limit", "Disk budget (0: unbounded).", nil, nil)

	sbLabels           = []string{"sandbox_id", "runtime"}
	descSbCPU          = prometheus.NewDesc("agentbox_sandbox_cpu_seconds_total", "CPU time a running sandbox has used (its cgroup's).", sbLabels, nil)
	descSbCPULimit     = prometheus.NewDesc("agentbox_sandbox_cpu_limit_cores", "A running sandbox's CPU limit in cores (0: unlimited).", sbLabels, nil)
	descSbMem          = prometheus.NewDesc("agentbox_sandbox_memory_used_bytes", "Memory a running sandbox uses, without reclaimable page cache.", sbLabels, nil)
	descSbMemLimit     = prometheus.NewDesc("agentbox_sandbox_memory_limit_bytes", "A running sandbox's memory limit (0: unlimited).", sbLabels, nil)
	descSbMemCache     = prometheus.NewDesc("agentbox_sandbox_memory_cache_bytes", "Page cache charged to a running sandbox.", sbLabels, nil)
	descSbOOM          = prometheus.NewDesc("agentbox_sandbox_oom_kills_total", "Processes of a running sandbox the kernel's OOM killer killed.", sbLabels, nil)
	descSbPids         = prometheus.NewDesc("agentbox_sandbox_pids", "Tasks (processes and threads) of a running sandbox.", sbLabels, nil)
	descSbPidsLimit    = prometheus.NewDesc("agentbox_sandbox_pids_limit", "A running sandbox's task limit (0: unlimited).", sbLabels, nil)
	descSbDisk         = prometheus.NewDesc("agentbox_sandbox_disk_used_bytes", "Space used on a running sandbox's disk.", sbLabels, nil)
	descSbDiskTotal    = prometheus.NewDesc("agentbox_sandbox_disk_total_bytes", "Size of a running sandbox's disk (0: not bounded by its runtime).", sbLabels, nil)
	descSampleDuration = prometheus.NewDesc("agentbox_sandbox_metrics_collect_duration_seconds", "How long this scrape took to sample every running sandbox.", nil, nil)
	descSampleFailures = prometheus.NewDesc("agentbox_sandbox_metrics_collect_failures", "Running sandboxes this scrape could not sample (stopped meanwhile, or a runtime without metrics).", nil, nil)
	descJobs           = prometheus.NewDesc("agentbox_jobs", "Jobs by state.", []string{"state"}, nil)
)

// stateCollector reads the store and samples the live sandboxes at every scrape. The
// per-sandbox series are bounded by the live bound (MaxSandboxes) and vanish with the sandbox.
type stateCollector struct {
	svc     *sandbox.Service
	samples *metrics.Service
	jobs    JobCounter
	log     *slog.Logger
	// noSandboxes leaves out the running sandboxes' samples (HistoryGatherer).
	noSandboxes bool
}

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descSandboxes, descCapSandboxesUsed, descCapSandboxesLimit, descCapCPUUsed, descCapCPULimit,
		descCapMemUsed, descCapMemLimit, descCapDiskUsed, descCapDiskLimit, descSbCPU, descSbCPULimit, descSbMem, descSbMemLimit,
		descSbMemCache, descSbOOM, descSbPids, descSbPidsLimit, descSbDisk, descSbDiskTotal, descSampleDuration, descSampleFailures, descJobs} {
		ch <- d
	}
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), collectTimeout)
	defer cancel()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, labels...)
	}
	sbs, err := c.svc.List(ctx, sandbox.ListFilter{})
	if err != nil {
		ch <- prometheus.NewInvalidMetric(descSandboxes, err)
		return
	}
	type key struct{ state, runtime string }
	counts := map[key]int{}
	for _, sb := range sbs {
		counts[key{string(sb.State), sb.Runtime}]++
	}
	for k, n := range counts {
		gauge(descSandboxes, float64(n), k.state, k.runtime)
	}
	// The running ones' samples are the slow part: they run while the store is read again.
	type fleetResult struct {
		m   sandbox.FleetMetrics
		err error
	}
	fleetCh := make(chan fleetResult, 1)
	go func() {
		if c.noSandboxes {
			fleetCh <- fleetResult{}
			return
		}
		m, err := c.samples.SampleSandboxes(ctx, sbs)
		fleetCh <- fleetResult{m, err}
	}()
	if cp, err := c.svc.Capacity(ctx); err == nil {
		gauge(descCapSandboxesUsed, float64(cp.Live))
		gauge(descCapSandboxesLimit, float64(cp.MaxSandboxes))
		gauge(descCapCPUUsed, cp.CPUUsed)
		gauge(descCapCPULimit, cp.CPUBudget)
		gauge(descCapMemUsed, float64(cp.MemoryUsedMB<<20))
		gauge(descCapMemLimit, float64(cp.MemoryBudgetMB<<20))
		gauge(descCapDiskUsed, float64(cp.DiskUsedMB<<20))
		gauge(descCapDiskLimit, float64(cp.DiskBudgetMB<<20))
	} else {
		ch <- prometheus.NewInvalidMetric(descCapSandboxesUsed, err)
	}
	if c.jobs != nil {
		if byState, err := c.jobs.JobsByState(ctx); err == nil {
			for st, n := range byState {
				gauge(descJobs, float64(n), st)
			}
		} else {
			ch <- prometheus.NewInvalidMetric(descJobs, err)
		}
	}
	fr := <-fleetCh
	if c.noSandboxes {
		return
	}
	if fr.err != nil {
		if !errors.Is(fr.err, context.Canceled) {
			c.log.Warn("prometheus: cannot sample the sandboxes", "err", fr.err)
		}
		ch <- prometheus.NewInvalidMetric(descSampleDuration, fr.err)
		return
	}
	gauge(descSampleDuration, fr.m.TookSeconds)
	gauge(descSampleFailures, float64(fr.m.Failed))
	for _, m := range fr.m.Sandboxes {
		l := []string{m.SandboxID, m.Runtime}
		if m.CPU != nil {
			counter(descSbCPU, m.CPU.UsageSeconds, l...)
			gauge(descSbCPULimit, m.CPU.LimitCores, l...)
		}
		if m.Memory != nil {
			gauge(descSbMem, float64(m.Memory.UsedBytes), l...)
			gauge(descSbMemLimit, float64(m.Memory.LimitBytes), l...)
			gauge(descSbMemCache, float64(m.Memory.CacheBytes), l...)
			counter(descSbOOM, float64(m.Memory.OOMEvents), l...)
		}
		if m.Pids != nil {
			gauge(descSbPids, float64(m.Pids.Current), l...)
			gauge(descSbPidsLimit, float64(m.Pids.Limit), l...)
		}
		if m.Disk != nil {
			gauge(descSbDisk, float64(m.Disk.UsedBytes), l...)
			gauge(descSbDiskTotal, float64(m.Disk.TotalBytes), l...)
		}
	}
}
