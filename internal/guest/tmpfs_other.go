//go:build unix && !linux

package guest

// onTmpfs: the agent's memory-backed file systems are Linux's (a sandbox's /tmp and /dev/shm).
func onTmpfs(string) bool { return false }
