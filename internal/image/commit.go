package image

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"

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
