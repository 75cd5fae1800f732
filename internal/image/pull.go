package image

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/agentbox/agentbox/internal/errcode"
)

// Bounds of one layer's stream.
const (
	// MaxTrailingBytes bounds what a layer's stream may hold after its tar's end (padding).
	MaxTrailingBytes = 1 << 20
	// ProgressInterval is the least time between two progress reports of one layer.
	ProgressInterval = 250 * time.Millisecond
	// LayerStallTimeout: a layer download that receives nothing for this long is abandoned
	// (IMAGE_PULL_FAILED, reason unreachable).
	LayerStallTimeout = 60 * time.Second
)

// ReasonInvalidImage: the manifest or config is malformed (details.reason).
const ReasonInvalidImage = "invalid_image"

func (s *Store) pull(ctx context.Context, r parsedRef, progress ProgressFunc) (*Image, error) {
	v, err := s.pulls.do(ctx, r.name, progress, func(ctx context.Context, report ProgressFunc) (any, error) {
		return s.fetch(ctx, r, report)
	})
	if err != nil {
		return nil, pullError(ctx, r.name, err)
	}
	img := *v.(*Image)
	return &img, nil
}

// fetch pulls r from its registry: the manifest (picking the platform from an index), the
// config, then the layers.
func (s *Store) fetch(ctx context.Context, r parsedRef, report ProgressFunc) (*Image, error) {
	report(Progress{Ref: r.name, Phase: "resolving"})
	opts := s.remoteOpts(ctx)
	desc, err := remote.Get(r.ref, opts...)
	if err != nil {
		return nil, pullError(ctx, r.name, err)
	}
	if desc.Size > MaxManifestBytes || len(desc.Manifest) > MaxManifestBytes {
		return nil, tooLarge("the manifest of %q is more than %d bytes", r.name, MaxManifestBytes)
	}
	var img v1.Image
	switch {
	case desc.MediaType.IsIndex():
		idx, err := desc.ImageIndex()
		if err != nil {
			return nil, pullError(ctx, r.name, err)
		}
		im, err := idx.IndexManifest()
		if err != nil {
			return nil, pullError(ctx, r.name, err)
		}
		var child *v1.Descriptor
		var have []string
		for i, m := range im.Manifests {
			if m.Platform == nil {
				continue
			}
			have = append(have, m.Platform.String())
			if child == nil && m.Platform.Satisfies(s.platform) && m.MediaType.IsImage() {
				child = &im.Manifests[i]
			}
		}
		if child == nil {
			return nil, errcode.New(errcode.ImagePullFailed, "image %q has no %s variant (it has: %s)", r.name, s.platform.String(), strings.Join(have, ", ")).
				With("reason", ReasonNoPlatform).With("ref", r.name)
		}
		if img, err = remote.Image(r.ref.Context().Digest(child.Digest.String()), opts...); err != nil {
			return nil, pullError(ctx, r.name, err)
		}
	case desc.MediaType.IsImage():
		if img, err = desc.Image(); err != nil {
			return nil, pullError(ctx, r.name, err)
		}
	default:
		return nil, errcode.New(errcode.ImagePullFailed, "%q is a %s, not an image", r.name, desc.MediaType).With("reason", ReasonInvalidImage).With("ref", r.name)
	}
	var names []string
	if r.tag != "" {
		names = []string{r.name}
	}
	return s.addImage(ctx, img, r.name, names, report, nil)
}

func invalidImage(ref string, err error) error {
	return errcode.Wrap(errcode.ImagePullFailed, err, "image %q is malformed", ref).With("reason", ReasonInvalidImage).With("ref", ref)
}

// addImage brings img into the cache (its layers unpacked, its blobs kept) and names it.
func (s *Store) addImage(ctx context.Context, img v1.Image, ref string, names []string, report ProgressFunc, mutate func(*imageRec)) (*Image, error) {
	if report == nil {
		report = func(Progress) {}
	}
	rawMf, err := img.RawManifest()
	if err != nil {
		return nil, pullError(ctx, ref, err)
	}
	if len(rawMf) > MaxManifestBytes {
		return nil, tooLarge("the manifest of %q is more than %d bytes", ref, MaxManifestBytes)
	}
	dg, err := img.Digest()
	if err != nil {
		return nil, invalidImage(ref, err)
	}
	digest := dg.String()
	mt, err := img.MediaType()
	if err != nil {
		return nil, invalidImage(ref, err)
	}
	rawCfg, err := img.RawConfigFile()
	if err != nil {
		return nil, pullError(ctx, ref, err)
	}
	if len(rawCfg) > MaxConfigBytes {
		return nil, tooLarge("the config of %q is more than %d bytes", ref, MaxConfigBytes)
	}
	cfgName, err := img.ConfigName()
	if err != nil {
		return nil, invalidImage(ref, err)
	}
	if sum := sha256.Sum256(rawCfg); "sha256:"+hex.EncodeToString(sum[:]) != cfgName.String() {
		return nil, errcode.New(errcode.ImagePullFailed, "the config of %q does not match its digest %s", ref, cfgName).With("reason", ReasonDigestMismatch).With("ref", ref)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, invalidImage(ref, err)
	}
	mf, err := img.Manifest()
	if err != nil {
		return nil, invalidImage(ref, err)
	}
	if len(mf.Layers) != len(cf.RootFS.DiffIDs) {
		return nil, invalidImage(ref, fmt.Errorf("%d layers but %d diff ids", len(mf.Layers), len(cf.RootFS.DiffIDs)))
	}
	if len(mf.Layers) > MaxImageLayers {
		return nil, tooLarge("image %q has %d layers; at most %d are accepted", ref, len(mf.Layers), MaxImageLayers).With("ref", ref)
	}

	s.mu.Lock()
	if rec := s.idx.Images[digest]; rec != nil && s.completeLocked(rec) {
		s.addNamesLocked(rec, names...)
		err := s.saveLocked()
		out := s.imageLocked(rec)
		s.mu.Unlock()
		report(Progress{Ref: ref, Phase: "cached"})
		return &out, err
	}
	s.mu.Unlock()

	layers := make([]Layer, len(mf.Layers))
	pins := []string{digest, cfgName.String()}
	for i, d := range mf.Layers {
		layers[i] = Layer{Digest: d.Digest.String(), DiffID: cf.RootFS.DiffIDs[i].String(), Size: d.Size, MediaType: string(d.MediaType)}
		if d.Size < 0 || d.Size > s.opts.MaxLayerBytes {
			return nil, tooLarge("layer %s of %q is %d bytes; at most %d are accepted", d.Digest, ref, d.Size, s.opts.MaxLayerBytes).With("ref", ref)
		}
		pins = append(pins, layers[i].Digest, layers[i].DiffID)
	}
	s.pin(pins...)
	defer s.unpin(pins...)

	vls, err := img.Layers()
	if err != nil {
		return nil, pullError(ctx, ref, err)
	}
	if len(vls) != len(layers) {
		return nil, invalidImage(ref, fmt.Errorf("%d layers listed, %d in the manifest", len(vls), len(layers)))
	}
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg       sync.WaitGroup
		sem      = make(chan struct{}, MaxParallelLayers)
		errMu    sync.Mutex
		firstErr error
		total    int64
	)
	for i := range layers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case sem <- struct{}{}:
			case <-lctx.Done():
				return
			}
			defer func() { <-sem }()
			n, err := s.layer(lctx, ref, vls[i], layers[i], report)
			errMu.Lock()
			defer errMu.Unlock()
			total += n
			if err == nil && total > s.opts.MaxImageBytes {
				err = tooLarge("image %q's layers are more than %d bytes", ref, s.opts.MaxImageBytes).With("ref", ref)
			}
			if err != nil && firstErr == nil {
				firstErr = err
				cancel()
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return nil, pullError(ctx, ref, firstErr)
	}
	if err := ctx.Err(); err != nil {
		return nil, pullError(ctx, ref, err)
	}
	if err := s.writeBlob(digest, rawMf); err != nil {
		return nil, err
	}
	if err := s.writeBlob(cfgName.String(), rawCfg); err != nil {
		return nil, err
	}
	now := time.Now().UTC()
	plat := cf.OS + "/" + cf.Architecture
	if cf.Variant != "" {
		plat += "/" + cf.Variant
	}
	rec := &imageRec{MediaType: string(mt), Image: Image{
		Ref: ref, Digest: digest, ID: cfgName.String(), Platform: plat, Layers: layers,
		Config: Config{Env: cf.Config.Env, WorkingDir: cf.Config.WorkingDir, User: cf.Config.User,
			Entrypoint: cf.Config.Entrypoint, Cmd: cf.Config.Cmd, Labels: cf.Config.Labels},
		Created: cf.Created.Time.UTC(), PulledAt: now, LastUsed: now,
	}}
	if mutate != nil {
		mutate(rec)
	}
	s.mu.Lock()
	if len(s.idx.Images) >= MaxImages && s.idx.Images[digest] == nil {
		s.mu.Unlock()
		return nil, errcode.New(errcode.CapacityUnavailable, "the image cache holds %d images, its maximum; prune some", MaxImages)
	}
	if old := s.idx.Images[digest]; old != nil {
		rec.Names = old.Names
	}
	s.idx.Images[digest] = rec
	s.addNamesLocked(rec, names...)
	if len(names) == 0 {
		rec.Ref = ref
	}
	err = s.saveLocked()
	out := s.imageLocked(rec)
	s.mu.Unlock()
	if err != nil {
		return nil, err
	}
	report(Progress{Ref: ref, Phase: "done", Done: out.Size, Total: out.Size})
	s.collect(ctx)
	return &out, nil
}

// writeBlob stores a small blob (a manifest or config) already verified.
func (s *Store) writeBlob(digest string, b []byte) error {
	p := s.blobPath(digest)
	if _, err := os.Stat(p); err != nil {
		if err := writeFileAtomic(p, b); err != nil {
			return fmt.Errorf("image cache: %w", err)
		}
	}
	s.mu.Lock()
	s.idx.Blobs[digest] = int64(len(b))
	s.mu.Unlock()
	return nil
}

// layer brings one layer into the cache (one flight per blob digest) and returns its files'
// size.
func (s *Store) layer(ctx context.Context, ref string, vl v1.Layer, l Layer, report ProgressFunc) (int64, error) {
	s.mu.Lock()
	lr, haveLayer := s.idx.Layers[l.DiffID]
	_, haveBlob := s.idx.Blobs[l.Digest]
	s.mu.Unlock()
	if haveLayer && haveBlob {
		report(Progress{Ref: ref, Layer: l.Digest, Phase: "cached", Done: l.Size, Total: l.Size})
		return lr.Size, nil
	}
	v, err := s.layers.do(ctx, l.Digest, report, func(ctx context.Context, report ProgressFunc) (any, error) {
		return s.unpackLayer(ctx, ref, vl, l, report)
	})
	if err != nil {
		return 0, err
	}
	return v.(int64), nil
}

// srcReader records the source's error and reports progress.
type srcReader struct {
	r      io.Reader
	err    error
	n, max int64
	last   time.Time
	stall  *time.Timer
	report func(n int64)
}

func (r *srcReader) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	if n > 0 {
		r.stall.Reset(LayerStallTimeout)
	}
	r.n += int64(n)
	if r.n > r.max {
		return n, tooLarge("the layer is more than its manifest's %d bytes", r.max)
	}
	if err != nil && err != io.EOF {
		r.err = err
	}
	if now := time.Now(); now.Sub(r.last) >= ProgressInterval || err == io.EOF {
		r.last = now
		r.report(r.n)
	}
	return n, err
}

func (s *Store) unpackLayer(ctx context.Context, ref string, vl v1.Layer, l Layer, report ProgressFunc) (int64, error) {
	rc, err := vl.Compressed()
	if err != nil {
		return 0, pullError(ctx, ref, err)
	}
	defer rc.Close()
	stop := context.AfterFunc(ctx, func() { rc.Close() })
	defer stop()
	stall := time.AfterFunc(LayerStallTimeout, func() { rc.Close() })
	defer stall.Stop()

	blob, err := os.CreateTemp(s.path("tmp"), "blob-")
	if err != nil {
		return 0, err
	}
	defer func() {
		blob.Close()
		os.Remove(blob.Name())
	}()
	dir, err := os.MkdirTemp(s.path("tmp"), "layer-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir) // gone once renamed
	if err := os.Chmod(dir, 0o755); err != nil {
		return 0, err
	}
	src := &srcReader{r: rc, max: l.Size, stall: stall, report: func(n int64) {
		report(Progress{Ref: ref, Layer: l.Digest, Phase: "downloading", Done: n, Total: l.Size})
	}}
	bh := sha256.New()
	tee := io.TeeReader(src, io.MultiWriter(blob, bh))
	var dh hash.Hash = sha256.New()
	var stats unpackStats
	uerr := func() error {
		dr, err := decompress(tee)
		if err != nil {
			return unsafeLayer(l.Digest, "not a gzip, zstd or tar stream: %v", err)
		}
		defer dr.Close()
		ur := io.TeeReader(dr, dh)
		stats, err = unpackTar(ur, dir, s.opts.MaxLayerBytes, func(msg string, args ...any) { s.log.Info(msg, args...) })
		if err != nil {
			return err
		}
		n, err := io.Copy(io.Discard, io.LimitReader(ur, MaxTrailingBytes+1))
		if err != nil {
			return err
		}
		if n > MaxTrailingBytes {
			return unsafeLayer(l.Digest, "more than %d bytes after the tar's end", MaxTrailingBytes)
		}
		return nil
	}()
	// Read the compressed stream to its end: its digest decides what a failure was.
	if _, err := io.Copy(io.Discard, io.LimitReader(tee, MaxTrailingBytes+1)); err != nil && uerr == nil {
		uerr = err
	}
	if ctx.Err() != nil {
		return 0, pullError(ctx, ref, ctx.Err())
	}
	if src.err != nil {
		return 0, pullError(ctx, ref, src.err)
	}
	if got := "sha256:" + hex.EncodeToString(bh.Sum(nil)); got != l.Digest {
		return 0, errcode.New(errcode.ImagePullFailed, "layer %s of %q does not match its digest (got %s)", l.Digest, ref, got).
			With("reason", ReasonDigestMismatch).With("ref", ref).With("layer", l.Digest)
	}
	if uerr != nil {
		var ce *errcode.Error
		if errors.As(uerr, &ce) {
			ce.Details["ref"] = ref
			ce.Details["layer"] = l.Digest
			return 0, ce
		}
		return 0, fmt.Errorf("unpacking layer %s: %w", l.Digest, uerr)
	}
	if got := "sha256:" + hex.EncodeToString(dh.Sum(nil)); got != l.DiffID {
		return 0, errcode.New(errcode.ImagePullFailed, "layer %s of %q does not match its diff id %s (got %s)", l.Digest, ref, l.DiffID, got).
			With("reason", ReasonDigestMismatch).With("ref", ref).With("layer", l.Digest)
	}
	if err := blob.Sync(); err != nil {
		return 0, err
	}
	report(Progress{Ref: ref, Layer: l.Digest, Phase: "unpacking", Done: l.Size, Total: l.Size})
	if stats.Skipped > 0 || stats.Clamped > 0 {
		s.log.Info("image layer: entries neutralised", "layer", l.Digest, "skipped", stats.Skipped, "ids_clamped", stats.Clamped)
	}
	return stats.Bytes, s.installLayer(blob.Name(), dir, l, stats)
}

// installLayer renames a verified blob and unpacked directory into the cache.
func (s *Store) installLayer(blobTmp, dirTmp string, l Layer, stats unpackStats) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.idx.Blobs[l.Digest]; !ok {
		if err := os.Rename(blobTmp, s.blobPath(l.Digest)); err != nil {
			return err
		}
		fi, err := os.Stat(s.blobPath(l.Digest))
		if err != nil {
			return err
		}
		s.idx.Blobs[l.Digest] = fi.Size()
	}
	if _, ok := s.idx.Layers[l.DiffID]; !ok {
		if err := os.Rename(dirTmp, s.layerDir(l.DiffID)); err != nil {
			return err
		}
		s.idx.Layers[l.DiffID] = layerRec{Size: stats.Bytes, DiskBytes: stats.DiskBytes, Entries: stats.Entries}
	}
	return nil
}
