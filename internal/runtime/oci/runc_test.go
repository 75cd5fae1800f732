package oci

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/guest"
	"github.com/agentbox/agentbox/internal/hostinfo"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/runtimetest"
	"github.com/agentbox/agentbox/internal/statedir"
)

// guestBinary is the lean agent (agentbox-guest) TestMain builds when the runc tests can run.
var (
	guestBinary   string
	guestBuildErr error
)

// TestMain builds the guest binary the runc tests need, and fails the package's tests if any
// goroutine (a wait, a guest client's connection, an OOM guard) is still running when they end.
func TestMain(m *testing.M) {
	var tmp string
	if runcUsable() == "" {
		tmp, guestBinary, guestBuildErr = buildAgentbox()
	}
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		if tmp != "" {
			os.RemoveAll(tmp)
		}
		os.Exit(code)
	}))
}

// runcUsable says why the runc tests cannot run here, or "".
func runcUsable() string {
	if os.Geteuid() != 0 {
		return "the runc tests need root (CI runs them as root)"
	}
	if _, err := exec.LookPath("runc"); err != nil {
		return "runc is not installed (apt-get install runc)"
	}
	return ""
}

// buildAgentbox builds the static lean agent (./cmd/agentbox-guest) the sandboxes run.
func buildAgentbox() (dir, bin string, err error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", "", err
	}
	mod := wd
	for {
		if _, err := os.Stat(filepath.Join(mod, "go.mod")); err == nil {
			break
		}
		parent := filepath.Dir(mod)
		if parent == mod {
			return "", "", fmt.Errorf("no go.mod above %s", wd)
		}
		mod = parent
	}
	dir, err = os.MkdirTemp("", "abbin")
	if err != nil {
		return "", "", err
	}
	bin = filepath.Join(dir, "agentbox-guest")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/agentbox-guest")
	cmd.Dir = mod
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return dir, "", fmt.Errorf("go build ./cmd/agentbox-guest: %v\n%s", err, out)
	}
	return dir, bin, nil
}

// newRunc returns a runc Runtime under a fresh short Root, checked and removed at the end.
func newRunc(t testing.TB) *Runtime {
	t.Helper()
	if reason := runcUsable(); reason != "" {
		t.Skip(reason)
	}
	if guestBuildErr != nil {
		t.Fatalf("cannot build the agent: %v", guestBuildErr)
	}
	root, err := os.MkdirTemp("", "abrt")
	if err != nil {
		t.Fatal(err)
	}
	// A cgroup parent of its own, so that parallel tests (and a server on this host) never
	// list or sweep each other's sandboxes.
	parent := "abtest-" + filepath.Base(root)
	rt, err := New(context.Background(), Config{Root: root, GuestBinary: guestBinary, CgroupParent: parent, Subreaper: true})
	if err != nil {
		t.Fatal(err)
	}
	if c := rt.Capabilities(); !c.Available {
		t.Fatalf("runc unavailable: %s", c.Reason)
	}
	t.Cleanup(func() {
		out, err := exec.Command("runc", "--root", filepath.Join(root, "state"), "list", "-q").CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != "" {
			t.Errorf("runc still lists containers under %s: %q %v", root, out, err)
		}
		if ids, err := rt.List(context.Background()); err != nil || len(ids) != 0 {
			t.Errorf("List after the test: %v %v", ids, err)
		}
		os.RemoveAll(root)
		for _, mnt := range rt.cgroupMounts {
			p := filepath.Join(mnt, parent)
			if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
				t.Errorf("cgroup parent %s: %v", p, err)
			}
		}
	})
	return rt
}

func TestRuncSuite(t *testing.T) {
	t.Parallel()
	rt := newRunc(t)
	runtimetest.Run(t, rt, killInit(rt))
}

func TestRuncCapabilities(t *testing.T) {
	t.Parallel()
	rt := newRunc(t)
	c := rt.Capabilities()
	if c.Name != "runc" || c.Version == "" || c.Isolation != runtime.IsolationProcess || !slices.Equal(c.NetworkModes, []string{runtime.NetworkNone, runtime.NetworkEgress}) {
		t.Errorf("capabilities %+v", c)
	}
	if mode, _ := hostinfo.CgroupMode(); c.CgroupMode != mode {
		t.Errorf("cgroup mode %q, host %q", c.CgroupMode, mode)
	}
	for _, h := range []string{overlayHardening, "no-new-privileges(image-host)", "masked-paths", "netns:loopback-only", "cgroup:memory,cpu,pids"} {
		if !slices.Contains(c.Hardening, h) {
			t.Errorf("hardening %v lacks %s", c.Hardening, h)
		}
	}
	// The transparent path is declared exactly when the host could build its network namespace.
	if has := slices.Contains(c.Hardening, runtime.HardeningTransparentEgress); has != (c.TransparentEgressReason == "") {
		t.Errorf("hardening lists transparent_egress %v, but the reason it is missing is %q", has, c.TransparentEgressReason)
	}
}

func TestNewUnavailable(t *testing.T) {
	t.Parallel()
	rt, err := New(context.Background(), Config{Name: "runc", Binary: "no-such-runtime-binary", Root: t.TempDir(), GuestBinary: "/bin/true"})
	if err != nil {
		t.Fatal(err)
	}
	c := rt.Capabilities()
	if c.Available || !strings.Contains(c.Reason, "not found") {
		t.Fatalf("capabilities %+v", c)
	}
	_, err = rt.Create(context.Background(), runtimetest.DefaultSpec(runtimetest.NewID()))
	if !errcode.Is(err, errcode.RuntimeUnavailable) {
		t.Fatalf("create on an unavailable runtime: %v", err)
	}
	if _, err := New(context.Background(), Config{Root: "relative", GuestBinary: "/bin/true"}); err == nil {
		t.Error("relative Root accepted")
	}
	if _, err := New(context.Background(), Config{Root: "/" + strings.Repeat("x", maxRootLen), GuestBinary: "/bin/true"}); err == nil {
		t.Error("a Root too long for the agent's socket accepted")
	}
}

// TestDefaultCgroupParent: without a CgroupParent a runtime's is its root's own (statedir's
// identity of Root), never the parent every runtime used to share; two roots, two parents.
func TestDefaultCgroupParent(t *testing.T) {
	t.Parallel()
	parents := map[string]bool{}
	for range 2 {
		root := t.TempDir()
		rt, err := New(context.Background(), Config{Name: "runc", Binary: "no-such-runtime-binary", Root: root, GuestBinary: "/bin/true"})
		if err != nil {
			t.Fatal(err)
		}
		want, _ := statedir.Identity(root)
		if rt.cgroupParent != want || rt.cgroupParent == LegacyCgroupParent {
			t.Fatalf("the default cgroup parent of %s is %q, want %q", root, rt.cgroupParent, want)
		}
		parents[rt.cgroupParent] = true
	}
	if len(parents) != 2 {
		t.Fatalf("two roots share a default cgroup parent: %v", parents)
	}
}

func TestRuncInvalidSpecs(t *testing.T) {
	t.Parallel()
	rt := newRunc(t)
	ctx := context.Background()
	for name, spec := range map[string]runtime.Spec{
		"image":  {ID: runtimetest.NewID(), Image: "ubuntu:24.04"},
		"id":     {ID: "../../etc", Image: "host"},
		"memory": {ID: runtimetest.NewID(), Image: "host", MemoryMB: 4},
		"env":    {ID: runtimetest.NewID(), Image: "host", Env: map[string]string{"A=B": "c"}},
	} {
		_, err := rt.Create(ctx, spec)
		if !errcode.Is(err, errcode.InvalidArgument) {
			t.Errorf("%s: %v", name, err)
		}
		if name == "image" && !strings.Contains(errcode.Message(err), "supported images: host") {
			t.Errorf("image error does not name the supported images: %v", err)
		}
		if validID(spec.ID) {
			if _, err := os.Stat(rt.sandboxDir(spec.ID)); err == nil {
				t.Errorf("%s: bundle left behind", name)
			}
		}
	}
	if err := rt.Delete(ctx, "sb-../../x"); !errcode.Is(err, errcode.InvalidArgument) {
		t.Errorf("delete of a malformed id: %v", err)
	}
	if err := rt.Start(ctx, runtimetest.NewID()); !errcode.Is(err, errcode.SandboxNotFound) {
		t.Errorf("start of an unknown id: %v", err)
	}
	if err := rt.Stop(ctx, runtimetest.NewID()); !errcode.Is(err, errcode.SandboxNotFound) {
		t.Errorf("stop of an unknown id: %v", err)
	}
	if _, err := rt.Agent(ctx, runtimetest.NewID()); !errcode.Is(err, errcode.SandboxNotFound) {
		t.Errorf("agent of an unknown id: %v", err)
	}
	spec := runtimetest.DefaultSpec(runtimetest.NewID())
	spec.Network = "host"
	if _, err := rt.Create(ctx, spec); !errcode.Is(err, errcode.InvalidArgument) || !strings.Contains(errcode.Message(err), "supported network modes: none") {
		t.Errorf("network host: %v", err)
	}
}

// TestRuncCreateFailureCleansUp makes runc create fail (an rlimit above the host's hard limit,
// the failure HOST.md describes) and checks the typed error and that nothing is left.
func TestRuncCreateFailureCleansUp(t *testing.T) {
	t.Parallel()
	rt := newRunc(t)
	rt.hostRlimits.NOFILE = 1 << 40 // no clamping: the spec asks for more than the host allows
	id := runtimetest.NewID()
	_, err := rt.Create(context.Background(), runtimetest.DefaultSpec(id))
	if !errcode.Is(err, errcode.RuntimeUnavailable) || !strings.Contains(err.Error(), "rlimit") {
		t.Fatalf("create with an excessive rlimit: %v (want the runtime's error in the cause)", err)
	}
	// The caller's message says what failed and what to do; the runtime's words (host paths
	// among them) stay in the cause and the log.
	if msg := errcode.Message(err); strings.Contains(msg, "rlimit") || strings.Contains(msg, rt.root) || !strings.Contains(msg, "server log") {
		t.Errorf("caller-facing message %q: want no runtime error or host path, and where to look", msg)
	}
	assertNoTrace(t, rt, id)
}

// TestRuncCreatedStop covers a sandbox that was created and never started.
func TestRuncCreatedStop(t *testing.T) {
	t.Parallel()
	rt := newRunc(t)
	ctx := context.Background()
	id := runtimetest.NewID()
	t.Cleanup(func() { _ = rt.Delete(ctx, id) })
	if _, err := rt.Create(ctx, runtimetest.DefaultSpec(id)); err != nil {
		t.Fatal(err)
	}
	if _, err := rt.Create(ctx, runtimetest.DefaultSpec(id)); !errcode.Is(err, errcode.Conflict) {
		t.Fatalf("second create of %s: %v", id, err)
	}
	if err := rt.Stop(ctx, id); err != nil {
		t.Fatalf("stop of a created sandbox: %v", err)
	}
	if st, err := rt.State(ctx, id); err != nil || st != runtime.StatusStopped {
		t.Fatalf("state after stop: %v %v", st, err)
	}
	if err := rt.Start(ctx, id); !errcode.Is(err, errcode.SandboxNotRunning) {
		t.Fatalf("start of a stopped sandbox: %v", err)
	}
	if err := rt.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
	assertNoTrace(t, rt, id)
}

func TestRuncMemoryLimitOOM(t *testing.T) {
	t.Parallel()
	rt := newRunc(t)
	id := runtimetest.NewID()
	spec := runtimetest.DefaultSpec(id)
	spec.MemoryMB = 128
	c := runtimetest.Start(t, rt, spec)

	limit := readCgroupFile(t, rt, "memory", id, "memory.limit_in_bytes")
	if limit != strconv.Itoa(128<<20) {
		t.Errorf("memory.limit_in_bytes = %s", limit)
	}
	if rt.swap {
		if sw := readCgroupFile(t, rt, "memory", id, "memory.memsw.limit_in_bytes"); sw != strconv.Itoa(128<<20) {
			t.Errorf("memory.memsw.limit_in_bytes = %s (swap must be off)", sw)
		}
	}
	res := runtimetest.Exec(t, c, "python3", "-c", "b = bytearray(512 << 20); print(len(b))")
	if res.ExitCode != 137 && res.Signal != "SIGKILL" {
		t.Fatalf("allocating 512 MiB under a 128 MiB limit: %+v", res)
	}
	if strings.Contains(res.Stdout, "536870912") {
		t.Fatalf("the allocation succeeded: %+v", res)
	}
	t.Logf("allocation killed: exit %d signal %q", res.ExitCode, res.Signal)
	if res := runtimetest.Exec(t, c, "true"); res.ExitCode != 0 {
		t.Fatalf("agent unusable after the OOM kill: %+v", res)
	}
	if st, _ := rt.State(context.Background(), id); st != runtime.StatusRunning {
		t.Fatalf("state after OOM kill: %s", st)
	}
}

func TestRuncPidsLimit(t *testing.T) {
	t.Parallel()
	rt := newRunc(t)
	id := runtimetest.NewID()
	spec := runtimetest.DefaultSpec(id)
	spec.PidsLimit = 64
	c := runtimetest.Start(t, rt, spec)
	if got := readCgroupFile(t, rt, "pids", id, "pids.max"); got != "64" {
		t.Errorf("pids.max = %s", got)
	}
	bomb := `import os, time
n = 0
end = time.time() + 4
while time.time() < end:
    try:
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
        n += 1
    except OSError:
        time.sleep(0.01)
`
	start := time.Now()
	res := runtimetest.ExecRequest(t, c, guest.ExecRequest{Argv: []string{"python3", "-c", bomb}, TimeoutMs: 2000})
	if !res.TimedOut {
		t.Logf("fork bomb result: %+v", res)
	}
	// The agent caps its commands' RLIMIT_NPROC below pids.max (guest.ReservePids), so the bomb
	// stops at that limit and the cgroup keeps pids for the agent.
	if res.ExitCode == 0 && !res.TimedOut {
		t.Errorf("fork bomb result: %+v", res)
	}
	if cur := readCgroupFile(t, rt, "pids", id, "pids.current"); cur == "64" {
		t.Errorf("the fork bomb took every pid of the sandbox (pids.current %s)", cur)
	}
	if res := runtimetest.Exec(t, c, "true"); res.ExitCode != 0 {
		t.Fatalf("sandbox unresponsive after the fork bomb: %+v", res)
	}
	t.Logf("fork bomb contained; sandbox answered %s after it started", time.Since(start).Round(time.Millisecond))
}

func TestRuncRlimitsClamped(t *testing.T) {
	t.Parallel()
	rt := newRunc(t)
	spec := runtimetest.DefaultSpec(runtimetest.NewID())
	c := runtimetest.Start(t, rt, spec)
	host, err := hostinfo.HardRlimits()
	if err != nil {
		t.Fatal(err)
	}
	res := runtimetest.Exec(t, c, "cat", "/proc/self/limits")
	// Processes: the spec asks for the host's hard limit; the agent then caps its commands below
	// the sandbox's pids limit (guest.ReservePids keeps 64 pids for itself).
	nproc := min(host.NPROC, wantNPROC)
	if spec.PidsLimit > 0 {
		nproc = uint64(max(spec.PidsLimit-64, spec.PidsLimit/2))
	}
	want := map[string]uint64{"Max open files": min(host.NOFILE, wantNOFILE), "Max processes": nproc}
	sc := bufio.NewScanner(strings.NewReader(res.Stdout))
	found := 0
	for sc.Scan() {
		line := sc.Text()
		for name, w := range want {
			if strings.HasPrefix(line, name) {
				f := strings.Fields(strings.TrimPrefix(line, name))
				if len(f) < 2 || f[0] != strconv.FormatUint(w, 10) || f[1] != f[0] {
					t.Errorf("%s: %q, want soft=hard=%d", name, line, w)
				}
				found++
			}
		}
	}
	if found != 2 {
		t.Fatalf("limits not found in %q", res.Stdout)
	}
}

func TestRuncFilesystem(t *testing.T) {
	t.Parallel()
	rt := newRunc(t)
	id := runtimetest.NewID()
	c := runtimetest.Start(t, rt, runtimetest.DefaultSpec(id))
	if res := runtimetest.ExecRequest(t, c, guest.ExecRequest{Argv: []string{"touch", guestBinaryPath}, User: "root", TimeoutMs: 60000}); res.ExitCode == 0 {
		t.Errorf("touch %s succeeded on a read-only bind", guestBinaryPath)
	}
	// The root (and /usr, an overlay of its own) is writable by the sandbox's root: its
	// writable layers are on the sandbox's disk.
	for _, p := range []string{"/etc/x", "/x", "/usr/x"} {
		if res := runtimetest.ExecRequest(t, c, guest.ExecRequest{Argv: []string{"touch", p}, User: "root", TimeoutMs: 60000}); res.ExitCode != 0 {
			t.Errorf("touch %s as root: %+v", p, res)
		}
		if res := runtimetest.Exec(t, c, "touch", p+"-agent"); res.ExitCode == 0 {
			t.Errorf("touch %s-agent succeeded as the agent user", p)
		}
	}
	upper := filepath.Join(rt.sandboxDir(id), diskMountName, diskRootfsDir, "upper")
	if _, err := os.Stat(filepath.Join(upper, "etc", "x")); err != nil {
		t.Errorf("/etc/x not in the writable layer: %v", err)
	}
	if _, err := os.Stat(filepath.Join(rt.rootfs, "etc", "x")); err == nil {
		t.Errorf("/etc/x landed in the shared rootfs")
	}
	if _, err := os.Stat(filepath.Join(rt.sandboxDir(id), diskMountName, diskRootfsDir, bindsDirName, "usr", "upper", "x")); err != nil {
		t.Errorf("/usr/x not in the sandbox's layer of /usr: %v", err)
	}
	if _, err := os.Lstat("/usr/x"); err == nil {
		t.Errorf("HOLE: /usr/x landed in the host's /usr")
	}
	for _, p := range []string{"/workspace/x", "/tmp/x", "/home/agent/x"} {
		if res := runtimetest.Exec(t, c, "touch", p); res.ExitCode != 0 {
			t.Errorf("touch %s: %+v", p, res)
		}
	}
	if _, err := os.Stat(filepath.Join(rt.sandboxDir(id), diskMountName, "workspace", "x")); err != nil {
		t.Errorf("workspace file not on the host: %v", err)
	}
	// The agent's socket directory is root's: the agent user cannot reach the agent (or the
	// jobs' output the agent keeps beside it).
	if res := runtimetest.ExecRequest(t, c, guest.ExecRequest{Argv: []string{"ls", "/.agentbox/run"}, User: "root", TimeoutMs: 60000}); strings.Join(strings.Fields(res.Stdout), " ") != "agent.sock jobs" {
		t.Errorf("/.agentbox/run: %+v", res)
	}
	if res := runtimetest.Exec(t, c, "python3", "-c", "import ssl; print('ok')"); strings.TrimSpace(res.Stdout) != "ok" {
		t.Errorf("python3 with ssl: %+v", res)
	}
}

func TestRuncHardening(t *testing.T) {
	t.Parallel()
	rt := newRunc(t)
	id := runtimetest.NewID()
	c := runtimetest.Start(t, rt, runtimetest.DefaultSpec(id))
	res := runtimetest.Exec(t, c, "cat", "/proc/1/status")
	fields := map[string]string{}
	for _, line := range strings.Split(res.Stdout, "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			fields[k] = strings.TrimSpace(v)
		}
	}
	// CHOWN 0, DAC_OVERRIDE 1, FOWNER 3, FSETID 4, KILL 5, SETGID 6, SETUID 7, SETPCAP 8, NET_BIND_SERVICE 10.
	const wantCaps = "00000000000005fb"
	for _, k := range []string{"CapBnd", "CapEff", "CapPrm"} {
		if fields[k] != wantCaps {
			t.Errorf("%s = %s, want %s", k, fields[k], wantCaps)
		}
	}
	if fields["CapAmb"] != "0000000000000000" || fields["NoNewPrivs"] != "1" {
		t.Errorf("CapAmb %s NoNewPrivs %s", fields["CapAmb"], fields["NoNewPrivs"])
	}
	// Read from the host, between the agent's starts: while the agent starts a command its own
	// value is the command's (guest.withCommandOOMScoreAdj), which a command reading it at once
	// can see.
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/oom_score_adj", readPid(filepath.Join(rt.sandboxDir(id), "init.pid")))); err != nil || strings.TrimSpace(string(b)) != strconv.Itoa(rt.oomScoreAdj) {
		t.Errorf("agent oom_score_adj %q %v, want %d", b, err, rt.oomScoreAdj)
	}
	// A command, and what it starts, is the OOM killer's choice before the agent: 0 beside a
	// shielded agent, 500 above an agent the host could not shield.
	wantCmd := min(rt.oomScoreAdj+500, 1000)
	if rt.oomScoreAdj < 0 {
		wantCmd = 0
	}
	if res := runtimetest.Exec(t, c, "sh", "-c", "cat /proc/self/oom_score_adj /proc/$$/oom_score_adj"); strings.Join(strings.Fields(res.Stdout), " ") != fmt.Sprintf("%d %d", wantCmd, wantCmd) {
		t.Errorf("a command's (and its child's) oom_score_adj: %q, want %d beside the agent's %d", res.Stdout, wantCmd, rt.oomScoreAdj)
	}
	// Masked files read empty; which of them exist depends on the kernel's configuration.
	res = runtimetest.Exec(t, c, "sh", "-c", "for p in /proc/kcore /proc/keys /proc/timer_list /proc/sched_debug /proc/latency_stats; do [ -e $p ] && echo $p $(wc -c < $p); done; true")
	if masked := strings.Fields(res.Stdout); len(masked) == 0 {
		t.Errorf("none of the masked files exists: %+v", res)
	} else {
		for i := 0; i+1 < len(masked); i += 2 {
			if masked[i+1] != "0" {
				t.Errorf("%s not masked: %s bytes", masked[i], masked[i+1])
			}
		}
	}
	if res := runtimetest.Exec(t, c, "sh", "-c", "echo 1 > /proc/sys/kernel/domainname"); res.ExitCode == 0 {
		t.Error("/proc/sys is writable")
	}
	if res := runtimetest.Exec(t, c, "sh", "-c", "ls /dev"); res.ExitCode != 0 {
		t.Errorf("ls /dev: %+v", res)
	} else {
		t.Logf("/dev: %s", strings.Join(strings.Fields(res.Stdout), " "))
	}
}

// TestRuncDeleteLeavesNothing checks every host resource named from the id after Delete.
func TestRuncDeleteLeavesNothing(t *testing.T) {
	t.Parallel()
	rt := newRunc(t)
	id := runtimetest.NewID()
	c := runtimetest.Start(t, rt, runtimetest.DefaultSpec(id))
	runtimetest.Exec(t, c, "sh", "-c", "sleep 1000 & sleep 1000 &")
	if err := rt.Delete(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	assertNoTrace(t, rt, id)
}

func assertNoTrace(t *testing.T, rt *Runtime, id string) {
	t.Helper()
	mounts, err := hostinfo.CgroupMounts()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range mounts {
		p := filepath.Join(m.Path, cgroupPath(rt.cgroupParent, id))
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("cgroup %s left (%v)", p, err)
		}
	}
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(mi), id) {
		t.Errorf("a mount mentions %s", id)
	}
	for _, l := range loopDevices() {
		if strings.Contains(l.Backing, id) {
			t.Errorf("loop device %s still backed by %s", l.Dev, l.Backing)
		}
	}
	for _, p := range []string{filepath.Join(rt.stateDir(), id), rt.sandboxDir(id)} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left (%v)", p, err)
		}
	}
	if ids, _ := rt.List(context.Background()); slices.Contains(ids, id) {
		t.Errorf("%s still listed", id)
	}
}

func readCgroupFile(t *testing.T, rt *Runtime, controller, id, file string) string {
	t.Helper()
	mounts, err := hostinfo.CgroupMounts()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range mounts {
		if slices.Contains(m.Options, controller) {
			b, err := os.ReadFile(filepath.Join(m.Path, cgroupPath(rt.cgroupParent, id), file))
			if err != nil {
				t.Fatal(err)
			}
			return strings.TrimSpace(string(b))
		}
	}
	t.Skipf("no v1 %s hierarchy on this host", controller)
	return ""
}

// TestRuncStartupLatency measures create → start → agent answering, the path users wait on.
func TestRuncStartupLatency(t *testing.T) {
	rt := newRunc(t)
	ctx := context.Background()
	// Warm up: the first Create prepares the shared rootfs.
	runtimetest.Start(t, rt, runtimetest.DefaultSpec(runtimetest.NewID()))
	const n = 7
	var create, start, ready []time.Duration
	for range n {
		id := runtimetest.NewID()
		t0 := time.Now()
		if _, err := rt.Create(ctx, runtimetest.DefaultSpec(id)); err != nil {
			t.Fatal(err)
		}
		t1 := time.Now()
		if err := rt.Start(ctx, id); err != nil {
			t.Fatal(err)
		}
		t2 := time.Now()
		c := runtimetest.Client(t, rt, id)
		rctx, cancel := context.WithTimeout(ctx, runtimetest.ReadyTimeout)
		err := c.WaitReady(rctx)
		cancel()
		t3 := time.Now()
		c.Close()
		if err != nil {
			t.Fatal(err)
		}
		create, start, ready = append(create, t1.Sub(t0)), append(start, t2.Sub(t1)), append(ready, t3.Sub(t0))
		if err := rt.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	med := func(d []time.Duration) time.Duration { s := slices.Clone(d); slices.Sort(s); return s[len(s)/2] }
	t.Logf("median of %d: create %v, start %v, create→agent ready %v (all: %v)", n, med(create), med(start), med(ready), ready)
}

// BenchmarkCreateStartReady is one sandbox's create → start → agent answering → delete.
func BenchmarkCreateStartReady(b *testing.B) {
	rt := newRunc(b)
	ctx := context.Background()
	runtimetest.Start(b, rt, runtimetest.DefaultSpec(runtimetest.NewID())) // prepares the rootfs
	b.ResetTimer()
	for range b.N {
		id := runtimetest.NewID()
		if _, err := rt.Create(ctx, runtimetest.DefaultSpec(id)); err != nil {
			b.Fatal(err)
		}
		if err := rt.Start(ctx, id); err != nil {
			b.Fatal(err)
		}
		c := runtimetest.Client(b, rt, id)
		rctx, cancel := context.WithTimeout(ctx, runtimetest.ReadyTimeout)
		err := c.WaitReady(rctx)
		cancel()
		c.Close()
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if err := rt.Delete(ctx, id); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}

// BenchmarkDeleteRunning is the delete of a running sandbox.
func BenchmarkDeleteRunning(b *testing.B) {
	rt := newRunc(b)
	ctx := context.Background()
	for range b.N {
		b.StopTimer()
		id := runtimetest.NewID()
		runtimetest.Start(b, rt, runtimetest.DefaultSpec(id))
		b.StartTimer()
		if err := rt.Delete(ctx, id); err != nil {
			b.Fatal(err)
		}
	}
}
