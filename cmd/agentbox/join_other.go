//go:build !linux

package main

import (
	"context"
	"fmt"
	"runtime"
)

// installService is Linux-only for now (a launchd plist and a Windows service come later).
func installService(context.Context, string, []string) error {
	return fmt.Errorf("--install writes a systemd unit and works on Linux only; on %s run `agentbox join URL` under the platform's service manager", runtime.GOOS)
}
