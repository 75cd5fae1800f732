//go:build faultpoints

package faultpoint

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
)

// Enabled reports whether this build has crash points (the faultpoints build tag).
const Enabled = true

var (
	target   = parse(os.Getenv(EnvVar))
	hits     atomic.Int64
	failing  = parse(os.Getenv(FailEnvVar))
	failHits atomic.Int64
)

type point struct {
	name string
	nth  int64
}

func parse(v string) point {
	name, n, ok := strings.Cut(strings.TrimSpace(v), ":")
	p := point{name: name, nth: 1}
	if ok {
		if i, err := strconv.ParseInt(n, 10, 64); err == nil && i > 0 {
			p.nth = i
		}
	}
	return p
}

// Hit kills the process with SIGKILL, as a crash would (no deferred call, no flush), when name is
// the crash point AGENTBOX_FAULTPOINT names and this is its Nth hit; it says so on stderr first.
func Hit(name string) {
	if target.name == "" || name != target.name {
		return
	}
	if hits.Add(1) != target.nth {
		return
	}
	fmt.Fprintf(os.Stderr, "faultpoint: crashing at %s (hit %d)\n", name, target.nth)
	syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // the signal is on its way
}

// Fail returns an error for each of the first N hits of name when AGENTBOX_FAULTFAIL is
// NAME:N (NAME: the first hit only), nil otherwise.
func Fail(name string) error {
	if failing.name == "" || name != failing.name {
		return nil
	}
	n := failHits.Add(1)
	if n > failing.nth {
		return nil
	}
	fmt.Fprintf(os.Stderr, "faultpoint: failing %s (hit %d of %d)\n", name, n, failing.nth)
	return fmt.Errorf("faultpoint: injected failure at %s (hit %d)", name, n)
}
