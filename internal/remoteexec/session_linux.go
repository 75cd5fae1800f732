package remoteexec

import (
	"os"
	"strconv"
	"strings"
	"syscall"
)

// killSession SIGKILLs every process whose session is sid (/proc/PID/stat's sixth field): a
// child that moved to a process group of its own is still in the session.
func killSession(sid int) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp session …; comm may hold spaces and parentheses.
		i := strings.LastIndexByte(string(b), ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) >= 4 {
			if s, err := strconv.Atoi(f[3]); err == nil && s == sid {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
}
