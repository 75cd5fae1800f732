//go:build linux

package fsdiff

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"

	"golang.org/x/sys/unix"
)

// The walk and the file opens are Linux's: openat2, fstatat and overlay xattrs (see the
// package comment for why each is used).

func (w *walker) walkTree(i int) error {
	t := w.trees[i]
	if w.cursor != "" && PathCompare(t.Path, w.cursor) <= 0 && !isAncestor(t.Path, w.cursor) && t.Path != w.cursor {
		return nil // wholly before the cursor
	}
	fd, err := unix.Open(t.Dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil // an empty tree
		}
		return fmt.Errorf("open %s: %w", t.Dir, err)
	}
	return w.walkDir(i, fd, t.Path, "", 0)
}

// walkDir lists directory fd (in-sandbox path p, rel to its tree) and recurses; it closes fd.
func (w *walker) walkDir(ti, fd int, p, rel string, depth int) error {
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	if depth >= MaxDepth {
		return &LimitError{What: "depth", Max: MaxDepth, Path: p}
	}
	if err := w.ctx.Err(); err != nil {
		return err
	}
	var names []string
	for {
		chunk, err := f.Readdirnames(1024)
		names = append(names, chunk...)
		if w.seen+len(names) > w.max {
			return &LimitError{What: "entries", Max: w.max, Path: p}
		}
		if errors.Is(err, io.EOF) || (err == nil && len(chunk) == 0) {
			break
		}
		if err != nil {
			return fmt.Errorf("read directory %s: %w", p, err)
		}
	}
	slices.Sort(names)
	t := w.trees[ti]
	for _, name := range names {
		c := joinPath(p, name)
		crel := name
		if rel != "" {
			crel = rel + "/" + name
		}
		if w.otherRoot(ti, c) || slices.Contains(t.Exclude, c) {
			continue // a nested tree wins; a mount point is not the sandbox's file
		}
		ctxOnly := false
		if w.cursor != "" && PathCompare(c, w.cursor) <= 0 {
			if c != w.cursor && !isAncestor(c, w.cursor) {
				continue // before the cursor, subtree and all
			}
			ctxOnly = true
		}
		w.seen++
		if w.seen > w.max {
			return &LimitError{What: "entries", Max: w.max, Path: c}
		}
		var st unix.Stat_t
		if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue // gone while we looked
			}
			return fmt.Errorf("stat %s: %w", c, err)
		}
		e := Entry{Path: c, Mode: st.Mode & 0o7777, Size: st.Size, UID: int64(st.Uid) - int64(t.UIDBase),
			GID: int64(st.Gid) - int64(t.GIDBase), Mtime: st.Mtim.Nano(), Ctime: st.Ctim.Nano(), Ino: st.Ino,
			tree: ti, rel: crel, context: ctxOnly}
		var sub int = -1
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			e.Type = TypeFile
		case unix.S_IFDIR:
			e.Type, e.Size = TypeDir, 0
			dfd, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
					continue // replaced while we looked
				}
				return fmt.Errorf("open %s: %w", c, err)
			}
			if t.Layer {
				e.Opaque = opaque(dfd)
			}
			sub = dfd
		case unix.S_IFLNK:
			e.Type = TypeSymlink
			buf := make([]byte, maxLinkTarget)
			n, err := unix.Readlinkat(fd, name, buf)
			if err == nil {
				e.Target = string(buf[:n])
			}
		case unix.S_IFCHR:
			e.Type, e.Size = TypeOther, 0
			if t.Layer && st.Rdev == 0 {
				e.Whiteout, e.Type = true, TypeUnknown
			}
		default:
			e.Type, e.Size = TypeOther, 0
		}
		w.entries = append(w.entries, e)
		if sub >= 0 {
			if err := w.walkDir(ti, sub, c, crel, depth+1); err != nil {
				return err
			}
		}
	}
	return nil
}

// opaque reports whether directory fd is an opaque overlay directory.
func opaque(fd int) bool {
	buf := make([]byte, 4)
	for _, x := range []string{"trusted.overlay.opaque", "user.overlay.opaque"} {
		if n, err := unix.Fgetxattr(fd, x, buf); err == nil && n == 1 && buf[0] == 'y' {
			return true
		}
	}
	return false
}

// openBeneath opens rel under dir for reading without following any symlink (nor leaving
// dir), non-blocking, and checks it is a regular file.
func openBeneath(dir, rel string) (*os.File, error) {
	dfd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(dfd)
	return openAt(dfd, rel)
}

// openAt is openBeneath relative to an open directory.
func openAt(dfd int, rel string) (*os.File, error) {
	fd, err := unix.Openat2(dfd, rel, &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_NOFOLLOW | unix.O_NONBLOCK | unix.O_NOCTTY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return nil, fmt.Errorf("%s is not a regular file", rel)
	}
	return os.NewFile(uintptr(fd), rel), nil
}

func (c *comparer) open(dir, rel string) (*os.File, error) {
	dfd, ok := c.dirs[dir]
	if !ok {
		var err error
		if dfd, err = unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err != nil {
			return nil, err
		}
		c.dirs[dir] = dfd
	}
	return openAt(dfd, rel)
}

func (c *comparer) close() {
	for _, fd := range c.dirs {
		unix.Close(fd)
	}
}
