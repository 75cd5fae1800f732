package sandbox

import (
	"context"
	"errors"
	goruntime "runtime"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/runtime"
)

// Observer is told how long the service's calls take, for a metrics exporter (Prometheus in
// internal/api) without this package importing one. Its methods must be cheap and must not
// block. Outcome is "ok" or the error's errcode code.
type Observer interface {
	ObserveCreate(runtime, outcome string, d time.Duration)
	ObserveExec(runtime, outcome string, d time.Duration)
}

func outcome(err error) string {
	if err == nil {
		return "ok"
	}
	return string(errcode.Of(err))
}

// SandboxMetrics is one sample of a sandbox's resource use (runtime.Metrics) with the sandbox's
// identity and its CPU use as a percentage of its limit since the previous sample.
type SandboxMetrics struct {
	SandboxID string `json:"sandbox_id"`
	State     State  `json:"state"`
	Runtime   string `json:"runtime"`
	runtime.Metrics
	// CPUPercent is the CPU time used between the previous sample of this sandbox (taken by
	// any caller of this server) and this one, as a percentage of its CPU limit (of the host's
	// CPUs when unlimited). It is absent on a sandbox's first sample and when the runtime does
	// not measure CPU; CPUPercentWindowSeconds is the time between the two samples.
	CPUPercent              *float64 `json:"cpu_percent,omitempty"`
	CPUPercentWindowSeconds float64  `json:"cpu_percent_window_seconds,omitempty"`
	// MemoryPercent is memory used as a percentage of its limit (absent when unlimited).
	MemoryPercent *float64 `json:"memory_percent,omitempty"`
	// ExpiresAt is when the sandbox's TTL ends.
	ExpiresAt time.Time `json:"expires_at"`
	// RunningJobs is how many of its jobs are starting or running as their records say (set by
	// FleetMetrics from one store query; absent when the job records could not be read).
	RunningJobs *int `json:"running_jobs,omitempty"`
}

// cpuSample is what CPUPercent needs of a sandbox's previous sample.
type cpuSample struct {
	usage float64
	at    time.Time
}

// cpuSamples keeps the latest CPU sample of each sandbox sampled. It never holds more than
// bound entries: past it, the least recently sampled goes first (a destroyed sandbox's entry is
// dropped when it is destroyed; live sandboxes are at most MaxSandboxes).
type cpuSamples struct {
	mu    sync.Mutex
	bound int
	m     map[string]cpuSample
}

// swap records cur for id and returns the previous sample.
func (c *cpuSamples) swap(id string, cur cpuSample) (cpuSample, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]cpuSample{}
	}
	prev, ok := c.m[id]
	c.m[id] = cur
	for len(c.m) > c.bound {
		oldest, at := "", time.Time{}
		for k, v := range c.m {
			if oldest == "" || v.at.Before(at) {
				oldest, at = k, v.at
			}
		}
		delete(c.m, oldest)
	}
	return prev, ok
}

func (c *cpuSamples) drop(id string) {
	c.mu.Lock()
	delete(c.m, id)
	c.mu.Unlock()
}

func (c *cpuSamples) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.m)
}

// Metrics samples one running sandbox's resource use. A sandbox that is not running is
// SANDBOX_NOT_RUNNING; a runtime that cannot measure anything is UNSUPPORTED_OPERATION.
func (s *Service) Metrics(ctx context.Context, id string) (SandboxMetrics, error) {
	if err := checkID(id); err != nil {
		return SandboxMetrics{}, err
	}
	sb, err := s.store.GetSandbox(ctx, id)
	if err != nil {
		return SandboxMetrics{}, err
	}
	return s.sample(ctx, sb)
}

func (s *Service) sample(ctx context.Context, sb Sandbox) (SandboxMetrics, error) {
	if sb.State != StateRunning {
		return SandboxMetrics{}, errcode.New(errcode.SandboxNotRunning, "sandbox %s is %s; only a running sandbox has metrics", sb.ID, sb.State).With("state", string(sb.State))
	}
	rt, err := s.runtimeOf(sb)
	if err != nil {
		return SandboxMetrics{}, err
	}
	mr, ok := rt.(runtime.MetricsReader)
	if !ok {
		return SandboxMetrics{}, errcode.New(errcode.UnsupportedOp, "runtime %s does not report sandbox metrics", sb.Runtime)
	}
	m, err := mr.Metrics(ctx, sb.ID)
	if err != nil {
		return SandboxMetrics{}, err
	}
	out := SandboxMetrics{SandboxID: sb.ID, State: sb.State, Runtime: sb.Runtime, Metrics: m, ExpiresAt: sb.ExpiresAt}
	if m.CPU != nil {
		prev, ok := s.cpu.swap(sb.ID, cpuSample{usage: m.CPU.UsageSeconds, at: m.SampledAt})
		if ok && m.SampledAt.After(prev.at) && m.CPU.UsageSeconds >= prev.usage {
			window := m.SampledAt.Sub(prev.at).Seconds()
			limit := m.CPU.LimitCores
			if limit <= 0 {
				limit = float64(goruntime.NumCPU())
			}
			pct := (m.CPU.UsageSeconds - prev.usage) / window / limit * 100
			out.CPUPercent, out.CPUPercentWindowSeconds = &pct, window
		}
	}
	if m.Memory != nil && m.Memory.LimitBytes > 0 {
		pct := float64(m.Memory.UsedBytes) / float64(m.Memory.LimitBytes) * 100
		out.MemoryPercent = &pct
	}
	return out, nil
}

// FleetMetricsConcurrency bounds how many sandboxes FleetMetrics samples at once.
const FleetMetricsConcurrency = 16

// FleetMetrics is one sample of every running sandbox (at most MaxList), sampled concurrently
// (at most FleetMetricsConcurrency at a time), sorted by id. A sandbox whose sample fails is left
// out and counted in Failed (one that stopped meanwhile, a runtime without metrics).
type FleetMetrics struct {
	Sandboxes []SandboxMetrics `json:"sandboxes"`
	// Failed counts running sandboxes whose sample failed; Errors has up to 10 of their ids
	// and reasons.
	Failed int               `json:"failed"`
	Errors map[string]string `json:"errors,omitempty"`
	// Took is how long the sampling took.
	TookSeconds float64 `json:"took_seconds"`
}

// FleetMetrics samples every running sandbox.
func (s *Service) FleetMetrics(ctx context.Context) (FleetMetrics, error) {
	sbs, err := s.store.ListSandboxes(ctx, ListFilter{States: []State{StateRunning}, Limit: MaxList})
	if err != nil {
		return FleetMetrics{}, err
	}
	return s.SampleSandboxes(ctx, sbs)
}

// SampleSandboxes is FleetMetrics of the running sandboxes among sbs (records the caller has
// just listed; at most MaxList are sampled).
func (s *Service) SampleSandboxes(ctx context.Context, sbs []Sandbox) (FleetMetrics, error) {
	began := time.Now()
	sbs = slices.DeleteFunc(slices.Clone(sbs), func(sb Sandbox) bool { return sb.State != StateRunning })
	if len(sbs) > MaxList {
		sbs = sbs[:MaxList]
	}
	out := FleetMetrics{Sandboxes: make([]SandboxMetrics, 0, len(sbs))}
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, FleetMetricsConcurrency)
	for _, sb := range sbs {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			wg.Wait()
			return FleetMetrics{}, ctx.Err()
		}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			m, err := s.sample(ctx, sb)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				out.Failed++
				if out.Errors == nil {
					out.Errors = map[string]string{}
				}
				if len(out.Errors) < 10 {
					out.Errors[sb.ID] = errcode.Message(err)
				}
				return
			}
			out.Sandboxes = append(out.Sandboxes, m)
		}()
	}
	wg.Wait()
	if err := ctx.Err(); err != nil && !errors.Is(err, context.Canceled) {
		return FleetMetrics{}, err
	}
	if active, err := s.store.ActiveJobsBySandbox(ctx); err == nil {
		for i := range out.Sandboxes {
			n := active[out.Sandboxes[i].SandboxID]
			out.Sandboxes[i].RunningJobs = &n
		}
	} else {
		s.log.Warn("cannot count running jobs for the fleet's metrics", "err", err)
	}
	sort.Slice(out.Sandboxes, func(i, j int) bool { return out.Sandboxes[i].SandboxID < out.Sandboxes[j].SandboxID })
	out.TookSeconds = time.Since(began).Seconds()
	return out, nil
}
