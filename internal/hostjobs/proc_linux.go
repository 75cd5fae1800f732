package hostjobs

import (
	"bytes"
	"os"
	"os/exec"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// procStart returns pid's start time (/proc/<pid>/stat field 22) and whether it is a live,
// non-zombie process.
func procStart(pid int) (uint64, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, false
	}
	f := bytes.Fields(b[i+1:]) // f[0] is field 3 (state)
	if len(f) < 20 || f[0][0] == 'Z' || f[0][0] == 'X' {
		return 0, false
	}
	start, err := strconv.ParseUint(string(f[19]), 10, 64)
	return start, err == nil
}

// ppid returns pid's parent from /proc/<pid>/stat.
func ppid(pid int) int {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 2 {
		return 0
	}
	n, _ := strconv.Atoi(string(f[1]))
	return n
}

// descendants returns every live process below root.
func descendants(root int) []int {
	if root <= 0 {
		return nil
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	children := map[int][]int{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if pp := ppid(pid); pp > 0 {
			children[pp] = append(children[pp], pid)
		}
	}
	var out []int
	queue := []int{root}
	for len(queue) > 0 && len(out) < 100000 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			out = append(out, c)
			queue = append(queue, c)
		}
	}
	return out
}

// becomeSubreaper makes the supervisor the reaper of its job's orphans, so they stay below it.
func becomeSubreaper() { unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) }

// waitJob reaps children until the job itself ends (orphans of its tree reparented to the
// supervisor are reaped on the way) and returns its exit code and signal.
func waitJob(cmd *exec.Cmd) (int, string) {
	pid := cmd.Process.Pid
	for {
		var ws unix.WaitStatus
		got, err := unix.Wait4(-1, &ws, 0, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return -1, ""
		}
		if got == pid {
			return waitStatus(syscall.WaitStatus(ws))
		}
	}
}

// reapRest reaps the orphans of the job's tree reparented to the supervisor until none is left,
// so they stay below it (and within reach of a cancel) and leave no zombies.
func reapRest() {
	for {
		var ws unix.WaitStatus
		_, err := unix.Wait4(-1, &ws, 0, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return
		}
	}
}

// systemdScope returns the argv prefix that runs the supervisor in its own transient systemd
// scope (so stopping or restarting the agent's service, which kills the service's cgroup, does
// not reach it), or nil where systemd is not the init system or systemd-run is missing.
func systemdScope(id string) []string {
	if _, err := os.Stat("/run/systemd/system"); err != nil {
		return nil
	}
	path, err := exec.LookPath("systemd-run")
	if err != nil {
		return nil
	}
	return []string{path, "--scope", "--quiet", "--collect", "--unit=agentbox-" + id,
		"--description=agentbox remote job " + id, "--"}
}
