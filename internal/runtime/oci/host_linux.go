package oci

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/hostinfo"
)

// ownOOMScoreAdj reads this process's oom_score_adj and whether it holds CAP_SYS_RESOURCE,
// which lowering a container's below it needs.
func ownOOMScoreAdj() (adj int, sysResource bool) {
	if b, err := os.ReadFile("/proc/self/oom_score_adj"); err == nil {
		adj, _ = strconv.Atoi(strings.TrimSpace(string(b)))
	}
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return adj, false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			eff, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return adj, err == nil && eff&(1<<unix.CAP_SYS_RESOURCE) != 0
		}
	}
	return adj, false
}

// swapSupported reports whether memory+swap can be bounded: memory.memsw.* on v1 (absent
// when the kernel does not account swap), memory.swap.max on v2.
func swapSupported(mounts []hostinfo.CgroupMount, mode string) bool {
	for _, m := range mounts {
		if m.Version != 1 {
			continue
		}
		for _, o := range m.Options {
			if o == "memory" {
				_, err := os.Stat(filepath.Join(m.Path, "memory.memsw.limit_in_bytes"))
				return err == nil
			}
		}
	}
	if mode == hostinfo.CgroupV2 {
		matches, _ := filepath.Glob("/sys/fs/cgroup/*/memory.swap.max")
		return len(matches) > 0
	}
	return false
}

// initGone reports whether pid has exited, reaping it when it is this process's zombie child.
func (r *Runtime) initGone(pid int) bool {
	state, ppid, ok := procState(pid)
	if !ok {
		return true
	}
	if state != 'Z' && state != 'X' {
		return false
	}
	if r.reap && ppid == os.Getpid() {
		// A zombie keeps its pid, so this cannot reap anything but the sandbox's init. A
		// multi-threaded init (runsc's sandbox process) shows Z while its other threads still
		// exit and cannot be reaped before they have: it is gone once reaped, not before (runsc
		// delete waits for the pid to vanish).
		wpid, err := unix.Wait4(pid, nil, unix.WNOHANG, nil)
		return wpid == pid || err != nil
	}
	return true
}

// procState reads the state letter and parent pid of pid from /proc.
func procState(pid int) (state byte, ppid int, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, false
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 || len(f[0]) != 1 {
		return 0, 0, false
	}
	ppid, _ = strconv.Atoi(f[1])
	return f[0][0], ppid, true
}

func readPid(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

// removeCgroups removes /<CgroupParent>/<id> under every mounted hierarchy, killing what is still
// inside (nothing, normally: the runtime's delete removes it first).
func (r *Runtime) removeCgroups(ctx context.Context, id string) error {
	for _, mnt := range r.cgroupMounts {
		p := filepath.Join(mnt, cgroupPath(r.cgroupParent, id))
		if _, err := os.Stat(p); err != nil {
			continue
		}
		var lastErr error
		for attempt := 0; attempt < 100; attempt++ {
			if lastErr = removeCgroupTree(p); lastErr == nil {
				break
			}
			killCgroup(p)
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(time.Duration(attempt+1) * time.Millisecond):
			}
		}
		if lastErr != nil {
			return errcode.Wrap(errcode.RuntimeUnavailable, lastErr, "cannot remove the cgroups of sandbox %s: a process of it is still alive; retry", id)
		}
	}
	return nil
}

// removeCgroupTree rmdirs a cgroup and its children, deepest first.
func removeCgroupTree(p string) error {
	ents, err := os.ReadDir(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range ents {
		if e.IsDir() {
			if err := removeCgroupTree(filepath.Join(p, e.Name())); err != nil {
				return err
			}
		}
	}
	if err := unix.Rmdir(p); err != nil && !errors.Is(err, unix.ENOENT) {
		return &fs.PathError{Op: "rmdir", Path: p, Err: err}
	}
	return nil
}

// killCgroup SIGKILLs every process left in a cgroup tree.
func killCgroup(p string) {
	_ = filepath.WalkDir(p, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
			return nil
		}
		b, _ := os.ReadFile(path)
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil && pid > 0 {
				_ = unix.Kill(pid, unix.SIGKILL)
			}
		}
		return nil
	})
}

// Close releases what the runtime holds on the host beyond its sandboxes: the cgroup parent
// directory in every hierarchy, if no sandbox is left under it (a non-empty parent stays, for
// the sandboxes a restarted server adopts), and runsc's pinned network namespace for its gofers
// (a bind mount in the state directory, made again by the next create). Sandboxes themselves are
// untouched. It does no blocking I/O; ctx is the contract's (runtime.Closer).
func (r *Runtime) Close(ctx context.Context) error {
	if r.flavor == FlavorGVisor {
		// Concurrent creates may have stacked several mounts there.
		for unix.Unmount(filepath.Join(r.stateDir(), gvisorNullNetNS), unix.MNT_DETACH) == nil {
		}
	}
	for _, mnt := range r.cgroupMounts {
		p := filepath.Join(mnt, r.cgroupParent)
		ents, err := os.ReadDir(p)
		if err != nil {
			continue
		}
		busy := false
		for _, e := range ents {
			busy = busy || e.IsDir()
		}
		if !busy {
			_ = unix.Rmdir(p) // EBUSY if a sandbox appeared meanwhile: keep it
		}
	}
	return ctx.Err()
}
