//go:build !linux

package guest

import (
	"errors"
	"log/slog"
)

// ReservePids does nothing off Linux.
func ReservePids(*slog.Logger) {}

// LimitFileSize is refused off Linux, where no sandbox runs.
func LimitFileSize(int64) error { return errors.New("--fsize-mb needs Linux") }
