package security

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/store/sqlite"
	"github.com/agentbox/agentbox/internal/testenv"
	"github.com/agentbox/agentbox/internal/wire"
)

// attack is one thing sandboxed code tries, run on every runtime.
type attack struct {
	name string
	// does is what the sandboxed code (or, for the few host-side attacks, the attacker) does.
	does string
	// want is what must be observed, on the host wherever harm would show there.
	want string
	// gvisor says how the expectation differs under gVisor, and why that is the truth and
	// harmless; "" when it is the same.
	gvisor string
	// create is the arena's sandbox; noSandbox attacks make their own.
	create    wire.CreateRequest
	noSandbox bool
	// serial attacks measure time: they run alone, before the others.
	serial bool
	run    func(a *arena)
}

// knownHoles are attacks that succeed today, by attack/runtime, with what happens. Each is
// reported as a skip naming the hole, never as a pass; remove the entry with the fix.
var knownHoles = map[string]string{}

func allAttacks() []attack {
	var all []attack
	for _, group := range [][]attack{secretAttacks(), pathAttacks(), fsAttacks(), privAttacks(), netAttacks(), resourceAttacks(), lifecycleAttacks(), impostorAttacks(), egressAttacks()} {
		all = append(all, group...)
	}
	return all
}

func TestAttackTable(t *testing.T) {
	seen := map[string]bool{}
	all := allAttacks()
	for _, a := range all {
		if a.name == "" || a.does == "" || a.want == "" || a.run == nil {
			t.Errorf("attack %q lacks a name, what it does, what must be observed or a run", a.name)
		}
		if seen[a.name] {
			t.Errorf("attack %q twice", a.name)
		}
		seen[a.name] = true
	}
	if len(all) < 30 {
		t.Errorf("%d attacks; the suite needs at least 30", len(all))
	}
}

// TestAttacks runs every attack on runc, crun and gVisor against one real `agentbox serve`, then
// checks that the host holds nothing of any sandbox.
func TestAttacks(t *testing.T) {
	s := newServerFixture(t)
	s.start()
	start := time.Now()
	defer func() {
		// Always, even when -run picked a few attacks: the suite leaves the host as it found it.
		s.assertHostClean(t)
	}()
	defer func() {
		if t.Failed() {
			t.Logf("server log (last 16 KiB):\n%s", tail(s.logs.String(), 16<<10))
		}
	}()
	all := allAttacks()
	arenas := attackArenas(t, s)
	devNullAtStart := hostDevNull(t)
	if !strings.HasSuffix(devNullAtStart, "mode=20666 rdev=1:3 owner=0:0") {
		t.Fatalf("the host's /dev/null is %s before the suite (restore it: rm /dev/null; mknod -m 666 /dev/null c 1 3)", devNullAtStart)
	}
	runOne := func(t *testing.T, atk attack, ar arenaKind) {
		rt := ar.rt
		if why, ok := knownHoles[atk.name+"/"+ar.name]; ok {
			t.Skipf("KNOWN HOLE, not fixed (it stays a known hole until it is): %s", why)
		}
		t.Logf("does: %s", atk.does)
		t.Logf("want: %s", atk.want)
		if rt == "gvisor" && atk.gvisor != "" {
			t.Logf("gvisor: %s", atk.gvisor)
		}
		a := &arena{t: t, s: s, rt: rt, image: ar.image}
		if !atk.noSandbox {
			a.sb = a.newSandbox(atk.create)
			a.id = a.sb.ID
		}
		atk.run(a)
		// After every attack (whichever attack running beside it did it): the host's /dev/null
		// is still the host's.
		if got := hostDevNull(t); got != devNullAtStart {
			t.Errorf("the host's /dev/null is %s, was %s at the suite's start", got, devNullAtStart)
		}
	}
	t.Run("serial", func(t *testing.T) {
		for _, atk := range all {
			if !atk.serial {
				continue
			}
			for _, ar := range arenas {
				t.Run(atk.name+"/"+ar.name, func(t *testing.T) { runOne(t, atk, ar) })
			}
		}
	})
	t.Run("parallel", func(t *testing.T) {
		for _, atk := range all {
			if atk.serial {
				continue
			}
			for _, ar := range arenas {
				t.Run(atk.name+"/"+ar.name, func(t *testing.T) {
					t.Parallel()
					runOne(t, atk, ar)
				})
			}
		}
	})
	t.Logf("attacks took %s; the server's peak RSS was %s", time.Since(start).Round(time.Millisecond), statusField(s.pid(), "VmHWM"))
}

// assertHostClean destroys whatever is left, stops the server and checks that the host holds
// no process, cgroup, mount, loop device, uid range or sandbox dir of the suite.
func (s *server) assertHostClean(t *testing.T) {
	ctx := context.Background()
	if s.running() {
		left, err := s.c.List(ctx, []string{"creating", "running", "stopping", "failed", "lost"}, nil)
		if err != nil {
			t.Errorf("list: %v", err)
		}
		for _, sb := range left {
			t.Errorf("sandbox %s (%s) outlived its attack", sb.ID, sb.State)
			s.c.Destroy(ctx, sb.ID)
		}
		s.stop()
	}
	ids := s.allIDs()
	// Containers the OCI runtimes still know.
	for rt, bin := range map[string]string{"runc": "runc", "crun": "crun", "gvisor": "runsc"} {
		root := filepath.Join(s.stateDir, "runtimes", rt, "state")
		if _, err := os.Stat(root); err != nil {
			continue
		}
		quiet := "-q"
		if rt == "gvisor" {
			quiet = "-quiet"
		}
		out, err := exec.Command(bin, "--root", root, "list", quiet).CombinedOutput()
		if err != nil {
			t.Errorf("%s list: %v %s", bin, err, out)
		} else if strings.TrimSpace(string(out)) != "" {
			t.Errorf("%s still has containers: %s", bin, out)
		}
	}
	// Sandbox dirs.
	if d, _ := filepath.Glob(filepath.Join(s.stateDir, "runtimes", "*", "sandboxes", "*")); len(d) > 0 {
		t.Errorf("sandbox dirs left: %v", d)
	}
	// Mounts, loop devices (backing files under the state dir), cgroups and processes.
	needles := append([]string{s.stateDir}, ids...)
	if leaks := testenv.Leaks(needles...); len(leaks) > 0 {
		t.Errorf("host leaks:\n%s", strings.Join(leaks, "\n"))
	}
	backing, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, p := range backing {
		if b, err := os.ReadFile(p); err == nil && strings.HasPrefix(string(b), s.stateDir) {
			t.Errorf("loop device %s still backs %s", p, strings.TrimSpace(string(b)))
		}
	}
	if pids := pidsWhere(func(_ int, cg, cmd string) bool {
		return strings.Contains(cg, "/"+s.parent) || strings.Contains(cmd, s.stateDir)
	}); len(pids) > 0 {
		t.Errorf("processes of the suite left: %v", pids)
	}
	// Every sandbox cgroup under the parents is gone; the parents themselves are removed here.
	parents, _ := filepath.Glob("/sys/fs/cgroup/*/" + s.parent + "*")
	sort.Sort(sort.Reverse(sort.StringSlice(parents)))
	for _, p := range parents {
		ents, _ := os.ReadDir(p)
		for _, e := range ents {
			if e.IsDir() {
				t.Errorf("cgroup left: %s/%s", p, e.Name())
			}
		}
		os.Remove(p)
	}
	// Uid ranges: none recorded, and no host process runs as an id of the pool.
	st, err := sqlite.Open(ctx, filepath.Join(s.stateDir, "agentbox.db"))
	if err != nil {
		t.Errorf("open the store: %v", err)
	} else {
		rs, err := st.ListIDRanges(ctx)
		if err != nil || len(rs) > 0 {
			t.Errorf("uid ranges still allocated: %+v %v", rs, err)
		}
		st.Close()
	}
	lo, hi := s.poolBase, s.poolBase+200*sandbox.IDRangeSize
	if pids := pidsWhere(func(pid int, _, _ string) bool {
		for _, f := range strings.Fields(statusField(pid, "Uid")) {
			if u, _ := strconv.ParseInt(f, 10, 64); u >= lo && u < hi {
				return true
			}
		}
		return false
	}); len(pids) > 0 {
		t.Errorf("host processes still run as uids of the sandboxes' pool: %v", pids)
	}
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}
