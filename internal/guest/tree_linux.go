package guest

import (
	"bytes"
	"os"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"
)

// Exec tags. Every command an agent running as root starts carries, as a supplementary group, a
// tag that no other command in flight has. A process cannot drop a supplementary group without
// CAP_SETGID, which the sandbox's agent user does not have, so every process a command starts
// keeps its tag: daemons that leave the command's process group and session with setsid, and
// orphans that a double fork hands to PID 1, included. A timeout or a cancelled request kills
// the command's process group and then every process in the sandbox that carries its tag and
// started after it (so a tag used again never matches a daemon that an earlier command left
// running on purpose). Only root commands could drop the tag, by calling setgroups.
const (
	execTagBase  = 50000 // gids 50000-59999 inside the sandbox; its image has no group there
	execTagCount = 10000
	// clkTck is USER_HZ, the unit of /proc/<pid>/stat's starttime, on every Linux port.
	clkTck = 100
)

// execTags hands out exec tags round-robin, never one still in use.
type execTags struct {
	mu   sync.Mutex
	next uint32
	used map[uint32]bool
}

// acquire returns a free tag, or 0 when every tag is in use.
func (t *execTags) acquire() uint32 {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.used == nil {
		t.used = map[uint32]bool{}
	}
	for range execTagCount {
		tag := execTagBase + t.next
		t.next = (t.next + 1) % execTagCount
		if !t.used[tag] {
			t.used[tag] = true
			return tag
		}
	}
	return 0
}

func (t *execTags) release(tag uint32) {
	if tag == 0 {
		return
	}
	t.mu.Lock()
	delete(t.used, tag)
	t.mu.Unlock()
}

// bootTicks is the time since boot in starttime's unit, rounded down.
func bootTicks() uint64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return 0
	}
	return uint64(ts.Sec)*clkTck + uint64(ts.Nsec)/(1e9/clkTck)
}

// killTagged SIGKILLs every live process (but this one) that carries tag as a supplementary
// group, started at or after since and descends from this process, and returns how many it
// signalled. In a sandbox the agent is PID 1 and every process descends from it; elsewhere
// (tests) it is the child subreaper of its commands, so theirs still do, and an agent never
// touches another's processes.
func killTagged(tag uint32, since uint64) int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	self := os.Getpid()
	want := []byte(strconv.FormatUint(uint64(tag), 10))
	n := 0
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		if !hasGroup(pid, want) {
			continue
		}
		state, start, _, ok := procStat(pid)
		if !ok || state == 'Z' || state == 'X' || start < since || !descends(pid, self) {
			continue
		}
		if unix.Kill(pid, unix.SIGKILL) == nil {
			n++
		}
	}
	return n
}

// hasGroup reports whether the Groups line of /proc/<pid>/status lists gid.
func hasGroup(pid int, gid []byte) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return false
	}
	i := bytes.Index(b, []byte("\nGroups:"))
	if i < 0 {
		return false
	}
	line := b[i+len("\nGroups:"):]
	if j := bytes.IndexByte(line, '\n'); j >= 0 {
		line = line[:j]
	}
	for _, f := range bytes.Fields(line) {
		if bytes.Equal(f, gid) {
			return true
		}
	}
	return false
}

// descends reports whether pid is a descendant of ancestor.
func descends(pid, ancestor int) bool {
	if ancestor == 1 {
		return true
	}
	for range 4096 {
		_, _, ppid, ok := procStat(pid)
		switch {
		case !ok || ppid <= 1:
			return false
		case ppid == ancestor:
			return true
		}
		pid = ppid
	}
	return false
}

// procStat reads the state letter, start time (in clock ticks since boot) and parent of pid.
func procStat(pid int) (state byte, start uint64, ppid int, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, 0, false
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, 0, false
	}
	// After "pid (comm)": state is field 3, ppid field 4 and starttime field 22 of proc(5).
	f := bytes.Fields(b[i+1:])
	if len(f) < 20 || len(f[0]) != 1 {
		return 0, 0, 0, false
	}
	start, err1 := strconv.ParseUint(string(f[19]), 10, 64)
	ppid, err2 := strconv.Atoi(string(f[1]))
	return f[0][0], start, ppid, err1 == nil && err2 == nil
}

// procEntry is what a scan of the command's tree reads of a process's stat.
type procEntry struct {
	ppid, pgrp int
	state      byte
	start      uint64
}

// readProcEntry reads pid's state, parent, process group and start time.
func readProcEntry(pid int) (procEntry, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procEntry{}, false
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return procEntry{}, false
	}
	// After "pid (comm)": state, ppid and pgrp are fields 3-5, starttime field 22 of proc(5).
	f := bytes.Fields(b[i+1:])
	if len(f) < 20 || len(f[0]) != 1 {
		return procEntry{}, false
	}
	ppid, err1 := strconv.Atoi(string(f[1]))
	pgrp, err2 := strconv.Atoi(string(f[2]))
	start, err3 := strconv.ParseUint(string(f[19]), 10, 64)
	return procEntry{ppid: ppid, pgrp: pgrp, state: f[0][0], start: start}, err1 == nil && err2 == nil && err3 == nil
}

// members scans /proc for the live processes of the tree (see cmdTree), remembers them, and
// returns their states by pid; ok is false when /proc cannot be read.
func (c *cmdTree) members() (map[int]byte, bool) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, false
	}
	// Candidates: live processes (not this one) started at or after the command.
	procs := make(map[int]procEntry, len(ents))
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == c.self {
			continue
		}
		pe, ok := readProcEntry(pid)
		if !ok || pe.state == 'Z' || pe.state == 'X' || pe.start < c.tree.since {
			continue
		}
		procs[pid] = pe
	}
	var tag []byte
	if c.tree.tag != 0 {
		tag = []byte(strconv.FormatUint(uint64(c.tree.tag), 10))
	}
	decided := make(map[int]bool, 16)
	// member decides pid, and on its way every candidate between it and the first decided
	// ancestor: a process is a member if it is one by itself or its parent is a member.
	member := func(pid int) bool {
		var chain []int
		m := false
		for range 4096 {
			if d, ok := decided[pid]; ok {
				m = d
				break
			}
			pe, ok := procs[pid]
			if !ok {
				break // not a candidate (started before the command, this process, or gone)
			}
			chain = append(chain, pid)
			if start, ok := c.known[pid]; pid == c.pid || pe.pgrp == c.pid || ok && start == pe.start ||
				tag != nil && hasGroup(pid, tag) && descends(pid, c.self) {
				m = true
				break
			}
			pid = pe.ppid
		}
		// The chain descends from its end: all of it is a member, or none of it is.
		for _, p := range chain {
			decided[p] = m
		}
		return m
	}
	out := map[int]byte{}
	for pid, pe := range procs {
		if member(pid) {
			out[pid] = pe.state
			c.known[pid] = pe.start
		}
	}
	return out, true
}
