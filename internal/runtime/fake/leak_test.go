package fake_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if any goroutine is still running when they end.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// The embedded agents share the guest package's reaper, process-wide by design (one
		// waiter for every child, started once and kept for the life of the process).
		goleak.IgnoreTopFunction("github.com/agentbox/agentbox/internal/guest.(*reaper).loop"))
}
