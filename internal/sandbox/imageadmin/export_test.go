package imageadmin

import "time"

// SetCommitPauseBound shortens how long a commit may keep a sandbox paused, until restore.
func SetCommitPauseBound(d time.Duration) (restore func()) {
	old := commitPauseBound.Swap(int64(d))
	return func() { commitPauseBound.Store(old) }
}
