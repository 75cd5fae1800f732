package oci

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/runtime"
)

// maxShiftDepth bounds the directory depth shiftIDs descends (each level holds a descriptor).
const maxShiftDepth = 2048

// shiftIDs moves the owner of every inode under the mounted file system root whose uid (gid)
// is in from's range to the same offset in to's range, and leaves other ids as they are. A
// range of Count 0 is the ids as the sandbox sees them (0..): the files of a sandbox without a
// user namespace. The tree is the sandbox's: nothing is followed (every call is relative to an
// opened directory, symlinks are chowned themselves with AT_SYMLINK_NOFOLLOW, a directory is
// opened O_NOFOLLOW), and it must not be in use (create shifts before the sandbox starts).
// chown clears setuid and setgid: they are put back. It also drops security.capability (file
// capabilities), which is not put back. POSIX ACLs keep their raw ids. It returns the number of
// inodes visited.
func shiftIDs(ctx context.Context, root string, from, to runtime.IDMap) (int, error) {
	count := max(from.Count, to.Count)
	if count == 0 {
		return 0, nil
	}
	if from.Count == 0 {
		from = runtime.IDMap{Count: count}
	}
	if to.Count == 0 {
		to = runtime.IDMap{Count: count}
	}
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	s := &idShifter{ctx: ctx, from: from, to: to, links: map[uint64]bool{}}
	// The root itself (create gives it its owner again: closeDisk).
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return 0, err
	}
	if err := s.fix(fd, "", &st); err != nil {
		unix.Close(fd)
		return s.n, err
	}
	err = s.walk(fd, 0)
	return s.n, err
}

type idShifter struct {
	ctx      context.Context
	from, to runtime.IDMap
	n        int
	links    map[uint64]bool // inodes of more than one link already shifted
}

// mapID moves id from [fromBase, fromBase+count) to toBase+offset.
func mapID(id, fromBase, toBase, count uint32) (uint32, bool) {
	if id >= fromBase && uint64(id) < uint64(fromBase)+uint64(count) {
		return toBase + (id - fromBase), true
	}
	return id, false
}

// fix shifts the inode name in dirfd (name "": dirfd itself), whose lstat is st.
func (s *idShifter) fix(dirfd int, name string, st *unix.Stat_t) error {
	s.n++
	if st.Nlink > 1 && st.Mode&unix.S_IFMT != unix.S_IFDIR {
		if s.links[st.Ino] {
			return nil // another link of it was shifted
		}
		s.links[st.Ino] = true
	}
	uid, uok := mapID(st.Uid, s.from.UIDBase, s.to.UIDBase, s.from.Count)
	gid, gok := mapID(st.Gid, s.from.GIDBase, s.to.GIDBase, s.from.Count)
	if !uok && !gok {
		return nil
	}
	var err error
	if name == "" {
		err = unix.Fchown(dirfd, int(uid), int(gid))
	} else {
		err = unix.Fchownat(dirfd, name, int(uid), int(gid), unix.AT_SYMLINK_NOFOLLOW)
	}
	if err != nil {
		return fmt.Errorf("chown %q: %w", name, err)
	}
	// chown of a non-directory clears setuid and setgid: put them back. (Symlinks have no
	// mode to put back; a regular file found by lstat is one, and nothing else runs on the disk.)
	if st.Mode&(unix.S_ISUID|unix.S_ISGID) != 0 && st.Mode&unix.S_IFMT != unix.S_IFLNK && st.Mode&unix.S_IFMT != unix.S_IFDIR {
		if err := unix.Fchmodat(dirfd, name, st.Mode&0o7777, 0); err != nil {
			return fmt.Errorf("chmod %q: %w", name, err)
		}
	}
	return nil
}

// walk shifts every entry of the directory dirfd, descending into directories, and closes dirfd.
func (s *idShifter) walk(dirfd int, depth int) error {
	dir := os.NewFile(uintptr(dirfd), "dir")
	defer dir.Close()
	if depth > maxShiftDepth {
		return fmt.Errorf("directories nested deeper than %d", maxShiftDepth)
	}
	for {
		if err := s.ctx.Err(); err != nil {
			return err
		}
		names, err := dir.Readdirnames(1024)
		for _, name := range names {
			var st unix.Stat_t
			if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				return fmt.Errorf("stat %q: %w", name, err)
			}
			if err := s.fix(dirfd, name, &st); err != nil {
				return err
			}
			if st.Mode&unix.S_IFMT != unix.S_IFDIR {
				continue
			}
			sub, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				return fmt.Errorf("open %q: %w", name, err)
			}
			if err := s.walk(sub, depth+1); err != nil {
				return fmt.Errorf("%s/%w", name, err)
			}
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}
