package faults

import (
	"sort"
	"sync"
)

// ledger is what the server acknowledged to the clients: each entry is a promise the
// invariant checks hold it to.
type ledger struct {
	mu sync.Mutex
	// keys: an idempotency key → the sandbox its first acknowledged create returned, and the
	// body it was sent with (a retry sends the same).
	keys    map[string]string
	keyBody map[string]map[string]any
	// created: sandboxes an acknowledged create or fork returned.
	created map[string]bool
	// destroyed: sandboxes an acknowledged destroy returned.
	destroyed map[string]bool
	// agentKilled: sandboxes whose agent a fault killed (lost is then their right state).
	agentKilled map[string]bool
	// files: sandbox → path → the content an acknowledged write put there.
	files map[string]map[string]string
	// jobs: acknowledged job starts; logs is set once the job ended and its logs were read.
	jobs []*jobAck
	// runs: run id → the events seen (seq → to).
	runs map[string]map[int64]string
	// approvals: approval id → the sandbox whose gated call it let through (and was answered).
	approvals map[string]string
	// execs: sandbox → acknowledged REST execs (each an audited call); execsDiskFull those
	// answered while the state dir's file system was full (or just after).
	execs, execsDiskFull map[string]int
	// auditDroppedDiskFull: audit records missing of calls answered while the disk was full.
	auditDroppedDiskFull int
	// seenIDs: every sandbox id the campaign saw, for the leak checks at the end.
	seenIDs map[string]bool

	lost, leaked int
}

type jobAck struct {
	sandbox, job string
	ended        bool
	logs         string // stdout as read once the job ended
	killedMarker string // a job whose process a fault killed: its output before the kill
}

func (l *ledger) init() {
	l.keys, l.keyBody = map[string]string{}, map[string]map[string]any{}
	l.created, l.destroyed, l.agentKilled = map[string]bool{}, map[string]bool{}, map[string]bool{}
	l.files = map[string]map[string]string{}
	l.runs = map[string]map[int64]string{}
	l.approvals = map[string]string{}
	l.execs, l.execsDiskFull = map[string]int{}, map[string]int{}
	l.seenIDs = map[string]bool{}
}

func (l *ledger) seen(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if id != "" {
		l.seenIDs[id] = true
	}
}

func (l *ledger) allSeen() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]string, 0, len(l.seenIDs))
	for id := range l.seenIDs {
		out = append(out, id)
	}
	sort.Strings(out)
	return out
}

func (l *ledger) addLost(n int) {
	l.mu.Lock()
	l.lost += n
	l.mu.Unlock()
}

func (l *ledger) addLeaked(n int) {
	l.mu.Lock()
	l.leaked += n
	l.mu.Unlock()
}

func (l *ledger) lostCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lost
}

func (l *ledger) leakedCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.leaked
}
