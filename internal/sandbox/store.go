package sandbox

import (
	"context"
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
}

// Pruner is the optional part of a Store that bounds its growth.
type Pruner interface {
	// PruneSandboxes deletes records (and their events, and any id range they still hold)
	// that reached a non-live state before the given time, returning how many sandboxes were
	// removed.
	PruneSandboxes(ctx context.Context, before time.Time) (int, error)
}

// Usage is what the live sandboxes (creating, running, stopping) hold together.
type Usage struct {
	Live     int
	CPU      float64
	MemoryMB int64
	DiskMB   int64
}
