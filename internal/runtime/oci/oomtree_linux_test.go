package oci

import (
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/guest"
	"github.com/agentbox/agentbox/internal/runtime/runtimetest"
)

// TestOOMKilledCommandEndsWhole: when the kernel's OOM killer ends a command's leader (the
// process holding the memory), the command's other processes end too, as a timeout ends them;
// before, a fork bomb whose leader the kernel picked went on forking after its exec returned.
func TestOOMKilledCommandEndsWhole(t *testing.T) {
	t.Parallel()
	rt := newFlavor(t, FlavorRunc)
	spec := runtimetest.DefaultSpec(runtimetest.NewID())
	spec.MemoryMB = 64
	c := runtimetest.Start(t, rt, spec)
	res := runtimetest.ExecRequest(t, c, guest.ExecRequest{Argv: []string{"python3", "-c",
		"import os, time\nif os.fork() == 0:\n    open('/tmp/child', 'w').write(str(os.getpid()))\n    time.sleep(120)\n    os._exit(0)\n" +
			"while not os.path.exists('/tmp/child'): time.sleep(0.01)\nb = []\nwhile True: b.append(bytearray(8 << 20))"}, TimeoutMs: 60000})
	if res.Signal != "SIGKILL" || !res.OOMKilled {
		t.Fatalf("the command: %+v, want SIGKILL and oom_killed", res)
	}
	child := strings.TrimSpace(runtimetest.Exec(t, c, "cat", "/tmp/child").Stdout)
	if child == "" {
		t.Fatal("the child never wrote its pid")
	}
	if r := runtimetest.Exec(t, c, "sh", "-c", "test -d /proc/"+child+" && cat /proc/"+child+"/cmdline"); r.ExitCode == 0 {
		t.Errorf("the command's child %s runs on after the command was killed for memory: %q", child, r.Stdout)
	}
}
