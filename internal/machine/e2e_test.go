package machine_test

import (
	"context"
	"errors"
	"net"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/testenv"
	"github.com/agentbox/agentbox/internal/testenv/machinelab"
	"github.com/agentbox/agentbox/internal/wire"
)

// joinProc is a real `agentbox join` running in a machine's namespace.
type joinProc struct {
	cmd  *exec.Cmd
	logs *testenv.SyncBuffer
	done chan struct{}
	code int
}

func startJoin(t *testing.T, m *machinelab.Machine, bin string, args ...string) *joinProc {
	t.Helper()
	return startJoinEnv(t, m, bin, nil, args...)
}

// startJoinEnv is startJoin with env (nil: the test's own) as the agent's environment.
func startJoinEnv(t *testing.T, m *machinelab.Machine, bin string, env []string, args ...string) *joinProc {
	t.Helper()
	p := &joinProc{logs: &testenv.SyncBuffer{}, done: make(chan struct{})}
	p.cmd = m.Command(append([]string{bin, "join"}, args...)...)
	p.cmd.Env = env
	p.cmd.Stdout, p.cmd.Stderr = p.logs, p.logs
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		err := p.cmd.Wait()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			p.code = ee.ExitCode()
		}
		close(p.done)
	}()
	t.Cleanup(func() {
		p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			p.cmd.Process.Kill()
			<-p.done
			t.Errorf("agentbox join did not stop on SIGTERM:\n%s", p.logs)
		}
	})
	return p
}

func (p *joinProc) wait(t *testing.T, d time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
		return p.code
	case <-time.After(d):
		t.Fatalf("agentbox join still runs after %v:\n%s", d, p.logs)
		return 0
	}
}

// freePort picks a port free on addr now (the server is restarted on the same one).
func freePort(t *testing.T, addr string) int {
	ln, err := net.Listen("tcp", addr+":0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func waitMachine(t *testing.T, cl *client.Client, ref, what string, d time.Duration, cond func(wire.Machine) bool) wire.Machine {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		ms, err := cl.ListMachines(context.Background())
		if err == nil {
			for _, m := range ms {
				if (m.Name == ref || m.ID == ref) && cond(m) {
					return m
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("machine %s: not %s within %v (last list: %+v, err %v)", ref, what, d, ms, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestJoinedMachinesEndToEnd runs the real binary: `agentbox serve` over TLS on a bridge of
// the test's own, and `agentbox join` in network namespaces with their own addresses. A
// machine joins with a token, is listed online with last_seen from its heartbeats, answers a
// probe over a stream of its session, reconnects after the server is SIGKILLed and restarted
// and after its link is cut and restored, and is cut off at once when removed (its agent is
// then refused and exits 3). A used-up and an expired token are refused.
func TestJoinedMachinesEndToEnd(t *testing.T) {
	testenv.RequireRoot(t)
	began := time.Now()
	lab := machinelab.New(t)
	bin := testenv.Binary(t)
	stateDir := testenv.ShortTempDir(t, "abmc-")
	host := lab.ServerAddr().String()
	listen := net.JoinHostPort(host, strconv.Itoa(freePort(t, host)))
	args := []string{"--listen", listen, "--allow-remote", "--allow-private-network", "--tls-self-signed"}
	srv := testenv.StartServer(t, stateDir, "e2e-token-"+strconv.FormatInt(time.Now().UnixNano(), 36), args...)
	cl := srv.Client()
	ctx := t.Context()
	if !strings.HasPrefix(srv.URL, "https://") || srv.Fingerprint == "" {
		t.Fatalf("server not on TLS: %s", srv.URL)
	}
	// A token that expires in a minute, used at the end.
	short, err := cl.CreateJoinToken(ctx, wire.TokenRequest{Expires: "1m", Uses: 5})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := cl.CreateJoinToken(ctx, wire.TokenRequest{Uses: 2})
	if err != nil {
		t.Fatal(err)
	}
	m1, m2 := lab.AddMachine(), lab.AddMachine()
	dir1, dir2 := filepath.Join(testenv.ShortTempDir(t, "abmc1-"), "m"), filepath.Join(testenv.ShortTempDir(t, "abmc2-"), "m")
	tlsArgs := []string{"--fingerprint", srv.Fingerprint}
	j1 := startJoin(t, m1, bin, append([]string{srv.URL, "--token", tok.Secret, "--name", "lab-one", "--state-dir", dir1}, tlsArgs...)...)

	// Online, with last_seen from its heartbeats (it moves while we wait; it is not the time of
	// the query).
	first := waitMachine(t, cl, "lab-one", "online with a heartbeat", 30*time.Second, func(m wire.Machine) bool { return m.Online && m.LastSeen != nil })
	if first.Platform != "linux" || first.AgentVersion == "" || first.GPUs == nil {
		t.Fatalf("facts: %+v", first)
	}
	later := waitMachine(t, cl, "lab-one", "with a newer heartbeat", 20*time.Second, func(m wire.Machine) bool { return m.LastSeen != nil && m.LastSeen.After(*first.LastSeen) })
	if q := time.Now(); later.LastSeen.After(q) || q.Sub(*later.LastSeen) > 10*time.Second {
		t.Fatalf("last_seen %v is not a recent heartbeat (now %v)", later.LastSeen, q)
	}
	// A stream reaches the agent's handler through Registry.Client; it is the process we started.
	info, err := cl.ProbeMachine(ctx, "lab-one")
	if err != nil || info.PID != j1.cmd.Process.Pid || info.Platform != "linux" {
		t.Fatalf("probe: %+v %v (join pid %d)", info, err, j1.cmd.Process.Pid)
	}

	// The server is SIGKILLed and restarted on the same address: the machine comes back.
	srv.Kill()
	srv = testenv.StartServer(t, stateDir, srv.Token, args...)
	cl = srv.Client()
	waitMachine(t, cl, "lab-one", "back online after the server restart", 60*time.Second, func(m wire.Machine) bool { return m.Online })
	if info, err := cl.ProbeMachine(ctx, "lab-one"); err != nil || info.PID != j1.cmd.Process.Pid {
		t.Fatalf("probe after restart: %+v %v", info, err)
	}

	// The link is cut: the server notices (no heartbeat for 3 intervals) and the machine is
	// offline; once the link is back, the agent reconnects by itself.
	if err := m1.LinkDown(); err != nil {
		t.Fatal(err)
	}
	waitMachine(t, cl, "lab-one", "offline with its link down", 40*time.Second, func(m wire.Machine) bool { return !m.Online })
	if _, err := cl.ProbeMachine(ctx, "lab-one"); errcode.Of(err) != errcode.MachineOffline {
		t.Fatalf("probe while offline: %v", err)
	}
	if err := m1.LinkUp(); err != nil {
		t.Fatal(err)
	}
	waitMachine(t, cl, "lab-one", "back online after the link returned", 90*time.Second, func(m wire.Machine) bool { return m.Online })

	// A second machine uses the token's last use; a third join with it is refused.
	j2 := startJoin(t, m2, bin, append([]string{srv.URL, "--token", tok.Secret, "--name", "lab-two", "--state-dir", dir2}, tlsArgs...)...)
	waitMachine(t, cl, "lab-two", "online", 30*time.Second, func(m wire.Machine) bool { return m.Online })
	used := startJoin(t, m2, bin, append([]string{srv.URL, "--token", tok.Secret, "--name", "lab-three", "--state-dir", dir2 + "-3"}, tlsArgs...)...)
	if code := used.wait(t, 20*time.Second); code == 0 || !strings.Contains(used.logs.String(), "used up") {
		t.Fatalf("a used-up token: exit %d:\n%s", code, used.logs)
	}

	// Removal cuts the machine off at once; its agent is refused and exits 3, and so does a
	// restart of it.
	if _, err := cl.RemoveMachine(ctx, "lab-one"); err != nil {
		t.Fatal(err)
	}
	if code := j1.wait(t, 20*time.Second); code != 3 || !strings.Contains(j1.logs.String(), "was removed") {
		t.Fatalf("removed machine's agent: exit %d:\n%s", code, j1.logs)
	}
	again := startJoin(t, m1, bin, append([]string{srv.URL, "--state-dir", dir1}, tlsArgs...)...)
	if code := again.wait(t, 20*time.Second); code != 3 {
		t.Fatalf("reconnect of a removed machine: exit %d:\n%s", code, again.logs)
	}
	if ms, _ := cl.ListMachines(ctx); len(ms) != 1 || ms[0].Name != "lab-two" || !ms[0].Online {
		t.Fatalf("machines after removal: %+v", ms)
	}
	_ = j2

	// The short token has expired by now (the steps above take over a minute; wait out the rest).
	if wait := time.Until(short.Token.ExpiresAt.Add(time.Second)); wait > 0 {
		time.Sleep(wait)
	}
	exp := startJoin(t, m1, bin, append([]string{srv.URL, "--token", short.Secret, "--name", "lab-late", "--state-dir", dir1 + "-late"}, tlsArgs...)...)
	if code := exp.wait(t, 20*time.Second); code == 0 || !strings.Contains(exp.logs.String(), "expired") {
		t.Fatalf("an expired token: exit %d:\n%s", code, exp.logs)
	}
	t.Logf("end to end in %v", time.Since(began).Round(time.Second))
}
