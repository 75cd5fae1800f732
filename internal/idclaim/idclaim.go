// Package idclaim keeps the host-wide claims on sandboxes' user-namespace id ranges, so that two
// agentbox servers on one host (each with its own store) never hand the same host uids to
// their sandboxes. A claim is a file under Dir named for the range's first id and holding the
// claiming server's identity (its state dir's, statedir.Identity) and the range's size; claims
// are made, read and removed under an exclusive flock of Dir/.lock. A claim outlives its
// server's process (a crashed server's sandboxes keep their ids); the server's own sweep drops
// the claims its store no longer holds, and a reboot empties Dir (a tmpfs) with the sandboxes.
package idclaim

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Dir is where servers keep their id range claims.
const Dir = "/run/agentbox/idranges"

// Claims are one server's view of the host's claims.
type Claims struct {
	dir   string
	owner string
	state string // the owner's state dir, recorded in each claim
}

// New returns owner's claims under dir, creating dir (0700). stateDir is the owner's state dir:
// a claim whose state dir is gone (a removed installation, a test's) is stale, and dropped by
// whoever reads it next.
func New(dir, owner, stateDir string) (*Claims, error) {
	if owner == "" || strings.ContainsAny(owner, " \n") || strings.ContainsAny(stateDir, "\n") {
		return nil, fmt.Errorf("idclaim: %q is not an owner", owner)
	}
	if abs, err := filepath.Abs(stateDir); err == nil && stateDir != "" {
		stateDir = abs
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("idclaim: %w", err)
	}
	return &Claims{dir: dir, owner: owner, state: stateDir}, nil
}

type claim struct {
	base, count int64
	owner       string
}

// locked runs fn holding the exclusive lock of the claims.
func (c *Claims) locked(fn func([]claim) error) error {
	f, err := os.OpenFile(filepath.Join(c.dir, ".lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("idclaim: %w", err)
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		return fmt.Errorf("idclaim: lock: %w", err)
	}
	defer unix.Flock(int(f.Fd()), unix.LOCK_UN) //nolint:errcheck // closing unlocks anyway
	ents, err := os.ReadDir(c.dir)
	if err != nil {
		return fmt.Errorf("idclaim: %w", err)
	}
	var all []claim
	for _, e := range ents {
		base, err := strconv.ParseInt(e.Name(), 10, 64)
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(c.dir, e.Name()))
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			return fmt.Errorf("idclaim: %w", err)
		}
		owner, rest, _ := strings.Cut(strings.TrimSpace(string(b)), " ")
		n, state, _ := strings.Cut(rest, " ")
		if state != "" && owner != c.owner {
			if _, err := os.Stat(state); errors.Is(err, fs.ErrNotExist) { // its server's state dir is gone
				_ = os.Remove(filepath.Join(c.dir, e.Name()))
				continue
			}
		}
		count, err := strconv.ParseInt(n, 10, 64)
		if err != nil || count <= 0 {
			count = 1 << 16
		}
		all = append(all, claim{base: base, count: count, owner: owner})
	}
	return fn(all)
}

func (c *Claims) write(base, count int64) error {
	p := filepath.Join(c.dir, strconv.FormatInt(base, 10))
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, []byte(c.owner+" "+strconv.FormatInt(count, 10)+" "+c.state+"\n"), 0o600); err != nil {
		return fmt.Errorf("idclaim: %w", err)
	}
	if err := os.Rename(tmp, p); err != nil {
		return fmt.Errorf("idclaim: %w", err)
	}
	return nil
}

// Claim claims [base, base+count) for this server: true when it is now this server's (newly, or
// already), false when a range of another server overlaps it.
func (c *Claims) Claim(base, count int64) (bool, error) {
	ok := false
	err := c.locked(func(all []claim) error {
		for _, o := range all {
			if o.owner != c.owner && base < o.base+o.count && o.base < base+count {
				return nil
			}
		}
		for _, o := range all {
			if o.owner == c.owner && o.base == base && o.count == count {
				ok = true
				return nil
			}
		}
		if err := c.write(base, count); err != nil {
			return err
		}
		ok = true
		return nil
	})
	return ok, err
}

// Sync makes this server's claims the ranges its store holds: it claims each of held (given as
// base → count: an installation from before the claims adopts its sandboxes' ranges) and drops
// its claims on any other. It returns the held ranges another server's claim overlaps.
func (c *Claims) Sync(held map[int64]int64) (conflicts []string, err error) {
	err = c.locked(func(all []claim) error {
		mine := map[int64]bool{}
		for _, o := range all {
			if o.owner != c.owner {
				continue
			}
			if n, ok := held[o.base]; ok && n == o.count {
				mine[o.base] = true
				continue
			}
			if err := os.Remove(filepath.Join(c.dir, strconv.FormatInt(o.base, 10))); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("idclaim: %w", err)
			}
		}
		for base, count := range held {
			if mine[base] {
				continue
			}
			clash := false
			for _, o := range all {
				if o.owner != c.owner && base < o.base+o.count && o.base < base+count {
					conflicts = append(conflicts, fmt.Sprintf("[%d, %d) overlaps [%d, %d) of %s", base, base+count, o.base, o.base+o.count, o.owner))
					clash = true
				}
			}
			if clash {
				continue // the other's claim stays: no server takes a range from another
			}
			if err := c.write(base, count); err != nil {
				return err
			}
		}
		return nil
	})
	return conflicts, err
}
