package image

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"os"
	"path"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/agentbox/agentbox/internal/errcode"
)

// Bounds of an import.
const (
	// MaxImportBytes bounds an imported tarball (it is spooled to tmp/ first).
	MaxImportBytes = 32 << 30
	// MaxImportImages bounds the images of one tarball.
	MaxImportImages = 64
)

// rawImage is an image made of raw manifest and config bytes whose blobs are files: the
// cache's own (push) or given (a commit's new layer). It implements partial's
// CompressedImageCore.
type rawImage struct {
	s      *Store
	mt     types.MediaType
	rawMf  []byte
	rawCfg []byte
	files  map[string]string // blob digest → file, before the cache's blobs
	sizes  map[string]int64
	lmt    map[string]types.MediaType
}

func (r *rawImage) RawConfigFile() ([]byte, error)      { return r.rawCfg, nil }
func (r *rawImage) MediaType() (types.MediaType, error) { return r.mt, nil }
func (r *rawImage) RawManifest() ([]byte, error)        { return r.rawMf, nil }
func (r *rawImage) LayerByDigest(h v1.Hash) (partial.CompressedLayer, error) {
	p, ok := r.files[h.String()]
	if !ok {
		p = r.s.blobPath(h.String())
	}
	return &fileLayer{path: p, digest: h, size: r.sizes[h.String()], mt: r.lmt[h.String()]}, nil
}

type fileLayer struct {
	path   string
	digest v1.Hash
	size   int64
	mt     types.MediaType
}

func (l *fileLayer) Digest() (v1.Hash, error)            { return l.digest, nil }
func (l *fileLayer) Compressed() (io.ReadCloser, error)  { return os.Open(l.path) }
func (l *fileLayer) Size() (int64, error)                { return l.size, nil }
func (l *fileLayer) MediaType() (types.MediaType, error) { return l.mt, nil }

// cachedImage is the v1.Image of a cached image (its blobs as fetched: byte-exact).
func (s *Store) cachedImage(rec *imageRec, extra map[string]string) (v1.Image, error) {
	rawMf, err := os.ReadFile(s.blobPath(rec.Digest))
	if err != nil {
		return nil, err
	}
	rawCfg, err := os.ReadFile(s.blobPath(rec.ID))
	if err != nil {
		return nil, err
	}
	return s.rawImage(rawMf, rawCfg, types.MediaType(rec.MediaType), extra)
}

func (s *Store) rawImage(rawMf, rawCfg []byte, mt types.MediaType, extra map[string]string) (v1.Image, error) {
	m, err := v1.ParseManifest(strings.NewReader(string(rawMf)))
	if err != nil {
		return nil, err
	}
	ri := &rawImage{s: s, mt: mt, rawMf: rawMf, rawCfg: rawCfg, files: extra, sizes: map[string]int64{}, lmt: map[string]types.MediaType{}}
	if ri.mt == "" {
		ri.mt = m.MediaType
	}
	for _, l := range m.Layers {
		ri.sizes[l.Digest.String()] = l.Size
		ri.lmt[l.Digest.String()] = l.MediaType
	}
	return partial.CompressedToImage(ri)
}

// Push pushes the cached image name to ref.
func (s *Store) Push(ctx context.Context, nameRef, ref string, progress ProgressFunc) error {
	src, err := s.parse(nameRef)
	if err != nil {
		return err
	}
	dst, err := s.parse(ref)
	if err != nil {
		return err
	}
	if dst.local {
		return errcode.New(errcode.InvalidArgument, "push destination %q is a bare digest: %s", ref, refForm)
	}
	s.mu.Lock()
	rec := s.lookupLocked(src)
	if rec == nil {
		s.mu.Unlock()
		return notCached(nameRef)
	}
	s.leases[rec.Digest]++ // kept from collection while it is read
	recCopy := *rec
	s.mu.Unlock()
	defer (&lease{s: s, digest: recCopy.Digest}).Release()
	img, err := s.cachedImage(&recCopy, nil)
	if err != nil {
		return fmt.Errorf("image cache: %w", err)
	}
	if dst.digest != "" && dst.digest != recCopy.Digest {
		return errcode.New(errcode.InvalidArgument, "push destination %q names digest %s, but %q is %s", ref, dst.digest, nameRef, recCopy.Digest)
	}
	updates := make(chan v1.Update, 16)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for u := range updates {
			if progress != nil {
				progress(Progress{Ref: dst.name, Phase: "pushing", Done: u.Complete, Total: u.Total})
			}
		}
	}()
	opts := append(s.remoteOpts(ctx), remote.WithProgress(updates))
	err = remote.Write(dst.ref, img, opts...)
	<-done
	if err != nil {
		return pullError(ctx, dst.name, err)
	}
	if progress != nil {
		progress(Progress{Ref: dst.name, Phase: "done"})
	}
	return nil
}

// Import reads a `docker save` or OCI-layout tarball and adds its images.
func (s *Store) Import(ctx context.Context, r io.Reader, progress ProgressFunc) ([]Image, error) {
	if progress == nil {
		progress = func(Progress) {}
	}
	f, err := os.CreateTemp(s.path("tmp"), "import-")
	if err != nil {
		return nil, err
	}
	defer func() {
		f.Close()
		os.Remove(f.Name())
	}()
	n, err := io.Copy(f, io.LimitReader(&ctxReader{ctx: ctx, r: r}, MaxImportBytes+1))
	if err != nil {
		return nil, errcode.Wrap(errcode.InvalidArgument, err, "reading the tarball")
	}
	if n > MaxImportBytes {
		return nil, errcode.New(errcode.FileTooLarge, "the tarball is more than %d bytes", int64(MaxImportBytes)).With("limit", int64(MaxImportBytes))
	}
	// Which kind: docker save has manifest.json, an OCI layout oci-layout and index.json.
	var docker, oci bool
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	tr := tar.NewReader(f)
	for i := 0; i < MaxLayerEntries; i++ {
		h, err := tr.Next()
		if err != nil {
			if err != io.EOF {
				return nil, errcode.Wrap(errcode.InvalidArgument, err, "the import is not a tar")
			}
			break
		}
		switch path.Clean(h.Name) {
		case "manifest.json":
			docker = true
		case "oci-layout":
			oci = true
		}
	}
	opener := func() (io.ReadCloser, error) { return os.Open(f.Name()) }
	var out []Image
	switch {
	case oci:
		out, err = s.importLayout(ctx, f.Name(), progress)
	case docker:
		out, err = s.importDocker(ctx, opener, progress)
	default:
		return nil, errcode.New(errcode.InvalidArgument, "the tarball is neither a `docker save` (manifest.json) nor an OCI layout (oci-layout, index.json)")
	}
	return out, err
}

type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c *ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

func (s *Store) importDocker(ctx context.Context, opener tarball.Opener, progress ProgressFunc) ([]Image, error) {
	m, err := tarball.LoadManifest(opener)
	if err != nil {
		return nil, errcode.Wrap(errcode.InvalidArgument, err, "the tarball's manifest.json is not valid")
	}
	if len(m) > MaxImportImages {
		return nil, errcode.New(errcode.InvalidArgument, "the tarball has %d images; at most %d are imported at once", len(m), MaxImportImages)
	}
	var out []Image
	for i, d := range m {
		var img v1.Image
		var names []string
		ref := ""
		if len(d.RepoTags) == 0 {
			if len(m) != 1 {
				s.log.Info("image import: skipping an untagged image of a multi-image tarball", "index", i)
				continue
			}
			img, err = tarball.Image(opener, nil)
		} else {
			tag, terr := name.NewTag(d.RepoTags[0])
			if terr != nil {
				return nil, errcode.Wrap(errcode.InvalidArgument, terr, "tag %q of the tarball is not valid", d.RepoTags[0])
			}
			img, err = tarball.Image(opener, &tag)
			for _, t := range d.RepoTags {
				p, perr := s.parse(t)
				if perr != nil {
					return nil, perr
				}
				names = append(names, p.name)
			}
			ref = names[0]
		}
		if err != nil {
			return nil, errcode.Wrap(errcode.InvalidArgument, err, "reading image %d of the tarball", i)
		}
		if ref == "" {
			dg, err := img.Digest()
			if err != nil {
				return nil, errcode.Wrap(errcode.InvalidArgument, err, "reading image %d of the tarball", i)
			}
			ref = dg.String()
		}
		got, err := s.addImage(ctx, img, ref, names, progress, nil)
		if err != nil {
			return nil, importError(err)
		}
		out = append(out, *got)
	}
	return out, nil
}

// importError keeps an unpack's typed error (its code is IMAGE_PULL_FAILED: what was read
// failed verification) and makes others INVALID_ARGUMENT: the tarball is at fault.
func importError(err error) error {
	if e, ok := errcode.As(err); ok && e.Details["reason"] != ReasonUnreachable {
		return err
	}
	return errcode.Wrap(errcode.InvalidArgument, err, "the tarball is not a valid image")
}

func (s *Store) importLayout(ctx context.Context, tarPath string, progress ProgressFunc) ([]Image, error) {
	dir, err := os.MkdirTemp(s.path("tmp"), "layout-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	f, err := os.Open(tarPath)
	if err != nil {
		return nil, err
	}
	// The same guarded unpack as a layer's: the tarball cannot write outside dir.
	_, err = unpackTar(f, dir, MaxImportBytes, nil)
	f.Close()
	if err != nil {
		return nil, errcode.Wrap(errcode.InvalidArgument, err, "the OCI layout tarball could not be read")
	}
	p, err := layout.FromPath(dir)
	if err != nil {
		return nil, errcode.Wrap(errcode.InvalidArgument, err, "the OCI layout is not valid")
	}
	idx, err := p.ImageIndex()
	if err != nil {
		return nil, errcode.Wrap(errcode.InvalidArgument, err, "the OCI layout's index.json is not valid")
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, errcode.Wrap(errcode.InvalidArgument, err, "the OCI layout's index.json is not valid")
	}
	if len(im.Manifests) > MaxImportImages {
		return nil, errcode.New(errcode.InvalidArgument, "the layout has %d images; at most %d are imported at once", len(im.Manifests), MaxImportImages)
	}
	var out []Image
	for _, d := range im.Manifests {
		var img v1.Image
		switch {
		case d.MediaType.IsImage():
			img, err = idx.Image(d.Digest)
		case d.MediaType.IsIndex():
			var child v1.ImageIndex
			if child, err = idx.ImageIndex(d.Digest); err == nil {
				img, err = s.pickPlatform(child)
			}
		default:
			continue
		}
		if err != nil {
			return nil, importError(err)
		}
		var names []string
		ref := d.Digest.String()
		if n := d.Annotations["org.opencontainers.image.ref.name"]; n != "" {
			if pr, perr := s.parse(n); perr == nil && pr.tag != "" {
				names, ref = []string{pr.name}, pr.name
			}
		}
		got, err := s.addImage(ctx, img, ref, names, progress, nil)
		if err != nil {
			return nil, importError(err)
		}
		out = append(out, *got)
	}
	return out, nil
}

// pickPlatform returns the image of idx for the store's platform.
func (s *Store) pickPlatform(idx v1.ImageIndex) (v1.Image, error) {
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	for _, m := range im.Manifests {
		if m.Platform != nil && m.Platform.Satisfies(s.platform) && m.MediaType.IsImage() {
			return idx.Image(m.Digest)
		}
	}
	return nil, errcode.New(errcode.ImagePullFailed, "the index has no %s image", s.platform.String()).With("reason", ReasonNoPlatform)
}
