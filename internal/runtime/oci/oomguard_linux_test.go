package oci

import "testing"

// TestRegrowth: the guard kills at once, then only for growth after the kill was done. The
// sequence is the one a loaded host produced: the threshold crossed at 201 MiB, the agent
// answering 826 ms later with nothing left to kill (the runaway was dead), the sandbox then
// holding 440 MiB that gVisor had not yet given back — a second kill there took an innocent
// `echo`.
func TestRegrowth(t *testing.T) {
	const mib = 1 << 20
	var rg regrowth
	steps := []struct {
		used   int64
		kill   bool
		killed int64 // usage once the kill is done, when kill
	}{
		{201 * mib, true, 440 * mib},
		{440 * mib, false, 0},
		{445 * mib, false, 0}, // less than oomRegrowth past the post-kill baseline
		{430 * mib, false, 0}, // memory given back: a lower baseline
		{437 * mib, false, 0},
		{439 * mib, true, 300 * mib}, // 9 MiB past the lowest: a runaway again
		{300 * mib, false, 0},
	}
	for i, s := range steps {
		if got := rg.due(s.used); got != s.kill {
			t.Fatalf("step %d (%d MiB): kill %v, want %v", i, s.used/mib, got, s.kill)
		}
		if s.kill {
			rg.killed(s.killed)
		}
	}
}
