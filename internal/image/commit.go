package image

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/runtime"
)

// Commit adds a layer made from a sandbox's writable layer on top of base and names the
// result name (NAME[:TAG], a local name; latest by default). The layer is an uncompressed
// tar (application/vnd.oci.image.layer.v1.tar, or Docker's equivalent under a Docker
// manifest): whiteouts (0:0 character devices) become .wh. entries, opaque directories
// .wh..wh..opq, host ids base+n become n; Exclude paths and sockets are left out.
func (s *Store) Commit(ctx context.Context, base *Image, layer runtime.WritableLayer, nameRef string, cfg *Config) (*Image, error) {
	if base == nil {
		return nil, errcode.New(errcode.InvalidArgument, "commit needs a base image")
	}
	r, err := s.parse(nameRef)
	if err != nil {
		return nil, err
	}
	if r.tag == "" {
		return nil, errcode.New(errcode.InvalidArgument, "commit name %q must be NAME[:TAG], not a digest", nameRef)
	}
	s.mu.Lock()
	rec := s.idx.Images[base.Digest]
	if rec == nil || !s.completeLocked(rec) {
		s.mu.Unlock()
		return nil, notCached(base.Digest)
	}
	s.leases[rec.Digest]++
	parent := *rec
	s.mu.Unlock()
	defer (&lease{s: s, digest: parent.Digest}).Release()
	if len(parent.Layers)+1 > MaxImageLayers {
		return nil, errcode.New(errcode.InvalidArgument, "image %s has %d layers; a commit on it would pass %d", parent.Digest, len(parent.Layers), MaxImageLayers)
	}

	blob, err := os.CreateTemp(s.path("tmp"), "commit-")
	if err != nil {
		return nil, err
	}
	defer func() {
		blob.Close()
		os.Remove(blob.Name())
	}()
	h := sha256.New()
	bw := bufio.NewWriterSize(io.MultiWriter(blob, h), 1<<20)
	if err := writeLayerTar(ctx, bw, layer, s.opts.MaxLayerBytes); err != nil {
		return nil, err
	}
	if err := bw.Flush(); err != nil {
		return nil, err
	}
	if f := LayerReadFrom(ctx); f != nil {
		if err := f(); err != nil {
			return nil, err
		}
	}
	size, err := blob.Seek(0, io.SeekCurrent)
	if err != nil {
		return nil, err
	}
	diffID := "sha256:" + hex.EncodeToString(h.Sum(nil))

	rawMf, err := os.ReadFile(s.blobPath(parent.Digest))
	if err != nil {
		return nil, err
	}
	rawCfg, err := os.ReadFile(s.blobPath(parent.ID))
	if err != nil {
		return nil, err
	}
	mf, err := v1.ParseManifest(bytes.NewReader(rawMf))
	if err != nil {
		return nil, err
	}
	cf, err := v1.ParseConfigFile(bytes.NewReader(rawCfg))
	if err != nil {
		return nil, err
	}
	now := time.Now().UTC()
	dh, _ := v1.NewHash(diffID)
	cf.RootFS.DiffIDs = append(cf.RootFS.DiffIDs, dh)
	cf.Created = v1.Time{Time: now}
	cf.History = append(cf.History, v1.History{Created: v1.Time{Time: now}, CreatedBy: "agentbox sandbox commit", Comment: r.name})
	if cfg != nil {
		if cfg.Env != nil {
			cf.Config.Env = cfg.Env
		}
		if cfg.WorkingDir != "" {
			cf.Config.WorkingDir = cfg.WorkingDir
		}
		if cfg.User != "" {
			cf.Config.User = cfg.User
		}
		if cfg.Entrypoint != nil {
			cf.Config.Entrypoint = cfg.Entrypoint
		}
		if cfg.Cmd != nil {
			cf.Config.Cmd = cfg.Cmd
		}
		for k, v := range cfg.Labels {
			if cf.Config.Labels == nil {
				cf.Config.Labels = map[string]string{}
			}
			cf.Config.Labels[k] = v
		}
	}
	newCfg, err := json.Marshal(cf)
	if err != nil {
		return nil, err
	}
	cfgSum := sha256.Sum256(newCfg)
	cfgDigest, _ := v1.NewHash("sha256:" + hex.EncodeToString(cfgSum[:]))
	lmt := types.OCIUncompressedLayer
	if mf.MediaType == types.DockerManifestSchema2 {
		lmt = types.DockerUncompressedLayer
	}
	mf.Config.Digest, mf.Config.Size = cfgDigest, int64(len(newCfg))
	mf.Layers = append(mf.Layers, v1.Descriptor{MediaType: lmt, Size: size, Digest: dh})
	newMf, err := json.Marshal(mf)
	if err != nil {
		return nil, err
	}
	img, err := s.rawImage(newMf, newCfg, mf.MediaType, map[string]string{diffID: blob.Name()})
	if err != nil {
		return nil, err
	}
	// The same path as a pull: the base's layers are cached, the new one is verified and
	// unpacked from the tar just written.
	return s.addImage(ctx, img, r.name, []string{r.name}, nil, func(rec *imageRec) {
		rec.Committed, rec.Parent = true, parent.Digest
	})
}

type layerReadKey struct{}

// WithLayerRead returns ctx carrying f: a Commit on it calls f once it has read the writable
// layer, before it builds and unpacks the image, and fails with f's error if f returns one.
// The sandbox service resumes the sandbox it paused for the commit there, so that the sandbox
// stays paused for the read of its layer only.
func WithLayerRead(ctx context.Context, f func() error) context.Context {
	return context.WithValue(ctx, layerReadKey{}, f)
}

// LayerReadFrom returns the function WithLayerRead put in ctx, or nil (for other Cache
// implementations to call as Store.Commit does).
func LayerReadFrom(ctx context.Context) func() error {
	f, _ := ctx.Value(layerReadKey{}).(func() error)
	return f
}

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
