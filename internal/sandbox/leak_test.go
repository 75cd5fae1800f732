package sandbox_test

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/agentbox/agentbox/internal/testenv/pglab"
)

// TestMain starts the throwaway Postgres the replica tests share (pglab; they skip without
// one) and fails the package's tests if any goroutine is still running when they end.
func TestMain(m *testing.M) {
	code := pglab.Main(m)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}
