//go:build !linux

package hostinfo

import (
	"errors"
	"runtime"
)

// errPlatform: the host facts the server reads are Linux's (/proc, cgroups, statfs).
var errPlatform = errors.New("hostinfo: needs Linux (the agentbox server's platform)")

// NumCPU returns the number of CPUs.
func NumCPU() int { return runtime.NumCPU() }

// DiskSpaceMiB is Linux-only.
func DiskSpaceMiB(string) (free, total int64, err error) { return 0, 0, errPlatform }
