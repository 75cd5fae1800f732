//go:build !unix

package statedir

import (
	"errors"
	"os"
)

var errWouldBlock = errors.New("would block")

// tryLock: the server's state dir is a POSIX host's; the binary builds elsewhere for the CLI
// and `agentbox join`.
func tryLock(*os.File) error {
	return errors.New("statedir: the server's state dir needs a POSIX host (the agentbox server's platform)")
}
