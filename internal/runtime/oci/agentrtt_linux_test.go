package oci

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/guest"
	"github.com/agentbox/agentbox/internal/runtime/runtimetest"
)

// BenchmarkAgentRoundTrip splits an exec round trip on each flavour into its parts, so that a
// slow exec names its slow part: a health call (the control channel alone: the socket, one HTTP
// exchange, the agent's handler), an exec of the static agent binary (process start without a
// dynamic loader) and an exec of `true` (what make bench times). Beside the wall time it
// reports the CPU the sandbox's cgroup spent per operation (for gVisor: the sentry, its gofer and
// the platform's stub processes), which a loaded machine inflates far less than the wall time.
func BenchmarkAgentRoundTrip(b *testing.B) {
	for _, f := range []Flavor{FlavorRunc, FlavorGVisor} {
		b.Run(string(f), func(b *testing.B) {
			rt := newFlavor(b, f)
			spec := runtimetest.DefaultSpec(runtimetest.NewID())
			c := runtimetest.Start(b, rt, spec)
			ctx := context.Background()
			cpu := func() float64 {
				for _, p := range []string{"/sys/fs/cgroup/cpuacct/" + rt.cgroupParent + "/" + spec.ID + "/cpuacct.usage",
					filepath.Join("/sys/fs/cgroup", rt.cgroupParent, spec.ID, "cpu.stat")} {
					b, err := os.ReadFile(p)
					if err != nil {
						continue
					}
					s := string(b)
					if strings.HasPrefix(s, "usage_usec ") { // cgroup v2: µs
						n, _ := strconv.ParseFloat(strings.Fields(s)[1], 64)
						return n * 1e3
					}
					n, _ := strconv.ParseFloat(strings.TrimSpace(s), 64)
					return n
				}
				return 0
			}
			measure := func(b *testing.B, op func() error) {
				c0 := cpu()
				for b.Loop() {
					if err := op(); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric((cpu()-c0)/1e6/float64(b.N), "sandbox-cpu-ms/op")
			}
			b.Run("health", func(b *testing.B) {
				measure(b, func() error { _, err := c.Health(ctx); return err })
			})
			for _, tc := range []struct {
				name string
				argv []string
			}{{"exec-static", []string{guestBinaryPath, "version"}}, {"exec-true", []string{"true"}}} {
				b.Run(tc.name, func(b *testing.B) {
					measure(b, func() error {
						res, err := c.Exec(ctx, guest.ExecRequest{Argv: tc.argv, TimeoutMs: 10000}, nil)
						if err == nil && res.ExitCode != 0 {
							b.Fatalf("%v: exit %d: %s", tc.argv, res.ExitCode, res.Stderr)
						}
						return err
					})
				})
			}
		})
	}
}
