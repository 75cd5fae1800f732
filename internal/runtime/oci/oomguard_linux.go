package oci

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/guest"
)

// The OOM guard of gVisor sandboxes. A gVisor sandbox's memory is its sentry's, so when the
// sandbox reaches its memory cgroup's limit the host kills the sentry (or the sentry, refused
// memory, exits) and the sandbox is lost with the command that ran away. runc sandboxes do not
// have this problem: Linux's OOM killer picks a process inside. So a gVisor sandbox's cgroup
// limit is memory_mb plus a slack, and the host registers a threshold at memory_mb (cgroup v1
// cgroup.event_control: an eventfd the kernel signals when usage crosses it, no polling). When
// it fires the host asks the agent to kill the command holding the most memory
// (guest.Client.OOMKill), as the kernel would. While usage stays above memory_mb the guard
// watches it every oomPoll and kills again if it keeps growing. The slack is room for the
// guard's reaction; the cgroup's limit, memory_mb plus the slack, stays the host's hard bound.
// A fork bomb grows the sentry too fast for any guard (a forked process costs gVisor several
// MiB), so gVisor's process bound also depends on memory_mb (gvisorProcesses).

const (
	oomGuardHardening = "gvisor:oom-guard(kill-largest-command-at-memory_mb)"
	// oomSlack*: the slack is memory_mb, within these bounds (MiB). A runaway command under
	// gVisor allocates up to ~2 GB/s here, and on a loaded host (the attack suite: fork bombs
	// and CPU spinners on 2 cores) the guard was seen to act 100-200 ms after the threshold.
	oomSlackMinMB = 512
	oomSlackMaxMB = 2048
	oomPoll       = 20 * time.Millisecond
	oomKillWait   = 5 * time.Second
	// oomRegrowth is how much usage may grow after a kill before the guard kills again.
	oomRegrowth = 8 << 20
	// oomThresholdFile holds the threshold, in the sandbox's dir, for a guard started after a
	// restart.
	oomThresholdFile = "oom-threshold"
)

// oomSlackMB is the room above a memory limit of memoryMB (0: none) for the guard to act in.
func oomSlackMB(memoryMB int64) int64 {
	if memoryMB <= 0 {
		return 0
	}
	return min(max(memoryMB, oomSlackMinMB), oomSlackMaxMB)
}

// prepareOOMGuard raises a created gVisor sandbox's memory cgroup limit from memoryMB to
// memoryMB plus the slack and records the threshold for guardMemory. runsc has sized the
// sandbox's kernel from the spec's limit by then, so the sandbox still sees memoryMB.
func (r *Runtime) prepareOOMGuard(id string, memoryMB int64) error {
	if r.flavor != FlavorGVisor || r.memoryCgroup == "" || memoryMB <= 0 {
		return nil
	}
	dir := filepath.Join(r.memoryCgroup, cgroupPath(r.cgroupParent, id))
	limit := strconv.FormatInt((memoryMB+oomSlackMB(memoryMB))<<20, 10)
	// memory+swap may not be below memory: raise it first (where the host has it).
	for _, f := range []string{"memory.memsw.limit_in_bytes", "memory.limit_in_bytes"} {
		err := os.WriteFile(filepath.Join(dir, f), []byte(limit), 0)
		if err != nil && !(f == "memory.memsw.limit_in_bytes" && errors.Is(err, fs.ErrNotExist)) {
			return fmt.Errorf("raise %s: %w", f, err)
		}
	}
	return os.WriteFile(filepath.Join(r.sandboxDir(id), oomThresholdFile), []byte(strconv.FormatInt(memoryMB<<20, 10)), 0o600)
}

// oomGuard watches one sandbox's memory cgroup.
type oomGuard struct {
	ev    *os.File // the eventfd the kernel signals
	usage *os.File // memory.usage_in_bytes
}

func (g *oomGuard) close() {
	g.ev.Close()
	g.usage.Close()
}

// guardMemory starts the OOM guard of a gVisor sandbox, unless it runs already or cannot run
// (another flavour, no cgroup v1 memory hierarchy, no limit).
func (r *Runtime) guardMemory(id string) {
	if r.flavor != FlavorGVisor || r.memoryCgroup == "" {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.guards[id] != nil {
		return
	}
	threshold, err := readInt64(filepath.Join(r.sandboxDir(id), oomThresholdFile))
	if err != nil {
		return // no memory limit, or not a sandbox of this server's making
	}
	g, err := newOOMGuard(filepath.Join(r.memoryCgroup, cgroupPath(r.cgroupParent, id)), threshold)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			r.log.Warn("no OOM guard for the sandbox: a command that runs out of memory takes the sandbox down", "sandbox_id", id, "err", err)
		}
		return
	}
	if r.guards == nil {
		r.guards = map[string]*oomGuard{}
	}
	r.guards[id] = g
	go r.runOOMGuard(id, g, threshold)
}

// unguardMemory stops a sandbox's OOM guard.
func (r *Runtime) unguardMemory(id string) {
	r.mu.Lock()
	g := r.guards[id]
	delete(r.guards, id)
	r.mu.Unlock()
	if g != nil {
		g.close()
	}
}

// newOOMGuard registers a threshold on the memory cgroup at dir.
func newOOMGuard(dir string, threshold int64) (*oomGuard, error) {
	usage, err := os.Open(filepath.Join(dir, "memory.usage_in_bytes"))
	if err != nil {
		return nil, err
	}
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		usage.Close()
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	g := &oomGuard{ev: os.NewFile(uintptr(efd), "oom-guard"), usage: usage}
	line := fmt.Sprintf("%d %d %d", efd, usage.Fd(), threshold)
	if err := os.WriteFile(filepath.Join(dir, "cgroup.event_control"), []byte(line), 0); err != nil {
		g.close()
		return nil, fmt.Errorf("register a memory threshold: %w", err)
	}
	return g, nil
}

// runOOMGuard waits for the threshold until the guard is closed or the cgroup goes.
func (r *Runtime) runOOMGuard(id string, g *oomGuard, threshold int64) {
	defer func() {
		// Gone with its cgroup (or closed by unguardMemory): forget it, close its files.
		r.mu.Lock()
		if r.guards[id] == g {
			delete(r.guards, id)
		}
		r.mu.Unlock()
		g.close()
	}()
	var buf [8]byte
	for {
		if _, err := g.ev.Read(buf[:]); err != nil {
			return // closed
		}
		used, err := g.read()
		if err != nil {
			return // the cgroup is gone (its removal signals the eventfd too)
		}
		var rg regrowth
		for used >= threshold {
			// First, on the host and at once, whatever the agent's latency: should usage
			// reach the cgroup's limit before the agent has killed, the host's OOM killer
			// takes an application's address space, never the sentry or the gofer.
			r.stubsFirst(id)
			if rg.due(used) {
				r.oomKill(id, used, threshold)
				// What the sandbox holds once the kill is done is the new baseline: memory
				// the runaway took while the agent was slow to answer (a loaded host) is not
				// growth after the kill, and gVisor gives a dead command's memory back to the
				// host only lazily, so usage stays up for a while after it.
				if used, err = g.read(); err != nil {
					return
				}
				rg.killed(used)
			}
			time.Sleep(oomPoll)
			if used, err = g.read(); err != nil {
				return
			}
		}
	}
}

// stubsFirst makes the host processes of a gVisor sandbox that hold its applications' address
// spaces (systrap's stub processes: the sentry's descendants) the host OOM killer's first choice
// in the sandbox's memory cgroup (oom_score_adj 1000), and leaves the sentry and the gofer as
// they are. At the cgroup's limit the kernel then kills the stub with the most resident memory
// — the runaway's — and the sentry kills the command that ran in it; were the sentry the
// kernel's choice instead (its own memory can outweigh a stub's), the whole sandbox would be
// lost. Stubs are made as the sandbox's processes come and go, so the guard marks them again
// while usage stays above the threshold.
func (r *Runtime) stubsFirst(id string) {
	sentry := readPid(filepath.Join(r.sandboxDir(id), "init.pid"))
	if sentry <= 0 {
		return
	}
	b, err := os.ReadFile(filepath.Join(r.memoryCgroup, cgroupPath(r.cgroupParent, id), "cgroup.procs"))
	if err != nil {
		return
	}
	parent := map[int]int{}
	for _, f := range strings.Fields(string(b)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			continue
		}
		if _, pp, ok := procState(pid); ok {
			parent[pid] = pp
		}
	}
	for pid := range parent {
		if descends(pid, sentry, parent) {
			_ = os.WriteFile(fmt.Sprintf("/proc/%d/oom_score_adj", pid), []byte("1000"), 0)
		}
	}
}

// descends reports whether pid is a descendant of ancestor by the parent links of one cgroup's
// processes.
func descends(pid, ancestor int, parent map[int]int) bool {
	for i := 0; i < len(parent); i++ {
		pp, ok := parent[pid]
		if !ok {
			return false
		}
		if pp == ancestor {
			return true
		}
		pid = pp
	}
	return false
}

// regrowth decides when the guard kills again while usage stays above the threshold: first at
// once, then only after usage has grown oomRegrowth past what the sandbox held once the last
// kill was done (or past its lowest since).
type regrowth struct {
	base   int64
	primed bool
}

// due reports whether usage used calls for a kill, lowering the baseline when usage fell.
func (rg *regrowth) due(used int64) bool {
	if !rg.primed {
		return true
	}
	if used < rg.base {
		rg.base = used
	}
	return used-rg.base >= oomRegrowth
}

// killed records usage once a kill is done.
func (rg *regrowth) killed(used int64) { rg.base, rg.primed = used, true }

func (g *oomGuard) read() (int64, error) {
	var b [32]byte
	n, err := g.usage.ReadAt(b[:], 0)
	if n == 0 && err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b[:n])), 10, 64)
}

// oomKill asks the sandbox's agent to kill the command holding the most memory.
func (r *Runtime) oomKill(id string, used, threshold int64) {
	ctx, cancel := context.WithTimeout(context.Background(), oomKillWait)
	defer cancel()
	c := guest.NewClient(guest.Dialer(r.dialer(id)))
	defer c.Close()
	start := time.Now()
	res, err := c.OOMKill(ctx)
	if err != nil {
		r.log.Warn("OOM guard: the agent did not kill", "sandbox_id", id, "usage_bytes", used, "threshold_bytes", threshold, "err", err)
		return
	}
	r.log.Warn("OOM guard: sandbox near its memory limit, killed the command holding the most memory",
		"sandbox_id", id, "usage_bytes", used, "threshold_bytes", threshold, "command", res.Command,
		"processes", res.Killed, "rss_bytes", res.RSSBytes, "took", time.Since(start))
}

// OOMKills reads the oom_kill count of a gVisor sandbox's host memory cgroup
// (runtime.OOMCounter). At the cgroup's limit — the guard too slow on a loaded host — the host's
// OOM killer ends a process of the sandbox's (a systrap stub of the runaway's address space),
// and the sentry then kills that command: the count says why it died.
func (r *Runtime) OOMKills(_ context.Context, id string) (int64, bool) {
	if r.flavor != FlavorGVisor || r.memoryCgroup == "" || checkID(id) != nil {
		return 0, false
	}
	var fr fileReader
	ev, err := fr.keyed(filepath.Join(r.memoryCgroup, cgroupPath(r.cgroupParent, id), "memory.oom_control"), "oom_kill")
	if err != nil {
		return 0, false
	}
	n, ok := ev["oom_kill"]
	return n, ok
}

func readInt64(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}
