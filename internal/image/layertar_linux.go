//go:build linux

package image

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/runtime"
)

// writeLayerTar writes the tar of a writable layer (overlayfs upper directory).
func writeLayerTar(ctx context.Context, w io.Writer, layer runtime.WritableLayer, max int64) error {
	exclude := map[string]bool{}
	for _, e := range layer.Exclude {
		c := strings.TrimPrefix(path.Clean("/"+e), "/")
		if c != "" {
			exclude[c] = true
		}
	}
	root, err := filepath.Abs(layer.Dir)
	if err != nil {
		return err
	}
	mapID := func(id uint32, base uint32) (int, bool) {
		if layer.IDMap.Count == 0 {
			return int(id), true
		}
		if id < base || id-base >= layer.IDMap.Count {
			return 0, false
		}
		return int(id - base), true
	}
	tw := tar.NewWriter(w)
	links := map[[2]uint64]string{}
	var total int64
	entries := 0
	buf := make([]byte, 1<<20)
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if rel == "." {
			return nil
		}
		rel = filepath.ToSlash(rel)
		if exclude[rel] {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if entries++; entries > MaxLayerEntries {
			return tooLarge("the writable layer has more than %d entries", MaxLayerEntries)
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		uid, ok1 := mapID(st.Uid, layer.IDMap.UIDBase)
		gid, ok2 := mapID(st.Gid, layer.IDMap.GIDBase)
		h := &tar.Header{Name: rel, Uid: uid, Gid: gid, Mode: int64(st.Mode & 0o7777),
			ModTime: time.Unix(st.Mtim.Sec, st.Mtim.Nsec), Format: tar.FormatPAX}
		dir, baseName := path.Split(rel)
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFCHR:
			if st.Rdev != 0 {
				return nil // a device node: never committed
			}
			return tw.WriteHeader(&tar.Header{Name: dir + whiteoutPrefix + baseName, Typeflag: tar.TypeReg, ModTime: h.ModTime, Format: tar.FormatPAX})
		case unix.S_IFSOCK, unix.S_IFBLK, unix.S_IFIFO:
			return nil
		}
		if !ok1 || !ok2 {
			return errcode.New(errcode.UnsupportedOp, "cannot commit %q: its owner %d:%d is outside the sandbox's ids (%d..%d)", "/"+rel, st.Uid, st.Gid, layer.IDMap.UIDBase, layer.IDMap.UIDBase+layer.IDMap.Count-1)
		}
		addXattrs(p, h)
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			h.Typeflag, h.Name = tar.TypeDir, rel+"/"
			if err := tw.WriteHeader(h); err != nil {
				return err
			}
			b := make([]byte, 4)
			if n, err := unix.Lgetxattr(p, xattrOpaque, b); err == nil && string(b[:n]) == "y" {
				return tw.WriteHeader(&tar.Header{Name: rel + "/" + whiteoutOpaque, Typeflag: tar.TypeReg, ModTime: h.ModTime, Format: tar.FormatPAX})
			}
			return nil
		case unix.S_IFLNK:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			h.Typeflag, h.Linkname = tar.TypeSymlink, target
			return tw.WriteHeader(h)
		case unix.S_IFREG:
			key := [2]uint64{uint64(st.Dev), st.Ino}
			if st.Nlink > 1 {
				if first, ok := links[key]; ok {
					h.Typeflag, h.Linkname = tar.TypeLink, first
					return tw.WriteHeader(h)
				}
				links[key] = rel
			}
			if total += st.Size; total > max {
				return tooLarge("the writable layer's files are more than %d bytes", max)
			}
			h.Typeflag, h.Size = tar.TypeReg, st.Size
			f, err := os.OpenFile(p, os.O_RDONLY|unix.O_NOFOLLOW, 0)
			if err != nil {
				return err
			}
			defer f.Close()
			if err := tw.WriteHeader(h); err != nil {
				return err
			}
			n, err := io.CopyBuffer(tw, &ctxReader{ctx, io.LimitReader(f, st.Size)}, buf)
			if err == nil && n != st.Size {
				err = fmt.Errorf("%s shrank while committed", rel)
			}
			return err
		}
		return nil
	})
	if err != nil {
		var ce *errcode.Error
		if errors.As(err, &ce) || ctx.Err() != nil {
			return err
		}
		return fmt.Errorf("committing %s: %w", layer.Dir, err)
	}
	return tw.Close()
}

// addXattrs records p's kept xattrs (user.*, security.capability) in h.
func addXattrs(p string, h *tar.Header) {
	sz, err := unix.Llistxattr(p, nil)
	if err != nil || sz <= 0 {
		return
	}
	list := make([]byte, sz)
	if sz, err = unix.Llistxattr(p, list); err != nil {
		return
	}
	n := 0
	for _, k := range strings.Split(string(list[:sz]), "\x00") {
		if k == "" || !keptXattr(k) || n >= MaxEntryXattrs {
			continue
		}
		v := make([]byte, MaxXattrBytes)
		vn, err := unix.Lgetxattr(p, k, v)
		if err != nil {
			continue
		}
		if h.PAXRecords == nil {
			h.PAXRecords = map[string]string{}
		}
		h.PAXRecords["SCHILY.xattr."+k] = string(v[:vn])
		n++
	}
}
