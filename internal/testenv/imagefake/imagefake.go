// Package imagefake is an in-memory image.Cache for the control plane's and the surfaces'
// tests: no registry, no unpacking. Images are added by the test (Add) or "pulled" from a table
// of remote images (AddRemote); each layer is an empty directory under the cache's own
// directory, so a runtime that checks its Rootfs finds real paths. It counts pulls, outstanding
// leases and commits, and can be told to fail (SetFault), so that tests can assert that a failed
// resolve leaves nothing held and that every lease is released.
package imagefake

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/image"
	"github.com/agentbox/agentbox/internal/runtime"
)

// MaxImportBytes bounds what Import reads.
const MaxImportBytes = 64 << 20

// Cache is the fake. Its methods are safe for concurrent use.
type Cache struct {
	dir string

	mu      sync.Mutex
	images  map[string]*image.Image // by digest
	refs    map[string]string       // name → digest
	remote  map[string]image.Config // refs a Pull or Resolve can fetch
	pulls   int
	leases  int
	commits []Commit
	pushes  []string
	fault   func(op string, ref string) error
	// InUse, when set, is asked by Remove and Prune (the service's ImagesInUse).
	InUse func(ctx context.Context) (map[string]int, error)
}

// Commit is one call of Cache.Commit.
type Commit struct {
	Base  string // the base image's digest
	Layer runtime.WritableLayer
	Name  string
	// Files are the names found in Layer.Dir when it was committed.
	Files []string
}

var _ image.Cache = (*Cache)(nil)

// New returns an empty cache whose layer directories live under dir.
func New(dir string) *Cache {
	return &Cache{dir: dir, images: map[string]*image.Image{}, refs: map[string]string{}, remote: map[string]image.Config{}}
}

// SetFault makes every operation op ("resolve", "pull", "commit", "push", "import", "layers")
// call f first; a non-nil return is the operation's error. nil removes it.
func (c *Cache) SetFault(f func(op, ref string) error) {
	c.mu.Lock()
	c.fault = f
	c.mu.Unlock()
}

func (c *Cache) check(op, ref string) error {
	c.mu.Lock()
	f := c.fault
	c.mu.Unlock()
	if f != nil {
		return f(op, ref)
	}
	return nil
}

// Pulls is how many pulls (Resolve of an absent image, or Pull) happened.
func (c *Cache) Pulls() int { c.mu.Lock(); defer c.mu.Unlock(); return c.pulls }

// Leases is how many leases are outstanding.
func (c *Cache) Leases() int { c.mu.Lock(); defer c.mu.Unlock(); return c.leases }

// Commits returns the commits made so far.
func (c *Cache) Commits() []Commit { c.mu.Lock(); defer c.mu.Unlock(); return slices.Clone(c.commits) }

// Pushes returns "name → ref" of every push.
func (c *Cache) Pushes() []string { c.mu.Lock(); defer c.mu.Unlock(); return slices.Clone(c.pushes) }

// normal is the fake's normalisation: a missing tag is latest (no registry defaults).
func normal(ref string) string {
	if strings.HasPrefix(ref, "sha256:") || strings.Contains(ref, "@") {
		return ref
	}
	last := ref[strings.LastIndex(ref, "/")+1:]
	if !strings.Contains(last, ":") {
		return ref + ":latest"
	}
	return ref
}

// AddRemote makes ref pullable with cfg.
func (c *Cache) AddRemote(ref string, cfg image.Config) {
	c.mu.Lock()
	c.remote[normal(ref)] = cfg
	c.mu.Unlock()
}

// Add puts an image named ref with cfg (and nlayers layers) in the cache, as if pulled, and
// returns it. Adding ref again with another cfg moves the name to a new digest.
func (c *Cache) Add(ref string, cfg image.Config, nlayers int) (*image.Image, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.addLocked(normal(ref), cfg, nlayers, "")
}

func (c *Cache) addLocked(ref string, cfg image.Config, nlayers int, parent string) (*image.Image, error) {
	sum := sha256.Sum256(fmt.Appendf(nil, "%s|%v|%d|%s|%d", ref, cfg, nlayers, parent, len(c.images)))
	img := &image.Image{Ref: ref, Names: []string{ref}, Digest: fmt.Sprintf("sha256:%x", sum), ID: fmt.Sprintf("sha256:%x", sha256.Sum256(sum[:])),
		Platform: "linux/amd64", Config: cfg, Created: time.Now().UTC(), PulledAt: time.Now().UTC(), Parent: parent, Committed: parent != ""}
	if parent != "" {
		img.Layers = slices.Clone(c.images[parent].Layers)
	}
	for i := range nlayers {
		diff := fmt.Sprintf("%x", sha256.Sum256(fmt.Appendf(nil, "%s/%d", img.Digest, i)))
		if err := os.MkdirAll(filepath.Join(c.dir, "layers", diff), 0o755); err != nil {
			return nil, err
		}
		img.Layers = append(img.Layers, image.Layer{Digest: "sha256:" + diff, DiffID: "sha256:" + diff, Size: 1})
	}
	if old, ok := c.refs[ref]; ok && c.images[old] != nil {
		c.images[old].Names = slices.DeleteFunc(c.images[old].Names, func(n string) bool { return n == ref })
	}
	c.images[img.Digest] = img
	c.refs[ref] = img.Digest
	cp := *img
	return &cp, nil
}

func (c *Cache) lookup(ref string) *image.Image {
	if img := c.images[ref]; img != nil {
		return img
	}
	if i := strings.Index(ref, "@"); i >= 0 {
		return c.images[ref[i+1:]]
	}
	if d, ok := c.refs[normal(ref)]; ok {
		return c.images[d]
	}
	return nil
}

type lease struct {
	c    *Cache
	once sync.Once
}

func (l *lease) Release() {
	l.once.Do(func() {
		l.c.mu.Lock()
		l.c.leases--
		l.c.mu.Unlock()
	})
}

// Resolve returns the cached image or "pulls" a remote one (reporting each layer to progress);
// else IMAGE_NOT_FOUND.
func (c *Cache) Resolve(ctx context.Context, ref string, progress image.ProgressFunc) (*image.Image, image.Lease, error) {
	if err := c.check("resolve", ref); err != nil {
		return nil, nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	img := c.lookup(ref)
	if img == nil {
		cfg, ok := c.remote[normal(ref)]
		if !ok {
			return nil, nil, errcode.New(errcode.ImageNotFound, "image %q is not in the registry", ref)
		}
		c.pulls++
		var err error
		if img, err = c.addLocked(normal(ref), cfg, 2, ""); err != nil {
			return nil, nil, err
		}
		img = c.images[img.Digest]
		if progress != nil {
			for _, l := range img.Layers {
				progress(image.Progress{Ref: ref, Layer: l.Digest, Phase: "downloading", Done: 1, Total: 2})
				progress(image.Progress{Ref: ref, Layer: l.Digest, Phase: "done", Done: 2, Total: 2})
			}
		}
	}
	c.leases++
	cp := *img
	return &cp, &lease{c: c}, nil
}

// Pull "pulls" a remote ref (a new digest each time), reporting progress for two layers.
func (c *Cache) Pull(ctx context.Context, ref string, progress image.ProgressFunc) (*image.Image, error) {
	if err := c.check("pull", ref); err != nil {
		return nil, err
	}
	c.mu.Lock()
	cfg, ok := c.remote[normal(ref)]
	c.mu.Unlock()
	if !ok {
		return nil, errcode.New(errcode.ImageNotFound, "image %q is not in the registry", ref)
	}
	for i, l := range []string{"sha256:aaaa", "sha256:bbbb"} {
		for done := int64(0); done <= 100; done += 50 {
			if progress != nil {
				progress(image.Progress{Ref: ref, Layer: l, Phase: "downloading", Done: done * int64(i+1), Total: 100 * int64(i+1)})
			}
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pulls++
	img, err := c.addLocked(normal(ref), cfg, 2, "")
	if err == nil && progress != nil {
		progress(image.Progress{Ref: ref, Phase: "done", Done: 300, Total: 300})
	}
	return img, err
}

// Get returns a cached image by reference or digest.
func (c *Cache) Get(ctx context.Context, ref string) (*image.Image, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	img := c.lookup(ref)
	if img == nil {
		return nil, errcode.New(errcode.ImageNotFound, "image %q is not in the cache", ref)
	}
	cp := *img
	return &cp, nil
}

// LayerDirs returns the layers' directories.
func (c *Cache) LayerDirs(ctx context.Context, img *image.Image) ([]string, error) {
	if err := c.check("layers", img.Digest); err != nil {
		return nil, err
	}
	var dirs []string
	for _, l := range img.Layers {
		dirs = append(dirs, filepath.Join(c.dir, "layers", strings.TrimPrefix(l.DiffID, "sha256:")))
	}
	return dirs, nil
}

// List returns every image, by reference.
func (c *Cache) List(ctx context.Context) ([]image.Image, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]image.Image, 0, len(c.images))
	for _, img := range c.images {
		out = append(out, *img)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Ref < out[j].Ref })
	return out, nil
}

func (c *Cache) inUse(ctx context.Context) map[string]int {
	if c.InUse == nil {
		return nil
	}
	m, _ := c.InUse(ctx)
	return m
}

// Remove untags ref; an image in use is CONFLICT unless force.
func (c *Cache) Remove(ctx context.Context, ref string, force bool) ([]string, error) {
	used := c.inUse(ctx)
	c.mu.Lock()
	defer c.mu.Unlock()
	img := c.lookup(ref)
	if img == nil {
		return nil, errcode.New(errcode.ImageNotFound, "image %q is not in the cache", ref)
	}
	if used[img.Digest] > 0 && !force {
		return nil, errcode.New(errcode.Conflict, "image %q is used by %d live sandboxes", ref, used[img.Digest])
	}
	delete(c.refs, normal(ref))
	img.Names = slices.DeleteFunc(img.Names, func(n string) bool { return n == normal(ref) })
	removed := []string{normal(ref)}
	if len(img.Names) == 0 && used[img.Digest] == 0 {
		delete(c.images, img.Digest)
		removed = append(removed, img.Digest)
	}
	return removed, nil
}

// Prune removes every image not in use (all) or only untagged ones.
func (c *Cache) Prune(ctx context.Context, all bool) (image.PruneReport, error) {
	used := c.inUse(ctx)
	c.mu.Lock()
	defer c.mu.Unlock()
	var rep image.PruneReport
	for d, img := range c.images {
		if used[d] > 0 || (!all && len(img.Names) > 0) {
			continue
		}
		for _, n := range img.Names {
			delete(c.refs, n)
		}
		delete(c.images, d)
		rep.Removed = append(rep.Removed, d)
		rep.FreedBytes++
	}
	sort.Strings(rep.Removed)
	return rep, nil
}

// Import reads r (at most MaxImportBytes) and adds one image "imported:<n bytes>".
func (c *Cache) Import(ctx context.Context, r io.Reader, progress image.ProgressFunc) ([]image.Image, error) {
	if err := c.check("import", ""); err != nil {
		return nil, err
	}
	// Read in 1 MiB steps, reporting each (as a real import reports while it reads).
	var n int64
	for {
		m, err := io.CopyN(io.Discard, io.LimitReader(r, MaxImportBytes+1-n), 1<<20)
		n += m
		if progress != nil && m > 0 {
			progress(image.Progress{Phase: "reading", Done: n})
		}
		if err == io.EOF || n > MaxImportBytes {
			break
		}
		if err != nil {
			return nil, err
		}
	}
	if n > MaxImportBytes {
		return nil, errcode.New(errcode.FileTooLarge, "the tarball is over %d bytes", MaxImportBytes)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	img, err := c.addLocked(fmt.Sprintf("imported:%d", n), image.Config{}, 1, "")
	if err != nil {
		return nil, err
	}
	return []image.Image{*img}, nil
}

// Push records the push of a cached image.
func (c *Cache) Push(ctx context.Context, name, ref string, progress image.ProgressFunc) error {
	if err := c.check("push", ref); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.lookup(name) == nil {
		return errcode.New(errcode.ImageNotFound, "image %q is not in the cache", name)
	}
	c.pushes = append(c.pushes, name+" → "+ref)
	if progress != nil {
		progress(image.Progress{Ref: ref, Phase: "pushing", Done: 1, Total: 1})
	}
	return nil
}

// Commit adds an image of base's layers plus one, named name, recording the call and the
// files found in layer.Dir; like image.Store it calls image.LayerReadFrom(ctx) after the read.
func (c *Cache) Commit(ctx context.Context, base *image.Image, layer runtime.WritableLayer, name string, cfg *image.Config) (*image.Image, error) {
	if err := c.check("commit", name); err != nil {
		return nil, err
	}
	var files []string
	ents, err := os.ReadDir(layer.Dir)
	if err != nil {
		return nil, errcode.Wrap(errcode.Internal, err, "read the writable layer")
	}
	for _, e := range ents {
		files = append(files, e.Name())
	}
	if f := image.LayerReadFrom(ctx); f != nil {
		if err := f(); err != nil {
			return nil, err
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.images[base.Digest] == nil {
		return nil, errcode.New(errcode.ImageNotFound, "base image %s is not in the cache", base.Digest)
	}
	conf := c.images[base.Digest].Config
	if cfg != nil {
		conf = *cfg
	}
	img, err := c.addLocked(normal(name), conf, 1, base.Digest)
	if err != nil {
		return nil, err
	}
	c.commits = append(c.commits, Commit{Base: base.Digest, Layer: layer, Name: name, Files: files})
	return img, nil
}

// Usage counts images and layers.
func (c *Cache) Usage(ctx context.Context) (image.Usage, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, img := range c.images {
		n += len(img.Layers)
	}
	return image.Usage{Dir: c.dir, Images: len(c.images), Layers: n, Bytes: int64(n), BudgetBytes: 1 << 30}, nil
}
