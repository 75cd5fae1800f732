// Package security is agentbox's attack suite: code that an AI wrote and nobody read, run in
// real sandboxes through the real control plane (`agentbox serve`, its REST API and CLI), on
// runc, crun and gVisor, trying to get out. Every attack says what the sandboxed code does and what
// must be observed, on the host wherever the harm would show there.
package security

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/config"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/runtime/runtimetest"
	"github.com/agentbox/agentbox/internal/testenv"
	"github.com/agentbox/agentbox/internal/testenv/netlab"
	"github.com/agentbox/agentbox/internal/wire"
)

// defaultParallel is how many attacks run at once unless -test.parallel says otherwise. Most
// attacks wait (on a sandbox's timeout, a hold for host-side inspection, a create); the ones
// that measure time run alone first.
const defaultParallel = 6

func TestMain(m *testing.M) {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		_ = flag.Set("test.parallel", strconv.Itoa(defaultParallel))
	}
	os.Exit(m.Run())
}

// runtimes are the runtimes every attack runs on.
var runtimes = []string{"runc", "crun", "gvisor"}

// createFor is the create request that puts a sandbox on runtime rt: runc and crun by name,
// gVisor by requirement (kernel isolation), as a client that wants a user-space kernel would ask.
func createFor(rt string, req wire.CreateRequest) wire.CreateRequest {
	if rt == "gvisor" {
		req.Requirements = wire.Requirements{Isolation: "kernel"}
	} else {
		req.Runtime = rt
	}
	return req
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func randInt(n int64) int64 {
	v, _ := rand.Int(rand.Reader, big.NewInt(n))
	return v.Int64()
}

// syncBuffer is a bytes.Buffer safe for a process's writes and the test's reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// server is a real `agentbox serve` started for the suite, with secrets for the sandboxes to
// look for: a canary in its environment and its token in a file only the server reads.
type server struct {
	t         *testing.T
	bin       string
	stateDir  string
	secretDir string // host dir holding the token file and canaries; nothing in it is bound
	tokenFile string
	token     string
	envCanary string // value of ABSEC_CANARY_ENV in the server's environment
	parent    string // cgroup parent (runc's; other runtimes add -<name>)
	poolBase  int64
	cmd       *exec.Cmd
	url       string
	logs      *syncBuffer
	c         *client.Client
	inherited *os.File // passed to the server as fds 3 and 200
	lab       *netlab.Lab
	egress    bool // the server runs with the lab's egress flags (egressFlags)

	idsMu sync.Mutex
	ids   []string // every sandbox the suite created, for the final leak check
}

var fixtureSeq atomic.Int64

// newServerFixture prepares a state dir, a token file and a canary; start runs the server.
func newServerFixture(t *testing.T) *server {
	t.Helper()
	testenv.RequireRoot(t)
	for _, bin := range []string{"runsc", "python3"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Fatalf("%s is not installed: run `sudo make deps` (make test installs it)", bin)
		}
	}
	s := &server{t: t, bin: testenv.Binary(t)}
	s.stateDir = testenv.ShortTempDir(t, "absec")
	s.secretDir = t.TempDir()
	s.parent = "absec-" + filepath.Base(s.stateDir)
	// A pool of its own, far from the default one other servers and test packages use, and
	// from the pools of this process's other servers (each spans 200 ranges).
	// Slots of 2^24 ids from 2^30: 176 of them end below 2^32 with room for a pool.
	s.poolBase = (1 << 30) + ((randInt(11)*16+fixtureSeq.Add(1))%176)*(1<<24)
	s.token = "absec-token-" + randHex(16)
	s.tokenFile = filepath.Join(s.secretDir, "token")
	var err error
	if err = os.WriteFile(s.tokenFile, []byte(s.token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s.envCanary = "absec-env-canary-" + randHex(16)
	// A descriptor the server inherits, as from a careless supervisor or shell: a host file
	// no sandbox may get hold of.
	inherited := newHostCanary(t, filepath.Join(s.secretDir, "inherited-fd"))
	if s.inherited, err = os.Open(inherited.path); err != nil {
		t.Fatal(err)
	}
	s.c = client.New("http://unset", s.token)
	s.lab = netlab.New(t) // before the cleanup below: the server stops before the lab goes
	t.Cleanup(func() {
		s.stop()
		s.inherited.Close()
	})
	return s
}

func (s *server) start() {
	t := s.t
	t.Helper()
	os.Remove(config.ServerInfoPath(s.stateDir))
	s.logs = &syncBuffer{}
	s.cmd = exec.Command(s.bin, "serve", "--listen", "127.0.0.1:0", "--state-dir", s.stateDir,
		"--cgroup-parent", s.parent, "--uid-pool-base", strconv.FormatInt(s.poolBase, 10),
		"--cpu-budget", "1000", "--memory-budget-mb", "1000000", "--disk-budget-mb", "1000000", "--max-sandboxes", "100")
	if flags := egressFlags(s.bin, s.lab); flags != nil {
		s.cmd.Args, s.egress = append(s.cmd.Args, flags...), true
	}
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "AGENTBOX_") {
			env = append(env, kv)
		}
	}
	// The token comes from the file only, so the only copies on the host are the file and the
	// server's memory.
	s.cmd.Env = append(env, "ABSEC_CANARY_ENV="+s.envCanary, "AGENTBOX_TOKEN_FILE="+s.tokenFile)
	s.cmd.Stdout, s.cmd.Stderr = s.logs, s.logs
	// As fd 3 and fd 200: runsc reuses low numbers for its own descriptors, so only a high one
	// shows whether inherited descriptors reach a sandbox.
	s.cmd.ExtraFiles = make([]*os.File, 198)
	s.cmd.ExtraFiles[0], s.cmd.ExtraFiles[197] = s.inherited, s.inherited
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		if info, err := config.ReadServerInfo(s.stateDir); err == nil && info.PID == s.cmd.Process.Pid {
			s.url = info.URL
			break
		}
		if time.Now().After(deadline) {
			s.cmd.Process.Kill()
			s.cmd.Wait()
			t.Fatalf("server did not start:\n%s", s.logs)
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.c = client.New(s.url, s.token)
}

func (s *server) pid() int { return s.cmd.Process.Pid }

func (s *server) running() bool { return s.cmd != nil && s.cmd.ProcessState == nil }

// stop ends the server with SIGTERM (SIGKILL after 20 s).
func (s *server) stop() {
	if !s.running() {
		return
	}
	s.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { s.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		s.cmd.Process.Kill()
		<-done
	}
}

// kill ends the server with SIGKILL, as a crash would.
func (s *server) kill() {
	s.cmd.Process.Kill()
	s.cmd.Wait()
}

func (s *server) record(id string) {
	s.idsMu.Lock()
	s.ids = append(s.ids, id)
	s.idsMu.Unlock()
}

func (s *server) allIDs() []string {
	s.idsMu.Lock()
	defer s.idsMu.Unlock()
	return append([]string(nil), s.ids...)
}

// cgroupParent is the cgroup parent of runtime rt's sandboxes.
func (s *server) cgroupParent(rt string) string {
	if rt == "runc" {
		return s.parent
	}
	return s.parent + "-" + rt
}

// rest sends one raw request to the REST API and returns the status and body.
func (s *server) rest(ctx context.Context, method, path string, q url.Values, body io.Reader) (int, []byte, error) {
	u := s.url + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+s.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	return resp.StatusCode, b, err
}

// cli runs the agentbox CLI against the server.
func (s *server) cli(ctx context.Context, args ...string) (stdout, stderr string, code int) {
	cmd := exec.CommandContext(ctx, s.bin, args...)
	cmd.Env = append(os.Environ(), "AGENTBOX_URL="+s.url, "AGENTBOX_TOKEN="+s.token)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		code = -1
		e.WriteString(err.Error())
	}
	return o.String(), e.String(), code
}

// arena is one attack on one runtime: its sandbox and the host-side view of it.
type arena struct {
	t  *testing.T
	s  *server
	rt string
	// image is the image of the arena's sandboxes ("": host).
	image string
	sb    wire.Sandbox
	id    string
}

func (a *arena) gvisor() bool { return a.rt == "gvisor" }

// newSandbox creates a sandbox on the arena's runtime; it is destroyed (and checked for leaks)
// when the test ends.
func (a *arena) newSandbox(req wire.CreateRequest) wire.Sandbox {
	a.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if req.Image == "" {
		req.Image = a.image
	}
	sb, err := a.s.c.Create(ctx, createFor(a.rt, req))
	if err != nil {
		a.t.Fatalf("create on %s: %v", a.rt, err)
	}
	a.s.record(sb.ID)
	if sb.Runtime != a.rt || sb.State != wire.StateRunning {
		a.t.Fatalf("create on %s gave a sandbox on %q in state %s", a.rt, sb.Runtime, sb.State)
	}
	t := a.t
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		if _, err := a.s.c.Destroy(ctx, sb.ID); err != nil {
			t.Errorf("destroy %s: %v", sb.ID, err)
			return
		}
		if leaks := testenv.LeaksAfter(5*time.Second, sb.ID); len(leaks) > 0 {
			t.Errorf("after destroying %s the host still holds:\n%s", sb.ID, strings.Join(leaks, "\n"))
		}
		if _, err := os.Stat(filepath.Join(a.s.stateDir, "runtimes", a.rt, "sandboxes", sb.ID)); err == nil {
			t.Errorf("sandbox dir of %s left after destroy", sb.ID)
		}
	})
	return sb
}

// exec runs a command in sandbox id and fails the test if the API call fails. Only from the
// test's goroutine.
func (a *arena) execIn(id string, req wire.ExecRequest) wire.ExecResult {
	a.t.Helper()
	res, err := a.tryExecIn(id, req)
	if err != nil {
		a.t.Fatalf("exec %q in %s: %v", req.Command, id, err)
	}
	return res
}

// tryExecIn is execIn returning the error; safe from any goroutine.
func (a *arena) tryExecIn(id string, req wire.ExecRequest) (wire.ExecResult, error) {
	if req.TimeoutSeconds == 0 {
		req.TimeoutSeconds = 60
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(req.TimeoutSeconds*float64(time.Second))+90*time.Second)
	defer cancel()
	return a.s.c.Exec(ctx, id, req, nil)
}

// sh runs a shell script as the agent user (the default) in the arena's sandbox.
func (a *arena) sh(script string) wire.ExecResult {
	a.t.Helper()
	return a.execIn(a.id, wire.ExecRequest{Command: []string{"sh", "-c", script}})
}

// root runs a shell script as root inside the arena's sandbox.
func (a *arena) root(script string) wire.ExecResult {
	a.t.Helper()
	return a.execIn(a.id, wire.ExecRequest{Command: []string{"sh", "-c", script}, User: "root"})
}

// alive asserts that the sandbox still runs commands, within d.
func (a *arena) alive(id string, d time.Duration) {
	a.t.Helper()
	deadline := time.Now().Add(d)
	for {
		res, err := a.tryExecIn(id, wire.ExecRequest{Command: []string{"echo", "alive"}, TimeoutSeconds: 10})
		if err == nil && res.Stdout == "alive\n" {
			return
		}
		sb, gerr := a.s.c.Get(context.Background(), id)
		if gone := gerr == nil && sb.State != wire.StateRunning; gone || time.Now().After(deadline) {
			a.t.Fatalf("sandbox %s does not answer (waited up to %s) after the attack: %+v %v (record: state %s, error %q, %v; host cgroup: %s)", id, d, res, err, sb.State, sb.Error, gerr, a.cgroupDiag(id))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// sandboxDir is the sandbox's bundle directory on the host.
func (a *arena) sandboxDir(id string) string {
	return filepath.Join(a.s.stateDir, "runtimes", a.rt, "sandboxes", id)
}

// initPid is the host pid of the sandbox's init (runc: the agent; gVisor: the sentry).
func (a *arena) initPid(id string) int {
	b, _ := os.ReadFile(filepath.Join(a.sandboxDir(id), "init.pid"))
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if pid <= 0 {
		a.t.Fatalf("no init.pid for %s", id)
	}
	return pid
}

// cgroupNeedle is what /proc/PID/cgroup of the sandbox's host processes contains.
func (a *arena) cgroupNeedle(id string) string { return "/" + a.s.cgroupParent(a.rt) + "/" + id }

// hostPids returns the host processes in sandbox id's cgroups (for gVisor: its sentry, gofer
// and their helpers), zombies excluded.
func (a *arena) hostPids(id string) []int {
	return pidsWhere(func(pid int, cg, _ string) bool {
		return strings.Contains(cg, a.cgroupNeedle(id)+"\n") || strings.Contains(cg, a.cgroupNeedle(id)+"/")
	})
}

// cgroupFile reads a control file of the sandbox's cgroup on the host (v1 controller dir).
func (a *arena) cgroupFile(id, controller, file string) (string, error) {
	b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup", controller, a.s.cgroupParent(a.rt), id, file))
	return strings.TrimSpace(string(b)), err
}

// pidsWhere lists host pids (zombies excluded) for which match(pid, cgroup, cmdline) holds.
func pidsWhere(match func(pid int, cgroup, cmdline string) bool) []int {
	var out []int
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		pid, err := strconv.Atoi(filepath.Base(p))
		if err != nil {
			continue
		}
		stat, _ := os.ReadFile(p + "/stat")
		if i := bytes.LastIndexByte(stat, ')'); i < 0 || i+2 >= len(stat) || stat[i+2] == 'Z' {
			continue
		}
		cg, _ := os.ReadFile(p + "/cgroup")
		cmd, _ := os.ReadFile(p + "/cmdline")
		if match(pid, string(cg), strings.ReplaceAll(string(cmd), "\x00", " ")) {
			out = append(out, pid)
		}
	}
	return out
}

// hostPidsWithArg lists host processes whose command line contains marker.
func hostPidsWithArg(marker string) []string {
	var out []string
	for _, pid := range pidsWhere(func(_ int, _, cmd string) bool { return strings.Contains(cmd, marker) }) {
		cmd, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
		out = append(out, fmt.Sprintf("%d: %s", pid, strings.ReplaceAll(string(cmd), "\x00", " ")))
	}
	return out
}

func sha256File(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("hash %s: %v", path, err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// statusField reads a field of /proc/PID/status ("VmHWM", "TracerPid"...).
func statusField(pid int, field string) string {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// kib parses "1234 kB".
func kib(s string) int64 {
	v, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(s, "kB")), 10, 64)
	return v
}

// fsFree returns the free bytes and inodes of the file system holding path.
func fsFree(t *testing.T, path string) (bytes, inodes uint64) {
	t.Helper()
	var st syscall.Statfs_t
	if err := syscall.Statfs(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Bavail * uint64(st.Bsize), st.Ffree
}

// memAvailable is the host's MemAvailable in KiB.
func memAvailable() int64 {
	b, _ := os.ReadFile("/proc/meminfo")
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "MemAvailable:"); ok {
			return kib(v)
		}
	}
	return 0
}

// code returns the error code of an API error ("" for nil, "?" for an untyped one).
func code(err error) errcode.Code {
	if err == nil {
		return ""
	}
	if e, ok := errcode.As(err); ok {
		return e.Code
	}
	return "?"
}

// readAll reads a file through the files API; it returns the bytes or the API error.
func (a *arena) readFile(id, path string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rc, _, err := a.s.c.ReadFile(ctx, id, path, 0, 0)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return io.ReadAll(io.LimitReader(rc, 64<<20))
}

func (a *arena) writeFile(id, path string, data []byte) error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_, err := a.s.c.WriteFile(ctx, id, path, 0o644, bytes.NewReader(data))
	return err
}

// mkdir and remove use the REST endpoints directly (the Go client has no method for them).
func (a *arena) mkdir(id, path string, parents bool) (int, string) {
	body, _ := json.Marshal(map[string]any{"path": path, "parents": parents})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, b, err := a.s.rest(ctx, http.MethodPost, "/v1/sandboxes/"+id+"/files/mkdir", nil, bytes.NewReader(body))
	if err != nil {
		a.t.Fatalf("mkdir %s: %v", path, err)
	}
	return st, string(b)
}

func (a *arena) remove(id, path string, recursive bool) (int, string) {
	q := url.Values{"path": {path}}
	if recursive {
		q.Set("recursive", "true")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, b, err := a.s.rest(ctx, http.MethodDelete, "/v1/sandboxes/"+id+"/files", q, nil)
	if err != nil {
		a.t.Fatalf("remove %s: %v", path, err)
	}
	return st, string(b)
}

// lines splits output into non-empty lines.
func lines(s string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.TrimSpace(l) != "" {
			out = append(out, l)
		}
	}
	return out
}

// hostCanary is a file on the host that no sandbox may read, change or remove.
type hostCanary struct {
	path    string
	content string
	sum     string
}

func newHostCanary(t *testing.T, path string) hostCanary {
	t.Helper()
	c := hostCanary{path: path, content: "absec-host-canary-" + randHex(16) + "\n"}
	if err := os.WriteFile(path, []byte(c.content), 0o644); err != nil {
		t.Fatal(err)
	}
	c.sum = sha256File(t, path)
	return c
}

// intact fails the test if the canary changed or vanished.
func (c hostCanary) intact(t *testing.T) {
	t.Helper()
	b, err := os.ReadFile(c.path)
	if err != nil {
		t.Errorf("HOST CANARY %s is gone: %v", c.path, err)
		return
	}
	if string(b) != c.content {
		t.Errorf("HOST CANARY %s changed: %q", c.path, b)
	}
}

// dirEntries lists a host directory's names.
func dirEntries(t *testing.T, dir string) []string {
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

// apiExec is an exec request of argv as user ("" = the agent user).
func apiExec(user string, argv ...string) wire.ExecRequest {
	return wire.ExecRequest{Command: argv, User: user}
}

// nsLinks returns the namespaces (as "net:[4026531840]") that pids are in.
func nsLinks(pids []int) map[string]bool {
	out := map[string]bool{}
	for _, pid := range pids {
		for _, ns := range []string{"user", "mnt", "net", "pid", "uts", "ipc", "cgroup"} {
			if l, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/%s", pid, ns)); err == nil {
				out[l] = true
			}
		}
	}
	return out
}

// hostFD is one open file descriptor of a host process.
type hostFD struct {
	pid, fd  int
	target   string
	dev, ino uint64
	mode     uint32
}

// hostFDs lists pid's open file descriptors with what they point at.
func hostFDs(pid int) []hostFD {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, _ := os.ReadDir(dir)
	var out []hostFD
	for _, e := range ents {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		target, _ := os.Readlink(filepath.Join(dir, e.Name()))
		f := hostFD{pid: pid, fd: n, target: target}
		var st syscall.Stat_t
		if syscall.Stat(filepath.Join(dir, e.Name()), &st) == nil {
			f.dev, f.ino, f.mode = st.Dev, st.Ino, st.Mode
		}
		out = append(out, f)
	}
	return out
}

// heldFDs lists, as "pid:target", the fds of sandbox id's host processes whose target contains
// one of the given names (anon_inode kinds such as "io_uring" or "bpf-map").
func (a *arena) heldFDs(id string, names ...string) []string {
	var held []string
	for _, pid := range a.hostPids(id) {
		for _, f := range hostFDs(pid) {
			if slices.ContainsFunc(names, func(n string) bool { return strings.Contains(f.target, n) }) {
				held = append(held, fmt.Sprintf("%d:%s", pid, f.target))
			}
		}
	}
	return held
}

// uidBase is the host uid that root inside sandbox id maps to (from its init's uid_map); -1
// without a user namespace mapping.
func (a *arena) uidBase(id string) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/uid_map", a.initPid(id)))
	if err != nil {
		return -1
	}
	f := strings.Fields(string(b))
	if len(f) != 3 || f[0] != "0" || f[2] == "4294967295" {
		return -1
	}
	v, _ := strconv.ParseInt(f[1], 10, 64)
	return v
}

// hostMountOptions returns the per-mount options of the host mount at path ("" if none).
func hostMountOptions(path string) string {
	b, _ := os.ReadFile("/proc/self/mountinfo")
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) > 5 && f[4] == path {
			return f[5]
		}
	}
	return ""
}

// hostAccounts returns the uids of the host's /etc/passwd.
func hostAccounts() map[int64]string {
	out := map[int64]string{}
	b, _ := os.ReadFile("/etc/passwd")
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Split(l, ":")
		if len(f) > 2 {
			if u, err := strconv.ParseInt(f[2], 10, 64); err == nil {
				out[u] = f[0]
			}
		}
	}
	return out
}

// asHostUser runs argv on the host as an unprivileged uid/gid and returns its combined output
// and whether it succeeded.
func asHostUser(uid, gid uint32, argv ...string) (string, bool) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid, Groups: []uint32{}}}
	out, err := cmd.CombinedOutput()
	return string(out), err == nil
}

// cgroupDiag summarises the OOM kills and pids of sandbox id's host cgroups, for failures.
func (a *arena) cgroupDiag(id string) string {
	var parts []string
	var mine []string
	for _, l := range strings.Split(a.s.logs.String(), "\n") {
		if strings.Contains(l, id) && len(mine) < 20 {
			mine = append(mine, l)
		}
	}
	defer func() { a.t.Logf("server log of %s:\n%s", id, strings.Join(mine, "\n")) }()
	if v, err := a.cgroupFile(id, "memory", "memory.oom_control"); err == nil {
		parts = append(parts, "memory.oom_control "+strings.ReplaceAll(v, "\n", ", "))
	}
	if v, err := a.cgroupFile(id, "memory", "memory.max_usage_in_bytes"); err == nil {
		parts = append(parts, "memory.max_usage_in_bytes "+v)
	}
	for _, f := range []string{"pids.current", "pids.max", "pids.events"} {
		if v, err := a.cgroupFile(id, "pids", f); err == nil {
			parts = append(parts, f+" "+strings.ReplaceAll(v, "\n", ", "))
		}
	}
	if b, err := os.ReadFile(filepath.Join(a.sandboxDir(id), "disk", "guest.log")); err == nil && len(b) > 0 {
		var fatal []string
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "fatal error") || strings.HasPrefix(l, "runtime: ") || strings.HasPrefix(l, "panic: ") {
				fatal = append(fatal, l)
			}
		}
		if len(fatal) > 0 {
			parts = append(parts, "agent log: "+strings.Join(fatal[:min(len(fatal), 6)], " | "))
		}
	}
	return strings.Join(parts, "; ")
}

// hostDevNull is the host's /dev/null as the runtime suite describes it.
func hostDevNull(t testing.TB) string { return runtimetest.HostDevNull(t) }
