package sandbox

import (
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

// FleetMetrics is one sample of every running sandbox (at most MaxList), sampled concurrently
// (at most metrics.FleetConcurrency at a time), sorted by id. A sandbox whose sample fails is left
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
