package security

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/agentbox/agentbox/internal/testenv"
	"github.com/agentbox/agentbox/internal/wire"
)

// marker is a unique sleep duration: a command line to find processes by, inside and on the host.
func marker() string { return fmt.Sprintf("%d.%d", 4000+randInt(1000), 100000+randInt(899999)) }

// daemonProg double-forks a daemon that leaves the session and process group, ignores SIGTERM,
// SIGHUP and SIGINT, closes its descriptors and sleeps with the marker in its command line.
const daemonProg = `
import os, signal, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(s, signal.SIG_IGN)
        os.chdir("/")
        for fd in range(3):
            os.close(fd)
        time.sleep(float(sys.argv[1]))
    os._exit(0)
`

// goneEverywhere waits until no process with marker is left, inside sandbox id and on the host.
// Under gVisor the workload's processes live in the sentry: only the inside check sees them.
func (a *arena) goneEverywhere(id string, markers ...string) {
	a.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var left []string
		for _, m := range markers {
			if p := a.markerProcs(id, m); p != "" {
				left = append(left, "inside: "+p)
			}
			left = append(left, hostPidsWithArg(m)...)
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			a.t.Errorf("processes survived:\n%s", strings.Join(left, "\n"))
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func lifecycleAttacks() []attack {
	return []attack{
		{
			name:   "life-sigterm-ignored",
			does:   "a shell and a Python child that ignore SIGTERM, SIGINT and SIGHUP sleep past the exec's 2 s timeout",
			want:   "the exec returns timed_out within 7 s and no process of it is left, inside or on the host",
			gvisor: "the workload's processes live inside the sentry; they are checked from inside (the host sees only the sentry, which must stay)",
			run: func(a *arena) {
				m1, m2 := marker(), marker()
				start := time.Now()
				res := a.execIn(a.id, wire.ExecRequest{Command: []string{"sh", "-c",
					"trap '' TERM INT HUP; python3 -c 'import signal, sys, time\nfor s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP): signal.signal(s, signal.SIG_IGN)\ntime.sleep(float(sys.argv[1]))' " + m2 + " & sleep " + m1},
					TimeoutSeconds: 2})
				if !res.TimedOut || time.Since(start) > 7*time.Second {
					a.t.Errorf("timeout: %+v after %s", res, time.Since(start))
				}
				a.goneEverywhere(a.id, m1, m2)
			},
		},
		{
			name:   "life-setsid-daemon-timeout",
			does:   "before its 3 s timeout, the command starts `setsid -f sleep`, a `nohup sleep &`, and a double-forked daemon that calls setsid, ignores SIGTERM/SIGHUP and closes its fds, then sleeps in the foreground",
			want:   "at the timeout every one of them is killed: none is left inside or on the host",
			gvisor: "checked from inside the sentry, as above",
			run: func(a *arena) {
				m1, m2, m3, m4 := marker(), marker(), marker(), marker()
				res := a.execIn(a.id, wire.ExecRequest{Command: []string{"sh", "-c",
					"setsid -f sleep " + m1 + "; python3 -c '" + daemonProg + "' " + m2 + "; nohup sleep " + m3 + " >/dev/null 2>&1 & sleep " + m4},
					TimeoutSeconds: 3})
				if !res.TimedOut {
					a.t.Errorf("timeout: %+v", res)
				}
				a.goneEverywhere(a.id, m1, m2, m3, m4)
			},
		},
		{
			name: "life-daemon-survives-until-destroy",
			does: "a command that exits at once leaves a `setsid -f sleep` and a double-forked, signal-ignoring daemon behind; then the sandbox is destroyed",
			want: "the daemons may outlive their exec (background jobs are allowed) but not the sandbox: after destroy no process of it is left on the host, and no cgroup, mount or loop device",
			run: func(a *arena) {
				m1, m2 := marker(), marker()
				res := a.execIn(a.id, wire.ExecRequest{Command: []string{"sh", "-c", "setsid -f sleep " + m1 + "; python3 -c '" + daemonProg + "' " + m2}, TimeoutSeconds: 30})
				if res.ExitCode != 0 || res.TimedOut {
					a.t.Fatalf("start the daemons: %+v", res)
				}
				time.Sleep(300 * time.Millisecond)
				for _, m := range []string{m1, m2} {
					if a.markerProcs(a.id, m) == "" {
						a.t.Errorf("daemon %s did not start (the attack did not happen)", m)
					}
				}
				if _, err := a.s.c.Destroy(context.Background(), a.id); err != nil {
					a.t.Fatal(err)
				}
				for _, m := range []string{m1, m2} {
					if left := hostPidsWithArg(m); len(left) > 0 {
						a.t.Errorf("HOLE: after destroy, host processes remain: %v", left)
					}
				}
				if pids := a.hostPids(a.id); len(pids) > 0 {
					a.t.Errorf("after destroy, host processes of the sandbox remain: %v", pids)
				}
				if leaks := testenv.Leaks(a.id); len(leaks) > 0 {
					a.t.Errorf("after destroy:\n%s", strings.Join(leaks, "\n"))
				}
			},
		},
		{
			name: "life-ttl-kills-daemons",
			does: "a sandbox with a 10 s TTL leaves a `setsid -f sleep` and a double-forked daemon running, and waits",
			want: "the server destroys the sandbox within 5 s of its expiry; then no process, cgroup, mount or loop device of it is left on the host",
			// 10 s, not less: under the parallel suite a gVisor create and the first exec
			// can take seconds, and the daemons must be seen running before the TTL.
			create: wire.CreateRequest{TTLSeconds: 10},
			run: func(a *arena) {
				m1, m2 := marker(), marker()
				a.execIn(a.id, wire.ExecRequest{Command: []string{"sh", "-c", "setsid -f sleep " + m1 + "; python3 -c '" + daemonProg + "' " + m2}, TimeoutSeconds: 30})
				time.Sleep(300 * time.Millisecond)
				for _, m := range []string{m1, m2} {
					if a.markerProcs(a.id, m) == "" {
						a.t.Errorf("daemon %s did not start (the attack did not happen)", m)
					}
				}
				deadline := a.sb.ExpiresAt.Add(5 * time.Second)
				for {
					sb, err := a.s.c.Get(context.Background(), a.id)
					if err == nil && sb.State == wire.StateDestroyed {
						a.t.Logf("destroyed %s after its expiry", time.Since(a.sb.ExpiresAt).Round(time.Millisecond))
						break
					}
					if time.Now().After(deadline) {
						// What the server did and when: the expiry's stopping event says when the
						// control loop took the sandbox, the rest how long its destroy ran.
						evs, _ := a.s.c.Events(context.Background(), a.id)
						for _, ev := range evs {
							a.t.Logf("event %s %s %s→%s %q (%s after the expiry)", ev.At.Format("15:04:05.000"), ev.Type, ev.From, ev.To, ev.Reason, ev.At.Sub(a.sb.ExpiresAt).Round(time.Millisecond))
						}
						a.t.Fatalf("the sandbox is still %s %s after its expiry (%v)", sb.State, time.Since(a.sb.ExpiresAt), err)
					}
					time.Sleep(100 * time.Millisecond)
				}
				for _, m := range []string{m1, m2} {
					if left := hostPidsWithArg(m); len(left) > 0 {
						a.t.Errorf("HOLE: after the TTL, host processes remain: %v", left)
					}
				}
				if pids := a.hostPids(a.id); len(pids) > 0 {
					a.t.Errorf("after the TTL, host processes of the sandbox remain: %v", pids)
				}
				if leaks := testenv.Leaks(a.id); len(leaks) > 0 {
					a.t.Errorf("after the TTL:\n%s", strings.Join(leaks, "\n"))
				}
			},
		},
		{
			name:      "life-server-sigkill-during-create",
			does:      "not sandboxed code: the server (the real binary, its own state dir) is SIGKILLed 5, 40, 120 and 300 ms into a create, four times, then restarted",
			want:      "after the restart no sandbox is left creating or stopping; each is failed, lost, or running and answering (adopted); after destroying them and stopping the server the host holds no container, process, cgroup, mount, loop device, uid range or sandbox dir",
			noSandbox: true,
			run: func(a *arena) {
				s := newServerFixture(a.t)
				ctx := context.Background()
				for _, delay := range []time.Duration{5 * time.Millisecond, 40 * time.Millisecond, 120 * time.Millisecond, 300 * time.Millisecond} {
					s.start()
					go s.c.Create(ctx, createFor(a.rt, wire.CreateRequest{}))
					time.Sleep(delay)
					s.kill()
				}
				s.start()
				list, err := s.c.List(ctx, []string{"creating", "running", "stopping", "failed", "lost", "destroyed"}, nil)
				if err != nil {
					a.t.Fatal(err)
				}
				for _, sb := range list {
					s.record(sb.ID)
					a.t.Logf("after restart: %s %s %q", sb.ID, sb.State, sb.Error)
					switch sb.State {
					case wire.StateCreating, wire.StateStopping:
						a.t.Errorf("after restart %s is still %s", sb.ID, sb.State)
					case wire.StateRunning:
						if res, err := s.c.Exec(ctx, sb.ID, wire.ExecRequest{Command: []string{"true"}}, nil); err != nil || res.ExitCode != 0 {
							a.t.Errorf("adopted sandbox %s does not run commands: %v", sb.ID, err)
						}
					}
					if _, err := s.c.Destroy(ctx, sb.ID); err != nil {
						a.t.Errorf("destroy %s: %v", sb.ID, err)
					}
				}
				if len(list) == 0 {
					a.t.Logf("no create reached the store before a kill")
				}
				if a.t.Failed() {
					a.t.Logf("server log:\n%s", tail(s.logs.String(), 8<<10))
				}
				s.assertHostClean(a.t)
			},
		},
	}
}
