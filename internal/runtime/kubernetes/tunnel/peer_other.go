//go:build !linux

package tunnel

import (
	"errors"
	"net"
)

// peerPID: only Linux reports a unix socket's peer; the pod side runs on Linux.
func peerPID(*net.UnixConn) (int32, error) { return 0, errors.New("no SO_PEERCRED on this platform") }
