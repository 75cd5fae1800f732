package sandbox

import (
	"context"
	"fmt"
	"time"
)

// Store is what the sandbox service needs of durable state. internal/store.Store (the full
// contract, with its shared test suite) includes it.
//
// Errors: GetSandbox of an unknown id returns errcode SANDBOX_NOT_FOUND; UpdateSandbox whose
// expected version does not match returns errcode CONFLICT.
type Store interface {
	// CreateSandbox inserts sb (Version must be 1) and a first event for it, atomically.
	CreateSandbox(ctx context.Context, sb Sandbox, ev Event) error
	// AdmitSandbox is CreateSandbox behind admission, in one transaction with the insert, so
	// that no two creates (of this process or of others on the same database) overshoot:
	//   - when sb.IdempotencyKey is set and a sandbox of sb.Owner already has that key, it
	//     writes nothing and returns that sandbox with created=false;
	//   - when sb, added to the live sandboxes of sb.Node, would exceed a bound of a, it writes
	//     nothing and returns an *OverCapacityError naming the bound.
	// Otherwise it inserts sb and ev and returns sb with created=true.
	AdmitSandbox(ctx context.Context, sb Sandbox, ev Event, a Admission) (existing Sandbox, created bool, err error)
	GetSandbox(ctx context.Context, id string) (Sandbox, error)
	// ListSandboxes returns matching sandboxes, oldest first, at most filter.Limit (or 1000).
	ListSandboxes(ctx context.Context, filter ListFilter) ([]Sandbox, error)
	// CountLive returns how many sandboxes are in a live state and the sums of their cpu,
	// memory_mb and disk_mb.
	CountLive(ctx context.Context) (Usage, error)
	// UpdateSandbox writes sb if the stored version equals sb.Version-1, appending ev (if
	// ev.To != "") in the same transaction.
	UpdateSandbox(ctx context.Context, sb Sandbox, ev Event) error
	// ListEvents returns events in sequence order, at most filter.Limit (or 1000).
	ListEvents(ctx context.Context, filter EventFilter) ([]Event, error)

	// AllocateIDRange records r as held by r.SandboxID, whose record must exist (else
	// SANDBOX_NOT_FOUND). It is a CONFLICT, and changes nothing, if that sandbox already holds a
	// range or r overlaps a range another sandbox holds: two sandboxes never share a host id,
	// whatever races between callers (or server processes on one database).
	AllocateIDRange(ctx context.Context, r IDRange) error
	// ReleaseIDRange frees the range sandboxID holds; it is nil if it holds none.
	ReleaseIDRange(ctx context.Context, sandboxID string) error
	// ListIDRanges returns every held range, lowest base first.
	ListIDRanges(ctx context.Context) ([]IDRange, error)

	// ImagesInUse returns the image digests (Sandbox.ImageDigest) of live sandboxes, each with
	// how many live sandboxes pin it; the host image ("") is never in it.
	ImagesInUse(ctx context.Context) (map[string]int, error)

	// The parts the service's features need: every one is required, so a driver that lacks
	// one does not compile (storetest is their shared suite).
	Pruner
	WakeAdmitter
	JobStore
	NetStore
	SnapshotStore
	PoolStore
}

// Pruner is the part of a Store that bounds its growth.
type Pruner interface {
	// PruneSandboxes deletes records (and their events, and any id range they still hold)
	// that reached a non-live state before the given time, returning how many sandboxes were
	// removed.
	PruneSandboxes(ctx context.Context, before time.Time) (int, error)
}

// Usage is what the live sandboxes (creating, running, stopping, sleeping) hold together.
// Sleeping ones count in Live and DiskMB, not in CPU and MemoryMB (State.HoldsCompute);
// Sleeping is how many of Live sleep.
type Usage struct {
	Live     int
	CPU      float64
	MemoryMB int64
	DiskMB   int64
	Sleeping int
}

// Admission bounds what one node holds: how many live sandboxes, and the sums of their cpu,
// memory_mb and disk_mb, the sandbox being admitted included. A zero field is unbounded.
type Admission struct {
	MaxLive  int
	CPU      float64
	MemoryMB int64
	DiskMB   int64
}

// OverCapacityError says which bound of an Admission a sandbox would exceed.
type OverCapacityError struct {
	// Resource is "sandboxes", "cpu", "memory_mb" or "disk_mb".
	Resource string
	// Used is what the node's live sandboxes hold now; Asked is the new sandbox's share (1 for
	// "sandboxes"); Limit is the bound.
	Used, Asked, Limit float64
}

func (e *OverCapacityError) Error() string {
	return fmt.Sprintf("%s: %g used + %g asked > %g allowed", e.Resource, e.Used, e.Asked, e.Limit)
}

// Check returns the bound of a that u plus sb would exceed, or nil.
func (a Admission) Check(u Usage, sb Sandbox) *OverCapacityError {
	switch {
	case a.MaxLive > 0 && u.Live+1 > a.MaxLive:
		return &OverCapacityError{"sandboxes", float64(u.Live), 1, float64(a.MaxLive)}
	case a.CPU > 0 && u.CPU+sb.CPU > a.CPU+1e-9:
		return &OverCapacityError{"cpu", u.CPU, sb.CPU, a.CPU}
	case a.MemoryMB > 0 && u.MemoryMB+sb.MemoryMB > a.MemoryMB:
		return &OverCapacityError{"memory_mb", float64(u.MemoryMB), float64(sb.MemoryMB), float64(a.MemoryMB)}
	case a.DiskMB > 0 && u.DiskMB+sb.DiskMB > a.DiskMB:
		return &OverCapacityError{"disk_mb", float64(u.DiskMB), float64(sb.DiskMB), float64(a.DiskMB)}
	}
	return nil
}
