package guest_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if any goroutine is still running when they end.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// The reaper is process-wide by design (one waiter for every child, started once by
		// the first agent and kept for the life of the process: see reaper.go).
		goleak.IgnoreTopFunction("github.com/agentbox/agentbox/internal/guest.(*reaper).loop"))
}
