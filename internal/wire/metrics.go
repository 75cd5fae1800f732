package wire

import (
	"time"
)

// SandboxMetrics is one sample of a sandbox's resource use (runtime.Metrics) with the sandbox's
// identity and its CPU use as a percentage of its limit since the previous sample.
type SandboxMetrics struct {
	SandboxID string `json:"sandbox_id"`
	State     State  `json:"state"`
	Runtime   string `json:"runtime"`
	Metrics
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

// Metrics is one sample of a sandbox's resource use. Limits of 0 mean unlimited.
type Metrics struct {
	SampledAt time.Time      `json:"sampled_at"`
	CPU       *CPUMetrics    `json:"cpu,omitempty"`
	Memory    *MemoryMetrics `json:"memory,omitempty"`
	Pids      *PidsMetrics   `json:"pids,omitempty"`
	Disk      *DiskMetrics   `json:"disk,omitempty"`
	// Unsupported names the groups (cpu, memory, pids, disk) the runtime cannot measure.
	Unsupported []string `json:"unsupported,omitempty"`
}

// CPUMetrics is CPU time used since the sandbox started and its limit.
type CPUMetrics struct {
	UsageSeconds float64 `json:"usage_seconds"`
	LimitCores   float64 `json:"limit_cores"` // 0: unlimited
}

// MemoryMetrics is memory in use (without reclaimable page cache), the limit, the page cache,
// and how many times the kernel's OOM killer killed a process of the sandbox.
type MemoryMetrics struct {
	UsedBytes  int64 `json:"used_bytes"`
	LimitBytes int64 `json:"limit_bytes"` // 0: unlimited
	CacheBytes int64 `json:"cache_bytes"`
	OOMEvents  int64 `json:"oom_events"`
}

// PidsMetrics is how many tasks (processes and threads) the sandbox holds and its limit.
type PidsMetrics struct {
	Current int64 `json:"current"`
	Limit   int64 `json:"limit"` // 0: unlimited
}

// DiskMetrics is the space used on the sandbox's own disk and its size.
type DiskMetrics struct {
	UsedBytes  int64 `json:"used_bytes"`
	TotalBytes int64 `json:"total_bytes"` // 0: not bounded by the runtime
}
