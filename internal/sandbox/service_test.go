package sandbox_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/oci"
	"github.com/agentbox/agentbox/internal/runtime/runtimetest"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/sandbox/jobs"
	"github.com/agentbox/agentbox/internal/sandbox/netsession"
	"github.com/agentbox/agentbox/internal/sandbox/pools"
	"github.com/agentbox/agentbox/internal/sandbox/snapshots"
	"github.com/agentbox/agentbox/internal/store/sqlite"
	"github.com/agentbox/agentbox/internal/testenv"
)

type env struct {
	svc   *sandbox.Service
	jobs  *jobs.Service       // svc's jobs feature
	net   *netsession.Service // svc's network
	pools *pools.Service      // svc's warm pools
	snaps *snapshots.Service  // svc's snapshots feature
	root  string              // runtime root
	st    *sqlite.Store
	rt    runtime.Runtime // the runtime itself, behind the service's back
}

// newEnv builds a real service: real SQLite, real runc, the real agentbox binary as the agent.
func newEnv(t *testing.T, cfg sandbox.Config) *env {
	t.Helper()
	return newEnvWrapped(t, cfg, nil)
}

// newEnvWrapped is newEnv with the runtime passed through wrap (nil: as it is), e.g. to make
// one of its operations fail.
func newEnvWrapped(t *testing.T, cfg sandbox.Config, wrap func(runtime.Runtime) runtime.Runtime) *env {
	t.Helper()
	return newEnvWith(t, cfg, wrap, nil)
}

// newEnvWith is newEnvWrapped with the store the service uses passed through wrapStore too (nil:
// as it is); the features and the test's own reads use the store itself.
func newEnvWith(t *testing.T, cfg sandbox.Config, wrap func(runtime.Runtime) runtime.Runtime, wrapStore func(*sqlite.Store) sandbox.Store) *env {
	t.Helper()
	testenv.RequireRoot(t)
	dir := testenv.ShortTempDir(t, "absvc")
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(dir, "agentbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(dir, "rt")
	rt, err := oci.New(ctx, oci.Config{Name: "runc", Binary: "runc", Root: root, GuestBinary: testenv.GuestBinary(t),
		CgroupParent: "abt-" + filepath.Base(dir), Subreaper: true})
	if err != nil {
		t.Fatal(err)
	}
	var used runtime.Runtime = rt
	if wrap != nil {
		used = wrap(rt)
	}
	var svcStore sandbox.Store = st
	if wrapStore != nil {
		svcStore = wrapStore(st)
	}
	svc, err := sandbox.NewService(svcStore, []runtime.Runtime{used}, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{svc: svc, net: netsession.New(svc.Core(), st), jobs: jobs.New(svc.Core(), st), snaps: snapshots.New(svc.Core(), st), root: root, st: st, rt: rt}
	e.pools = pools.New(svc.Core(), st) // after the network, whose Prepare a claim reads
	t.Cleanup(func() {
		list, _ := svc.List(context.Background(), sandbox.ListFilter{})
		for _, sb := range list {
			svc.Destroy(context.Background(), sb.ID)
		}
		e.assertNoLeaks(t)
		svc.Close()
		st.Close()
	})
	return e
}

// killContainer SIGKILLs id's container behind the service's back and returns once runc says it
// has stopped: a kill is delivered asynchronously, and a reconcile that still sees it running
// would rightly adopt it.
func (e *env) killContainer(t *testing.T, id string) {
	t.Helper()
	root := filepath.Join(e.root, "state")
	if out, err := exec.Command("runc", "--root", root, "kill", id, "KILL").CombinedOutput(); err != nil {
		t.Fatalf("runc kill: %v %s", err, out)
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
		out, err := exec.Command("runc", "--root", root, "state", id).CombinedOutput()
		if err == nil && strings.Contains(string(out), `"status": "stopped"`) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("container %s still not stopped a minute after SIGKILL: %v %s", id, err, out)
		}
	}
}

// assertNoLeaks checks the host: no container, cgroup, mount, process or sandbox dir left.
func (e *env) assertNoLeaks(t *testing.T) {
	t.Helper()
	out, err := exec.Command("runc", "--root", filepath.Join(e.root, "state"), "list", "-q").CombinedOutput()
	if err != nil {
		t.Errorf("runc list: %v: %s", err, out)
	}
	if s := strings.TrimSpace(string(out)); s != "" {
		t.Errorf("leaked containers: %s", s)
	}
	dirs, _ := filepath.Glob(filepath.Join(e.root, "sandboxes", "*"))
	if len(dirs) > 0 {
		t.Errorf("leaked sandbox dirs: %v", dirs)
	}
	all, _ := e.st.ListSandboxes(context.Background(), sandbox.ListFilter{Limit: 100000})
	var ids []string
	for _, sb := range all {
		ids = append(ids, sb.ID)
	}
	if len(ids) > 0 {
		if leaks := testenv.Leaks(ids...); len(leaks) > 0 {
			t.Errorf("leaked host resources:\n%s", strings.Join(leaks, "\n"))
		}
	}
}

func (e *env) create(t *testing.T, req sandbox.CreateRequest) sandbox.Sandbox {
	t.Helper()
	sb, err := e.svc.Create(context.Background(), req)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	if sb.State != sandbox.StateRunning {
		t.Fatalf("create returned state %s", sb.State)
	}
	return sb
}

func (e *env) exec(t *testing.T, id string, req sandbox.ExecRequest) sandbox.ExecResult {
	t.Helper()
	res, err := e.svc.Exec(context.Background(), id, req, nil)
	if err != nil {
		t.Fatalf("exec %v: %v", req.Argv, err)
	}
	return res
}

func argv(a ...string) sandbox.ExecRequest { return sandbox.ExecRequest{Argv: a} }

// cutExec starts in sandbox id a command that runs until the sandbox goes, waits until it has
// started, and returns a wait for the error that ends it (at most 10 s).
func (e *env) cutExec(t *testing.T, id string) (wait func() error) {
	t.Helper()
	errc, started := make(chan error, 1), make(chan struct{})
	var once sync.Once
	go func() {
		_, err := e.svc.Exec(context.Background(), id, argv("sh", "-c", "echo started; exec sleep 60"), func(string, []byte) {
			once.Do(func() { close(started) })
		})
		errc <- err
	}()
	select {
	case <-started:
	case err := <-errc:
		t.Fatalf("the command ended before its sandbox did: %v", err)
	}
	return func() error {
		select {
		case err := <-errc:
			return err
		case <-time.After(10 * time.Second):
			t.Fatal("the command still runs 10 s after its sandbox was destroyed")
			return nil
		}
	}
}

func TestExecRoundTrip(t *testing.T) {
	e := newEnv(t, sandbox.Config{})
	sb := e.create(t, sandbox.CreateRequest{Env: map[string]string{"GREETING": "hello"}, Labels: map[string]string{"team": "a"}})
	cases := []struct {
		name      string
		req       sandbox.ExecRequest
		exit      int
		signal    string
		stdout    string
		stderrHas string
	}{
		{name: "echo", req: argv("echo", "hi"), stdout: "hi\n"},
		{name: "exit code", req: argv("sh", "-c", "exit 3"), exit: 3},
		{name: "signal", req: argv("sh", "-c", "kill -9 $$"), exit: 137, signal: "SIGKILL"},
		{name: "stderr", req: argv("sh", "-c", "echo oops >&2; exit 1"), exit: 1, stderrHas: "oops"},
		{name: "not found", req: argv("no-such-command-xyz"), exit: 127, stderrHas: "no-such-command-xyz"},
		{name: "stdin", req: sandbox.ExecRequest{Argv: []string{"cat"}, Stdin: []byte("from stdin")}, stdout: "from stdin"},
		{name: "sandbox env", req: argv("sh", "-c", "echo $GREETING"), stdout: "hello\n"},
		{name: "exec env", req: sandbox.ExecRequest{Argv: []string{"sh", "-c", "echo $GREETING $X"}, Env: map[string]string{"X": "y"}}, stdout: "hello y\n"},
		{name: "default cwd", req: argv("pwd"), stdout: "/workspace\n"},
		{name: "cwd", req: sandbox.ExecRequest{Argv: []string{"pwd"}, Cwd: "/tmp"}, stdout: "/tmp\n"},
		{name: "hostname is the id", req: argv("hostname"), stdout: sb.ID + "\n"},
		{name: "no shell interpretation", req: argv("echo", "$HOME", ";", "ls"), stdout: "$HOME ; ls\n"},
		{name: "host tools", req: argv("sh", "-c", "git --version >/dev/null && python3 -c 'print(6*7)'"), stdout: "42\n"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			res := e.exec(t, sb.ID, tc.req)
			if res.ExitCode != tc.exit || res.Signal != tc.signal {
				t.Errorf("exit %d signal %q, want %d %q (stderr %q)", res.ExitCode, res.Signal, tc.exit, tc.signal, res.Stderr)
			}
			if tc.stdout != "" && res.Stdout != tc.stdout {
				t.Errorf("stdout %q, want %q", res.Stdout, tc.stdout)
			}
			if !strings.Contains(res.Stderr, tc.stderrHas) {
				t.Errorf("stderr %q does not contain %q", res.Stderr, tc.stderrHas)
			}
		})
	}
	// The agent user cannot write the root (only root can, into the sandbox's own layer);
	// /workspace, /tmp and /home/agent are its.
	res := e.exec(t, sb.ID, argv("sh", "-c", "touch /usr/x 2>/dev/null && echo rw-root; for d in /workspace /tmp /home/agent; do touch $d/f && echo ok; done"))
	if res.Stdout != "ok\nok\nok\n" {
		t.Errorf("writable paths: %q %q", res.Stdout, res.Stderr)
	}
	evs, err := e.svc.Events(context.Background(), sandbox.EventFilter{SandboxID: sb.ID})
	if err != nil || len(evs) != 2 || evs[0].To != sandbox.StateCreating || evs[1].To != sandbox.StateRunning {
		t.Errorf("events %+v %v", evs, err)
	}
}

func TestTimeoutKillsProcessTree(t *testing.T) {
	e := newEnv(t, sandbox.Config{})
	sb := e.create(t, sandbox.CreateRequest{})
	start := time.Now()
	res := e.exec(t, sb.ID, sandbox.ExecRequest{
		Argv:    []string{"sh", "-c", `trap "" TERM; (trap "" TERM; sleep 1000) & sleep 1000`},
		Timeout: time.Second,
	})
	if !res.TimedOut {
		t.Fatalf("timed_out false: %+v", res)
	}
	if d := time.Since(start); d > 6*time.Second {
		t.Fatalf("timeout took %s", d)
	}
	ps := e.exec(t, sb.ID, argv("sh", "-c", "for p in /proc/[0-9]*; do cat $p/comm; done"))
	if strings.Contains(ps.Stdout, "sleep") {
		t.Fatalf("sleep processes survived the timeout:\n%s", ps.Stdout)
	}
}

func TestOutputBound(t *testing.T) {
	e := newEnv(t, sandbox.Config{})
	sb := e.create(t, sandbox.CreateRequest{})
	res := e.exec(t, sb.ID, argv("sh", "-c", "head -c 5000000 /dev/zero | tr '\\0' a"))
	if !res.Truncated || res.StdoutBytes != 5000000 || len(res.Stdout) != sandbox.DefaultMaxOutputBytes {
		t.Fatalf("truncated %v stdout_bytes %d kept %d", res.Truncated, res.StdoutBytes, len(res.Stdout))
	}
	_, err := e.svc.Exec(context.Background(), sb.ID, sandbox.ExecRequest{Argv: []string{"true"}, MaxOutputBytes: 1 << 30}, nil)
	if errcode.Of(err) != errcode.OutputLimitExceeded {
		t.Fatalf("huge max_output_bytes: %v", err)
	}
}

func TestStreamingAndCancel(t *testing.T) {
	e := newEnv(t, sandbox.Config{})
	sb := e.create(t, sandbox.CreateRequest{})
	var mu sync.Mutex
	var chunks []string
	first := make(chan time.Time, 1)
	start := time.Now()
	res, err := e.svc.Exec(context.Background(), sb.ID, argv("sh", "-c", "echo one; sleep 1; echo two"), func(stream string, data []byte) {
		mu.Lock()
		defer mu.Unlock()
		chunks = append(chunks, stream+":"+string(data))
		select {
		case first <- time.Now():
		default:
		}
	})
	if err != nil || res.Stdout != "one\ntwo\n" {
		t.Fatalf("stream exec: %+v %v", res, err)
	}
	if at := <-first; at.Sub(start) > 900*time.Millisecond {
		t.Fatalf("first chunk arrived after %s, not while the command ran", at.Sub(start))
	}
	// A cancelled call kills the command.
	ctx, cancel := context.WithCancel(context.Background())
	go func() { time.Sleep(500 * time.Millisecond); cancel() }()
	_, err = e.svc.Exec(ctx, sb.ID, argv("sh", "-c", "echo started > /workspace/marker; sleep 1000"), func(string, []byte) {})
	if err == nil {
		t.Fatal("cancelled exec returned no error")
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		ps := e.exec(t, sb.ID, argv("sh", "-c", "for p in /proc/[0-9]*; do cat $p/comm; done"))
		if !strings.Contains(ps.Stdout, "sleep") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the cancelled command still runs:\n%s", ps.Stdout)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestFiles(t *testing.T) {
	e := newEnv(t, sandbox.Config{})
	sb := e.create(t, sandbox.CreateRequest{})
	ctx := context.Background()
	read := func(path string) ([]byte, error) {
		rc, _, err := e.svc.ReadFile(ctx, sb.ID, path, 0, 0, 0)
		if err != nil {
			return nil, err
		}
		defer rc.Close()
		return io.ReadAll(rc)
	}
	// Every byte value round-trips.
	var all []byte
	for i := 0; i < 256; i++ {
		all = append(all, byte(i))
	}
	if _, err := e.svc.WriteFile(ctx, sb.ID, "bin/all.bin", 0o600, bytes.NewReader(all)); errcode.Of(err) != errcode.FileNotFound {
		t.Fatalf("write into a missing dir: %v", err)
	}
	if _, err := e.svc.WriteFile(ctx, sb.ID, "all.bin", 0o600, bytes.NewReader(all)); err != nil {
		t.Fatal(err)
	}
	if got, err := read("/workspace/all.bin"); err != nil || !bytes.Equal(got, all) {
		t.Fatalf("binary round trip: %v", err)
	}
	if res := e.exec(t, sb.ID, argv("stat", "-c", "%a %s", "all.bin")); res.Stdout != "600 256\n" {
		t.Fatalf("mode/size inside: %q", res.Stdout)
	}
	// 50 MiB of random bytes.
	big := make([]byte, 50<<20)
	rand.Read(big)
	if _, err := e.svc.WriteFile(ctx, sb.ID, "/workspace/big", 0o644, bytes.NewReader(big)); err != nil {
		t.Fatal(err)
	}
	got, err := read("/workspace/big")
	if err != nil || sha256.Sum256(got) != sha256.Sum256(big) {
		t.Fatalf("50 MiB round trip differs: %v", err)
	}
	res := e.exec(t, sb.ID, argv("sha256sum", "/workspace/big"))
	if want := fmt.Sprintf("%x", sha256.Sum256(big)); !strings.HasPrefix(res.Stdout, want) {
		t.Fatalf("sha inside %q want %s", res.Stdout, want)
	}
	// Atomic replace: a reader holding the old file sees old content; the path sees the new.
	e.exec(t, sb.ID, argv("sh", "-c", "echo old > f.txt"))
	if _, err := e.svc.WriteFile(ctx, sb.ID, "f.txt", 0o644, strings.NewReader("new\n")); err != nil {
		t.Fatal(err)
	}
	if got, _ := read("f.txt"); string(got) != "new\n" {
		t.Fatalf("after replace: %q", got)
	}
	// Range and bound.
	rc, size, err := e.svc.ReadFile(ctx, sb.ID, "all.bin", 10, 5, 0)
	if err != nil || size != 256 {
		t.Fatal(err, size)
	}
	part, _ := io.ReadAll(rc)
	rc.Close()
	if !bytes.Equal(part, all[10:15]) {
		t.Fatalf("range: %v", part)
	}
	_, _, err = e.svc.ReadFile(ctx, sb.ID, "big", 0, 0, 1<<20)
	if e2, ok := errcode.As(err); !ok || e2.Code != errcode.FileTooLarge || e2.Details["size"] != float64(50<<20) {
		t.Fatalf("over-limit read: %v", err)
	}
	// A symlink to a host-only path resolves inside the sandbox, never on the host.
	canary := filepath.Join(os.TempDir(), "agentbox-canary-"+sb.ID)
	if err := os.WriteFile(canary, []byte("HOST SECRET"), 0o600); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(canary)
	e.exec(t, sb.ID, argv("ln", "-s", canary, "/workspace/escape"))
	e.exec(t, sb.ID, argv("ln", "-s", "/", "/workspace/rootlink"))
	for _, p := range []string{"/workspace/escape", "/workspace/rootlink" + canary, "../../../../.." + canary} {
		got, err := read(p)
		if bytes.Contains(got, []byte("HOST SECRET")) {
			t.Fatalf("read %s returned host content", p)
		}
		if errcode.Of(err) != errcode.FileNotFound {
			t.Errorf("read %s: %v, want FILE_NOT_FOUND", p, err)
		}
	}
	// A FIFO does not hang the reader.
	e.exec(t, sb.ID, argv("mkfifo", "/workspace/fifo"))
	done := make(chan error, 1)
	go func() { _, err := read("/workspace/fifo"); done <- err }()
	select {
	case err := <-done:
		if errcode.Of(err) != errcode.InvalidArgument {
			t.Fatalf("fifo read: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("reading a FIFO hung")
	}
	// List, stat, mkdir, remove.
	if _, err := e.svc.Mkdir(ctx, sb.ID, sandbox.MkdirRequest{Path: "a/b/c", Parents: true}); err != nil {
		t.Fatal(err)
	}
	dl, err := e.svc.ListDir(ctx, sb.ID, "/workspace")
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]string{}
	for _, en := range dl.Entries {
		names[en.Name] = en.Type
	}
	if names["a"] != "dir" || names["all.bin"] != "file" || names["escape"] != "symlink" {
		t.Fatalf("list: %v", names)
	}
	if err := e.svc.Remove(ctx, sb.ID, "a", true); err != nil {
		t.Fatal(err)
	}
	if _, err := e.svc.Stat(ctx, sb.ID, "a"); errcode.Of(err) != errcode.FileNotFound {
		t.Fatalf("stat after remove: %v", err)
	}
	if _, err := e.svc.Stat(ctx, sb.ID, "bad\x00path"); errcode.Of(err) != errcode.InvalidArgument {
		t.Fatalf("NUL path: %v", err)
	}
}

func TestNoNetwork(t *testing.T) {
	e := newEnv(t, sandbox.Config{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan struct{}, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			accepted <- struct{}{}
			c.Close()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	sb := e.create(t, sandbox.CreateRequest{})
	script := fmt.Sprintf(`
import socket
s = socket.socket()
s.settimeout(3)
try:
    s.connect(("127.0.0.1", %d))
    print("connected")
except OSError as e:
    print("refused", e)
`, port)
	res := e.exec(t, sb.ID, argv("python3", "-c", script))
	if !strings.HasPrefix(res.Stdout, "refused") {
		t.Fatalf("connect to the host's loopback: %q %q", res.Stdout, res.Stderr)
	}
	select {
	case <-accepted:
		t.Fatal("the host listener accepted a connection from the sandbox")
	default:
	}
	ifs := e.exec(t, sb.ID, argv("cat", "/proc/net/dev"))
	for _, line := range strings.Split(ifs.Stdout, "\n")[2:] {
		if name, _, ok := strings.Cut(strings.TrimSpace(line), ":"); ok && name != "lo" {
			t.Fatalf("sandbox has interface %q", name)
		}
	}
}

func TestMemoryLimitAndPids(t *testing.T) {
	e := newEnv(t, sandbox.Config{PidsLimit: 64})
	sb := e.create(t, sandbox.CreateRequest{MemoryMB: 64})
	res := e.exec(t, sb.ID, argv("python3", "-c", "b = bytearray(512 << 20); print(len(b))"))
	if res.Signal != "SIGKILL" || !res.OOMKilled {
		t.Fatalf("allocating 512 MiB under a 64 MiB limit: %+v (want SIGKILL, oom_killed)", res)
	}
	if r := e.exec(t, sb.ID, argv("sh", "-c", "kill -9 $$")); r.Signal != "SIGKILL" || r.OOMKilled {
		t.Errorf("a command that SIGKILLs itself is not an OOM kill: %+v", r)
	}
	if r := e.exec(t, sb.ID, argv("echo", "alive")); r.Stdout != "alive\n" {
		t.Fatalf("sandbox not alive after OOM: %+v", r)
	}
	// The bomb's shell waits, so the timeout (not the bomb dying out on its own) ends it: the
	// kill of its whole tree must leave the sandbox usable at once. The bomb runs in a subshell
	// forked before it starts: the outer shell never forks into a full pids cgroup itself (dash
	// exits 2 on "Cannot fork", which a loaded make test once hit between its own two forks).
	res = e.exec(t, sb.ID, sandbox.ExecRequest{Argv: []string{"sh", "-c", "(f() { f | f & }; f); exec sleep 1000"}, Timeout: 3 * time.Second})
	if !res.TimedOut {
		t.Fatalf("fork bomb: %+v", res)
	}
	if r := e.exec(t, sb.ID, argv("sh", "-c", "cat /sys/fs/cgroup/pids/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids.max")); strings.TrimSpace(r.Stdout) != "64" {
		t.Fatalf("pids.max inside: %q", r.Stdout)
	}
	if r := e.exec(t, sb.ID, argv("echo", "alive")); r.Stdout != "alive\n" {
		t.Fatalf("sandbox not responsive after a fork bomb: %+v", r)
	}
	_ = res
}

func TestTTLExpiry(t *testing.T) {
	e := newEnv(t, sandbox.Config{})
	sb := e.create(t, sandbox.CreateRequest{TTLSeconds: 2})
	// A command still running when the TTL runs out fails with the reason, not "unexpectedly".
	wait := e.cutExec(t, sb.ID)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go e.svc.Run(ctx)
	deadline := time.Now().Add(15 * time.Second)
	for {
		got, err := e.svc.Get(context.Background(), sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.State == sandbox.StateDestroyed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox still %s after its TTL", got.State)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if st, _ := e.svc.Runtimes(), 0; len(st) == 0 {
		t.Fatal("no runtimes")
	}
	if err := wait(); errcode.Of(err) != errcode.SandboxNotRunning || !strings.Contains(err.Error(), "TTL ran out") {
		t.Fatalf("exec cut by the TTL: %v", err)
	}
	e.assertNoLeaks(t)
	evs, _ := e.svc.Events(context.Background(), sandbox.EventFilter{SandboxID: sb.ID})
	if last := evs[len(evs)-1]; last.To != sandbox.StateDestroyed || last.Reason != "ttl expired" {
		t.Fatalf("last event %+v", last)
	}
	// Extend pushes expiry; destroy is idempotent.
	sb2 := e.create(t, sandbox.CreateRequest{TTLSeconds: 60})
	ext, err := e.svc.Extend(context.Background(), sb2.ID, 120)
	if err != nil || ext.ExpiresAt.Sub(sb2.ExpiresAt) != 120*time.Second {
		t.Fatalf("extend: %v %v", ext.ExpiresAt.Sub(sb2.ExpiresAt), err)
	}
	// ExpireIn moves the end to a time from now, earlier as well as later, capped at MaxTTL.
	before := time.Now()
	if short, err := e.svc.ExpireIn(context.Background(), sb2.ID, 30*time.Second); err != nil || short.ExpiresAt.Before(before.Add(30*time.Second).Add(-time.Millisecond)) || short.ExpiresAt.After(time.Now().Add(30*time.Second)) {
		t.Fatalf("expire in 30 s: %v %v", short.ExpiresAt.Sub(before), err)
	}
	if long, err := e.svc.ExpireIn(context.Background(), sb2.ID, 1000*time.Hour); err != nil || long.ExpiresAt.After(time.Now().Add(e.svc.Config().MaxTTL)) {
		t.Fatalf("expire beyond the max TTL: %v %v", long.ExpiresAt, err)
	}
	for i := 0; i < 2; i++ {
		d, err := e.svc.Destroy(context.Background(), sb2.ID)
		if err != nil || d.State != sandbox.StateDestroyed {
			t.Fatalf("destroy #%d: %+v %v", i, d, err)
		}
	}
	if _, err := e.svc.Exec(context.Background(), sb2.ID, argv("true"), nil); errcode.Of(err) != errcode.SandboxNotRunning {
		t.Fatalf("exec in destroyed sandbox: %v", err)
	}
	if _, err := e.svc.ExpireIn(context.Background(), sb2.ID, time.Minute); errcode.Of(err) != errcode.SandboxNotRunning {
		t.Fatalf("expire a destroyed sandbox: %v", err)
	}
}

// TestDestroyDuringExec: a command cut by a destroy fails with SANDBOX_NOT_RUNNING saying so,
// and the sandbox is recorded destroyed, not lost.
func TestDestroyDuringExec(t *testing.T) {
	e := newEnv(t, sandbox.Config{})
	sb := e.create(t, sandbox.CreateRequest{})
	wait := e.cutExec(t, sb.ID)
	if d, err := e.svc.Destroy(context.Background(), sb.ID); err != nil || d.State != sandbox.StateDestroyed {
		t.Fatalf("destroy: %+v %v", d, err)
	}
	if err := wait(); errcode.Of(err) != errcode.SandboxNotRunning || !strings.Contains(err.Error(), "destroyed while the call ran") {
		t.Fatalf("exec cut by a destroy: %v", err)
	}
	if got, err := e.svc.Get(context.Background(), sb.ID); err != nil || got.State != sandbox.StateDestroyed {
		t.Fatalf("after destroy: %+v %v", got, err)
	}
	e.assertNoLeaks(t)
}

func TestBadInput(t *testing.T) {
	e := newEnv(t, sandbox.Config{})
	ctx := context.Background()
	bad := []sandbox.CreateRequest{
		{MemoryMB: -1}, {MemoryMB: 1}, {CPU: -2}, {CPU: 0.001}, {DiskMB: -5}, {TTLSeconds: -1},
		{TTLSeconds: 1 << 40}, {Env: map[string]string{"1BAD": "x"}}, {Env: map[string]string{"A": "x\x00y"}},
		{Labels: map[string]string{"": "x"}}, {Image: "ubuntu:latest"},
	}
	for _, req := range bad {
		if _, err := e.svc.Create(ctx, req); errcode.Of(err) != errcode.InvalidArgument {
			t.Errorf("create %+v: %v, want INVALID_ARGUMENT", req, err)
		}
	}
	if _, err := e.svc.Create(ctx, sandbox.CreateRequest{Runtime: "nope"}); errcode.Of(err) != errcode.RuntimeUnavailable {
		t.Errorf("unknown runtime: %v", err)
	}
	if list, _ := e.svc.List(ctx, sandbox.ListFilter{States: []sandbox.State{"creating", "running", "failed"}}); len(list) != 0 {
		t.Errorf("bad creates left records: %+v", list)
	}
	for _, id := range []string{"", "sb-1", "../../etc", "sb-0123456789aX", "sb-0123456789ab\x00"} {
		if _, err := e.svc.Get(ctx, id); errcode.Of(err) != errcode.InvalidArgument {
			t.Errorf("get %q: %v", id, err)
		}
	}
	if _, err := e.svc.Get(ctx, "sb-0123456789ab"); errcode.Of(err) != errcode.SandboxNotFound {
		t.Errorf("get unknown: %v", err)
	}
	if _, err := e.svc.Destroy(ctx, "sb-0123456789ab"); errcode.Of(err) != errcode.SandboxNotFound {
		t.Errorf("destroy unknown: %v", err)
	}
	sb := e.create(t, sandbox.CreateRequest{})
	for _, req := range []sandbox.ExecRequest{{}, {Argv: []string{""}}, {Argv: []string{"a\x00b"}}, {Argv: []string{"true"}, Timeout: -time.Second}, {Argv: []string{"true"}, Env: map[string]string{"A=B": "c"}}} {
		if _, err := e.svc.Exec(ctx, sb.ID, req, nil); errcode.Of(err) != errcode.InvalidArgument {
			t.Errorf("exec %+v: %v", req, err)
		}
	}
	if _, err := e.svc.Extend(ctx, sb.ID, 0); errcode.Of(err) != errcode.InvalidArgument {
		t.Errorf("extend 0: %v", err)
	}
}

// TestDiskBudget: the sum of live sandboxes' disk_mb stays within the budget (their sparse disks
// could otherwise fill the host's file system together); a refused create leaves nothing.
func TestDiskBudget(t *testing.T) {
	e := newEnv(t, sandbox.Config{DiskBudgetMB: 100})
	ctx := context.Background()
	a := e.create(t, sandbox.CreateRequest{DiskMB: 64})
	before, _ := e.svc.List(ctx, sandbox.ListFilter{})
	_, err := e.svc.Create(ctx, sandbox.CreateRequest{DiskMB: 64})
	if errcode.Of(err) != errcode.CapacityUnavailable || !strings.Contains(err.Error(), "disk budget") {
		t.Fatalf("over the disk budget: %v", err)
	}
	if after, _ := e.svc.List(ctx, sandbox.ListFilter{}); len(after) != len(before) {
		t.Errorf("a refused create left a record: %d sandboxes, then %d", len(before), len(after))
	}
	if c, err := e.svc.Capacity(ctx); err != nil || c.DiskBudgetMB != 100 || c.DiskUsedMB != 64 {
		t.Errorf("capacity %+v %v", c, err)
	}
	e.create(t, sandbox.CreateRequest{DiskMB: 32})
	if _, err := e.svc.Destroy(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	e.create(t, sandbox.CreateRequest{DiskMB: 64})
}

func TestCapacity(t *testing.T) {
	if testing.Short() {
		t.Skip("creates 200 sandboxes")
	}
	e := newEnv(t, sandbox.Config{CPUBudget: 20, MemoryBudgetMB: 200 * 32})
	ctx := context.Background()
	// The cpu budget refuses a create that would exceed it, and nothing is created.
	if _, err := e.svc.Create(ctx, sandbox.CreateRequest{CPU: 21, MemoryMB: 32}); errcode.Of(err) != errcode.CapacityUnavailable {
		t.Fatalf("over cpu budget: %v", err)
	}
	if _, err := e.svc.Create(ctx, sandbox.CreateRequest{CPU: 0.01, MemoryMB: 201 * 32}); errcode.Of(err) != errcode.CapacityUnavailable {
		t.Fatalf("over memory budget: %v", err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 200)
	work := make(chan int)
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range work {
				// 0.1 cores, not less: a sandbox starts under its cpu quota, and at 0.01
				// cores each start takes seconds.
				if _, err := e.svc.Create(ctx, sandbox.CreateRequest{CPU: 0.1, MemoryMB: 32}); err != nil {
					errs <- err
				}
			}
		}()
	}
	for i := 0; i < 200; i++ {
		work <- i
	}
	close(work)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("create within capacity: %v", err)
	}
	_, err := e.svc.Create(ctx, sandbox.CreateRequest{CPU: 0.01, MemoryMB: 16})
	if errcode.Of(err) != errcode.CapacityUnavailable {
		t.Fatalf("201st create: %v, want CAPACITY_UNAVAILABLE", err)
	}
	c, _ := e.svc.Capacity(ctx)
	if c.Live != 200 || c.Free != 0 {
		t.Fatalf("capacity %+v", c)
	}
	list, err := e.svc.List(ctx, sandbox.ListFilter{})
	if err != nil || len(list) != 200 {
		t.Fatalf("list shows %d sandboxes: %v", len(list), err)
	}
}

func TestConcurrentLifecycle(t *testing.T) {
	e := newEnv(t, sandbox.Config{})
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 50)
	sem := make(chan struct{}, 10)
	for i := 0; i < 50; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			sb, err := e.svc.Create(ctx, sandbox.CreateRequest{MemoryMB: 64, CPU: 0.1})
			if err != nil {
				errs <- err
				return
			}
			res, err := e.svc.Exec(ctx, sb.ID, argv("echo", fmt.Sprint(i)), nil)
			if err != nil || res.Stdout != fmt.Sprintf("%d\n", i) {
				errs <- fmt.Errorf("exec %d: %+v %v", i, res, err)
			}
			if _, err := e.svc.Destroy(ctx, sb.ID); err != nil {
				errs <- err
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	e.assertNoLeaks(t)
}

// TestRunSweepsOrphans: the background loop, not only Reconcile at start, removes a container
// (with its disk, loop device, mounts, cgroups and dir) that no record owns, and frees an id
// range whose sandbox is gone; a sandbox of its own stays.
func TestRunSweepsOrphans(t *testing.T) {
	e := newEnv(t, sandbox.Config{SweepInterval: 200 * time.Millisecond})
	ctx := context.Background()
	keep := e.create(t, sandbox.CreateRequest{})
	gone := e.create(t, sandbox.CreateRequest{})
	if _, err := e.svc.Destroy(ctx, gone.ID); err != nil {
		t.Fatal(err)
	}
	// What a crash between steps could leave: a running container without a record, and a
	// range still held by a destroyed sandbox. Planted before the loop starts (a sweep would
	// rightly remove a recordless container while it is being made); Run does not sweep at
	// start, only every SweepInterval.
	orphan := sandbox.NewID()
	runtimetest.Start(t, e.rt, runtimetest.DefaultSpec(orphan))
	if err := e.st.AllocateIDRange(ctx, sandbox.IDRange{SandboxID: gone.ID, Base: 1 << 30, Count: sandbox.IDRangeSize}); err != nil {
		t.Fatal(err)
	}
	if leaks := testenv.Leaks(orphan); len(leaks) == 0 {
		t.Fatal("the planted orphan left no trace on the host: the test would prove nothing")
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { e.svc.Run(runCtx); close(done) }()
	defer func() { cancel(); <-done }()
	deadline := time.Now().Add(15 * time.Second)
	for {
		ids, _ := e.rt.List(ctx)
		held := false
		for _, r := range e.ranges(t) {
			held = held || r.SandboxID == gone.ID
		}
		if !slices.Contains(ids, orphan) && !held {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 15 s of sweeps every 200 ms: runtime lists %v (orphan %s), range of %s held: %v", ids, orphan, gone.ID, held)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if leaks := testenv.Leaks(orphan); len(leaks) > 0 {
		t.Errorf("the swept orphan left:\n%s", strings.Join(leaks, "\n"))
	}
	if r := e.exec(t, keep.ID, argv("echo", "still here")); r.Stdout != "still here\n" {
		t.Errorf("the sandbox of its own after the sweeps: %+v", r)
	}
	e.rangeOf(t, keep.ID)
}

func TestReconcile(t *testing.T) {
	e := newEnv(t, sandbox.Config{})
	ctx := context.Background()
	keep := e.create(t, sandbox.CreateRequest{})
	gone := e.create(t, sandbox.CreateRequest{})
	// Kill gone's container behind the service's back, and plant an orphan.
	e.killContainer(t, gone.ID)
	orphan := sandbox.NewID()
	orphanDir := filepath.Join(e.root, "sandboxes", orphan)
	if err := os.MkdirAll(orphanDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := e.svc.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if sb, _ := e.svc.Get(ctx, keep.ID); sb.State != sandbox.StateRunning {
		t.Fatalf("live sandbox not adopted: %s", sb.State)
	}
	if r := e.exec(t, keep.ID, argv("echo", "still here")); r.Stdout != "still here\n" {
		t.Fatalf("exec after reconcile: %+v", r)
	}
	if sb, _ := e.svc.Get(ctx, gone.ID); sb.State != sandbox.StateLost {
		t.Fatalf("dead sandbox is %s, want lost", sb.State)
	}
	if _, err := os.Stat(orphanDir); !os.IsNotExist(err) {
		t.Fatalf("orphan dir not swept: %v", err)
	}
}
