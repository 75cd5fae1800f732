//go:build !linux

package vminit

import (
	"fmt"
	"os"
)

// Main is Linux's: a VM's init runs in a Linux guest.
func Main(args []string) int {
	fmt.Fprintln(os.Stderr, "agentbox guest-vm: only in a Linux guest")
	return 1
}
