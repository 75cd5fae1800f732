//go:build unix

package guest

import (
	"net/http"

	"golang.org/x/sys/unix"
)

// handleSync writes back every file system's dirty data (sync(2)) before it answers: a runtime
// whose sandbox has a page cache of its own (a VM's kernel) calls it before it reads the
// sandbox's disk from the host, so that every write made before the call is on the disk.
func (s *server) handleSync(w http.ResponseWriter, _ *http.Request) {
	unix.Sync()
	writeJSON(w, http.StatusOK, map[string]bool{"ok": true})
}
