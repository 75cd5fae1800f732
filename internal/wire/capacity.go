package wire

import (
	"time"
)

// Capacity is how much of the server's bounds is used.
type Capacity struct {
	MaxSandboxes   int     `json:"max_sandboxes"`
	Live           int     `json:"live"`
	Free           int     `json:"free"`
	CPUBudget      float64 `json:"cpu_budget"`
	CPUUsed        float64 `json:"cpu_used"`
	MemoryBudgetMB int64   `json:"memory_budget_mb"`
	MemoryUsedMB   int64   `json:"memory_used_mb"`
	DiskBudgetMB   int64   `json:"disk_budget_mb"`
	DiskUsedMB     int64   `json:"disk_used_mb"`
	// Sleeping is how many of Live sleep: they count against the live bound and the disk
	// budget, not the CPU and memory budgets.
	Sleeping int `json:"sleeping"`
	// Overcommit is how far the budgets let limits exceed the host (1: hard reservations).
	Overcommit float64 `json:"overcommit,omitempty"`
	// What the host really has free now, and what admission keeps for it.
	MemoryAvailableMB int64 `json:"host_memory_available_mb,omitempty"`
	MemoryReserveMB   int64 `json:"host_memory_reserve_mb,omitempty"`
	DiskFreeMB        int64 `json:"host_disk_free_mb,omitempty"`
	DiskReserveMB     int64 `json:"host_disk_reserve_mb,omitempty"`
	// Pools are the warm pools: target size, ready, hits and misses (pooled sandboxes count in
	// Live and the budgets like any other); MaxPooled bounds their sizes' sum.
	Pools     []PoolStatus `json:"pools,omitempty"`
	MaxPooled int          `json:"max_pooled,omitempty"`
}

// Pool is a warm pool's configuration: its name, the shape of the sandboxes it holds and how
// many it keeps ready.
type Pool struct {
	Name     string  `json:"name"`
	Image    string  `json:"image"`
	Runtime  string  `json:"runtime"`
	CPU      float64 `json:"cpu"`
	MemoryMB int64   `json:"memory_mb"`
	DiskMB   int64   `json:"disk_mb"`
	// Network is "none" (the default) or "egress": a pool of egress sandboxes holds them with
	// the egress plumbing up and a policy that allows nothing; a create with any network
	// policy (and secrets) claims one, and its policy and secrets apply at the claim.
	Network string `json:"network"`
	// Size is how many ready sandboxes the pool keeps (0 keeps none: the pool is parked).
	Size      int       `json:"size"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// PoolStatus is a pool with what it holds now and how creates of its shape fared since the
// server started.
type PoolStatus struct {
	Pool
	// Ready is how many running sandboxes the pool holds; Starting how many are being created.
	Ready    int `json:"ready"`
	Starting int `json:"starting"`
	// Hits counts creates of the pool's shape that claimed a ready sandbox; Misses those that
	// found none ready and started one (both since this server started).
	Hits   int64 `json:"hits"`
	Misses int64 `json:"misses"`
	// LastError is why the last refill failed, while refills keep failing ("" otherwise).
	LastError string `json:"last_error,omitempty"`
}
