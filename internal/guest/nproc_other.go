//go:build !linux

package guest

import "log/slog"

// ReservePids does nothing off Linux.
func ReservePids(*slog.Logger) {}
