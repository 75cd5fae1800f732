//go:build unix && !linux

package guest

import (
	"net/http"

	"github.com/agentbox/agentbox/internal/errcode"
)

// handlePTY: terminals need Linux (the agent runs inside a Linux sandbox).
func (s *server) handlePTY(w http.ResponseWriter, _ *http.Request) {
	s.writeError(w, errcode.New(errcode.UnsupportedOp, "terminals are supported on Linux only"))
}
