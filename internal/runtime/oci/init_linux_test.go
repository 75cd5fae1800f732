package oci

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/guest"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/runtimetest"
)

// killInit is the suite's Killer for an OCI runtime: SIGKILL to the init's host pid (runsc's
// sandbox process under gVisor), behind the runtime's back.
func killInit(rt *Runtime) runtimetest.Killer {
	return func(t testing.TB, id string) {
		t.Helper()
		pid := readPid(filepath.Join(rt.sandboxDir(id), "init.pid"))
		if pid <= 0 {
			t.Fatalf("sandbox %s has no init.pid", id)
		}
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatalf("kill the init %d of %s: %v", pid, id, err)
		}
	}
}

func mustDisksMiB(t testing.TB, rt *Runtime) int64 {
	t.Helper()
	n, err := rt.DisksMiB(context.Background())
	if err != nil {
		t.Fatalf("DisksMiB: %v", err)
	}
	return n
}

// fakeBundle makes Root/sandboxes/<id> with init.pid = pid and init.start = start, for the
// Wait and Adopt logic without a container (no root needed).
func fakeBundle(t *testing.T, pid int, start uint64) (*Runtime, string) {
	t.Helper()
	rt := &Runtime{root: t.TempDir(), name: "test", caps: runtime.Capabilities{Available: true}}
	id := runtimetest.NewID()
	dir := rt.sandboxDir(id)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "init.pid"), []byte(strconv.Itoa(pid)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, initStartFile), []byte(strconv.FormatUint(start, 10)), 0o600); err != nil {
		t.Fatal(err)
	}
	return rt, id
}

func startOf(t *testing.T, pid int) uint64 {
	t.Helper()
	_, start, ok := procStart(pid)
	if !ok {
		t.Fatalf("no /proc/%d/stat", pid)
	}
	return start
}

// TestWaitPidfd: Wait blocks on a live init, returns when it dies (before anyone reaps it, and
// after), returns ctx.Err() when cancelled, and takes a pid whose start time differs from the
// recorded one for an init that is gone.
func TestWaitPidfd(t *testing.T) {
	t.Parallel()
	cmd := exec.Command("sleep", "1000")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	rt, id := fakeBundle(t, cmd.Process.Pid, startOf(t, cmd.Process.Pid))

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := rt.Wait(ctx, id); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait on a live init: %v, want the context's deadline", err)
	}
	done := make(chan error, 1)
	go func() { done <- rt.Wait(context.Background(), id) }()
	time.Sleep(50 * time.Millisecond)
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Wait after the kill: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Wait did not return when the init died (a zombie, not reaped yet)")
	}
	// Not reaped yet: a zombie has exited.
	if err := rt.Wait(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait() // reaped: the pid is free
	if err := rt.Wait(context.Background(), id); err != nil {
		t.Fatal(err)
	}

	// A live process at the recorded pid that started at another time is not the init.
	self, _ := fakeBundle(t, os.Getpid(), startOf(t, os.Getpid())+1)
	for _, e := range mustReadDir(t, filepath.Join(self.root, "sandboxes")) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		err := self.Wait(ctx, e)
		cancel()
		if err != nil {
			t.Fatalf("Wait on a reused pid: %v, want nil at once", err)
		}
	}
	if err := rt.Wait(context.Background(), runtimetest.NewID()); err != nil {
		t.Fatalf("Wait on an absent sandbox: %v", err)
	}
}

func mustReadDir(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

// threads is this process's number of OS threads.
func threads(t *testing.T) int {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Threads:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n
		}
	}
	t.Fatal("no Threads line")
	return 0
}

// TestWaitCostsNoThreads: 300 sandboxes' Waits park in the netpoller, not in OS threads.
func TestWaitCostsNoThreads(t *testing.T) {
	cmd := exec.Command("sleep", "1000")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	rt, id := fakeBundle(t, cmd.Process.Pid, startOf(t, cmd.Process.Pid))
	before := threads(t)
	ctx, cancel := context.WithCancel(context.Background())
	const n = 300
	done := make(chan error, n)
	for range n {
		go func() { done <- rt.Wait(ctx, id) }()
	}
	time.Sleep(300 * time.Millisecond)
	during := threads(t)
	cancel()
	for range n {
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("Wait: %v", err)
		}
	}
	// A Wait that held an OS thread would cost one per waiter (n); a parked one costs none, but
	// the scheduler may still start a few threads while the goroutines' setup syscalls (pidfd_open,
	// /proc reads) block on a loaded machine — 43 were seen once under make test — so the bound is
	// well below n and well above that noise.
	if during-before > n/3 {
		t.Fatalf("%d waiting sandboxes took %d more OS threads (%d → %d)", n, during-before, before, during)
	}
	t.Logf("%d waits: threads %d → %d", n, before, during)
}

// TestAdoptHandle: Adopt accepts the handle of the init on record and refuses another's, a
// malformed one, and a dead init's.
func TestAdoptHandle(t *testing.T) {
	t.Parallel()
	self := os.Getpid()
	start := startOf(t, self)
	rt, id := fakeBundle(t, self, start)
	ctx := context.Background()
	h := initRef{pid: self, start: start}.handle()
	for _, hh := range []runtime.Handle{h, ""} {
		if err := rt.Adopt(ctx, id, hh); err != nil {
			t.Fatalf("adopt %q: %v", hh, err)
		}
	}
	if ref, err := parseHandle(h); err != nil || ref.pid != self || ref.start != start {
		t.Fatalf("handle %q round trip: %+v %v", h, ref, err)
	}
	if err := rt.Adopt(ctx, id, initRef{pid: self, start: start + 1}.handle()); !errcode.Is(err, errcode.SandboxNotRunning) {
		t.Fatalf("adopt with another init's handle: %v", err)
	}
	if err := rt.Adopt(ctx, id, "garbage"); !errcode.Is(err, errcode.InvalidArgument) {
		t.Fatalf("adopt with a malformed handle: %v", err)
	}
	stale, sid := fakeBundle(t, self, start+1) // the pid's process is not the recorded init
	if err := stale.Adopt(ctx, sid, ""); !errcode.Is(err, errcode.SandboxNotRunning) {
		t.Fatalf("adopt of a sandbox whose pid was reused: %v", err)
	}
}

// impostor, run as root in a sandbox, replaces the agent's socket with its own listener that
// answers every connection with a forged health reply, and logs each connection.
const impostor = `import os, socket
run = "/.agentbox/run"
s = socket.socket(socket.AF_UNIX)
s.bind(run + "/imp.sock")
s.listen(16)
os.rename(run + "/imp.sock", run + "/agent.sock")
open(run + "/imp.ready", "w").write("1")
body = b'{"ok":true,"version":"v1"}'
while True:
    c, _ = s.accept()
    with open(run + "/imp.log", "a") as f:
        f.write("conn\n")
    try:  # the host closes a refused connection at once: a broken pipe must not end the impostor
        c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    except OSError:
        pass
    c.close()
`

// TestRuncAgentPeerCheck: root in the sandbox replaces its agent socket with its own listener;
// a dial through Agent is refused with a *runtime.AgentPeerError (SANDBOX_NOT_RUNNING, saying
// the socket is held by another process), and no forged reply reaches the caller.
func TestRuncAgentPeerCheck(t *testing.T) {
	t.Parallel()
	rt := newRunc(t)
	ctx := context.Background()
	spec := runtimetest.DefaultSpec(runtimetest.NewID())
	spec.IDMap = runtimetest.TestIDMap()
	c := runtimetest.Start(t, rt, spec)
	if h, err := c.Health(ctx); err != nil || !h.OK {
		t.Fatalf("health before the attack: %+v %v", h, err)
	}
	res := runtimetest.ExecRequest(t, c, guest.ExecRequest{User: "root", TimeoutMs: 30000,
		Argv: []string{"sh", "-c", `setsid python3 -c "$0" </dev/null >/dev/null 2>&1 & echo started`, impostor}})
	if res.Stdout != "started\n" {
		t.Fatalf("start the impostor: %+v", res)
	}
	ready := filepath.Join(rt.sandboxDir(spec.ID), "run", "imp.ready")
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(ready); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the impostor did not take the socket (the attack did not happen)")
		}
	}

	dial, err := rt.Agent(ctx, spec.ID)
	if err != nil {
		t.Fatal(err)
	}
	_, err = dial(ctx)
	var pe *runtime.AgentPeerError
	if !errors.As(err, &pe) || pe.ID != spec.ID || pe.PeerPID == pe.WantPID {
		t.Fatalf("dial of a socket held by an impostor: %v, want a *runtime.AgentPeerError", err)
	}
	if !errcode.Is(err, errcode.SandboxNotRunning) || !strings.Contains(errcode.Message(err), "held by another process") {
		t.Fatalf("dial error %q: want SANDBOX_NOT_RUNNING saying the socket is held by another process", err)
	}
	fresh := guest.NewClient(guest.Dialer(dial))
	defer fresh.Close()
	h, err := fresh.Health(ctx)
	if err == nil {
		t.Fatalf("a forged reply reached the caller: %+v", h)
	}
	if !errors.As(err, &pe) {
		t.Errorf("health through the client: %v, want a *runtime.AgentPeerError in the chain", err)
	}
	// The impostor got connections (the check runs after connect) but never a byte of ours:
	// it answers without reading, and the dialer closed each connection before using it.
	// It accepts asynchronously: give it time to log the connections the kernel queued for it.
	logPath := filepath.Join(rt.sandboxDir(spec.ID), "run", "imp.log")
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if b, _ := os.ReadFile(logPath); strings.Contains(string(b), "conn") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the impostor logged no connection: the dials did not reach it, so the test proves nothing")
		}
	}
}
