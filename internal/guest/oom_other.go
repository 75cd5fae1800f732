//go:build unix && !linux

package guest

import "net/http"

func (s *server) oomKills() int64 { return -1 }

func (s *server) handleOOMKill(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, OOMKillResult{})
}
