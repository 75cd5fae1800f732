//go:build unix && !linux

package guest

import "golang.org/x/sys/unix"

func signalTagged(uint32, uint64, unix.Signal) int { return 0 }
