// Package metrics samples sandboxes' resource use (sandbox_metrics, GET /v1/fleet/metrics, the
// Prometheus collector): a feature over the sandbox lifecycle core, which it reaches through its
// sandbox.Core handle; it keeps each sandbox's previous CPU sample, for a CPU percentage.
package metrics

import (
	"context"
	"errors"
	"log/slog"
	goruntime "runtime"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/sandboxid"
)

// Store is what metrics read of durable state (sandbox.Store includes it).
type Store interface {
	GetSandbox(ctx context.Context, id string) (sandbox.Sandbox, error)
	// ListSandboxes returns matching sandboxes, oldest first, at most filter.Limit.
	ListSandboxes(ctx context.Context, filter sandbox.ListFilter) ([]sandbox.Sandbox, error)
	// ActiveJobsBySandbox returns how many starting or running job records each sandbox has.
	ActiveJobsBySandbox(ctx context.Context) (map[string]int, error)
}

// Service samples sandboxes' resource use. It is safe for concurrent use.
type Service struct {
	core  *sandbox.Core
	store Store
	log   *slog.Logger
	cpu   cpuSamples // each sandbox's previous CPU sample, for SandboxMetrics.CPUPercent
}

// New returns the metrics feature over core, reading st, and registers its hook (a sandbox
// whose agent connection is released loses its CPU sample).
func New(core *sandbox.Core, st Store) *Service {
	s := &Service{core: core, store: st, log: core.Log(), cpu: cpuSamples{bound: core.Config().MaxSandboxes}}
	core.Register(sandbox.Hooks{Name: "metrics", Released: s.cpu.drop})
	return s
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
func (s *Service) Metrics(ctx context.Context, id string) (sandbox.SandboxMetrics, error) {
	if err := sandboxid.Check(id); err != nil {
		return sandbox.SandboxMetrics{}, err
	}
	sb, err := s.store.GetSandbox(ctx, id)
	if err != nil {
		return sandbox.SandboxMetrics{}, err
	}
	return s.sample(ctx, sb)
}

func (s *Service) sample(ctx context.Context, sb sandbox.Sandbox) (sandbox.SandboxMetrics, error) {
	if sb.State != sandbox.StateRunning {
		return sandbox.SandboxMetrics{}, errcode.New(errcode.SandboxNotRunning, "sandbox %s is %s; only a running sandbox has metrics", sb.ID, sb.State).With("state", string(sb.State))
	}
	rt, err := s.core.RuntimeOf(sb)
	if err != nil {
		return sandbox.SandboxMetrics{}, err
	}
	mr, ok := rt.(runtime.MetricsReader)
	if !ok {
		return sandbox.SandboxMetrics{}, errcode.New(errcode.UnsupportedOp, "runtime %s does not report sandbox metrics", sb.Runtime)
	}
	m, err := mr.Metrics(ctx, sb.ID)
	if err != nil {
		return sandbox.SandboxMetrics{}, err
	}
	out := sandbox.SandboxMetrics{SandboxID: sb.ID, State: sb.State, Runtime: sb.Runtime, Metrics: m, ExpiresAt: sb.ExpiresAt}
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

// FleetConcurrency bounds how many sandboxes FleetMetrics samples at once.
const FleetConcurrency = 16

// FleetMetrics samples every running sandbox.
func (s *Service) FleetMetrics(ctx context.Context) (sandbox.FleetMetrics, error) {
	sbs, err := s.store.ListSandboxes(ctx, sandbox.ListFilter{States: []sandbox.State{sandbox.StateRunning}, Limit: sandbox.MaxList})
	if err != nil {
		return sandbox.FleetMetrics{}, err
	}
	return s.SampleSandboxes(ctx, sbs)
}

// SampleSandboxes is FleetMetrics of the running sandboxes among sbs (records the caller has
// just listed; at most sandbox.MaxList are sampled).
func (s *Service) SampleSandboxes(ctx context.Context, sbs []sandbox.Sandbox) (sandbox.FleetMetrics, error) {
	began := time.Now()
	sbs = slices.DeleteFunc(slices.Clone(sbs), func(sb sandbox.Sandbox) bool { return sb.State != sandbox.StateRunning })
	if len(sbs) > sandbox.MaxList {
		sbs = sbs[:sandbox.MaxList]
	}
	out := sandbox.FleetMetrics{Sandboxes: make([]sandbox.SandboxMetrics, 0, len(sbs))}
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, FleetConcurrency)
	for _, sb := range sbs {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			wg.Wait()
			return sandbox.FleetMetrics{}, ctx.Err()
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
		return sandbox.FleetMetrics{}, err
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
