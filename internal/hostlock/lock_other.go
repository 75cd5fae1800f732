//go:build !unix

package hostlock

import (
	"errors"
	"os"
)

var errWouldBlock = errors.New("would block")

// tryLock: a server's host resources are a POSIX host's; the binary builds elsewhere for the
// CLI and `agentbox join`.
func tryLock(*os.File) error {
	return errors.New("hostlock: host locks need a POSIX host (the agentbox server's platform)")
}
