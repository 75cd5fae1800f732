package guest

import (
	"log/slog"
	"time"
)

// ServerConfig configures the in-sandbox agent.
type ServerConfig struct {
	// Socket is the unix socket path to listen on.
	Socket string
	// Workdir is the default working directory and base of relative paths (default /workspace).
	Workdir string
	Logger  *slog.Logger
	// ShutdownGrace is how long Run lets in-flight requests finish once its context ends before
	// it kills the commands still running and closes every connection (default 5 s).
	ShutdownGrace time.Duration
}
