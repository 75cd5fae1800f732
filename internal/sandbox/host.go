package sandbox

import (
	"context"
	"fmt"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/text"
)

// LocalNode names the machine a server runs on, the node of every sandbox it makes itself.
const LocalNode = "local"

// Headroom is what a host really has free now.
type Headroom struct {
	MemoryAvailableMB int64 // MemAvailable of /proc/meminfo
	DiskFreeMB        int64 // free space of the file system holding sandboxes' disks
}

// host is what one machine gives sandboxes: its runtimes, its pool of host ids, the bounds
// admission keeps there and how to read its real headroom. A server has one, LocalNode; a
// cluster's nodes or joined machines will each be one, with resources of their own.
type host struct {
	name      string
	runtimes  map[string]runtime.Runtime
	idBases   []int64 // first ids of the pool's ranges, lowest first
	admission Admission
	headroom  func(ctx context.Context) (Headroom, error)
	// reserves are what admission leaves the host, whatever the limits say.
	memoryReserveMB, diskReserveMB int64
}

// checkHeadroom refuses a create that would leave the host less memory or disk than its
// reserves: what would really run out, whatever limits are overcommitted.
func (h *host) checkHeadroom(ctx context.Context) error {
	if h.headroom == nil {
		return nil
	}
	hr, err := h.headroom(ctx)
	if err != nil {
		return fmt.Errorf("read the host's free memory and disk: %w", err)
	}
	// An idle sandbox costs a few MiB of memory and a few hundred KiB of disk; these floors keep
	// one more from being the one that tips the host over.
	const memFloorMB, diskFloorMB = 32, 64
	if hr.MemoryAvailableMB-memFloorMB < h.memoryReserveMB {
		return errcode.New(errcode.CapacityUnavailable, "the host has only %d MiB of memory available and keeps %d MiB in reserve; destroy sandboxes you no longer need, or free memory on the host",
			hr.MemoryAvailableMB, h.memoryReserveMB).With("memory_available_mb", hr.MemoryAvailableMB).With("memory_reserve_mb", h.memoryReserveMB)
	}
	if hr.DiskFreeMB-diskFloorMB < h.diskReserveMB {
		return errcode.New(errcode.CapacityUnavailable, "the host's state directory has only %d MiB of disk free and keeps %d MiB in reserve; destroy sandboxes you no longer need, or free disk space",
			hr.DiskFreeMB, h.diskReserveMB).With("disk_free_mb", hr.DiskFreeMB).With("disk_reserve_mb", h.diskReserveMB)
	}
	return nil
}

// overCapacity turns a store's refusal into the error a caller reads.
func overCapacity(o *OverCapacityError) error {
	switch o.Resource {
	case "sandboxes":
		return errcode.New(errcode.CapacityUnavailable, "this server already holds %d live sandboxes (its maximum); destroy sandboxes you no longer need, then retry", int(o.Used)).
			With("live", int(o.Used)).With("max_sandboxes", int(o.Limit))
	case "cpu":
		return errcode.New(errcode.CapacityUnavailable, "cpu budget exhausted: %.2f of %.2f cores are allocated and %.2f more were asked; ask for less cpu or destroy sandboxes", o.Used, o.Limit, o.Asked).
			With("cpu_used", o.Used).With("cpu_budget", o.Limit)
	case "memory_mb":
		return errcode.New(errcode.CapacityUnavailable, "memory budget exhausted: %d of %d MiB are allocated and %d more were asked; ask for less memory_mb or destroy sandboxes", int64(o.Used), int64(o.Limit), int64(o.Asked)).
			With("memory_used_mb", int64(o.Used)).With("memory_budget_mb", int64(o.Limit))
	default:
		return errcode.New(errcode.CapacityUnavailable, "disk budget exhausted: %d of %d MiB of sandbox disks are allocated and %d more were asked; ask for less disk_mb or destroy sandboxes", int64(o.Used), int64(o.Limit), int64(o.Asked)).
			With("disk_used_mb", int64(o.Used)).With("disk_budget_mb", int64(o.Limit))
	}
}

// runtimeOf returns the runtime that runs sb, on sb's node.
func (s *Service) runtimeOf(sb Sandbox) (runtime.Runtime, error) {
	h := s.local
	if sb.Node != "" && sb.Node != h.name {
		return nil, errcode.New(errcode.RuntimeUnavailable, "sandbox %s runs on node %q, which this server does not manage", sb.ID, text.Truncate(sb.Node, 64))
	}
	rt, ok := h.runtimes[sb.Runtime]
	if !ok {
		return nil, errcode.New(errcode.RuntimeUnavailable, "sandbox %s belongs to runtime %q, which this server does not have", sb.ID, sb.Runtime)
	}
	return rt, nil
}

// roomFor refuses, before anything is made, n sandboxes of shape that the host's headroom or
// the admission bounds would not take all of (CAPACITY_UNAVAILABLE, its message prefixed with
// what).
func (s *Service) roomFor(ctx context.Context, shape Sandbox, n int, what string) error {
	if err := s.local.checkHeadroom(ctx); err != nil {
		return err
	}
	u, err := s.store.CountLive(ctx)
	if err != nil {
		return fmt.Errorf("count live sandboxes: %w", err)
	}
	k := n - 1
	u.Live += k
	u.CPU += float64(k) * shape.CPU
	u.MemoryMB += int64(k) * shape.MemoryMB
	u.DiskMB += int64(k) * shape.DiskMB
	if over := s.local.admission.Check(u, shape); over != nil {
		return errcode.Prefixed(what, overCapacity(over))
	}
	return nil
}
