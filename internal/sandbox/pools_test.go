package sandbox_test

import (
	"context"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/fake"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/sandbox/jobs"
	"github.com/agentbox/agentbox/internal/sandbox/pools"
	"github.com/agentbox/agentbox/internal/sandbox/snapshots"
	"github.com/agentbox/agentbox/internal/store/sqlite"
)

// Warm pools on the fake runtime (real SQLite, real guest agents in-process).

func (e *fakeEnv) pool(t *testing.T, name string) sandbox.PoolStatus {
	t.Helper()
	pools, err := e.pools.ListPools(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pools {
		if p.Name == name {
			return p
		}
	}
	t.Fatalf("pool %s not listed: %+v", name, pools)
	return sandbox.PoolStatus{}
}

func (e *fakeEnv) setPool(t *testing.T, p sandbox.Pool) {
	t.Helper()
	if _, err := e.pools.SetPool(t.Context(), p); err != nil {
		t.Fatalf("SetPool: %v", err)
	}
}

func (e *fakeEnv) execOut(t *testing.T, id string, args ...string) string {
	t.Helper()
	res, err := e.svc.Exec(t.Context(), id, sandbox.ExecRequest{Argv: args}, nil)
	if err != nil {
		t.Fatalf("exec %v in %s: %v", args, id, err)
	}
	if res.ExitCode != 0 {
		t.Fatalf("exec %v in %s: exit %d: %s", args, id, res.ExitCode, res.Stderr)
	}
	return res.Stdout
}

func TestPoolClaimIsFreshWithTheClaimantsEnv(t *testing.T) {
	e := newFakeEnv(t, sandbox.Config{})
	e.setPool(t, sandbox.Pool{Name: "py", Size: 2})
	if p := e.pool(t, "py"); p.Ready != 0 || p.Size != 2 || p.Image != "host" || p.Runtime != "runc" || p.Network != "none" || p.MemoryMB != sandbox.DefaultMemoryMB {
		t.Fatalf("pool before refill: %+v; want size 2, 0 ready, the defaults' shape", p)
	}
	e.pools.Refill(t.Context())
	if p := e.pool(t, "py"); p.Ready != 2 {
		t.Fatalf("after a refill pass: %d ready, want 2", p.Ready)
	}
	// Pooled sandboxes are nobody's: not in the caller's list.
	if l, _ := e.svc.List(t.Context(), sandbox.ListFilter{}); len(l) != 0 {
		t.Fatalf("List shows %d sandboxes; pooled ones must be hidden", len(l))
	}
	members, _ := e.svc.List(t.Context(), sandbox.ListFilter{Pool: "py"})
	if len(members) != 2 || members[0].Owner != "pool:py" || len(members[0].Env) != 0 {
		t.Fatalf("members: %+v", members)
	}
	runs := e.rt.Calls(fake.OpRun) + e.rt.Calls(fake.OpCreate)

	ctx := sandbox.WithOwner(t.Context(), "alice")
	a, err := e.svc.Create(ctx, sandbox.CreateRequest{Env: map[string]string{"POOL_GREETING": "hello-alice"},
		Labels: map[string]string{"team": "a"}, TTLSeconds: 60})
	if err != nil {
		t.Fatal(err)
	}
	if !a.FromPool || a.Pool != "" || a.Owner != "alice" || a.Labels["team"] != "a" || a.State != sandbox.StateRunning {
		t.Fatalf("claimed record: %+v; want from_pool, no pool, alice's owner and labels", a)
	}
	if want := e.clock.Now().Add(60 * time.Second); !a.ExpiresAt.Equal(want) {
		t.Fatalf("expires_at %s, want the claimant's TTL from now (%s)", a.ExpiresAt, want)
	}
	if got := e.rt.Calls(fake.OpRun) + e.rt.Calls(fake.OpCreate); got != runs {
		t.Fatalf("a claim started a sandbox (%d runtime creates, want %d)", got, runs)
	}
	// The claimant's env reaches every command: exec (with its own env over it) and jobs.
	if got := e.execOut(t, a.ID, "sh", "-c", "echo $POOL_GREETING"); got != "hello-alice\n" {
		t.Fatalf("exec in the claimed sandbox sees POOL_GREETING=%q, want hello-alice", got)
	}
	res, err := e.svc.Exec(t.Context(), a.ID, sandbox.ExecRequest{Argv: []string{"sh", "-c", "echo $POOL_GREETING"}, Env: map[string]string{"POOL_GREETING": "own"}}, nil)
	if err != nil || res.Stdout != "own\n" {
		t.Fatalf("a command's own env must win: %q %v", res.Stdout, err)
	}
	j, err := e.jobs.StartJob(t.Context(), a.ID, sandbox.JobStartRequest{Argv: []string{"sh", "-c", "echo job:$POOL_GREETING"}})
	if err != nil {
		t.Fatal(err)
	}
	jw, err := e.jobs.WaitJob(t.Context(), a.ID, j.ID, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if out, _ := e.jobs.JobLogs(t.Context(), a.ID, j.ID, sandbox.JobLogsRequest{}); !strings.Contains(string(out.Data), "job:hello-alice") {
		t.Fatalf("job (state %s) output %q; want the claimant's env", jw.State, out.Data)
	}
	// Leave a mark in alice's sandbox; bob's claim must not see it nor alice's env.
	e.execOut(t, a.ID, "sh", "-c", "echo secret > alice.txt")
	b, err := e.svc.Create(sandbox.WithOwner(t.Context(), "bob"), sandbox.CreateRequest{})
	if err != nil || !b.FromPool || b.ID == a.ID {
		t.Fatalf("bob's create: %+v %v; want another pooled sandbox", b, err)
	}
	if got := e.execOut(t, b.ID, "sh", "-c", "echo [$POOL_GREETING]; ls"); got != "[]\n" {
		t.Fatalf("bob's sandbox shows %q; want nothing of alice's", got)
	}
	p := e.pool(t, "py")
	if p.Ready != 0 || p.Hits != 2 || p.Misses != 0 {
		t.Fatalf("after two claims: %+v; want 0 ready, 2 hits", p)
	}
	// Empty pool: a miss, started as usual.
	c, err := e.svc.Create(t.Context(), sandbox.CreateRequest{})
	if err != nil || c.FromPool {
		t.Fatalf("create with the pool empty: %+v %v; want a cold create", c, err)
	}
	if p := e.pool(t, "py"); p.Misses != 1 {
		t.Fatalf("misses %d, want 1", p.Misses)
	}
	// Another shape never claims.
	d, err := e.svc.Create(t.Context(), sandbox.CreateRequest{MemoryMB: 256})
	if err != nil || d.FromPool {
		t.Fatalf("create of another shape: %+v %v", d, err)
	}
	// Refill after claims; a destroyed claimed sandbox never returns to the pool.
	e.pools.Refill(t.Context())
	if p := e.pool(t, "py"); p.Ready != 2 {
		t.Fatalf("after refill: %d ready, want 2", p.Ready)
	}
	if _, err := e.svc.Destroy(t.Context(), a.ID); err != nil {
		t.Fatal(err)
	}
	members, _ = e.svc.List(t.Context(), sandbox.ListFilter{Pool: "py"})
	for _, m := range members {
		if m.ID == a.ID || m.ID == b.ID {
			t.Fatalf("a claimed sandbox is back in the pool: %s", m.ID)
		}
	}
	// Capacity counts pooled sandboxes and reports the pool.
	cp, err := e.svc.Capacity(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if cp.Live != 5 || len(cp.Pools) != 1 || cp.Pools[0].Ready != 2 || cp.Pools[0].Hits != 2 || cp.MaxPooled != sandbox.DefaultMaxSandboxes/2 {
		t.Fatalf("capacity: live %d, pools %+v, max_pooled %d; want 5 live (2 pooled), the pool's figures", cp.Live, cp.Pools, cp.MaxPooled)
	}
}

func TestPoolConcurrentClaimantsNeverShare(t *testing.T) {
	e := newFakeEnv(t, sandbox.Config{})
	e.setPool(t, sandbox.Pool{Name: "p", Size: 4})
	e.pools.Refill(t.Context())
	const n = 10
	var wg sync.WaitGroup
	out := make([]sandbox.Sandbox, n)
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			out[i], errs[i] = e.svc.Create(t.Context(), sandbox.CreateRequest{})
		})
	}
	wg.Wait()
	seen, pooled := map[string]bool{}, 0
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("create %d: %v", i, errs[i])
		}
		if seen[out[i].ID] {
			t.Fatalf("two creates got sandbox %s", out[i].ID)
		}
		seen[out[i].ID] = true
		if out[i].FromPool {
			pooled++
		}
	}
	if pooled != 4 {
		t.Fatalf("%d creates claimed from a pool of 4; want exactly 4", pooled)
	}
	if p := e.pool(t, "p"); p.Hits != 4 || p.Misses != n-4 || p.Ready != 0 {
		t.Fatalf("pool: %+v", p)
	}
}

func TestPoolIdempotentCreateClaimsOnce(t *testing.T) {
	e := newFakeEnv(t, sandbox.Config{})
	e.setPool(t, sandbox.Pool{Name: "p", Size: 2})
	e.pools.Refill(t.Context())
	req := sandbox.CreateRequest{IdempotencyKey: "k1", Env: map[string]string{"A": "1"}}
	a, err := e.svc.Create(t.Context(), req)
	if err != nil || !a.FromPool {
		t.Fatalf("first create: %+v %v", a, err)
	}
	b, err := e.svc.Create(t.Context(), req)
	if err != nil || b.ID != a.ID {
		t.Fatalf("retried create: %s %v; want %s again", b.ID, err, a.ID)
	}
	if p := e.pool(t, "p"); p.Ready != 1 || p.Hits != 1 {
		t.Fatalf("a retry claimed again: %+v", p)
	}
	req.Env = map[string]string{"A": "2"}
	if _, err := e.svc.Create(t.Context(), req); errcode.Of(err) != errcode.Conflict {
		t.Fatalf("same key, other request: %v; want CONFLICT", err)
	}
}

func TestPoolRefillYieldsToInteractiveCreates(t *testing.T) {
	e := newFakeEnv(t, sandbox.Config{})
	e.setPool(t, sandbox.Pool{Name: "p", Size: 2})
	// A caller's create held in its runtime start: in flight while the refill runs.
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	e.rt.SetFault(func(ctx context.Context, op fake.Op, id string) error {
		if op != fake.OpRun && op != fake.OpCreate {
			return nil
		}
		held := false
		once.Do(func() { held = true })
		if held {
			close(entered)
			<-release
		}
		return nil
	})
	created := make(chan error, 1)
	go func() {
		_, err := e.svc.Create(context.Background(), sandbox.CreateRequest{Image: "host", MemoryMB: 64})
		created <- err
	}()
	<-entered
	e.pools.Refill(t.Context())
	if p := e.pool(t, "p"); p.Ready+p.Starting != 0 {
		t.Fatalf("refill ran while an interactive create was in flight: %+v", p)
	}
	close(release)
	if err := <-created; err != nil {
		t.Fatal(err)
	}
	e.pools.Refill(t.Context())
	if p := e.pool(t, "p"); p.Ready != 2 {
		t.Fatalf("after the create: %+v", p)
	}
}

func TestPoolRefillBacksOffOnFailure(t *testing.T) {
	e := newFakeEnv(t, sandbox.Config{})
	e.setPool(t, sandbox.Pool{Name: "p", Size: 1})
	clear := failOn(e.rt, fake.OpRun, "") // the fake runtime is a runtime.Runner: a create is one run
	defer clear()
	e.pools.Refill(t.Context())
	before := e.rt.Calls(fake.OpRun) + e.rt.Calls(fake.OpCreate)
	p := e.pool(t, "p")
	if p.LastError == "" {
		t.Fatalf("a failed refill is not reported: %+v", p)
	}
	e.pools.Refill(t.Context()) // inside the backoff: no attempt
	if got := e.rt.Calls(fake.OpRun) + e.rt.Calls(fake.OpCreate); got != before {
		t.Fatalf("refill retried inside its backoff (%d → %d runtime calls)", before, got)
	}
	clear()
	e.clock.Add(2 * time.Second)
	e.pools.Refill(t.Context())
	if p := e.pool(t, "p"); p.Ready != 1 || p.LastError != "" {
		t.Fatalf("after the backoff: %+v", p)
	}
}

func TestPoolShrinkAndDeleteRetire(t *testing.T) {
	e := newFakeEnv(t, sandbox.Config{})
	e.setPool(t, sandbox.Pool{Name: "p", Size: 3})
	e.pools.Refill(t.Context())
	e.setPool(t, sandbox.Pool{Name: "p", Size: 1})
	e.pools.Refill(t.Context())
	if p := e.pool(t, "p"); p.Ready != 1 {
		t.Fatalf("after shrinking to 1: %+v", p)
	}
	// A new shape replaces the old one's sandboxes.
	e.setPool(t, sandbox.Pool{Name: "p", Size: 1, MemoryMB: 256})
	e.pools.Refill(t.Context())
	e.pools.Refill(t.Context())
	members, _ := e.svc.List(t.Context(), sandbox.ListFilter{Pool: "p", States: []sandbox.State{sandbox.StateRunning}})
	if len(members) != 1 || members[0].MemoryMB != 256 {
		t.Fatalf("after a new shape: %+v", members)
	}
	if err := e.pools.DeletePool(t.Context(), "p"); err != nil {
		t.Fatal(err)
	}
	e.pools.Refill(t.Context())
	if cp, _ := e.svc.Capacity(t.Context()); cp.Live != 0 || len(cp.Pools) != 0 {
		t.Fatalf("after delete: live %d pools %+v", cp.Live, cp.Pools)
	}
	if r := e.rt.Resources(); len(r) != 0 {
		t.Fatalf("host resources left: %v", r)
	}
	if err := e.pools.DeletePool(t.Context(), "p"); errcode.Of(err) != errcode.PoolNotFound {
		t.Fatalf("deleting it again: %v; want POOL_NOT_FOUND", err)
	}
}

func TestPoolsAdoptedAfterRestart(t *testing.T) {
	e := newFakeEnv(t, sandbox.Config{})
	e.setPool(t, sandbox.Pool{Name: "p", Size: 2})
	e.pools.Refill(t.Context())
	runs := e.rt.Calls(fake.OpRun) + e.rt.Calls(fake.OpCreate)
	e.restart(t) // a new server over the same store and runtime (the sandboxes kept running)
	if p := e.pool(t, "p"); p.Ready != 2 || p.Size != 2 {
		t.Fatalf("after restart: %+v; want the pool with its 2 sandboxes adopted", p)
	}
	e.pools.Refill(t.Context())
	if got := e.rt.Calls(fake.OpRun) + e.rt.Calls(fake.OpCreate); got != runs {
		t.Fatalf("the restarted server started %d more sandboxes for a full pool", got-runs)
	}
	sb, err := e.svc.Create(t.Context(), sandbox.CreateRequest{Env: map[string]string{"POOL_X": "after-restart"}})
	if err != nil || !sb.FromPool {
		t.Fatalf("claim after restart: %+v %v", sb, err)
	}
	if got := e.execOut(t, sb.ID, "sh", "-c", "echo $POOL_X"); got != "after-restart\n" {
		t.Fatalf("exec in an adopted, claimed sandbox: %q", got)
	}
}

func TestPoolCrashedRefillIsSwept(t *testing.T) {
	e := newFakeEnv(t, sandbox.Config{})
	e.setPool(t, sandbox.Pool{Name: "p", Size: 1})
	// The server dies in the middle of a refill: its record stays creating while the runtime's
	// create hangs; a new server starts over the same store and runtime.
	block := make(chan struct{})
	e.rt.SetFault(func(ctx context.Context, op fake.Op, id string) error {
		if op == fake.OpRun || op == fake.OpCreate {
			<-block
			return errInjected
		}
		return nil
	})
	done := make(chan struct{})
	go func() { e.pools.Refill(t.Context()); close(done) }()
	deadline := time.Now().Add(5 * time.Second)
	for e.pool(t, "p").Starting != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the refill never recorded its sandbox")
		}
		time.Sleep(10 * time.Millisecond)
	}
	members, _ := e.svc.List(t.Context(), sandbox.ListFilter{Pool: "p"})
	if len(members) != 1 || members[0].State != sandbox.StateCreating {
		t.Fatalf("members while refilling: %+v", members)
	}
	e.restart(t) // Reconcile: a creating record of no create of this server is swept
	got, err := e.svc.Get(t.Context(), members[0].ID)
	if err != nil || got.State != sandbox.StateFailed {
		t.Fatalf("the crashed refill's sandbox after restart: %s %v; want failed (swept)", got.State, err)
	}
	if p := e.pool(t, "p"); p.Starting != 0 || p.Ready != 0 {
		t.Fatalf("the swept sandbox still counts toward the pool: %+v", p)
	}
	e.rt.SetFault(nil)
	close(block) // the dead server's create returns at last; it changes nothing
	<-done
	e.pools.Refill(t.Context())
	if p := e.pool(t, "p"); p.Ready != 1 {
		t.Fatalf("refill after the sweep: %+v", p)
	}
	if got, _ := e.svc.Get(t.Context(), members[0].ID); got.State != sandbox.StateFailed {
		t.Fatalf("the dead server's create revived its record: %s", got.State)
	}
}

func TestPoolValidation(t *testing.T) {
	e := newFakeEnv(t, sandbox.Config{MaxSandboxes: 10})
	for _, tc := range []struct {
		p    sandbox.Pool
		want string
	}{
		{sandbox.Pool{Name: "", Size: 1}, "name"},
		{sandbox.Pool{Name: "Bad Name", Size: 1}, "name"},
		{sandbox.Pool{Name: "p", Size: -1}, "size must be between 0 and 5"},
		{sandbox.Pool{Name: "p", Size: 6}, "size must be between 0 and 5"},
		{sandbox.Pool{Name: "p", Size: 1, Network: "allow"}, `"none" or "egress"`},
		{sandbox.Pool{Name: "p", Size: 1, MemoryMB: 1}, "memory_mb"},
		{sandbox.Pool{Name: "p", Size: 1, CPU: -1}, "cpu"},
	} {
		_, err := e.pools.SetPool(t.Context(), tc.p)
		if errcode.Of(err) != errcode.InvalidArgument || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("SetPool(%+v): %v; want INVALID_ARGUMENT naming %q", tc.p, err, tc.want)
		}
	}
	if _, err := e.pools.SetPool(t.Context(), sandbox.Pool{Name: "p", Size: 1, Runtime: "nope"}); err == nil || !strings.Contains(err.Error(), `runtime "nope"`) {
		t.Errorf("SetPool with an unknown runtime: %v", err)
	}
	e.setPool(t, sandbox.Pool{Name: "a", Size: 3})
	if _, err := e.pools.SetPool(t.Context(), sandbox.Pool{Name: "b", Size: 3}); errcode.Of(err) != errcode.InvalidArgument || !strings.Contains(err.Error(), "at most 2") {
		t.Errorf("pools over the pooled bound: %v", err)
	}
	e.setPool(t, sandbox.Pool{Name: "a", Size: 5}) // replacing a pool does not count it twice
	for _, tc := range []struct{ flag, want string }{
		{"name=p", "name and size are required"},
		{"size=1", "name and size are required"},
		{"name=p,size=x", "size must be a number"},
		{"name=p,size=1,colour=red", "unknown key"},
		{"name=p,size=1,size=2", "size is given twice"},
		{"name=p,cpu", "not key=value"},
	} {
		if _, err := pools.ParseFlag(tc.flag); errcode.Of(err) != errcode.InvalidArgument || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParsePoolFlag(%q): %v; want %q", tc.flag, err, tc.want)
		}
	}
	p, err := pools.ParseFlag("name=py,image=host,runtime=runc,cpu=0.5,memory_mb=256,disk_mb=512,network=none,size=2")
	if err != nil || p != (sandbox.Pool{Name: "py", Image: "host", Runtime: "runc", CPU: 0.5, MemoryMB: 256, DiskMB: 512, Network: "none", Size: 2}) {
		t.Fatalf("ParsePoolFlag: %+v %v", p, err)
	}
}

// BenchmarkPoolClaim: what a create of a pool's shape costs in the control plane when the
// pool has a ready sandbox (validation, the pool lookup, the claim's one write transaction), on
// SQLite in a temp dir; the refill and the destroy are outside the timer.
//
//	go test ./internal/sandbox -run '^$' -bench BenchmarkPoolClaim -benchtime 200x
func BenchmarkPoolClaim(b *testing.B) {
	e := newFakeEnvB(b)
	if _, err := e.pools.SetPool(b.Context(), sandbox.Pool{Name: "b", Size: 1}); err != nil {
		b.Fatal(err)
	}
	req := sandbox.CreateRequest{Env: map[string]string{"K": "v"}, Labels: map[string]string{"l": "1"}}
	for b.Loop() {
		b.StopTimer()
		e.pools.Refill(b.Context())
		b.StartTimer()
		sb, err := e.svc.Create(b.Context(), req)
		if err != nil || !sb.FromPool {
			b.Fatalf("create: %+v %v", sb, err)
		}
		b.StopTimer()
		e.svc.Destroy(b.Context(), sb.ID)
		b.StartTimer()
	}
}

// newFakeEnvB is newFakeEnv for a benchmark (the real clock).
func newFakeEnvB(b *testing.B) *fakeEnv {
	st, err := sqlite.Open(b.Context(), filepath.Join(b.TempDir(), "agentbox.db"))
	if err != nil {
		b.Fatal(err)
	}
	rt, err := fake.New(fake.Config{Name: "runc"})
	if err != nil {
		b.Fatal(err)
	}
	svc, err := sandbox.NewService(st, []runtime.Runtime{rt}, sandbox.Config{}, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		svc.Close()
		rt.Shutdown(context.Background())
		st.Close()
	})
	return &fakeEnv{svc: svc, pools: pools.New(svc.Core(), st), jobs: jobs.New(svc.Core(), st), snaps: snapshots.New(svc.Core(), st), st: st, rt: rt}
}

// A create right after a pool was set to a new shape, before the refill retired the old
// shape's sandboxes, never gets one of the old shape: it starts a sandbox of its own shape,
// and the old one it took is destroyed.
func TestPoolClaimNeverGivesAnOldShape(t *testing.T) {
	e := newFakeEnv(t, sandbox.Config{})
	e.setPool(t, sandbox.Pool{Name: "p", Size: 1})
	e.pools.Refill(t.Context())
	old, _ := e.svc.List(t.Context(), sandbox.ListFilter{Pool: "p", States: []sandbox.State{sandbox.StateRunning}})
	if len(old) != 1 {
		t.Fatalf("pool members: %+v", old)
	}
	e.setPool(t, sandbox.Pool{Name: "p", Size: 1, MemoryMB: 256}) // no refill pass yet
	sb, err := e.svc.Create(t.Context(), sandbox.CreateRequest{MemoryMB: 256})
	if err != nil {
		t.Fatal(err)
	}
	if sb.ID == old[0].ID || sb.MemoryMB != 256 || sb.FromPool {
		t.Fatalf("create of the new shape: %+v; want a started sandbox of 256 MB, not the old member %s", sb, old[0].ID)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := e.svc.Get(t.Context(), old[0].ID)
		if err == nil && got.State == sandbox.StateDestroyed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the old-shape member: %+v %v; want destroyed", got, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if p := e.pool(t, "p"); p.Hits != 0 || p.Misses != 1 {
		t.Fatalf("pool counts: %+v; want the create counted a miss", p)
	}
	if _, err := e.svc.Destroy(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
}

// TestPoolMaxPooled: serve --max-pooled bounds the pools' sizes together, within the live bound.
func TestPoolMaxPooled(t *testing.T) {
	e := newFakeEnv(t, sandbox.Config{MaxSandboxes: 10, MaxPooled: 3})
	if _, err := e.pools.SetPool(t.Context(), sandbox.Pool{Name: "p", Size: 4}); errcode.Of(err) != errcode.InvalidArgument || !strings.Contains(err.Error(), "between 0 and 3") {
		t.Fatalf("a pool over --max-pooled: %v", err)
	}
	e.setPool(t, sandbox.Pool{Name: "p", Size: 3})
	if cp, _ := e.svc.Capacity(t.Context()); cp.MaxPooled != 3 {
		t.Fatalf("capacity's max_pooled: %d; want 3", cp.MaxPooled)
	}
	big := newFakeEnv(t, sandbox.Config{MaxSandboxes: 4, MaxPooled: 50})
	if cp, _ := big.svc.Capacity(t.Context()); cp.MaxPooled != 4 {
		t.Fatalf("max_pooled above the live bound: %d; want the live bound 4", cp.MaxPooled)
	}
}
