package sandbox_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/runtimetest"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/store/sqlite"
)

// rangeOf returns the id range sandbox id holds, failing the test if it holds none.
func (e *env) rangeOf(t *testing.T, id string) sandbox.IDRange {
	t.Helper()
	rs, err := e.svc.IDRanges(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		if r.SandboxID == id {
			return r
		}
	}
	t.Fatalf("sandbox %s holds no id range (ranges: %+v)", id, rs)
	return sandbox.IDRange{}
}

func (e *env) ranges(t *testing.T) []sandbox.IDRange {
	t.Helper()
	rs, err := e.svc.IDRanges(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

func hostUID(t *testing.T, path string) uint32 {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Uid
}

// TestUserNamespace: a sandbox's root is the first id of its own range on the host, commands
// run as the agent user (base+1000 outside), and what they write is the range's.
func TestUserNamespace(t *testing.T) {
	e := newEnv(t, sandbox.Config{})
	ctx := context.Background()
	a := e.create(t, sandbox.CreateRequest{})
	b := e.create(t, sandbox.CreateRequest{})
	ra, rb := e.rangeOf(t, a.ID), e.rangeOf(t, b.ID)
	if ra.Overlaps(rb) || ra.Count != sandbox.IDRangeSize || rb.Count != sandbox.IDRangeSize || ra.Base < sandbox.DefaultIDPoolBase || rb.Base < sandbox.DefaultIDPoolBase {
		t.Fatalf("ranges %+v and %+v: want two disjoint blocks of %d from %d", ra, rb, sandbox.IDRangeSize, sandbox.DefaultIDPoolBase)
	}

	if res := e.exec(t, a.ID, argv("id", "-u")); res.Stdout != "1000\n" {
		t.Errorf("id -u = %q, want 1000", res.Stdout)
	}
	if res := e.exec(t, a.ID, sandbox.ExecRequest{Argv: []string{"id", "-u"}, User: "root"}); res.Stdout != "0\n" {
		t.Errorf("id -u as root = %q, want 0", res.Stdout)
	}
	if _, err := e.svc.Exec(ctx, a.ID, sandbox.ExecRequest{Argv: []string{"true"}, User: "nobody"}, nil); errcode.Of(err) != errcode.InvalidArgument {
		t.Errorf("user nobody: %v, want INVALID_ARGUMENT", err)
	}
	res := e.exec(t, a.ID, argv("cat", "/proc/self/uid_map"))
	if f := strings.Fields(res.Stdout); len(f) != 3 || f[0] != "0" || f[1] != fmt.Sprint(ra.Base) || f[2] != "65536" {
		t.Errorf("uid_map %q, want 0 %d 65536", res.Stdout, ra.Base)
	}

	// On the host: the agent runs as the range's root, a command as its agent user; never 0.
	e.exec(t, a.ID, argv("sh", "-c", "sleep 1000 >/dev/null 2>&1 &"))
	procs := runtimetest.HostProcesses(t, a.ID)
	seen := map[uint64]bool{}
	for pid, uids := range procs {
		for _, u := range uids {
			if !ra.Contains(int64(u)) {
				t.Errorf("host process %d of %s runs as uid %d, outside %+v", pid, a.ID, u, ra)
			}
		}
		seen[uids[0]] = true
	}
	if !seen[uint64(ra.Base)] || !seen[uint64(ra.Base+1000)] {
		t.Errorf("host uids of %s's processes %v: want %d (agent) and %d (the sleep)", a.ID, procs, ra.Base, ra.Base+1000)
	}

	// Files written in the workspace, by a command or through the files API, are the agent
	// user's: base+1000 on the host.
	e.exec(t, a.ID, argv("sh", "-c", "echo x > /workspace/by-cmd"))
	if _, err := e.svc.WriteFile(ctx, a.ID, "by-api", 0o644, strings.NewReader("y")); err != nil {
		t.Fatal(err)
	}
	ws := filepath.Join(e.root, "sandboxes", a.ID, "disk", "workspace")
	for _, f := range []string{"", "by-cmd", "by-api"} {
		if uid := hostUID(t, filepath.Join(ws, f)); int64(uid) != ra.Base+1000 {
			t.Errorf("workspace/%s is host uid %d, want %d", f, uid, ra.Base+1000)
		}
	}

	// Destroy frees the range; the next create takes the lowest free one: a's again.
	if _, err := e.svc.Destroy(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	for _, r := range e.ranges(t) {
		if r.SandboxID == a.ID {
			t.Fatalf("destroyed %s still holds %+v", a.ID, r)
		}
	}
	c := e.create(t, sandbox.CreateRequest{})
	if rc := e.rangeOf(t, c.ID); rc.Base != ra.Base {
		t.Errorf("after destroy, a new sandbox got %+v; want the freed %d", rc, ra.Base)
	}
}

// TestConcurrentCreatesDisjointRanges: creates racing each other never share a range, and each
// sandbox runs on the range recorded for it.
func TestConcurrentCreatesDisjointRanges(t *testing.T) {
	e := newEnv(t, sandbox.Config{})
	ctx := context.Background()
	const n = 8
	ids := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			sb, err := e.svc.Create(ctx, sandbox.CreateRequest{CPU: 0.1, MemoryMB: 64})
			ids[i], errs[i] = sb.ID, err
		})
	}
	close(start)
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	rs := e.ranges(t)
	if len(rs) != n {
		t.Fatalf("%d ranges for %d sandboxes: %+v", len(rs), n, rs)
	}
	for i := range rs {
		for j := range i {
			if rs[i].Overlaps(rs[j]) {
				t.Errorf("%+v overlaps %+v", rs[i], rs[j])
			}
		}
	}
	for _, id := range ids {
		r := e.rangeOf(t, id)
		if res := e.exec(t, id, argv("cat", "/proc/self/uid_map")); strings.Fields(res.Stdout)[1] != fmt.Sprint(r.Base) {
			t.Errorf("%s runs on %q, recorded %+v", id, res.Stdout, r)
		}
	}
	for _, id := range ids {
		if _, err := e.svc.Destroy(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if rs := e.ranges(t); len(rs) != 0 {
		t.Fatalf("ranges left after every sandbox was destroyed: %+v", rs)
	}
}

// failingStart is a runtime whose Start fails, after Create made the container.
type failingStart struct{ runtime.Runtime }

func (failingStart) Start(context.Context, string) error {
	return errcode.New(errcode.RuntimeUnavailable, "start failed on purpose")
}

func TestFailedCreateFreesIDRange(t *testing.T) {
	e := newEnvWrapped(t, sandbox.Config{}, func(rt runtime.Runtime) runtime.Runtime { return failingStart{rt} })
	_, err := e.svc.Create(context.Background(), sandbox.CreateRequest{})
	if errcode.Of(err) != errcode.RuntimeUnavailable {
		t.Fatalf("create: %v", err)
	}
	if rs := e.ranges(t); len(rs) != 0 {
		t.Fatalf("a failed create left ranges: %+v", rs)
	}
	list, _ := e.svc.List(context.Background(), sandbox.ListFilter{States: []sandbox.State{sandbox.StateFailed}})
	if len(list) != 1 {
		t.Fatalf("failed records: %+v", list)
	}
}

// TestIDPoolExhausted: with every range held, a create is refused before any record is made, and
// succeeds once a destroy frees one.
func TestIDPoolExhausted(t *testing.T) {
	e := newEnv(t, sandbox.Config{IDPoolRanges: 1})
	ctx := context.Background()
	a := e.create(t, sandbox.CreateRequest{})
	_, err := e.svc.Create(ctx, sandbox.CreateRequest{})
	if errcode.Of(err) != errcode.CapacityUnavailable || !strings.Contains(errcode.Message(err), "id range") {
		t.Fatalf("create with the pool exhausted: %v", err)
	}
	if list, _ := e.svc.List(ctx, sandbox.ListFilter{}); len(list) != 1 {
		t.Fatalf("the refused create left a record: %+v", list)
	}
	base := e.rangeOf(t, a.ID).Base
	if _, err := e.svc.Destroy(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	b := e.create(t, sandbox.CreateRequest{})
	if r := e.rangeOf(t, b.ID); r.Base != base {
		t.Fatalf("range %+v, want the freed %d", r, base)
	}
}

// TestReconcileFreesIDRanges: ranges recorded for sandboxes that are gone or no longer live are
// freed at start; a sandbox that is adopted keeps its own.
func TestReconcileFreesIDRanges(t *testing.T) {
	e := newEnv(t, sandbox.Config{})
	ctx := context.Background()
	keep := e.create(t, sandbox.CreateRequest{})
	gone := e.create(t, sandbox.CreateRequest{})
	keepRange := e.rangeOf(t, keep.ID)
	e.killContainer(t, gone.ID)
	// A record that failed long ago but still holds a range (its release was lost).
	now := time.Now().UTC().Truncate(time.Millisecond)
	stale := sandbox.Sandbox{ID: sandbox.NewID(), State: sandbox.StateFailed, Image: "host", Runtime: "runc",
		CreatedAt: now, UpdatedAt: now, ExpiresAt: now.Add(time.Hour), Version: 1}
	if err := e.st.CreateSandbox(ctx, stale, sandbox.Event{SandboxID: stale.ID, To: sandbox.StateFailed}); err != nil {
		t.Fatal(err)
	}
	if err := e.st.AllocateIDRange(ctx, sandbox.IDRange{SandboxID: stale.ID, Base: 4000000000, Count: 65536, AllocatedAt: now}); err != nil {
		t.Fatal(err)
	}
	if err := e.svc.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	rs := e.ranges(t)
	if len(rs) != 1 || rs[0].SandboxID != keep.ID || rs[0].Base != keepRange.Base {
		t.Fatalf("ranges after reconcile: %+v, want only %s's %d", rs, keep.ID, keepRange.Base)
	}
	if sb, _ := e.svc.Get(ctx, gone.ID); sb.State != sandbox.StateLost {
		t.Fatalf("killed sandbox is %s", sb.State)
	}
	if r := e.exec(t, keep.ID, argv("id", "-u")); r.Stdout != "1000\n" {
		t.Fatalf("adopted sandbox: %+v", r)
	}
}

// listThen is a store whose sandbox list runs then once the list is read, before it is returned:
// a change made there is one the lister cannot have seen.
type listThen struct {
	*sqlite.Store
	then func()
}

func (l listThen) ListSandboxes(ctx context.Context, f sandbox.ListFilter) ([]sandbox.Sandbox, error) {
	list, err := l.Store.ListSandboxes(ctx, f)
	if l.then != nil {
		l.then()
	}
	return list, err
}

// TestReconcileActsOnTheRecordNotTheList: a sandbox whose container dies is recorded lost by its
// watch; when that lands between reconcile's list and its turn on the sandbox, reconcile still
// frees its id range (it acts on the record it reads under the lock, not on the listed copy).
func TestReconcileActsOnTheRecordNotTheList(t *testing.T) {
	var then atomic.Pointer[func()]
	e := newEnvWith(t, sandbox.Config{}, nil, func(st *sqlite.Store) sandbox.Store {
		return listThen{Store: st, then: func() {
			if f := then.Load(); f != nil {
				(*f)()
			}
		}}
	})
	ctx := context.Background()
	keep := e.create(t, sandbox.CreateRequest{})
	gone := e.create(t, sandbox.CreateRequest{})
	settle := func() { // the list holds gone as running; its watch now records it lost
		e.killContainer(t, gone.ID)
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
			if sb, _ := e.st.GetSandbox(ctx, gone.ID); sb.State == sandbox.StateLost {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the watch did not record %s lost in a minute", gone.ID)
			}
		}
	}
	then.Store(&settle)
	err := e.svc.Reconcile(ctx)
	then.Store(nil)
	if err != nil {
		t.Fatal(err)
	}
	if rs := e.ranges(t); len(rs) != 1 || rs[0].SandboxID != keep.ID {
		t.Fatalf("ranges after reconcile: %+v, want only %s's", rs, keep.ID)
	}
}

// refuseLost is a store that refuses the first three writes recording sandbox *id lost, as a
// full disk would.
type refuseLost struct {
	*sqlite.Store
	id      *atomic.Pointer[string]
	refused *atomic.Int32
}

func (r refuseLost) UpdateSandbox(ctx context.Context, sb sandbox.Sandbox, ev sandbox.Event) error {
	if id := r.id.Load(); id != nil && sb.ID == *id && sb.State == sandbox.StateLost && r.refused.Add(1) <= 3 {
		return errcode.New(errcode.ResourceExhausted, "the store's file system is full")
	}
	return r.Store.UpdateSandbox(ctx, sb, ev)
}

// TestWatchRetriesRecordingLost: a sandbox whose container dies while the store refuses writes
// is still recorded lost once the store takes them again; the watch does not give up after one
// refused write and leave a gone sandbox recorded running.
func TestWatchRetriesRecordingLost(t *testing.T) {
	var refused atomic.Int32
	var id atomic.Pointer[string]
	e := newEnvWith(t, sandbox.Config{}, nil, func(st *sqlite.Store) sandbox.Store {
		return refuseLost{Store: st, id: &id, refused: &refused}
	})
	sb := e.create(t, sandbox.CreateRequest{})
	id.Store(&sb.ID)
	e.killContainer(t, sb.ID)
	ctx := context.Background()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		got, err := e.st.GetSandbox(ctx, sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.State == sandbox.StateLost {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a minute after its container died, %s is %s (%d lost writes refused)", sb.ID, got.State, refused.Load())
		}
	}
	if n := refused.Load(); n < 4 {
		t.Fatalf("%d lost writes tried, want the 3 the store refused and the one it took", n)
	}
}
