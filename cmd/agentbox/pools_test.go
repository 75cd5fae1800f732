package main

import (
	"context"
	"flag"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/store/sqlite"
	"github.com/agentbox/agentbox/internal/testenv"
	"github.com/agentbox/agentbox/internal/wire"
)

// TestServePoolFlag: serve's --pool is repeatable and refuses a bad value at parse time, naming
// the key.
func TestServePoolFlag(t *testing.T) {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	pools := registerPoolFlags(fs)
	if err := fs.Parse([]string{"--pool", "name=a,size=2", "--pool", "name=b,image=python:3.12,cpu=0.5,memory_mb=256,size=1", "--max-pooled", "7"}); err != nil {
		t.Fatal(err)
	}
	ps := pools.pools
	if len(ps) != 2 || ps[0].Name != "a" || ps[0].Size != 2 || ps[1].Image != "python:3.12" || ps[1].CPU != 0.5 || ps[1].MemoryMB != 256 || pools.maxPooled != 7 {
		t.Fatalf("pools: %+v", *pools)
	}
	for _, tc := range []struct{ v, want string }{
		{"name=a", "name and size are required"},
		{"name=a,size=two", "size must be a number"},
		{"name=a,size=1,memory=5", `unknown key "memory"`},
	} {
		fs := flag.NewFlagSet("serve", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		registerPoolFlags(fs)
		if err := fs.Parse([]string{"--pool", tc.v}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("--pool %q: %v; want %q", tc.v, err, tc.want)
		}
	}
}

// TestServePoolsSurviveSIGKILL: a real `agentbox serve` with a warm pool (--pool) is SIGKILLed
// once the pool is full; the server restarted on the same state dir adopts the pool's sandboxes
// (the same ones: no extra container, loop device or mount), a create claims one of them with
// the claimant's env, the pool refills, and once the pool is parked and the claimed sandbox
// destroyed nothing of the state dir is left on the host.
func TestServePoolsSurviveSIGKILL(t *testing.T) {
	testenv.RequireRoot(t)
	dir := testenv.ShortTempDir(t, "abpk")
	t.Cleanup(func() { removeCgroupParent("abtest-" + filepath.Base(dir)) })
	// runc explicitly: the test counts the pool's containers in runc's root.
	poolFlag := []string{"--runtime", "runc", "--pool", "name=warm,size=2,memory_mb=128,disk_mb=128"}
	srv := testenv.StartServer(t, dir, testToken, poolFlag...)
	c := srv.Client()
	waitPool(t, c, 2)

	// The pool's members, read from the store once the server is dead.
	srv.Kill()
	members := pooledIDs(t, dir)
	if len(members) != 2 {
		t.Fatalf("pool members after the kill: %v; want 2", members)
	}
	containers := runcContainers(t, dir)
	loops := loopsOf(dir)
	if !sameSet(containers, members) {
		t.Fatalf("containers after the kill %v, pool members %v", containers, members)
	}

	srv = testenv.StartServer(t, dir, testToken, poolFlag...)
	c = srv.Client()
	waitPool(t, c, 2)
	time.Sleep(1500 * time.Millisecond) // a refill pass or two: a leak would start a third
	if got := pooledIDs(t, dir); !sameSet(got, members) {
		t.Fatalf("pool members after the restart %v; want the adopted %v", got, members)
	}
	if got := runcContainers(t, dir); !sameSet(got, members) {
		t.Fatalf("containers after the restart %v; want only the adopted %v", got, members)
	}
	if got := loopsOf(dir); got != loops {
		t.Fatalf("loop devices of the state dir after the restart: %d; before: %d", got, loops)
	}
	l, err := c.ListPools(t.Context())
	if err != nil || len(l.Pools) != 1 || l.Pools[0].Ready != 2 || l.Pools[0].Starting != 0 {
		t.Fatalf("pools after the restart: %+v %v", l, err)
	}

	// A claim works and gets an adopted sandbox, with the claimant's env.
	sb, err := c.Create(t.Context(), wire.CreateRequest{MemoryMB: 128, DiskMB: 128, Env: map[string]string{"CLAIMANT": "after-kill"}})
	if err != nil {
		t.Fatal(err)
	}
	if !sb.FromPool || !slices.Contains(members, sb.ID) {
		t.Fatalf("create after the restart: %s from_pool=%v; want one of the adopted %v", sb.ID, sb.FromPool, members)
	}
	res, err := c.Exec(t.Context(), sb.ID, wire.ExecRequest{Command: []string{"sh", "-c", "echo $CLAIMANT"}}, nil)
	if err != nil || res.Stdout != "after-kill\n" {
		t.Fatalf("exec in the claimed sandbox: %+v %v", res, err)
	}
	waitPool(t, c, 2) // refilled

	// Park the pool, destroy the claimed sandbox: nothing of the state dir is left.
	if _, err := c.SetPool(t.Context(), wire.Pool{Name: "warm", MemoryMB: 128, DiskMB: 128, Size: 0}); err != nil {
		t.Fatal(err)
	}
	waitPool(t, c, 0)
	if _, err := c.Destroy(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	if got := runcContainers(t, dir); len(got) != 0 {
		t.Fatalf("containers left: %v", got)
	}
	if leaks := testenv.LeaksAfter(5*time.Second, append(members, dir+"/")...); len(leaks) > 0 {
		t.Fatalf("host leaks:\n%s", strings.Join(leaks, "\n"))
	}
}

// waitPool waits until pool "warm" holds ready sandboxes and none starting.
func waitPool(t *testing.T, c *client.Client, ready int) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		l, err := c.ListPools(t.Context())
		if err == nil && len(l.Pools) == 1 && l.Pools[0].Ready == ready && l.Pools[0].Starting == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool never held %d ready: %+v %v", ready, l, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// pooledIDs returns the ids of the running sandboxes pool "warm" holds, from the store.
func pooledIDs(t *testing.T, dir string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	st, err := sqlite.Open(ctx, filepath.Join(dir, "agentbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	list, err := st.ListSandboxes(ctx, sandbox.ListFilter{Pool: "warm", States: []sandbox.State{sandbox.StateCreating, sandbox.StateRunning}, Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, sb := range list {
		ids = append(ids, sb.ID)
	}
	return ids
}

// runcContainers lists the containers of the state dir's runc root.
func runcContainers(t *testing.T, dir string) []string {
	t.Helper()
	out, err := exec.Command("runc", "--root", filepath.Join(dir, "runtimes", "runc", "state"), "list", "-q").CombinedOutput()
	if err != nil && !os.IsNotExist(err) {
		t.Fatalf("runc list: %v: %s", err, out)
	}
	return strings.Fields(string(out))
}

// loopsOf counts the loop devices whose backing file is under dir.
func loopsOf(dir string) int {
	n := 0
	backing, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, p := range backing {
		if b, err := os.ReadFile(p); err == nil && strings.HasPrefix(string(b), dir+"/") {
			n++
		}
	}
	return n
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}
