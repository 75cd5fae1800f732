// Package statedir owns the server's state directory: its layout and the exclusive lock that
// guarantees one control plane per state dir.
package statedir

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
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
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600) // Go opens files close-on-exec
	if err != nil {
		return nil, fmt.Errorf("open lock: %w", err)
	}
	if err := tryLock(f); err != nil {
		b, _ := os.ReadFile(path)
		f.Close()
		if errors.Is(err, errWouldBlock) {
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

// Identity is the name of what a server of dir makes on its host outside dir (its cgroup
// parent): "agentbox-" and 8 hex digits of the SHA-256 of dir's absolute path, symlinks
// resolved, so the same directory gives the same name however it is written and across
// restarts, and two state dirs (almost surely) two names; the host locks (internal/hostlock)
// turn the rare collision into a refusal to start.
func Identity(dir string) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	if real, err := filepath.EvalSymlinks(abs); err == nil {
		abs = real
	}
	sum := sha256.Sum256([]byte(abs))
	return "agentbox-" + hex.EncodeToString(sum[:4]), nil
}

// CheckSearchable returns an error that names the fix when a directory above dir (dir included,
// as written and with symlinks resolved) does not let other users search it (mode o+x). The
// sandboxes' root users are unprivileged host ids (a range of their own, in no group of the
// host's), and the runtime's init resolves each sandbox's root file system and binds below dir
// as that user: under a 0700 mktemp dir or a 0750 home directory every create would fail.
// Making the directories searchable is the owner's choice, so the server refuses to start and
// says how, instead of changing them.
func CheckSearchable(dir string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	paths := []string{abs}
	// With symlinks resolved, from the deepest directory that exists.
	for d, tail := abs, ""; ; d, tail = filepath.Dir(d), filepath.Join(filepath.Base(d), tail) {
		if real, err := filepath.EvalSymlinks(d); err == nil {
			if real = filepath.Join(real, tail); real != abs {
				paths = append(paths, real)
			}
			break
		}
		if d == filepath.Dir(d) {
			break
		}
	}
	var closed []string
	for _, p := range paths {
		for d := p; ; d = filepath.Dir(d) {
			if st, err := os.Stat(d); err == nil && st.Mode().Perm()&0o001 == 0 && !slices.Contains(closed, d) {
				closed = append(closed, d)
			}
			if d == filepath.Dir(d) {
				break
			}
		}
	}
	if len(closed) == 0 {
		return nil
	}
	slices.Sort(closed)
	var modes []string
	for _, d := range closed {
		st, _ := os.Stat(d)
		modes = append(modes, fmt.Sprintf("%s (%04o)", d, st.Mode().Perm()))
	}
	return fmt.Errorf("state dir %s: sandboxes could not reach it, because other users cannot search %s "+
		"(a sandbox's root user is an unprivileged host id that must pass through every directory above its files). "+
		"Run `chmod o+x %s` (lets others pass through, not list), or choose a --state-dir elsewhere (for example /var/lib/agentbox)",
		dir, strings.Join(modes, ", "), strings.Join(closed, " "))
}
