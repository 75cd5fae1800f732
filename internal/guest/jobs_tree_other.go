//go:build unix && !linux

package guest

import "time"

func jobCPU(int, uint32, uint64) (time.Duration, bool) { return 0, false }

type cpuTree struct {
	pid  int
	tree processTree
}

func jobsCPU([]cpuTree) ([]time.Duration, bool) { return nil, false }
