// Package tmpfs sizes a sandbox's memory-backed file systems, the same on every runtime: /tmp
// and /dev/shm are tmpfs, so their pages count against memory_mb (a container's memory cgroup,
// a pod's limit, a VM's RAM), not disk_mb. Together they stay well under memory_mb, so that
// filling both leaves the agent and the commands memory to run: a full tmpfs must not take the
// sandbox down with the OOM killer.
package tmpfs

const (
	// minTmpMiB is the smallest /tmp; unlimitedTmpMiB /tmp's size when memory is unlimited.
	minTmpMiB       = 16
	unlimitedTmpMiB = 1024
	// minShmMiB and maxShmMiB bound /dev/shm.
	minShmMiB = 4
	maxShmMiB = 64
)

// TmpMiB is /tmp's size for a memory limit of memoryMB (0: none): a quarter of it, at least
// 16 MiB.
func TmpMiB(memoryMB int64) int64 {
	if memoryMB <= 0 {
		return unlimitedTmpMiB
	}
	return max(memoryMB/4, minTmpMiB)
}

// ShmMiB is /dev/shm's size for a memory limit of memoryMB (0: none): an eighth of it, between
// 4 and 64 MiB.
func ShmMiB(memoryMB int64) int64 {
	if memoryMB <= 0 {
		return maxShmMiB
	}
	return min(max(memoryMB/8, minShmMiB), maxShmMiB)
}
