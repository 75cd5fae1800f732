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
type Lock struct{ files []*os.File }

// Acquire takes the lock of each name (a file name in dir, created 0600 with dir 0700), all or
// none, without waiting. what says what a name guards, for the error: "cgroup parent" gives
// "cgroup parent X is in use by another agentbox server (pid N, lock F)", wrapping ErrHeld.
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
		path := filepath.Join(dir, name+".lock")
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600) // close-on-exec: children never hold it
		if err != nil {
			l.Release()
			return nil, fmt.Errorf("open %s: %w", path, err)
		}
		if err := tryLock(f); err != nil {
			b, _ := os.ReadFile(path)
			f.Close()
			l.Release()
			if errors.Is(err, errWouldBlock) {
				return nil, fmt.Errorf("%s %s is %w (pid %s, lock %s)", what, name, ErrHeld, strings.TrimSpace(string(b)), path)
			}
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		_ = f.Truncate(0)
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
		l.files = append(l.files, f)
	}
	return l, nil
}

// Release drops every lock (the files stay: removing a lock file another process may be
// opening would let two processes lock two different files of one name). Safe on nil.
func (l *Lock) Release() {
	if l == nil {
		return
	}
	for _, f := range l.files {
		f.Close()
	}
	l.files = nil
}
