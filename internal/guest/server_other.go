//go:build !unix

package guest

import (
	"context"
	"errors"
)

// Run serves the guest protocol; the agent needs a unix system (it runs inside a Linux sandbox).
func Run(ctx context.Context, cfg ServerConfig) error {
	return errors.New("guest: the agent runs only on unix systems")
}
