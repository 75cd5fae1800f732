// Package statedir owns the server's state directory: its layout and the exclusive lock that
// guarantees one control plane per state dir.
package statedir

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// ErrLocked is returned when another process holds the state dir.
var ErrLocked = errors.New("state dir is locked by another agentbox server")

// Lock is a held state-dir lock.
type Lock struct{ f *os.File }

// Acquire creates dir and takes its exclusive lock without waiting. The dir is 0711: searchable,
// not listable, because sandboxes' root users (unprivileged host users in user namespaces) must
// reach the runtimes' roots below it; what lies in it directly (the lock, the database) is 0600.
func Acquire(dir string) (*Lock, error) {
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return nil, fmt.Errorf("create state dir: %w", err)
	}
	if err := os.Chmod(dir, 0o711); err != nil {
		return nil, fmt.Errorf("state dir: %w", err)
	}
	path := filepath.Join(dir, "lock")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		b, _ := os.ReadFile(path)
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w (pid %s holds %s)", ErrLocked, strings.TrimSpace(string(b)), dir)
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	_ = f.Truncate(0)
	_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	return &Lock{f: f}, nil
}

// Release drops the lock.
func (l *Lock) Release() error { return l.f.Close() }
