package main

import (
	"fmt"
	"os"
	"path/filepath"
)

// guestBinaryName is the lean agent's file name: make build writes it beside bin/agentbox.
const guestBinaryName = "agentbox-guest"

// guestBinary is the agent binary sandboxes run (bound into local sandboxes, shipped in the
// kubernetes guest image): flag when set (--guest-binary), else agentbox-guest beside this
// executable, else this executable itself, whose guest commands are the same code with the
// whole server linked in (lean is false then: each idle sandbox holds several times the memory,
// and serve and doctor say so; `go run ./cmd/agentbox` still works).
func guestBinary(flag string) (path string, lean bool, err error) {
	if flag != "" {
		abs, err := filepath.Abs(flag)
		if err != nil {
			return "", false, err
		}
		if _, err := os.Stat(abs); err != nil {
			return "", false, fmt.Errorf("--guest-binary: %w", err)
		}
		return abs, true, nil // the operator's choice
	}
	self, err := os.Executable()
	if err != nil {
		return "", false, fmt.Errorf("find own executable: %w", err)
	}
	if self, err = filepath.EvalSymlinks(self); err != nil {
		return "", false, fmt.Errorf("find own executable: %w", err)
	}
	beside := filepath.Join(filepath.Dir(self), guestBinaryName)
	if st, err := os.Stat(beside); err == nil && st.Mode().IsRegular() {
		return beside, true, nil
	}
	return self, false, nil
}

// fatGuestWarning is what serve logs and doctor shows when no lean agent was found.
const fatGuestWarning = "no " + guestBinaryName + " beside this binary: sandboxes run this whole binary as their agent (several times the memory per idle sandbox); make build writes both, install them side by side or pass --guest-binary"
