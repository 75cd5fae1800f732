//go:build unix && !linux

package guest

const waitAllFlag = 0

// setSubreaper is a no-op where there is no child subreaper: orphans go to the system's init.
func setSubreaper() error { return nil }

// withCommandOOMScoreAdj runs start: there is no oom_score_adj.
func withCommandOOMScoreAdj(start func()) { start() }
