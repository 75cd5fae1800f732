// Package hostlock takes the host-wide locks that keep two agentbox servers off each other's
// host resources: an exclusive flock on a file named for the resource, under Dir, held for the
// server's life. The kernel drops a flock when its holder dies, so a crashed server never
// leaves a lock behind; the file keeps the holder's pid, which a refusal names.
package hostlock

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Dir is where servers keep their host-wide locks: a tmpfs, emptied at boot with the host
// resources (cgroups, mounts, namespaces) the locks guard.
const Dir = "/run/agentbox"

// ErrHeld is the error (wrapped) when another process holds a lock.
var ErrHeld = errors.New("held by another agentbox server")

// Lock is a set of held locks.
type Lock struct{ held []held }

type held struct {
	f    *os.File
	path string
}

// Acquire takes the lock of each name (a file name in dir, created 0600 with dir 0700), all or
// none, without waiting. what says what a name guards, for the error: "cgroup parent" gives
// "cgroup parent X is held by another agentbox server (pid N, lock F)", wrapping ErrHeld.
func Acquire(dir, what string, names ...string) (*Lock, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create %s: %w", dir, err)
	}
	l := &Lock{}
	for _, name := range names {
		if name == "" || strings.ContainsAny(name, "/\x00") || name == "." || name == ".." {
			l.Release()
			return nil, fmt.Errorf("hostlock: %q is not a file name", name)
		}
		f, err := lockFile(filepath.Join(dir, name+".lock"), what, name)
		if err != nil {
			l.Release()
			return nil, err
		}
		l.held = append(l.held, held{f: f, path: filepath.Join(dir, name+".lock")})
	}
	return l, nil
}

// lockFile opens path and takes its flock. Release removes the file while it holds the lock, so
// a lock taken on a file that was meanwhile removed (or replaced) is no lock: it is dropped and
// taken again on the file the path names now.
func lockFile(path, what, name string) (*os.File, error) {
	for {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600) // close-on-exec: children never hold it
		if err != nil {
			return nil, fmt.Errorf("open %s: %w", path, err)
		}
		if err := tryLock(f); err != nil {
			b, _ := os.ReadFile(path)
			f.Close()
			if errors.Is(err, errWouldBlock) {
				return nil, fmt.Errorf("%s %s is %w (pid %s, lock %s)", what, name, ErrHeld, strings.TrimSpace(string(b)), path)
			}
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		fi, ferr := f.Stat()
		pi, perr := os.Stat(path)
		if ferr != nil || perr != nil || !os.SameFile(fi, pi) {
			f.Close() // removed by its releasing holder after we opened it: take the new one
			continue
		}
		_ = f.Truncate(0)
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
		return f, nil
	}
}

// Release drops every lock and removes its file (while still holding it, so that no other
// process can be holding a lock on it: see lockFile). Safe on nil.
func (l *Lock) Release() {
	if l == nil {
		return
	}
	for _, h := range l.held {
		_ = os.Remove(h.path)
		h.f.Close()
	}
	l.held = nil
}
