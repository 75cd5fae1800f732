package guest

import (
	"os"
	"strconv"
	"strings"
	"sync"
)

// A command's oom_score_adj. The OOM killer of a sandbox's memory cgroup takes the process with
// the most resident memory, weighted by oom_score_adj; the agent is often that process (a Go
// binary among a fork bomb's small shells), and a sandbox whose agent is killed is lost. Every
// process the agent starts therefore gets a higher oom_score_adj than the agent's own (which the
// runtime lowers where the host lets it), so that the kernel takes a command first, whatever
// the host's privileges. A command's children inherit it.

// commandOOMScoreAdj is the oom_score_adj of the commands of an agent whose own is agent: 0 when
// the agent is shielded (negative), else agent+500 (at most 1000): enough that a command with no
// resident memory outranks the agent in any memory cgroup (the weight counts adj/1000 of the
// cgroup's limit in pages).
func commandOOMScoreAdj(agent int) int {
	if agent < 0 {
		return 0
	}
	return min(agent+500, 1000)
}

// commandAdj is this process's commands' oom_score_adj, as text ("" where it cannot be read).
var commandAdj = sync.OnceValue(func() string {
	b, err := os.ReadFile("/proc/self/oom_score_adj")
	if err != nil {
		return ""
	}
	own, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return ""
	}
	return strconv.Itoa(commandOOMScoreAdj(own))
})

// setCommandOOMScoreAdj gives the process pid just started its oom_score_adj. It runs before pid's
// program has done more than start (os.StartProcess returns once the exec succeeded), and
// raising a value needs no privilege; a failure (no /proc) leaves the inherited value.
func setCommandOOMScoreAdj(pid int) {
	if v := commandAdj(); v != "" {
		_ = os.WriteFile("/proc/"+strconv.Itoa(pid)+"/oom_score_adj", []byte(v), 0)
	}
}
