package sandbox_test

import (
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/runtime/runtimetest"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// TestTimeoutKillsDaemons: a command that leaves a setsid daemon and a double-forked orphan
// behind and then times out takes them with it, as the agent user and as root; a daemon that an
// earlier command started on purpose survives.
func TestTimeoutKillsDaemons(t *testing.T) {
	e := newEnv(t, sandbox.Config{})
	sb := e.create(t, sandbox.CreateRequest{})
	comms := func() string {
		return e.exec(t, sb.ID, argv("sh", "-c", "for p in /proc/[0-9]*; do echo $(cat $p/comm) $(cat $p/cmdline | tr '\\0' ' '); done")).Stdout
	}
	res := e.exec(t, sb.ID, argv("sh", "-c", "setsid sleep 999 >/dev/null 2>&1 &"))
	if res.ExitCode != 0 {
		t.Fatalf("keeper: %+v", res)
	}
	for _, user := range []string{"", "root"} {
		script := `setsid sh -c 'sleep 1000' >/dev/null 2>&1 &
sh -c 'sleep 1001 >/dev/null 2>&1 &'
setsid sh -c '(trap "" TERM HUP; sleep 1002 >/dev/null 2>&1 &)' >/dev/null 2>&1
sleep 1003`
		start := time.Now()
		res := e.exec(t, sb.ID, sandbox.ExecRequest{Argv: []string{"sh", "-c", script}, Timeout: time.Second, User: user})
		if !res.TimedOut {
			t.Fatalf("user %q: not timed out: %+v", user, res)
		}
		if d := time.Since(start); d > 6*time.Second {
			t.Fatalf("user %q: the timeout took %v", user, d)
		}
		ps := comms()
		for _, s := range []string{"sleep 1000", "sleep 1001", "sleep 1002", "sleep 1003"} {
			if strings.Contains(ps, s) {
				t.Errorf("user %q: %q survived the timeout:\n%s", user, s, ps)
			}
		}
		if !strings.Contains(ps, "sleep 999") {
			t.Fatalf("user %q: the daemon an earlier command left was killed too:\n%s", user, ps)
		}
	}
	// On the host, too: only the agent and the kept daemon are left.
	if procs := runtimetest.HostProcesses(t, sb.ID); len(procs) != 2 {
		t.Errorf("host processes of the sandbox: %v, want the agent and the kept daemon", procs)
	}
}
