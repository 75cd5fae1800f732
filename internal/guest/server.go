package guest

import (
	"context"
	"errors"
	"log/slog"
)

// ServerConfig configures the in-sandbox agent.
type ServerConfig struct {
	// Socket is the unix socket path to listen on.
	Socket string
	// Workdir is the default working directory and base of relative paths (default /workspace).
	Workdir string
	Logger  *slog.Logger
}

// Run serves the guest protocol until ctx is done. STUB: being implemented.
func Run(ctx context.Context, cfg ServerConfig) error {
	return errors.New("guest: not implemented yet")
}
