package guest

import (
	"bytes"
	"os"
	"strconv"
	"time"
)

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's times: 100 on every Linux ABI (and in
// gVisor's /proc).
const clockTicks = 100

// jobCPU sums the CPU time (utime, stime, and cutime, cstime: the children they waited for) of
// the live processes of a job whose main process is pid: its process group, and with a tag the
// processes carrying it (started at or after since, descending from this process), as a cancel
// finds them. ok is false when /proc cannot be read.
func jobCPU(pid int, tag uint32, since uint64) (time.Duration, bool) {
	d, ok := jobsCPU([]cpuTree{{pid: pid, tree: processTree{tag: tag, since: since}}})
	if !ok {
		return 0, false
	}
	return d[0], true
}

// cpuTree is one job's processes as jobCPU finds them: its process group pid and its tree.
type cpuTree struct {
	pid  int
	tree processTree
}

// jobsCPU is jobCPU of several jobs in one pass over /proc: a list of jobs reads each process's
// stat once (and its status once, only when a job has a tag), not once per job.
func jobsCPU(jobs []cpuTree) ([]time.Duration, bool) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, false
	}
	self := os.Getpid()
	byGroup := make(map[int]int, len(jobs))
	byTag := map[string]int{}
	for i, j := range jobs {
		byGroup[j.pid] = i
		if j.tree.tag != 0 {
			byTag[strconv.FormatUint(uint64(j.tree.tag), 10)] = i
		}
	}
	ticks := make([]uint64, len(jobs))
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil || p == self {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		// After "pid (comm)": pgrp is field 5, utime..cstime 14–17, starttime 22 of proc(5).
		f := bytes.Fields(b[i+1:])
		if len(f) < 20 {
			continue
		}
		pgrp, _ := strconv.Atoi(string(f[2]))
		k, ok := byGroup[pgrp]
		if !ok {
			if len(byTag) == 0 {
				continue
			}
			if k, ok = taggedJob(p, byTag); !ok {
				continue
			}
			start, err := strconv.ParseUint(string(f[19]), 10, 64)
			if err != nil || start < jobs[k].tree.since || !descends(p, self) {
				continue
			}
		}
		for _, x := range f[11:15] {
			n, _ := strconv.ParseUint(string(x), 10, 64)
			ticks[k] += n
		}
	}
	out := make([]time.Duration, len(jobs))
	for k, t := range ticks {
		out[k] = time.Duration(t) * time.Second / clockTicks
	}
	return out, true
}

// taggedJob returns the job (of byTag, by exec tag) whose tag pid carries, if any.
func taggedJob(pid int, byTag map[string]int) (int, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, false
	}
	i := bytes.Index(b, []byte("\nGroups:"))
	if i < 0 {
		return 0, false
	}
	line := b[i+len("\nGroups:"):]
	if j := bytes.IndexByte(line, '\n'); j >= 0 {
		line = line[:j]
	}
	for _, g := range bytes.Fields(line) {
		if k, ok := byTag[string(g)]; ok {
			return k, true
		}
	}
	return 0, false
}
