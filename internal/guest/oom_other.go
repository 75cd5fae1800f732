//go:build unix && !linux

package guest

import "net/http"

func (s *server) handleOOMKill(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, OOMKillResult{})
}
