//go:build !linux

package fsdiff

import (
	"errors"
	"os"
)

// errPlatform: diffs read sandboxes' files, which exist only where the server runs (Linux);
// the binary builds elsewhere for the CLI and `agentbox join`.
var errPlatform = errors.New("fsdiff: file diffs need Linux (the agentbox server's platform)")

func (w *walker) walkTree(int) error { return errPlatform }

func openBeneath(string, string) (*os.File, error) { return nil, errPlatform }

func (c *comparer) open(string, string) (*os.File, error) { return nil, errPlatform }

func (c *comparer) close() {}
