package image

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/agentbox/agentbox/internal/errcode"
)

// Bounds of the cache's bookkeeping.
const (
	// MaxManifestBytes bounds a manifest or index fetched or imported; MaxConfigBytes a config.
	MaxManifestBytes = 4 << 20
	MaxConfigBytes   = 8 << 20
	// MaxImageLayers bounds an image's layers (runtime.MaxRootfsLayers is the runtime's bound).
	MaxImageLayers = 127
	// MaxParallelLayers is how many layers of one image download and unpack at once.
	MaxParallelLayers = 3
	// MaxImages bounds the images in the cache; MaxNamesPerImage the names of one image.
	MaxImages        = 4096
	MaxNamesPerImage = 256
	// LastUsedResolution: an image's LastUsed is written at most this often.
	LastUsedResolution = time.Minute
	// MaxRefBytes bounds an image reference.
	MaxRefBytes = 1024
)

const indexVersion = 1

// index is index.json: every image, name and unpacked layer of the cache.
type index struct {
	Version int                  `json:"version"`
	Images  map[string]*imageRec `json:"images"` // manifest digest →
	Refs    map[string]string    `json:"refs"`   // normalised name → manifest digest
	Layers  map[string]layerRec  `json:"layers"` // diff id → the unpacked layer
	Blobs   map[string]int64     `json:"blobs"`  // digest → size
}

type imageRec struct {
	Image
	MediaType string `json:"manifest_media_type"`
}

type layerRec struct {
	Size      int64 `json:"size"`       // its files' bytes
	DiskBytes int64 `json:"disk_bytes"` // an estimate of what the directory takes
	Entries   int   `json:"entries"`
}

// Store is the image cache in a directory (<state>/images). It implements Cache.
type Store struct {
	dir      string
	opts     Options
	log      *slog.Logger
	keychain authn.Keychain
	platform v1.Platform

	mu     sync.Mutex
	idx    *index
	leases map[string]int // image digest → leases
	pins   map[string]int // layer diff ids and blob digests an operation in flight needs
	pulls  flights        // by reference
	layers flights        // by diff id
	// gcMu serialises collections.
	gcMu sync.Mutex
}

var _ Cache = (*Store)(nil)

// Open opens (creating) the cache in dir: it wipes tmp/ (what a killed pull left), loads
// index.json, and removes unpacked layers and blobs the index does not name.
func Open(dir string, opts Options) (*Store, error) {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.MaxImageBytes <= 0 {
		opts.MaxImageBytes = DefaultMaxImageBytes
	}
	if opts.MaxLayerBytes <= 0 {
		opts.MaxLayerBytes = DefaultMaxLayerBytes
	}
	if opts.BudgetBytes < 0 {
		return nil, errcode.New(errcode.InvalidArgument, "image cache budget is %d bytes; it must be 0 (no bound) or more", opts.BudgetBytes)
	}
	plat := v1.Platform{OS: "linux", Architecture: goruntime.GOARCH}
	if goruntime.GOARCH == "arm" {
		plat.Variant = "v7"
	}
	if opts.Platform != "" {
		p, err := v1.ParsePlatform(opts.Platform)
		if err != nil {
			return nil, errcode.Wrap(errcode.InvalidArgument, err, "image platform %q is not valid: expected OS/ARCH[/VARIANT] (linux/amd64)", opts.Platform)
		}
		plat = *p
	}
	s := &Store{dir: dir, opts: opts, log: opts.Logger, platform: plat,
		leases: map[string]int{}, pins: map[string]int{}}
	s.keychain = authn.NewMultiKeychain(staticKeychain(opts.Auth), authn.DefaultKeychain)
	for _, d := range []string{dir, s.path("blobs", "sha256"), s.path("layers")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("image cache: %w", err)
		}
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, fmt.Errorf("image cache: %w", err)
	}
	if err := os.RemoveAll(s.path("tmp")); err != nil {
		return nil, fmt.Errorf("image cache: wiping tmp: %w", err)
	}
	if err := os.Mkdir(s.path("tmp"), 0o700); err != nil {
		return nil, fmt.Errorf("image cache: %w", err)
	}
	idx, err := s.load()
	if err != nil {
		return nil, err
	}
	s.idx = idx
	s.mu.Lock()
	defer s.mu.Unlock()
	// Unpacked layers renamed in by a pull the index never recorded, and their blobs: gone.
	if ents, err := os.ReadDir(s.path("layers")); err == nil {
		for _, e := range ents {
			if _, ok := s.idx.Layers["sha256:"+e.Name()]; !ok {
				s.log.Info("image cache: removing a layer the index does not name", "layer", e.Name())
				s.removeLayerDirLocked("sha256:" + e.Name())
			}
		}
	}
	for d := range s.idx.Layers {
		if _, err := os.Lstat(s.layerDir(d)); err != nil {
			delete(s.idx.Layers, d)
		}
	}
	if ents, err := os.ReadDir(s.path("blobs", "sha256")); err == nil {
		for _, e := range ents {
			if _, ok := s.idx.Blobs["sha256:"+e.Name()]; !ok {
				_ = os.Remove(s.path("blobs", "sha256", e.Name()))
			}
		}
	}
	// An image whose layers or blobs are gone is gone.
	for dg, rec := range s.idx.Images {
		if !s.completeLocked(rec) {
			s.log.Warn("image cache: dropping an incomplete image", "digest", dg)
			s.dropImageLocked(dg)
		}
	}
	s.sweepLocked()
	return s, s.saveLocked()
}

// Dir is the cache's directory.
func (s *Store) Dir() string { return s.dir }

func (s *Store) path(el ...string) string { return filepath.Join(append([]string{s.dir}, el...)...) }

func (s *Store) layerDir(diffID string) string {
	return s.path("layers", strings.TrimPrefix(diffID, "sha256:"))
}

func (s *Store) blobPath(digest string) string {
	return s.path("blobs", "sha256", strings.TrimPrefix(digest, "sha256:"))
}

func (s *Store) load() (*index, error) {
	idx := &index{Version: indexVersion}
	b, err := os.ReadFile(s.path("index.json"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("image cache: %w", err)
	}
	if err == nil {
		if err := json.Unmarshal(b, idx); err != nil {
			return nil, fmt.Errorf("image cache: index.json: %w", err)
		}
	}
	if idx.Images == nil {
		idx.Images = map[string]*imageRec{}
	}
	if idx.Refs == nil {
		idx.Refs = map[string]string{}
	}
	if idx.Layers == nil {
		idx.Layers = map[string]layerRec{}
	}
	if idx.Blobs == nil {
		idx.Blobs = map[string]int64{}
	}
	return idx, nil
}

// saveLocked writes index.json atomically (temp file, fsync, rename, fsync of the directory).
func (s *Store) saveLocked() error {
	b, err := json.Marshal(s.idx)
	if err != nil {
		return err
	}
	return writeFileAtomic(s.path("index.json"), b)
}

func writeFileAtomic(path string, b []byte) error {
	tmp := path + ".tmp-" + randHex()
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err = f.Write(b); err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		d.Sync()
		d.Close()
	}
	return nil
}

func randHex() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// completeLocked reports whether every file rec needs is in the cache.
func (s *Store) completeLocked(rec *imageRec) bool {
	if _, ok := s.idx.Blobs[rec.Digest]; !ok {
		return false
	}
	if _, ok := s.idx.Blobs[rec.ID]; !ok {
		return false
	}
	for _, l := range rec.Layers {
		if _, ok := s.idx.Layers[l.DiffID]; !ok {
			return false
		}
		if _, ok := s.idx.Blobs[l.Digest]; !ok {
			return false
		}
	}
	return true
}

// dropImageLocked removes an image's record and names (not its files: sweepLocked does).
func (s *Store) dropImageLocked(digest string) {
	rec := s.idx.Images[digest]
	delete(s.idx.Images, digest)
	if rec != nil {
		for _, n := range rec.Names {
			if s.idx.Refs[n] == digest {
				delete(s.idx.Refs, n)
			}
		}
	}
}

// sweepLocked removes unpacked layers and blobs no image references and no operation in
// flight pins; it returns the bytes freed.
func (s *Store) sweepLocked() int64 {
	layers, blobs := map[string]bool{}, map[string]bool{}
	for _, rec := range s.idx.Images {
		blobs[rec.Digest], blobs[rec.ID] = true, true
		for _, l := range rec.Layers {
			layers[l.DiffID], blobs[l.Digest] = true, true
		}
	}
	var freed int64
	for d, l := range s.idx.Layers {
		if !layers[d] && s.pins[d] == 0 {
			freed += l.DiskBytes
			s.removeLayerDirLocked(d)
			delete(s.idx.Layers, d)
		}
	}
	for d, n := range s.idx.Blobs {
		if !blobs[d] && s.pins[d] == 0 {
			freed += n
			os.Remove(s.blobPath(d))
			delete(s.idx.Blobs, d)
		}
	}
	return freed
}

// removeLayerDirLocked moves a layer's directory to tmp/ (so a crash never leaves half a
// layer under layers/) and removes it.
func (s *Store) removeLayerDirLocked(diffID string) {
	dst := s.path("tmp", "rm-"+randHex())
	if err := os.Rename(s.layerDir(diffID), dst); err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			s.log.Warn("image cache: removing a layer", "layer", diffID, "err", err)
		}
		return
	}
	if err := os.RemoveAll(dst); err != nil {
		s.log.Warn("image cache: removing a layer", "layer", diffID, "err", err)
	}
}

func (s *Store) pin(keys ...string) {
	s.mu.Lock()
	for _, k := range keys {
		s.pins[k]++
	}
	s.mu.Unlock()
}

func (s *Store) unpin(keys ...string) {
	s.mu.Lock()
	for _, k := range keys {
		if s.pins[k]--; s.pins[k] <= 0 {
			delete(s.pins, k)
		}
	}
	s.mu.Unlock()
}

// imageLocked returns a copy of the image with its disk size filled in.
func (s *Store) imageLocked(rec *imageRec) Image {
	img := rec.Image
	img.Names = slices.Clone(rec.Names)
	img.Layers = slices.Clone(rec.Layers)
	img.DiskBytes = s.idx.Blobs[rec.Digest] + s.idx.Blobs[rec.ID]
	img.Size = 0
	for _, l := range rec.Layers {
		img.DiskBytes += s.idx.Blobs[l.Digest] + s.idx.Layers[l.DiffID].DiskBytes
		img.Size += s.idx.Layers[l.DiffID].Size
	}
	if len(img.Names) > 0 && !slices.Contains(img.Names, img.Ref) {
		img.Ref = img.Names[0]
	}
	return img
}

// lookupLocked finds an image by a parsed reference: a digest (bare or name@digest) or a name.
func (s *Store) lookupLocked(r parsedRef) *imageRec {
	if r.digest != "" {
		return s.idx.Images[r.digest]
	}
	if d, ok := s.idx.Refs[r.name]; ok {
		return s.idx.Images[d]
	}
	return nil
}

// Get returns a cached image by reference or digest; IMAGE_NOT_FOUND if absent.
func (s *Store) Get(ctx context.Context, refOrDigest string) (*Image, error) {
	r, err := s.parse(refOrDigest)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	rec := s.lookupLocked(r)
	if rec == nil {
		return nil, notCached(refOrDigest)
	}
	img := s.imageLocked(rec)
	return &img, nil
}

func notCached(ref string) error {
	return errcode.New(errcode.ImageNotFound, "image %q is not in the cache; pull it first", ref).With("ref", ref)
}

// LayerDirs returns img's unpacked layer directories, lowest first, and marks it used.
func (s *Store) LayerDirs(ctx context.Context, img *Image) ([]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rec := s.idx.Images[img.Digest]
	if rec == nil || !s.completeLocked(rec) {
		return nil, notCached(img.Digest)
	}
	dirs := make([]string, len(rec.Layers))
	for i, l := range rec.Layers {
		dirs[i] = s.layerDir(l.DiffID)
	}
	s.touchLocked(rec)
	return dirs, nil
}

// touchLocked marks rec used now, writing the index at most once per LastUsedResolution.
func (s *Store) touchLocked(rec *imageRec) {
	now := time.Now().UTC()
	if now.Sub(rec.LastUsed) < LastUsedResolution {
		return
	}
	rec.LastUsed = now
	if err := s.saveLocked(); err != nil {
		s.log.Warn("image cache: writing the index", "err", err)
	}
}

// List returns every cached image, by reference.
func (s *Store) List(ctx context.Context) ([]Image, error) {
	inUse := s.inUse(ctx)
	s.mu.Lock()
	out := make([]Image, 0, len(s.idx.Images))
	for _, rec := range s.idx.Images {
		img := s.imageLocked(rec)
		img.InUse = inUse[rec.Digest]
		out = append(out, img)
	}
	s.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if out[i].Ref != out[j].Ref {
			return out[i].Ref < out[j].Ref
		}
		return out[i].Digest < out[j].Digest
	})
	return out, nil
}

// inUse asks Options.InUse; on its failure, it logs and returns nil (callers that collect
// treat a failure as "everything is in use").
func (s *Store) inUse(ctx context.Context) map[string]int {
	if s.opts.InUse == nil {
		return map[string]int{}
	}
	m, err := s.opts.InUse(ctx)
	if err != nil {
		s.log.Warn("image cache: listing images in use", "err", err)
		return nil
	}
	if m == nil {
		m = map[string]int{}
	}
	return m
}

type lease struct {
	s      *Store
	digest string
	once   sync.Once
}

func (l *lease) Release() {
	l.once.Do(func() {
		l.s.mu.Lock()
		if l.s.leases[l.digest]--; l.s.leases[l.digest] <= 0 {
			delete(l.s.leases, l.digest)
		}
		l.s.mu.Unlock()
	})
}

// Resolve returns ref's image, pulling it if the cache has neither the digest nor the tag.
func (s *Store) Resolve(ctx context.Context, ref string, progress ProgressFunc) (*Image, Lease, error) {
	r, err := s.parse(ref)
	if err != nil {
		return nil, nil, err
	}
	for attempt := 0; ; attempt++ {
		s.mu.Lock()
		if rec := s.lookupLocked(r); rec != nil && s.completeLocked(rec) {
			s.leases[rec.Digest]++
			s.touchLocked(rec)
			img := s.imageLocked(rec)
			s.mu.Unlock()
			if progress != nil {
				progress(Progress{Ref: r.name, Phase: "cached"})
			}
			return &img, &lease{s: s, digest: rec.Digest}, nil
		}
		s.mu.Unlock()
		if r.local {
			return nil, nil, notCached(ref)
		}
		if attempt == 2 { // collected twice between its pull and its lease: the budget is too small
			return nil, nil, errcode.New(errcode.CapacityUnavailable, "image %q does not fit the image cache's budget of %d bytes", ref, s.opts.BudgetBytes)
		}
		if _, err := s.pull(ctx, r, progress); err != nil {
			return nil, nil, err
		}
	}
}

// Pull fetches ref from its registry even if the tag is cached.
func (s *Store) Pull(ctx context.Context, ref string, progress ProgressFunc) (*Image, error) {
	r, err := s.parse(ref)
	if err != nil {
		return nil, err
	}
	if r.local {
		return nil, errcode.New(errcode.InvalidArgument, "image %q is a bare digest: pull needs a name (NAME@sha256:…)", ref)
	}
	return s.pull(ctx, r, progress)
}

// Usage returns the cache's size and budget.
func (s *Store) Usage(ctx context.Context) (Usage, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return Usage{Dir: s.dir, Images: len(s.idx.Images), Layers: len(s.idx.Layers), Bytes: s.bytesLocked(), BudgetBytes: s.opts.BudgetBytes}, nil
}

func (s *Store) bytesLocked() int64 {
	var n int64
	for _, b := range s.idx.Blobs {
		n += b
	}
	for _, l := range s.idx.Layers {
		n += l.DiskBytes
	}
	return n
}

// Remove untags ref, deleting the image when no name is left (or ref is its digest).
func (s *Store) Remove(ctx context.Context, ref string, force bool) ([]string, error) {
	r, err := s.parse(ref)
	if err != nil {
		return nil, err
	}
	inUse := s.inUse(ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	rec := s.lookupLocked(r)
	if rec == nil {
		return nil, notCached(ref)
	}
	used := s.leases[rec.Digest]
	if inUse == nil {
		used++ // unknown: treat as used
	} else {
		used += inUse[rec.Digest]
	}
	var removed []string
	byName := r.digest == ""
	if used > 0 && (!force || !byName) {
		if !force {
			return nil, errcode.New(errcode.Conflict, "image %q is used by %d sandboxes; remove them first, or force to remove only its name", ref, used).With("in_use", used)
		}
		return nil, errcode.New(errcode.Conflict, "image %q is used by %d sandboxes; it cannot be removed by digest while they live", ref, used).With("in_use", used)
	}
	if byName {
		rec.Names = slices.DeleteFunc(rec.Names, func(n string) bool { return n == r.name })
		delete(s.idx.Refs, r.name)
		removed = append(removed, r.name)
	}
	if used == 0 && (!byName || len(rec.Names) == 0) {
		removed = append(removed, rec.Names...)
		s.dropImageLocked(rec.Digest)
		removed = append(removed, rec.Digest)
		s.sweepLocked()
	}
	return removed, s.saveLocked()
}

// Prune removes every image nothing uses (all) or only untagged ones, then what the budget
// needs, then unreferenced layers and blobs.
func (s *Store) Prune(ctx context.Context, all bool) (PruneReport, error) {
	inUse := s.inUse(ctx)
	s.gcMu.Lock()
	defer s.gcMu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	before := s.bytesLocked()
	rep := PruneReport{Removed: []string{}, BudgetBytes: s.opts.BudgetBytes}
	if inUse != nil {
		for dg, rec := range s.idx.Images {
			if inUse[dg] > 0 || s.leases[dg] > 0 || s.pins[dg] > 0 || (!all && len(rec.Names) > 0) {
				continue
			}
			rep.Removed = append(rep.Removed, nameOf(rec))
			s.dropImageLocked(dg)
		}
		rep.Removed = append(rep.Removed, s.budgetLocked(inUse)...)
	}
	s.sweepLocked()
	rep.CacheBytes = s.bytesLocked()
	rep.FreedBytes = before - rep.CacheBytes
	sort.Strings(rep.Removed)
	return rep, s.saveLocked()
}

func nameOf(rec *imageRec) string {
	if len(rec.Names) > 0 {
		return rec.Names[0]
	}
	return rec.Digest
}

// budgetLocked removes images nothing uses, least recently used first, until the cache is
// within its budget.
func (s *Store) budgetLocked(inUse map[string]int) []string {
	if s.opts.BudgetBytes <= 0 || inUse == nil {
		return nil
	}
	var removed []string
	s.sweepLocked()
	if s.bytesLocked() <= s.opts.BudgetBytes {
		return nil
	}
	cands := make([]*imageRec, 0, len(s.idx.Images))
	for dg, rec := range s.idx.Images {
		if inUse[dg] == 0 && s.leases[dg] == 0 && s.pins[dg] == 0 {
			cands = append(cands, rec)
		}
	}
	sort.Slice(cands, func(i, j int) bool { return lastUsed(cands[i]).Before(lastUsed(cands[j])) })
	for _, rec := range cands {
		if s.bytesLocked() <= s.opts.BudgetBytes {
			break
		}
		s.log.Info("image cache: collecting an image past the budget", "image", nameOf(rec), "budget_bytes", s.opts.BudgetBytes)
		removed = append(removed, nameOf(rec))
		s.dropImageLocked(rec.Digest)
		s.sweepLocked()
	}
	return removed
}

func lastUsed(rec *imageRec) time.Time {
	if rec.LastUsed.After(rec.PulledAt) {
		return rec.LastUsed
	}
	return rec.PulledAt
}

// collect keeps the cache within its budget (after an image was added).
func (s *Store) collect(ctx context.Context) {
	if s.opts.BudgetBytes <= 0 {
		return
	}
	inUse := s.inUse(ctx)
	s.gcMu.Lock()
	defer s.gcMu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if removed := s.budgetLocked(inUse); len(removed) > 0 {
		if err := s.saveLocked(); err != nil {
			s.log.Warn("image cache: writing the index", "err", err)
		}
	}
}

// addNamesLocked points names at digest (moving them off any other image).
func (s *Store) addNamesLocked(rec *imageRec, names ...string) {
	for _, n := range names {
		if n == "" {
			continue
		}
		if old, ok := s.idx.Refs[n]; ok && old != rec.Digest {
			if o := s.idx.Images[old]; o != nil {
				o.Names = slices.DeleteFunc(o.Names, func(x string) bool { return x == n })
			}
		}
		s.idx.Refs[n] = rec.Digest
		if !slices.Contains(rec.Names, n) && len(rec.Names) < MaxNamesPerImage {
			rec.Names = append(rec.Names, n)
		}
		rec.Ref = n
	}
}
