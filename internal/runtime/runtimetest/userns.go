package runtimetest

import (
	"bufio"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/guest"
	"github.com/agentbox/agentbox/internal/runtime"
)

// TestIDMap returns a range of 65536 host ids for a test sandbox: a random 65536-aligned base in
// [2^31, 2^32-2^16), above anything a server's pool hands out by default, so tests running at
// the same time (and servers on the host) practically never share ids.
func TestIDMap() runtime.IDMap {
	var b [4]byte
	_, _ = rand.Read(b[:])
	slot := binary.LittleEndian.Uint32(b[:]) % (1<<15 - 1) // 2^31 + slot*2^16 stays below 2^32-2^16
	base := uint32(1<<31) + slot<<16
	return runtime.IDMap{UIDBase: base, GIDBase: base, Count: 1 << 16}
}

// HostProcesses returns the host pids of every process whose cgroup path names sandbox id, with
// their real, effective, saved and file-system uids.
func HostProcesses(t testing.TB, id string) map[int][4]uint64 {
	t.Helper()
	out := map[int][4]uint64{}
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		cg, err := os.ReadFile(p + "/cgroup")
		if err != nil || !strings.Contains(string(cg), "/"+id) {
			continue
		}
		f, err := os.Open(p + "/status")
		if err != nil {
			continue
		}
		var uids [4]uint64
		found := false
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "Uid:"); ok {
				for i, s := range strings.Fields(v) {
					if i < 4 {
						uids[i], _ = strconv.ParseUint(s, 10, 64)
					}
				}
				found = true
			}
		}
		f.Close()
		if pid, err := strconv.Atoi(filepath.Base(p)); err == nil && found {
			out[pid] = uids
		}
	}
	return out
}

// testUserNamespace: with an id range, the sandbox's root is the range's first id on the host,
// commands run as the agent user (1000 inside, base+1000 outside), root on request, and the
// agent user writes only its workspace, home and /tmp.
func testUserNamespace(t *testing.T, rt runtime.Runtime) {
	id := NewID()
	spec := DefaultSpec(id)
	m := TestIDMap()
	spec.IDMap = m
	c := Start(t, rt, spec)

	if res := Exec(t, c, "id", "-u"); res.Stdout != "1000\n" {
		t.Errorf("id -u = %q, want 1000 (the agent user): %+v", res.Stdout, res)
	}
	if res := ExecRequest(t, c, guest.ExecRequest{Argv: []string{"sh", "-c", "id -u; echo $HOME"}, User: "root", TimeoutMs: 60000}); res.Stdout != "0\n/root\n" {
		t.Errorf("as root: %+v", res)
	}
	if res := Exec(t, c, "sh", "-c", "echo $HOME $USER"); res.Stdout != "/home/agent agent\n" {
		t.Errorf("HOME USER = %q", res.Stdout)
	}
	for _, f := range []string{"uid_map", "gid_map"} {
		res := Exec(t, c, "cat", "/proc/self/"+f)
		if got := strings.Fields(res.Stdout); len(got) != 3 || got[0] != "0" || got[1] != fmt.Sprint(m.UIDBase) || got[2] != fmt.Sprint(m.Count) {
			t.Errorf("/proc/self/%s = %q, want 0 %d %d", f, res.Stdout, m.UIDBase, m.Count)
		}
	}

	// On the host every process of the sandbox, the agent and a command alike, runs as an id
	// of the range: never 0.
	res := Exec(t, c, "sh", "-c", "sleep 1000 >/dev/null 2>&1 & echo started")
	if res.Stdout != "started\n" {
		t.Fatalf("background sleep: %+v", res)
	}
	procs := HostProcesses(t, id)
	inRange := func(u uint64) bool { return u >= uint64(m.UIDBase) && u < uint64(m.UIDBase)+uint64(m.Count) }
	var root, agent int
	for pid, uids := range procs {
		for _, u := range uids {
			if !inRange(u) {
				t.Errorf("host process %d of the sandbox has uid %d, outside its range [%d, %d)", pid, u, m.UIDBase, uint64(m.UIDBase)+uint64(m.Count))
			}
		}
		switch uids[0] {
		case uint64(m.UIDBase):
			root++
		case uint64(m.UIDBase) + 1000:
			agent++
		}
	}
	if root == 0 || agent == 0 {
		t.Errorf("host processes of the sandbox %v: want the agent as uid %d and the sleep as %d", procs, m.UIDBase, m.UIDBase+1000)
	}

	// The agent user writes its workspace, home and /tmp, and nothing else.
	res = Exec(t, c, "sh", "-c", `for p in /workspace /home/agent /tmp; do touch $p/w && echo ok $p; done`)
	if res.Stdout != "ok /workspace\nok /home/agent\nok /tmp\n" {
		t.Errorf("agent writes: %+v", res)
	}
	for _, p := range []string{"/x", "/etc/x", "/usr/x", "/root/x", "/home/x", "/.agentbox/run/x", "/proc/sys/kernel/x", "/dev/shm/../x"} {
		if res := Exec(t, c, "sh", "-c", "touch "+p); res.ExitCode == 0 {
			t.Errorf("the agent user could create %s", p)
		}
	}
	// Root, on request (a package install, say), writes its home; the agent user cannot look in.
	res = ExecRequest(t, c, guest.ExecRequest{Argv: []string{"sh", "-c", "mkdir -p /root/.cache/pkg && echo cfg > /root/.pkgrc && stat -c '%u %a' /root"}, User: "root", TimeoutMs: 60000})
	if res.ExitCode != 0 || res.Stdout != "0 700\n" {
		t.Errorf("root writing /root: %+v", res)
	}
	if res := Exec(t, c, "ls", "/root"); res.ExitCode == 0 {
		t.Errorf("the agent user can list /root: %+v", res)
	}
}
