//go:build !unix

package mitm

import (
	"errors"
	"os"
)

// errPlatform: the egress proxy is the server's (Linux); the binary builds elsewhere for the
// CLI and `agentbox join`.
var errPlatform = errors.New("egress: the egress proxy needs a POSIX host (the agentbox server's platform)")

func lockFile(*os.File) error { return errPlatform }

func unlockFile(*os.File) {}

func openNoFollow(string) (*os.File, error) { return nil, errPlatform }
