// Package faults is agentbox's fault campaign: concurrent clients over REST, MCP and the CLI do
// a realistic mix of work against a real `agentbox serve` (runc) while faults are injected at
// random — the server SIGKILLed and restarted, a sandbox's agent and a job's process SIGKILLed,
// a runc that fails or hangs, the state dir's file system full, a second server on the same
// host — and after each fault and at the end invariants are checked: the store matches the
// host, no acknowledged write is missing, an idempotency key never creates twice, the server
// serves, and the capacity figures are the records' sums. A seed picks everything the campaign
// chooses; it is printed, and FAULTS_SEED replays it.
package faults

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/testenv"
	"github.com/agentbox/agentbox/internal/testenv/pglab"
)

const token = "faults-campaign-token"

// TestMain stops the throwaway Postgres (FAULTS_STORE=postgres) after the tests.
func TestMain(m *testing.M) { os.Exit(pglab.Main(m)) }

// The shape of every sandbox the clients create; the warm pool keeps one of it, so creates
// claim from the pool.
const (
	shapeCPU    = 0.5
	shapeMemory = 256
	shapeDisk   = 256
)

// settings are the campaign's knobs, from the environment: FAULTS_SEED (default: a fixed seed),
// FAULTS_CLIENTS (default 3), FAULTS_MINUTES (a decimal; default 1.25), FAULTS_SKIP (fault
// kinds not to inject and operations not to do, comma-separated), FAULTS_STORE (sqlite, the
// default, or postgres: a throwaway Postgres, which the fault postgres_restart restarts).
type settings struct {
	postgres bool // FAULTS_STORE=postgres: the server's store is a throwaway Postgres (pglab)
	seed     uint64
	clients  int
	duration time.Duration
	skip     map[string]bool
}

func settingsFromEnv(t *testing.T) settings {
	s := settings{seed: 20261207, clients: 3, duration: 75 * time.Second, skip: map[string]bool{}}
	if v := os.Getenv("FAULTS_SEED"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("FAULTS_SEED=%q: %v", v, err)
		}
		s.seed = n
	}
	if v := os.Getenv("FAULTS_CLIENTS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 64 {
			t.Fatalf("FAULTS_CLIENTS=%q: want 1-64", v)
		}
		s.clients = n
	}
	if v := os.Getenv("FAULTS_MINUTES"); v != "" {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f <= 0 {
			t.Fatalf("FAULTS_MINUTES=%q: want a positive number", v)
		}
		s.duration = time.Duration(f * float64(time.Minute))
	}
	switch v := os.Getenv("FAULTS_STORE"); v {
	case "", "sqlite":
	case "postgres":
		s.postgres = true
	default:
		t.Fatalf("FAULTS_STORE=%q: want sqlite or postgres", v)
	}
	for _, k := range strings.Split(os.Getenv("FAULTS_SKIP"), ",") {
		if k = strings.TrimSpace(k); k != "" {
			s.skip[k] = true
		}
	}
	return s
}

// counter counts things by kind (and keeps the first message of each).
type counter struct {
	mu      sync.Mutex
	m       map[string]int
	samples map[string]string
}

func (c *counter) sample(kind, msg string) {
	c.add(kind)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.samples == nil {
		c.samples = map[string]string{}
	}
	if _, ok := c.samples[kind]; !ok {
		c.samples[kind] = msg
	}
}

func (c *counter) examples() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for k, m := range c.samples {
		out = append(out, k+": "+firstN(m, 300))
	}
	sort.Strings(out)
	return out
}

func firstN(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

func (c *counter) add(kind string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]int{}
	}
	c.m[kind]++
}

func (c *counter) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	keys := make([]string, 0, len(c.m))
	total := 0
	for k, n := range c.m {
		keys = append(keys, k)
		total += n
	}
	sort.Strings(keys)
	var b strings.Builder
	fmt.Fprintf(&b, "%d", total)
	for _, k := range keys {
		fmt.Fprintf(&b, " %s=%d", k, c.m[k])
	}
	return b.String()
}

// campaign is one run: the server under test, what clients were told (the ledger), and the
// figures.
type campaign struct {
	t        *testing.T
	set      settings
	bin      string
	base     string // the test's temp dir
	state    string // the server's state dir (a loop-mounted file system)
	parent   string // its cgroup parent
	repos    string // --checkout-dir, holding the runs' repository
	store    string // --store: a Postgres DSN, or "" for the state dir's SQLite
	modeFile string // the runc wrapper's mode
	wrapDir  string
	logs     *testenv.SyncBuffer

	// gate: clients hold it shared for each operation; a check holds it alone, so the store
	// and the host stand still while they are compared.
	gate sync.RWMutex

	srvMu   sync.Mutex
	srv     *proc
	starts  int
	restart time.Time // when the server last (re)started

	led ledger

	ops        counter      // operations by kind and outcome
	opErrs     counter      // failed operations by kind:code
	faults     counter      // faults injected by kind
	checks     counter      // invariant checks made, by kind
	ended      counter      // sandboxes failed or lost, but not by an agent_kill, by reason
	fullDisk   atomic.Bool  // the state dir's file system is full (a fault)
	fpBin      atomic.Value // the binary with crash points (string), once built
	points     []string     // the crash points still to try this round (the fault goroutine's)
	violations []string
	violMu     sync.Mutex
	notes      []string // what faults showed that is not a violation (e.g. a second server refused)
}

// api returns a REST client of the current server.
func (c *campaign) api() rest {
	c.srvMu.Lock()
	defer c.srvMu.Unlock()
	return rest{base: c.srv.url, token: token, hc: httpClient}
}

func (c *campaign) serverArgs() []string {
	var store []string
	if c.store != "" {
		store = []string{"--store", c.store}
	}
	return append(store, "--cgroup-parent", c.parent, "--checkout-dir", c.repos,
		"--approval-tools", "sandbox_extend", "--approval-timeout", "2m",
		"--pool", fmt.Sprintf("name=warm,size=1,cpu=%v,memory_mb=%d,disk_mb=%d", shapeCPU, shapeMemory, shapeDisk),
		"--max-sandboxes", "60", "--ready-timeout", "90s")
}

// start (re)starts the server under test.
func (c *campaign) start() error { return c.startWith(c.bin) }

// startWith (re)starts the server under test from bin with env added.
func (c *campaign) startWith(bin string, env ...string) error {
	c.srvMu.Lock()
	c.starts++
	n := c.starts
	c.srvMu.Unlock()
	fmt.Fprintf(c.logs, "\n===== faults: server start %d at %s =====\n", n, time.Now().UTC().Format(time.RFC3339Nano))
	env = append(env, "PATH="+c.wrapDir+":"+os.Getenv("PATH"), "AGENTBOX_TOKEN="+token)
	p, err := startServe(bin, c.state, env, c.logs, c.serverArgs()...)
	if err != nil {
		return err
	}
	c.srvMu.Lock()
	c.srv, c.restart = p, time.Now()
	c.srvMu.Unlock()
	return nil
}

func (c *campaign) violate(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	c.violMu.Lock()
	c.violations = append(c.violations, msg)
	c.violMu.Unlock()
	c.t.Errorf("VIOLATION: %s", msg)
}

func (c *campaign) note(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	c.violMu.Lock()
	c.notes = append(c.notes, msg)
	c.violMu.Unlock()
	c.t.Logf("note: %s", msg)
}

func (c *campaign) setMode(mode string) {
	if err := os.WriteFile(c.modeFile, []byte(mode), 0o644); err != nil {
		c.t.Errorf("runc wrapper mode: %v", err)
	}
}

// TestCampaign runs the fault campaign: a short one with a fixed seed by default (part of
// `make test`); `make soak` runs it long with a random seed.
func TestCampaign(t *testing.T) {
	testenv.RequireRoot(t)
	for _, tool := range []string{"git", "mkfs.ext4", "fallocate", "mount"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is not installed (make deps installs the host packages)", tool)
		}
	}
	set := settingsFromEnv(t)
	storeName := "sqlite"
	if set.postgres {
		storeName = "postgres"
	}
	t.Logf("fault campaign: seed %d, %d clients, %s, store %s (replay: FAULTS_SEED=%d FAULTS_CLIENTS=%d FAULTS_MINUTES=%g FAULTS_STORE=%s)",
		set.seed, set.clients, set.duration, storeName, set.seed, set.clients, set.duration.Minutes(), storeName)
	base := testenv.ShortTempDir(t, "abf")
	c := &campaign{t: t, set: set, bin: testenv.Binary(t), base: base, state: filepath.Join(base, "s"),
		parent: "abfaults-" + filepath.Base(base), repos: filepath.Join(base, "repos"),
		modeFile: filepath.Join(base, "runc-mode"), wrapDir: filepath.Join(base, "bin"), logs: &testenv.SyncBuffer{}}
	c.led.init()
	if set.postgres {
		c.store = pglab.DSN(t)
	}
	loopFS(t, c.state, 3072)
	runtimeWrapper(t, c.wrapDir, c.modeFile)
	c.setMode("ok")
	c.makeRepo()
	c.buildCrashBinary()
	if err := c.start(); err != nil {
		t.Fatalf("start: %v\n%s", err, c.logs)
	}
	t.Cleanup(func() {
		p := filepath.Join(os.TempDir(), fmt.Sprintf("agentbox-faults-%d-%d.log", set.seed, os.Getpid()))
		os.WriteFile(p, []byte(c.logs.String()), 0o600)
		t.Logf("seed %d; the server's whole log is in %s", set.seed, p)
		if t.Failed() {
			t.Logf("its tail:\n%s", tail(c.logs.String(), 8000))
		}
	})

	ctx, cancel := context.WithTimeout(context.Background(), set.duration)
	defer cancel()
	var wg sync.WaitGroup
	for i := 0; i < set.clients; i++ {
		cl := &client{c: c, n: i, rng: rand.New(rand.NewPCG(set.seed, uint64(i)+1))}
		wg.Add(1)
		go func() { defer wg.Done(); cl.loop(ctx) }()
	}
	c.injectFaults(ctx, rand.New(rand.NewPCG(set.seed, 0)))
	wg.Wait()

	// The end: nothing injected any more; everything settles, then the last checks.
	c.setMode("ok")
	c.checkAll("end")
	c.settleRuns()
	c.teardown()
	t.Logf("figures: seed %d, %d clients, %s", set.seed, set.clients, set.duration)
	t.Logf("  operations: %s", &c.ops)
	t.Logf("  failed operations: %s", &c.opErrs)
	for _, e := range c.opErrs.examples() {
		t.Logf("    e.g. %s", e)
	}
	t.Logf("  faults: %s", &c.faults)
	t.Logf("  invariant checks: %s", &c.checks)
	t.Logf("  server starts: %d", c.starts)
	t.Logf("  sandboxes failed or lost at the end, not by an agent_kill: %s", &c.ended)
	lost, leaked := c.led.lostCount(), c.led.leakedCount()
	t.Logf("  lost = %d (acknowledged writes missing), leaked = %d (host resources left)", lost, leaked)
	t.Logf("  audit records dropped of REST execs answered while the disk was full: %d", c.led.auditDroppedDiskFull)
	t.Logf("  violations: %d", len(c.violations))
	for _, n := range c.notes {
		t.Logf("  note: %s", n)
	}
	if len(c.violations) > 0 {
		t.Errorf("%d invariant violations (seed %d: replay with FAULTS_SEED=%d)", len(c.violations), set.seed, set.seed)
	}
}

// makeRepo makes the git repository the runs check out (file://, under --checkout-dir).
func (c *campaign) makeRepo() {
	repo := filepath.Join(c.repos, "repo")
	if err := os.MkdirAll(repo, 0o755); err != nil {
		c.t.Fatal(err)
	}
	os.WriteFile(filepath.Join(repo, "README"), []byte("faults campaign\n"), 0o644)
	for _, args := range [][]string{{"init", "-q", "-b", "main"}, {"add", "."},
		{"-c", "user.email=f@example.com", "-c", "user.name=faults", "commit", "-qm", "one"}} {
		cmd := exec.Command("git", args...)
		cmd.Dir = repo
		if out, err := cmd.CombinedOutput(); err != nil {
			c.t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
}

// teardown destroys every sandbox the server holds, stops it, and checks that nothing of any
// sandbox the campaign saw is left on the host.
func (c *campaign) teardown() {
	ctx := context.Background()
	r := c.api()
	if err := waitHealthy(ctx, r, time.Minute); err != nil {
		c.violate("teardown: the server does not serve: %v", err)
	}
	// The pool would refill what the destroys take: empty it first.
	if err := r.do(ctx, "DELETE", "/v1/pools/warm", nil, nil, nil); err != nil {
		c.t.Logf("teardown: delete pool: %v", err)
	}
	rows, err := r.query(ctx, `SELECT id, state, error FROM sandboxes`)
	if err != nil {
		c.violate("teardown: records: %v", err)
	}
	c.led.mu.Lock()
	for _, row := range rows {
		if st := str(row["state"]); (st == "lost" || st == "failed") && !c.led.agentKilled[str(row["id"])] {
			c.ended.sample(st+": "+firstN(str(row["error"]), 80), str(row["id"]))
		}
	}
	c.led.mu.Unlock()
	for _, row := range rows {
		id := str(row["id"])
		c.led.seen(id)
		if st := str(row["state"]); st == "destroyed" {
			continue
		}
		dctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		if err := r.do(dctx, "DELETE", "/v1/sandboxes/"+id, nil, nil, nil); err != nil && code(err) != "SANDBOX_NOT_FOUND" {
			c.violate("teardown: destroy %s: %v", id, err)
		}
		cancel()
	}
	c.srvMu.Lock()
	p := c.srv
	c.srvMu.Unlock()
	if !p.stop() {
		c.violate("the server did not stop on SIGTERM within 30 s")
	}
	ids := c.led.allSeen()
	if leaks := testenv.LeaksAfter(15*time.Second, append(ids, c.state+"/", c.parent)...); len(leaks) > 0 {
		c.led.addLeaked(len(leaks))
		c.violate("after the last destroy and a stop, host resources are left:\n%s", strings.Join(leaks, "\n"))
	}
	c.checks.add("teardown-leaks")
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}
