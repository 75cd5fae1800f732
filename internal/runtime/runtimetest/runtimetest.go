// Package runtimetest is the suite every runtime.Runtime must pass, and the helpers that
// runtime-specific tests share: create and start a sandbox, wait for its agent, run commands.
package runtimetest

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/guest"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/sandboxid"
)

// ReadyTimeout bounds how long a started sandbox's agent may take to answer.
const ReadyTimeout = 20 * time.Second

// NewID returns a fresh sandbox id (sandboxid.New).
func NewID() string { return sandboxid.New() }

// DefaultSpec is the spec the suite creates: image "host", one core, 256 MiB, 256 pids.
func DefaultSpec(id string) runtime.Spec {
	return runtime.Spec{ID: id, Image: "host", CPU: 1, MemoryMB: 256, DiskMB: 1024, PidsLimit: 256,
		Env: map[string]string{"AGENTBOX_TEST": "1"}}
}

// Start creates and starts a sandbox from spec (runtime.CreateAndStart: in one step where the
// runtime can), waits for its agent and returns a client.
// The sandbox is deleted when the test ends.
func Start(t testing.TB, rt runtime.Runtime, spec runtime.Spec) *guest.Client {
	t.Helper()
	c, _ := StartHandle(t, rt, spec)
	return c
}

// StartHandle is Start that also returns the sandbox's Handle.
func StartHandle(t testing.TB, rt runtime.Runtime, spec runtime.Spec) (*guest.Client, runtime.Handle) {
	t.Helper()
	ctx := context.Background()
	t.Cleanup(func() {
		if err := rt.Delete(context.Background(), spec.ID); err != nil {
			t.Errorf("cleanup: delete %s: %v", spec.ID, err)
		}
	})
	h, err := runtime.CreateAndStart(ctx, rt, spec)
	if err != nil {
		t.Fatalf("create and start %s: %v", spec.ID, err)
	}
	c := Client(t, rt, spec.ID)
	rctx, cancel := context.WithTimeout(ctx, ReadyTimeout)
	defer cancel()
	if err := c.WaitReady(rctx); err != nil {
		t.Fatalf("sandbox %s: %v", spec.ID, err)
	}
	return c, h
}

// Client returns a client of sandbox id's agent over the runtime's Agent dialer, closed when
// the test ends.
func Client(t testing.TB, rt runtime.Runtime, id string) *guest.Client {
	t.Helper()
	dial, err := rt.Agent(context.Background(), id)
	if err != nil {
		t.Fatalf("agent of %s: %v", id, err)
	}
	c := guest.NewClient(guest.Dialer(dial))
	t.Cleanup(c.Close)
	return c
}

// Exec runs argv in the sandbox with a 60 s timeout and fails the test on a protocol error
// (a non-zero exit is returned, not an error).
func Exec(t testing.TB, c *guest.Client, argv ...string) Result {
	t.Helper()
	return ExecRequest(t, c, guest.ExecRequest{Argv: argv, TimeoutMs: 60000})
}

// ExecRequest runs req and fails the test on a protocol error.
func ExecRequest(t testing.TB, c *guest.Client, req guest.ExecRequest) Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := c.Exec(ctx, req, nil)
	if err != nil {
		t.Fatalf("exec %q: %v", req.Argv, err)
	}
	return Result{ExecResult: res, Stdout: string(res.Stdout), Stderr: string(res.Stderr)}
}

// Result is a command's outcome with its output as text, for comparisons in tests.
type Result struct {
	guest.ExecResult
	Stdout, Stderr string
}

// String is the outcome as a failing test prints it: exit, signal, output as text.
func (r Result) String() string {
	return fmt.Sprintf("exit %d signal %q timed_out %v stdout %q stderr %q", r.ExitCode, r.Signal, r.TimedOut, r.Stdout, r.Stderr)
}

func wantState(t testing.TB, rt runtime.Runtime, id string, want runtime.Status) {
	t.Helper()
	got, err := rt.State(context.Background(), id)
	if err != nil {
		t.Fatalf("state %s: %v", id, err)
	}
	if got != want {
		t.Fatalf("state %s = %q, want %q", id, got, want)
	}
}

func listed(t testing.TB, rt runtime.Runtime, id string) bool {
	t.Helper()
	ids, err := rt.List(context.Background())
	if err != nil {
		t.Fatalf("list: %v", err)
	}
	return slices.Contains(ids, id)
}

// Killer makes sandbox id's init die behind the runtime's back, as a crash would (the fake
// runtime's Kill; SIGKILL to the init's host pid for an OCI runtime).
type Killer func(t testing.TB, id string)

// Run runs the whole suite: the contract's cases (RunContract) and the host cases, which need
// real sandboxes (hostname, network and user namespaces, processes on the host). rt must be
// available; Run creates sandboxes of image "host" with fresh ids and deletes them.
func Run(t *testing.T, rt runtime.Runtime, kill Killer) {
	RunContract(t, rt, kill)
	caps := rt.Capabilities()
	t.Run("Hostname", func(t *testing.T) { t.Parallel(); testHostname(t, rt) })
	t.Run("HostDevNull", func(t *testing.T) { testHostDevNull(t, rt) })
	t.Run("NetworkLoopbackOnly", func(t *testing.T) { t.Parallel(); testNetwork(t, rt) })
	t.Run("NetworkEgressHost", func(t *testing.T) { t.Parallel(); testEgressHost(t, rt) })
	t.Run("NetworkEgressTransparent", func(t *testing.T) { t.Parallel(); testEgressTransparent(t, rt) })
	t.Run("UserNamespace", func(t *testing.T) {
		t.Parallel()
		if !caps.UserNamespaces {
			t.Skipf("runtime %s gives sandboxes no user namespace (hardening %v)", rt.Name(), caps.Hardening)
		}
		testUserNamespace(t, rt)
	})
	if _, ok := rt.(runtime.Snapshotter); ok && slices.Contains(caps.Snapshots, runtime.SnapshotFiles) {
		t.Run("Snapshots", func(t *testing.T) { t.Parallel(); RunSnapshots(t, rt, SnapshotConfig{}) })
	}
}

// RunCluster is the suite of a runtime whose sandboxes are pods on a cluster (kubernetes): the
// contract's cases (RunContract) and the host cases that hold for a pod — hostname, and, on a
// test cluster whose node is this host, /dev/null. A pod always has its cluster network
// interface (what it can reach is the runtime's NetworkPolicy's business, tested with the
// runtime), never a user namespace or the egress path, so NetworkLoopbackOnly, the egress host
// cases and UserNamespace do not apply.
func RunCluster(t *testing.T, rt runtime.Runtime, kill Killer) {
	RunContract(t, rt, kill)
	t.Run("Hostname", func(t *testing.T) { t.Parallel(); testHostname(t, rt) })
	t.Run("HostDevNull", func(t *testing.T) { testHostDevNull(t, rt) })
}

// RunContract runs the cases that test the runtime contract's logic and nothing of the host
// (no containers, cgroups or mounts are looked at), so that a runtime without containers (the
// fake) passes them too: lifecycle and states, Agent, Wait, Adopt, Handle, network modes, List
// and concurrency. kill must not be nil: Wait and Adopt are tested on a sandbox that died.
func RunContract(t *testing.T, rt runtime.Runtime, kill Killer) {
	if kill == nil {
		t.Fatal("runtimetest: RunContract needs a Killer")
	}
	caps := rt.Capabilities()
	if !caps.Available {
		t.Fatalf("runtime %s is not available: %s", rt.Name(), caps.Reason)
	}
	if caps.Name != rt.Name() || caps.Isolation == "" || !slices.Contains(caps.NetworkModes, runtime.NetworkNone) || len(caps.Images) == 0 {
		t.Errorf("capabilities incomplete: %+v", caps)
	}
	t.Run("Lifecycle", func(t *testing.T) { t.Parallel(); testLifecycle(t, rt) })
	t.Run("CreateThenStart", func(t *testing.T) { t.Parallel(); testCreateThenStart(t, rt) })
	t.Run("DeleteUnknown", func(t *testing.T) { t.Parallel(); testDeleteUnknown(t, rt) })
	t.Run("ListCreatedNotStarted", func(t *testing.T) { t.Parallel(); testListCreated(t, rt) })
	t.Run("Concurrent", func(t *testing.T) { t.Parallel(); testConcurrent(t, rt) })
	t.Run("Agent", func(t *testing.T) { t.Parallel(); testAgent(t, rt) })
	t.Run("WaitStop", func(t *testing.T) { t.Parallel(); testWaitStop(t, rt) })
	t.Run("WaitKilled", func(t *testing.T) { t.Parallel(); testWaitKilled(t, rt, kill) })
	t.Run("WaitCancelled", func(t *testing.T) { t.Parallel(); testWaitCancelled(t, rt) })
	t.Run("Adopt", func(t *testing.T) { t.Parallel(); testAdopt(t, rt, kill) })
	t.Run("Handle", func(t *testing.T) { t.Parallel(); testHandle(t, rt) })
	t.Run("NetworkModes", func(t *testing.T) { t.Parallel(); testNetworkModes(t, rt) })
	t.Run("NetworkEgress", func(t *testing.T) { t.Parallel(); testEgressContract(t, rt) })
	t.Run("DisksMiB", func(t *testing.T) { t.Parallel(); testDisksMiB(t, rt) })
}

func testLifecycle(t *testing.T, rt runtime.Runtime) {
	ctx := context.Background()
	id := NewID()
	spec := DefaultSpec(id)
	c := Start(t, rt, spec)
	wantState(t, rt, id, runtime.StatusRunning)

	if res := Exec(t, c, "true"); res.ExitCode != 0 {
		t.Fatalf("true: %+v", res)
	}
	if res := Exec(t, c, "sh", "-c", "exit 7"); res.ExitCode != 7 {
		t.Fatalf("exit 7: %+v", res)
	}
	if res := Exec(t, c, "sh", "-c", "echo $AGENTBOX_TEST"); strings.TrimSpace(res.Stdout) != "1" {
		t.Fatalf("spec env not applied: %+v", res)
	}
	if !listed(t, rt, id) {
		t.Fatalf("running %s not listed", id)
	}

	if err := rt.Stop(ctx, id); err != nil {
		t.Fatalf("stop: %v", err)
	}
	wantState(t, rt, id, runtime.StatusStopped)
	if err := rt.Stop(ctx, id); err != nil {
		t.Fatalf("stop of a stopped sandbox: %v", err)
	}
	hctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, err := c.Health(hctx); err == nil {
		t.Fatal("agent still answers after Stop")
	}

	if err := rt.Delete(ctx, id); err != nil {
		t.Fatalf("delete: %v", err)
	}
	wantState(t, rt, id, runtime.StatusAbsent)
	if listed(t, rt, id) {
		t.Fatalf("deleted %s still listed", id)
	}
	if err := rt.Delete(ctx, id); err != nil {
		t.Fatalf("second delete: %v", err)
	}
}

// testCreateThenStart: the two-step path (Start, the helper, takes Run where the runtime has
// it): created, the sandbox is listed but its agent does not answer; started, it does.
func testCreateThenStart(t *testing.T, rt runtime.Runtime) {
	ctx := context.Background()
	id := NewID()
	t.Cleanup(func() {
		if err := rt.Delete(context.Background(), id); err != nil {
			t.Errorf("cleanup: delete %s: %v", id, err)
		}
	})
	if _, err := rt.Create(ctx, DefaultSpec(id)); err != nil {
		t.Fatalf("create: %v", err)
	}
	if !listed(t, rt, id) {
		t.Fatalf("created %s not listed", id)
	}
	c := Client(t, rt, id)
	hctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err := c.Health(hctx)
	cancel()
	if err == nil {
		t.Fatal("the agent answers before Start")
	}
	if err := rt.Start(ctx, id); err != nil {
		t.Fatalf("start: %v", err)
	}
	rctx, rcancel := context.WithTimeout(ctx, ReadyTimeout)
	defer rcancel()
	if err := c.WaitReady(rctx); err != nil {
		t.Fatalf("after start: %v", err)
	}
	wantState(t, rt, id, runtime.StatusRunning)
	if res := Exec(t, c, "echo", "started"); res.Stdout != "started\n" {
		t.Fatalf("exec after start: %+v", res)
	}
}

func testDeleteUnknown(t *testing.T, rt runtime.Runtime) {
	id := NewID()
	if err := rt.Delete(context.Background(), id); err != nil {
		t.Fatalf("delete of never-created %s: %v", id, err)
	}
	wantState(t, rt, id, runtime.StatusAbsent)
}

func testListCreated(t *testing.T, rt runtime.Runtime) {
	ctx := context.Background()
	id := NewID()
	t.Cleanup(func() { _ = rt.Delete(context.Background(), id) })
	if _, err := rt.Create(ctx, DefaultSpec(id)); err != nil {
		t.Fatalf("create: %v", err)
	}
	wantState(t, rt, id, runtime.StatusCreated)
	if !listed(t, rt, id) {
		t.Fatalf("created-but-not-started %s not listed", id)
	}
	if err := rt.Delete(ctx, id); err != nil {
		t.Fatalf("delete: %v", err)
	}
	wantState(t, rt, id, runtime.StatusAbsent)
	if listed(t, rt, id) {
		t.Fatalf("deleted %s still listed", id)
	}
}

func testConcurrent(t *testing.T, rt runtime.Runtime) {
	const n = 5
	ctx := context.Background()
	ids := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		ids[i] = NewID()
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = createRunDelete(ctx, rt, ids[i])
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("sandbox %s: %v", ids[i], err)
			_ = rt.Delete(ctx, ids[i])
		}
	}
	all, err := rt.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		if slices.Contains(all, id) {
			t.Errorf("%s still listed after delete", id)
		}
	}
}

func createRunDelete(ctx context.Context, rt runtime.Runtime, id string) (err error) {
	defer func() {
		if derr := rt.Delete(ctx, id); derr != nil && err == nil {
			err = fmt.Errorf("delete: %w", derr)
		}
	}()
	if _, err := rt.Create(ctx, DefaultSpec(id)); err != nil {
		return fmt.Errorf("create: %w", err)
	}
	if err := rt.Start(ctx, id); err != nil {
		return fmt.Errorf("start: %w", err)
	}
	dial, err := rt.Agent(ctx, id)
	if err != nil {
		return err
	}
	c := guest.NewClient(guest.Dialer(dial))
	defer c.Close()
	rctx, cancel := context.WithTimeout(ctx, ReadyTimeout)
	defer cancel()
	if err := c.WaitReady(rctx); err != nil {
		return err
	}
	res, err := c.Exec(ctx, guest.ExecRequest{Argv: []string{"echo", id}, TimeoutMs: 30000}, nil)
	if err != nil {
		return fmt.Errorf("exec: %w", err)
	}
	if strings.TrimSpace(string(res.Stdout)) != id {
		return fmt.Errorf("echo printed %q", res.Stdout)
	}
	return nil
}

// connectScript connects to 127.0.0.1:PORT and prints "connected" or "failed <error>".
const connectScript = `import socket, sys
s = socket.socket()
s.settimeout(3)
try:
    s.connect(("127.0.0.1", int(sys.argv[1])))
    print("connected")
except OSError as e:
    print("failed", e)
`

// selfScript listens on the sandbox's own loopback and connects to itself.
const selfScript = `import socket
l = socket.socket()
l.bind(("127.0.0.1", 0))
l.listen(1)
c = socket.create_connection(l.getsockname(), timeout=3)
a, _ = l.accept()
a.sendall(b"ping")
print(c.recv(4).decode())
`

// interfaces lists the interface names of a /proc/net/dev table.
func interfaces(procNetDev string) []string {
	var names []string
	for _, line := range strings.Split(procNetDev, "\n") {
		if name, _, ok := strings.Cut(line, ":"); ok && !strings.Contains(name, "|") {
			names = append(names, strings.TrimSpace(name))
		}
	}
	return names
}

func testNetwork(t *testing.T, rt runtime.Runtime) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var accepted atomic.Int32
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			conn.Close()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port

	c := Start(t, rt, DefaultSpec(NewID()))
	// /proc/net/dev rather than /sys/class/net: gVisor's sysfs has no class/net.
	if res := Exec(t, c, "cat", "/proc/net/dev"); strings.Join(interfaces(res.Stdout), " ") != "lo" {
		t.Errorf("network interfaces: %q, want only lo (%+v)", interfaces(res.Stdout), res)
	}
	res := Exec(t, c, "python3", "-c", connectScript, fmt.Sprint(port))
	if res.ExitCode == 127 || strings.Contains(res.Stderr, "not found") {
		t.Skipf("python3 is not available in the sandbox: %+v", res)
	}
	if res.ExitCode != 0 || !strings.HasPrefix(res.Stdout, "failed") {
		t.Errorf("connecting to the host's 127.0.0.1:%d from inside: %+v", port, res)
	}
	if n := accepted.Load(); n != 0 {
		t.Errorf("the host listener accepted %d connections from the sandbox", n)
	}
	if res := Exec(t, c, "python3", "-c", selfScript); strings.TrimSpace(res.Stdout) != "ping" {
		t.Errorf("the sandbox's own loopback does not work: %+v", res)
	}
	// Network none has no AnyIP route: an address outside is unreachable.
	if res := Exec(t, c, "python3", "-c", unreachScript); strings.TrimSpace(res.Stdout) != "failed ENETUNREACH" {
		t.Errorf("network none connecting to 203.0.113.7:443: %+v", res)
	}
}
