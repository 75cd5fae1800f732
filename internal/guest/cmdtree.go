//go:build unix

package guest

import (
	"time"

	"golang.org/x/sys/unix"
)

// A command's tree, as a timeout, a cancel or the agent's end finds it to end it: the command's
// process group; with an exec tag, every process that carries it (daemons that left the group
// with setsid, orphans of a double fork); every process that descends from one of these, tag or
// not (a root command that dropped its tag with setgroups but still has its parent); and every
// process an earlier scan of the same end found (a child of one, orphaned since). Only processes
// started at or after the command are ever taken.
//
// Ending it freezes it first: every member is sent SIGSTOP, and /proc is scanned again until a
// scan finds every member stopped, so no member can fork, exit or hand its children to PID 1
// while the set is taken (a parent killed first would orphan its untagged children); then every
// member is SIGKILLed, and the whole is repeated until a scan finds nothing of it.
type cmdTree struct {
	pid  int // the main process, leader of the command's process group
	tree processTree
	self int
	// known are the members earlier scans found: pid → start time (a reused pid starts later).
	known map[int]uint64
}

const (
	// freezeWait bounds one freeze: how long a scan waits for the members it sent SIGSTOP to
	// show as stopped (a process in uninterruptible sleep stops only when it leaves it).
	freezeWait = 100 * time.Millisecond
	// freezePoll is the pause between the scans of a freeze.
	freezePoll = 200 * time.Microsecond
)

func newCmdTree(pid int, tree processTree) *cmdTree {
	return &cmdTree{pid: pid, tree: tree, self: unix.Getpid(), known: map[int]uint64{}}
}

// signal sends sig to the tree's process group and every member, and returns whether anything of
// the tree is alive.
func (c *cmdTree) signal(sig unix.Signal) bool {
	// The scan comes first: a signal may end a parent and orphan its children before a scan
	// after it could find them.
	ms, ok := c.members()
	err := unix.Kill(-c.pid, sig)
	if !ok {
		return err == nil
	}
	for p := range ms {
		_ = unix.Kill(p, sig)
	}
	return err == nil || len(ms) > 0
}

// alive reports whether anything of the tree is alive (and remembers the members it finds).
func (c *cmdTree) alive() bool {
	ms, ok := c.members()
	if !ok {
		return unix.Kill(-c.pid, 0) == nil
	}
	return len(ms) > 0
}

// end freezes and kills the tree until a scan finds nothing of it; it reports false if something
// of it is still alive at deadline.
func (c *cmdTree) end(deadline time.Time) bool {
	for {
		_ = unix.Kill(-c.pid, unix.SIGSTOP)
		ms, ok := c.freeze()
		if !ok {
			// No /proc: the process group is all there is to find.
			if unix.Kill(-c.pid, unix.SIGKILL) != nil {
				return true
			}
		} else {
			if len(ms) == 0 {
				return true
			}
			_ = unix.Kill(-c.pid, unix.SIGKILL)
			for p := range ms {
				_ = unix.Kill(p, unix.SIGKILL)
			}
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(time.Millisecond)
	}
}

// freeze sends SIGSTOP to every member and scans again until a scan finds every member stopped
// (or freezeWait passes), and returns the last scan's members.
func (c *cmdTree) freeze() (map[int]byte, bool) {
	sent := map[int]bool{}
	until := time.Now().Add(freezeWait)
	for {
		ms, ok := c.members()
		if !ok {
			return nil, false
		}
		frozen := true
		for p, state := range ms {
			if !sent[p] {
				_ = unix.Kill(p, unix.SIGSTOP)
				sent[p], frozen = true, false
			} else if state != 'T' && state != 't' {
				frozen = false
			}
		}
		if frozen || time.Now().After(until) {
			return ms, true
		}
		time.Sleep(freezePoll)
	}
}
