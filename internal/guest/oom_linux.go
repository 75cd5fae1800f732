package guest

import (
	"bytes"
	"net/http"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// The OOM guard. Under gVisor the sandbox's memory (all of it in the sentry) hits the host
// cgroup's limit as a whole, and the host kills the sentry, so the sandbox would be lost with the
// runaway command. The host watches the cgroup and, when usage reaches memory_mb (the cgroup's
// limit is higher by a slack), asks the agent to do what Linux's OOM killer does inside a runc
// sandbox: kill the command holding the most memory. A command is every process of its exec tag (its forks and daemons included: a fork
// bomb is one command); a process without a tag is a command of its own.

// oomVictim is one command's processes.
type oomVictim struct {
	tag     uint32 // 0: one untagged process
	pids    []int
	rss     int64
	top     int64
	command string
}

// pickOOMVictim groups the processes of the sandbox (but this one) by exec tag and returns the
// group with the most resident memory. Only this process's descendants count: in a sandbox
// (the agent is PID 1) that is every process; elsewhere (tests) never another's.
func pickOOMVictim() (oomVictim, bool) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return oomVictim{}, false
	}
	self := os.Getpid()
	page := int64(os.Getpagesize())
	groups := map[int64]*oomVictim{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self || !descends(pid, self) {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/status")
		if err != nil {
			continue
		}
		key, tag := -int64(pid), uint32(0) // untagged: a command of its own
		if t, ok := execTagOf(b); ok {
			key, tag = int64(t), t
		}
		rss := statusKB(b, "VmRSS:") << 10
		if rss == 0 {
			if sb, err := os.ReadFile("/proc/" + e.Name() + "/statm"); err == nil {
				if f := bytes.Fields(sb); len(f) > 1 {
					n, _ := strconv.ParseInt(string(f[1]), 10, 64)
					rss = n * page
				}
			}
		}
		g := groups[key]
		if g == nil {
			g = &oomVictim{tag: tag}
			groups[key] = g
		}
		g.pids = append(g.pids, pid)
		g.rss += rss
		if rss >= g.top {
			g.top = rss
			g.command = statusField(b, "Name:")
		}
	}
	var best *oomVictim
	for _, g := range groups {
		if best == nil || g.rss > best.rss || (g.rss == best.rss && len(g.pids) > len(best.pids)) {
			best = g
		}
	}
	if best == nil {
		return oomVictim{}, false
	}
	return *best, true
}

// execTagOf returns the exec tag among the Groups of a /proc/<pid>/status.
func execTagOf(status []byte) (uint32, bool) {
	for _, f := range bytes.Fields([]byte(statusField(status, "Groups:"))) {
		gid, err := strconv.ParseUint(string(f), 10, 32)
		if err == nil && gid >= execTagBase && gid < execTagBase+execTagCount {
			return uint32(gid), true
		}
	}
	return 0, false
}

// statusField is the value of a "Key:" line of /proc/<pid>/status, trimmed.
func statusField(status []byte, key string) string {
	i := bytes.Index(status, []byte("\n"+key))
	if i < 0 {
		if !bytes.HasPrefix(status, []byte(key)) {
			return ""
		}
		i = -1
	}
	line := status[i+1+len(key):]
	if j := bytes.IndexByte(line, '\n'); j >= 0 {
		line = line[:j]
	}
	return string(bytes.TrimSpace(line))
}

// statusKB is a "Key: N kB" line of /proc/<pid>/status, in KiB.
func statusKB(status []byte, key string) int64 {
	f := bytes.Fields([]byte(statusField(status, key)))
	if len(f) == 0 {
		return 0
	}
	n, _ := strconv.ParseInt(string(f[0]), 10, 64)
	return n
}

// oomKill kills the command holding the most memory.
func (s *server) oomKill() OOMKillResult {
	v, ok := pickOOMVictim()
	if !ok {
		return OOMKillResult{}
	}
	res := OOMKillResult{RSSBytes: v.rss, Command: v.command}
	if v.tag != 0 {
		s.oomKilled.Store(v.tag, true)
	} else {
		s.oomKilled.Store(v.pids[0], true) // an untagged command is one process
	}
	for _, pid := range v.pids {
		if unix.Kill(pid, unix.SIGKILL) == nil {
			res.Killed++
		}
	}
	// A fork bomb forks on while it is killed: its tag finds the new ones.
	for i := 0; v.tag != 0 && i < 8; i++ {
		if killTagged(v.tag, 0) == 0 {
			break
		}
	}
	s.log.Warn("guest: out of memory: killed the command holding the most", "command", v.command, "processes", res.Killed, "rss_bytes", v.rss)
	return res
}

// oomKills is the kernel's count of OOM kills among the sandbox's commands, or -1 where it
// cannot be read: the sandbox's memory cgroup's (v1 memory.oom_control, read-only in runc and
// crun sandboxes), else that of the commands' own cgroup (v2 memory.events: a VM's, whose
// count includes its kernel's OOM kills at the end of its RAM).
func (s *server) oomKills() int64 {
	if n := cgroupCount("/sys/fs/cgroup/memory/memory.oom_control", "oom_kill "); n >= 0 || s.commandCgroup == "" {
		return n
	}
	return cgroupCount(filepath.Join(s.commandCgroup, "memory.events"), "oom_kill ")
}

// cgroupCount reads the count key (with its trailing space) of a cgroup's flat-keyed file, or -1.
func cgroupCount(path, key string) int64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return -1
	}
	f := bytes.Fields([]byte(statusField(append([]byte("\n"), b...), key)))
	if len(f) == 0 {
		return -1
	}
	n, err := strconv.ParseInt(string(f[0]), 10, 64)
	if err != nil {
		return -1
	}
	return n
}

func (s *server) handleOOMKill(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, s.oomKill())
}
