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

// oomAdj is this process's own oom_score_adj and its commands', as text (own "": unread).
var oomAdj = sync.OnceValues(func() (own, command string) {
	b, err := os.ReadFile("/proc/self/oom_score_adj")
	if err != nil {
		return "", ""
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return "", ""
	}
	return strconv.Itoa(n), strconv.Itoa(commandOOMScoreAdj(n))
})

// withCommandOOMScoreAdj runs start (which starts a child) with this process's oom_score_adj
// raised to its commands', so the child has it from its first instruction: a command that
// forks at once (a shell, a fork bomb) hands it to its children too, which a write after the
// start would race. Raising needs no privilege; going back to the process's own value is always
// allowed (the kernel refuses only values below the lowest a privileged writer set, and the own
// value is at least that). The caller serializes starts (the reaper's lock), so no two overlap.
// For the length of the start the agent is itself a first choice of the OOM killer; outside it,
// never before a command.
func withCommandOOMScoreAdj(start func()) {
	own, command := oomAdj()
	if own == "" || own == command || os.WriteFile("/proc/self/oom_score_adj", []byte(command), 0) != nil {
		start()
		return
	}
	defer func() { _ = os.WriteFile("/proc/self/oom_score_adj", []byte(own), 0) }()
	start()
}
