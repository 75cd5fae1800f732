package api_test

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/agentbox/agentbox/internal/testenv"
)

// TestMain fails the package's tests if any goroutine (a handler, a stream, a connection) is
// still running when they end, or if any server without an ErrorLog of its own (httptest's)
// recovered a panic ("http: panic serving …") while they ran.
func TestMain(m *testing.M) {
	panics := testenv.WatchDefaultLog()
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		if p := panics.Panics(); len(p) > 0 {
			fmt.Fprintf(os.Stderr, "FAIL: servers recovered %d panics while the tests ran; the first:\n%s\n", len(p), p[0])
			code = 1
		}
		os.Exit(code)
	}))
}
