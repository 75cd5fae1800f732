//go:build !linux

package image

import (
	"context"
	"errors"
	"io"

	"github.com/agentbox/agentbox/internal/runtime"
)

// errPlatform: layers are unpacked into and read from overlayfs directories, which only the
// server's platform (Linux) has; the binary builds elsewhere for the CLI and `agentbox join`.
var errPlatform = errors.New("image: unpacking and committing layers needs Linux (the agentbox server's platform)")

func unpackTar(io.Reader, string, int64, func(string, ...any)) (unpackStats, error) {
	return unpackStats{}, errPlatform
}

func writeLayerTar(context.Context, io.Writer, runtime.WritableLayer, int64) error {
	return errPlatform
}
