//go:build linux

package image

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errcode"
)

// unpacker writes one layer's tar into dir (a fresh directory) in overlayfs's format. Every
// path is resolved through an os.Root on dir, so no entry, however its names and earlier
// symlinks are built, is created, followed or linked outside dir.
type unpacker struct {
	root   *os.Root
	max    int64 // bound of the uncompressed tar's size (regular files' bytes)
	stats  unpackStats
	dirs   []dirTimes
	logf   func(format string, args ...any)
	buf    []byte
	layerN string // the layer's name, for messages
}

type dirTimes struct {
	name  string
	mtime time.Time
}

// unpackTar reads a layer's tar from r into dir. The caller verifies r's digest.
func unpackTar(r io.Reader, dir string, max int64, logf func(string, ...any)) (unpackStats, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return unpackStats{}, err
	}
	defer root.Close()
	u := &unpacker{root: root, max: max, logf: logf, buf: make([]byte, 1<<20)}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return u.stats, errcode.Wrap(errcode.ImagePullFailed, err, "layer is not a valid tar after %d entries", u.stats.Entries).With("reason", ReasonUnsafeLayer)
		}
		u.stats.Entries++
		if u.stats.Entries > MaxLayerEntries {
			return u.stats, tooLarge("layer has more than %d entries", MaxLayerEntries)
		}
		if err := u.entry(h, tr); err != nil {
			return u.stats, err
		}
	}
	// Directory times last: creating their entries changed them.
	for i := len(u.dirs) - 1; i >= 0; i-- {
		d := u.dirs[i]
		_ = u.utimes(d.name, d.mtime)
	}
	return u.stats, nil
}

// parent opens the directory holding name (creating missing parents 0755) and returns it
// with name's last element.
func (u *unpacker) parent(name string) (*os.File, string, error) {
	dir, base := path.Split(name)
	dir = strings.TrimSuffix(dir, "/")
	if dir == "" {
		dir = "."
	} else if err := u.root.MkdirAll(dir, 0o755); err != nil {
		return nil, "", err
	}
	// A symlink inside the layer is followed (as tar does); os.Root refuses one leading out.
	f, err := u.root.OpenFile(dir, os.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, "", err
	}
	return f, base, nil
}

func (u *unpacker) entry(h *tar.Header, tr *tar.Reader) error {
	name, err := cleanEntryName(h.Name)
	if err != nil {
		return unsafeLayer(h.Name, "%v", err)
	}
	if h.Size < 0 || h.Size > MaxEntryBytes {
		return tooLarge("layer refused: entry %q: size %d is more than %d bytes", h.Name, h.Size, int64(MaxEntryBytes)).With("entry", h.Name)
	}
	if h.Typeflag == tar.TypeReg || h.Typeflag == tar.TypeRegA {
		u.stats.Bytes += h.Size
		if u.stats.Bytes > u.max {
			return tooLarge("layer refused: its files are more than %d bytes", u.max)
		}
	}
	base := path.Base(name)
	// Whiteouts.
	if name != "" && strings.HasPrefix(base, whiteoutPrefix) {
		p, _, err := u.parent(name)
		if err != nil {
			return unsafeLayer(h.Name, "%v", err)
		}
		defer p.Close()
		if base == whiteoutOpaque {
			if err := unix.Fsetxattr(int(p.Fd()), xattrOpaque, []byte("y"), 0); err != nil {
				return fmt.Errorf("opaque %s: %w", name, err)
			}
			return nil
		}
		target := strings.TrimPrefix(base, whiteoutPrefix)
		if target == "" || target == "." || target == ".." {
			return unsafeLayer(h.Name, "whiteout of nothing")
		}
		if err := u.clear(p, target, false); err != nil {
			return err
		}
		if err := unix.Mknodat(int(p.Fd()), target, unix.S_IFCHR|0, 0); err != nil {
			return fmt.Errorf("whiteout %s: %w", name, err)
		}
		u.stats.DiskBytes += 4096
		return unix.Fchownat(int(p.Fd()), target, 0, 0, unix.AT_SYMLINK_NOFOLLOW)
	}
	uid, gid := h.Uid, h.Gid
	if uid < 0 || uid > MaxLayerID || gid < 0 || gid > MaxLayerID {
		u.stats.Clamped++
		if uid < 0 || uid > MaxLayerID {
			uid = ClampedID
		}
		if gid < 0 || gid > MaxLayerID {
			gid = ClampedID
		}
	}
	mode := uint32(h.Mode & 0o7777)

	if name == "" { // the root directory itself
		if h.Typeflag != tar.TypeDir {
			return unsafeLayer(h.Name, "the layer's root is not a directory")
		}
		d, err := u.root.Open(".")
		if err != nil {
			return err
		}
		defer d.Close()
		if err := u.meta(d, uid, gid, mode, h); err != nil {
			return err
		}
		u.dirs = append(u.dirs, dirTimes{".", h.ModTime})
		return nil
	}

	p, base, err := u.parent(name)
	if err != nil {
		return unsafeLayer(h.Name, "its directory is not inside the layer: %v", err)
	}
	defer p.Close()
	pfd := int(p.Fd())
	u.stats.DiskBytes += 4096

	switch h.Typeflag {
	case tar.TypeDir:
		var st unix.Stat_t
		if err := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil && st.Mode&unix.S_IFMT != unix.S_IFDIR {
			if err := u.clear(p, base, false); err != nil {
				return err
			}
		}
		if err := unix.Mkdirat(pfd, base, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("mkdir %s: %w", name, err)
		}
		d, err := openat(pfd, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW)
		if err != nil {
			return unsafeLayer(h.Name, "%v", err)
		}
		defer d.Close()
		if err := u.meta(d, uid, gid, mode, h); err != nil {
			return err
		}
		u.dirs = append(u.dirs, dirTimes{name, h.ModTime})
		return nil

	case tar.TypeReg, tar.TypeRegA:
		if err := u.clear(p, base, false); err != nil {
			return err
		}
		fd, err := unix.Openat(pfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return fmt.Errorf("create %s: %w", name, err)
		}
		f := os.NewFile(uintptr(fd), name)
		defer f.Close()
		n, err := io.CopyBuffer(onlyWriter{f}, io.LimitReader(tr, h.Size), u.buf)
		if err != nil {
			return fmt.Errorf("write %s: %w", name, err)
		}
		if n != h.Size {
			return unsafeLayer(h.Name, "the tar ends inside it")
		}
		u.stats.DiskBytes += (h.Size + 4095) &^ 4095
		if err := u.meta(f, uid, gid, mode, h); err != nil {
			return err
		}
		ts := unix.NsecToTimespec(h.ModTime.UnixNano())
		return unix.UtimesNanoAt(pfd, base, []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW)

	case tar.TypeSymlink:
		if len(h.Linkname) > MaxEntryNameBytes || h.Linkname == "" || strings.ContainsRune(h.Linkname, 0) {
			return unsafeLayer(h.Name, "bad symlink target")
		}
		if err := u.clear(p, base, false); err != nil {
			return err
		}
		// A symlink's target is kept as written (absolute ones are the image's own paths):
		// the unpack never follows it (every later name is resolved through the os.Root).
		if err := unix.Symlinkat(h.Linkname, pfd, base); err != nil {
			return fmt.Errorf("symlink %s: %w", name, err)
		}
		if err := unix.Fchownat(pfd, base, uid, gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return err
		}
		return unix.UtimesNanoAt(pfd, base, []unix.Timespec{unix.NsecToTimespec(h.ModTime.UnixNano()), unix.NsecToTimespec(h.ModTime.UnixNano())}, unix.AT_SYMLINK_NOFOLLOW)

	case tar.TypeLink:
		target, err := cleanEntryName(h.Linkname)
		if err != nil || target == "" {
			return unsafeLayer(h.Name, "hardlink to %q outside the layer", h.Linkname)
		}
		tp, tbase, err := u.parentNoCreate(target)
		if err != nil {
			return unsafeLayer(h.Name, "hardlink to %q outside the layer: %v", h.Linkname, err)
		}
		defer tp.Close()
		var st unix.Stat_t
		if err := unix.Fstatat(int(tp.Fd()), tbase, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return unsafeLayer(h.Name, "hardlink to %q, which the layer does not have", h.Linkname)
		}
		if st.Mode&unix.S_IFMT == unix.S_IFDIR {
			return unsafeLayer(h.Name, "hardlink to a directory")
		}
		if target == name {
			return nil
		}
		if err := u.clear(p, base, false); err != nil {
			return err
		}
		// linkat without AT_SYMLINK_FOLLOW links the entry itself (a symlink stays one).
		if err := unix.Linkat(int(tp.Fd()), tbase, pfd, base, 0); err != nil {
			return fmt.Errorf("hardlink %s: %w", name, err)
		}
		return nil

	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		u.stats.Skipped++
		if u.logf != nil {
			u.logf("image layer: skipped device or fifo entry", "entry", h.Name, "type", string(h.Typeflag))
		}
		return nil

	case tar.TypeXGlobalHeader, tar.TypeXHeader, tar.TypeGNULongName, tar.TypeGNULongLink:
		return nil // consumed by archive/tar
	default:
		u.stats.Skipped++
		return nil
	}
}

// parentNoCreate opens the directory holding name, which must exist.
func (u *unpacker) parentNoCreate(name string) (*os.File, string, error) {
	dir, base := path.Split(name)
	dir = strings.TrimSuffix(dir, "/")
	if dir == "" {
		dir = "."
	}
	f, err := u.root.OpenFile(dir, os.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, "", err
	}
	return f, base, nil
}

// clear removes whatever name is in p (an earlier entry of the same layer), a directory
// with its contents unless keepDir.
func (u *unpacker) clear(p *os.File, base string, keepDir bool) error {
	var st unix.Stat_t
	if err := unix.Fstatat(int(p.Fd()), base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return nil
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		if keepDir {
			return nil
		}
		return removeAllAt(int(p.Fd()), base)
	}
	return unix.Unlinkat(int(p.Fd()), base, 0)
}

// removeAllAt removes base in directory fd and, if a directory, its contents, never
// following a symlink.
func removeAllAt(dfd int, base string) error {
	if err := unix.Unlinkat(dfd, base, 0); err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	cfd, err := unix.Openat(dfd, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	d := os.NewFile(uintptr(cfd), base)
	names, err := d.Readdirnames(-1)
	if err == nil {
		for _, n := range names {
			if err = removeAllAt(cfd, n); err != nil {
				break
			}
		}
	}
	d.Close()
	if err != nil {
		return err
	}
	return unix.Unlinkat(dfd, base, unix.AT_REMOVEDIR)
}

func openat(dfd int, base string, flags int) (*os.File, error) {
	fd, err := unix.Openat(dfd, base, flags|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), base), nil
}

// meta sets an open file's owner, mode (setuid, setgid and sticky kept: the chown first, as
// it clears them) and kept xattrs (user.* and security.capability; the rest are dropped).
func (u *unpacker) meta(f *os.File, uid, gid int, mode uint32, h *tar.Header) error {
	fd := int(f.Fd())
	if err := unix.Fchown(fd, uid, gid); err != nil {
		return fmt.Errorf("chown %s: %w", h.Name, err)
	}
	if err := unix.Fchmod(fd, mode); err != nil {
		return fmt.Errorf("chmod %s: %w", h.Name, err)
	}
	n := 0
	for k, v := range h.PAXRecords {
		key, ok := strings.CutPrefix(k, "SCHILY.xattr.")
		if !ok || !keptXattr(key) {
			continue
		}
		if n++; n > MaxEntryXattrs || len(v) > MaxXattrBytes {
			return unsafeLayer(h.Name, "more than %d xattrs or one of more than %d bytes", MaxEntryXattrs, MaxXattrBytes)
		}
		if err := unix.Fsetxattr(fd, key, []byte(v), 0); err != nil {
			return fmt.Errorf("xattr %s on %s: %w", key, h.Name, err)
		}
	}
	return nil
}

// keptXattr reports whether a layer's xattr is kept: user.* and file capabilities.
func keptXattr(key string) bool {
	return strings.HasPrefix(key, "user.") || key == "security.capability"
}

func (u *unpacker) utimes(name string, mt time.Time) error {
	return u.root.Chtimes(name, mt, mt)
}

// onlyWriter hides f's ReadFrom so that io.CopyBuffer uses the buffer.
type onlyWriter struct{ w io.Writer }

func (o onlyWriter) Write(p []byte) (int, error) { return o.w.Write(p) }
