//go:build !faultpoints

// Package faultpoint names the crash points inside multi-step operations (create, destroy,
// snapshot, fork, a run's step, a pool refill) where the fault campaign (test/faults) kills the
// server, to show that a crash between two steps loses and leaks nothing. In a normal build Hit
// does nothing and costs nothing (an empty function the compiler inlines away); a build with the
// tag faultpoints (`go build -tags faultpoints`) kills the process at the point named by
// AGENTBOX_FAULTPOINT (faultpoint_on.go).
package faultpoint

// Enabled reports whether this build has crash points (the faultpoints build tag).
const Enabled = false

// Hit marks the crash point name: a no-op in this build.
func Hit(name string) {}

// Fail returns the injected failure of the failure point name: always nil in this build.
func Fail(name string) error { return nil }
