package main

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/agentbox/agentbox/internal/testenv/pglab"
)

// TestMain fails the package's tests if any goroutine is still running when they end (after
// the Postgres that store tests may have started is stopped).
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
