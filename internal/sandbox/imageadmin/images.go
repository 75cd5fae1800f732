// Package imageadmin fronts the server's image cache (image.Cache, Config.Images) for the
// surfaces (REST, MCP, CLI), which never hold it themselves: list, inspect, pull, remove,
// prune, import, push, the cache's usage, and commit of a running sandbox's writable layer as
// a new image. It is a feature over the sandbox lifecycle core, reached through its
// sandbox.Core handle; what a create needs of an image (resolving and pinning it) stays in the
// core.
package imageadmin

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"regexp"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/image"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/sandboxid"
	"github.com/agentbox/agentbox/internal/text"
)

// Store is what the image calls read and write of durable state (sandbox.Store includes it).
type Store interface {
	// ImagesInUse returns the digests of the images live sandboxes use, with how many use each.
	ImagesInUse(ctx context.Context) (map[string]int, error)
	GetSandbox(ctx context.Context, id string) (sandbox.Sandbox, error)
	// UpdateSandbox writes sb (its Version one above the stored one) with event ev.
	UpdateSandbox(ctx context.Context, sb sandbox.Sandbox, ev sandbox.Event) error
}

// Service is the image admin calls. It is safe for concurrent use.
type Service struct {
	core  *sandbox.Core
	store Store
	cache image.Cache // nil: the server has no image cache
	log   *slog.Logger
}

// New returns the image calls over core's image cache (Config.Images), reading and writing st.
// It registers no hooks: the core never calls it.
func New(core *sandbox.Core, st Store) *Service {
	return &Service{core: core, store: st, cache: core.Config().Images, log: core.Log()}
}

var digestRE = regexp.MustCompile(`^(?:sha256:[0-9a-f]{64}|sha512:[0-9a-f]{128})$`)

// checkImageRefOrDigest accepts a reference or a bare digest (what Get, Remove and Push take).
func checkImageRefOrDigest(field, ref string) error {
	if digestRE.MatchString(ref) {
		return nil
	}
	return sandbox.CheckImageRef(field, ref)
}

// imageErr keeps a typed error as it is and makes an untyped one IMAGE_PULL_FAILED.
func imageErr(err error, format string, args ...any) error {
	if _, ok := errcode.As(err); ok {
		return err
	}
	return errcode.Wrap(errcode.ImagePullFailed, err, format+"; see the server log", args...)
}

// CheckImages returns nil if the server has an image cache, else UNSUPPORTED_OPERATION saying
// so (for a surface to refuse before it commits to a streamed reply).
func (s *Service) CheckImages() error {
	_, err := s.images()
	return err
}

// images returns the cache, or UNSUPPORTED_OPERATION when the server has none.
func (s *Service) images() (image.Cache, error) {
	if s.cache == nil {
		return nil, errcode.New(errcode.UnsupportedOp, "this server has no image cache: only image %q is available (agentbox serve and agentbox mcp have one under <state>/images)", image.Host)
	}
	return s.cache, nil
}

// ImagesInUse returns the digests of the images live sandboxes use, with how many use each
// (what the cache must never collect).
func (s *Service) ImagesInUse(ctx context.Context) (map[string]int, error) {
	return s.store.ImagesInUse(ctx)
}

// fillInUse sets imgs' InUse from the store's records.
func (s *Service) fillInUse(ctx context.Context, imgs []image.Image) error {
	used, err := s.store.ImagesInUse(ctx)
	if err != nil {
		return err
	}
	for i := range imgs {
		imgs[i].InUse = used[imgs[i].Digest]
	}
	return nil
}

// ListImages lists the cached images, each with how many live sandboxes use it.
func (s *Service) ListImages(ctx context.Context) ([]image.Image, error) {
	c, err := s.images()
	if err != nil {
		return nil, err
	}
	imgs, err := c.List(ctx)
	if err != nil {
		return nil, err
	}
	if err := s.fillInUse(ctx, imgs); err != nil {
		return nil, err
	}
	return imgs, nil
}

// InspectImage returns one cached image by reference or digest, never pulling.
func (s *Service) InspectImage(ctx context.Context, ref string) (image.Image, error) {
	if err := checkImageRefOrDigest("ref", ref); err != nil {
		return image.Image{}, err
	}
	c, err := s.images()
	if err != nil {
		return image.Image{}, err
	}
	img, err := c.Get(ctx, ref)
	if err != nil {
		return image.Image{}, err
	}
	one := []image.Image{*img}
	if err := s.fillInUse(ctx, one); err != nil {
		return image.Image{}, err
	}
	return one[0], nil
}

// PullImage pulls ref from its registry (even if a tag is cached: a moved tag is re-pinned;
// sandboxes keep their digests). progress may be nil.
func (s *Service) PullImage(ctx context.Context, ref string, progress image.ProgressFunc) (image.Image, error) {
	if err := sandbox.CheckImageRef("ref", ref); err != nil {
		return image.Image{}, err
	}
	c, err := s.images()
	if err != nil {
		return image.Image{}, err
	}
	img, err := c.Pull(ctx, ref, progress)
	if err != nil {
		return image.Image{}, imageErr(err, "pull of %q failed", text.Truncate(ref, 128))
	}
	return *img, nil
}

// RemoveImage untags ref, deleting the image when no name is left; an image a live sandbox uses
// is CONFLICT unless force (then only the name goes). It returns what was removed.
func (s *Service) RemoveImage(ctx context.Context, ref string, force bool) ([]string, error) {
	if err := checkImageRefOrDigest("ref", ref); err != nil {
		return nil, err
	}
	c, err := s.images()
	if err != nil {
		return nil, err
	}
	return c.Remove(ctx, ref, force)
}

// PruneImages removes what no live sandbox uses: untagged images and what the budget needs, or
// with all every unused image.
func (s *Service) PruneImages(ctx context.Context, all bool) (image.PruneReport, error) {
	c, err := s.images()
	if err != nil {
		return image.PruneReport{}, err
	}
	return c.Prune(ctx, all)
}

// ImportImages adds the images of a `docker save` or OCI-layout tarball read from r (the
// caller bounds r).
func (s *Service) ImportImages(ctx context.Context, r io.Reader, progress image.ProgressFunc) ([]image.Image, error) {
	c, err := s.images()
	if err != nil {
		return nil, err
	}
	return c.Import(ctx, r, progress)
}

// PushImage pushes the cached image name (a reference or digest) to ref in a registry.
func (s *Service) PushImage(ctx context.Context, name, ref string, progress image.ProgressFunc) error {
	if err := checkImageRefOrDigest("name", name); err != nil {
		return err
	}
	if err := sandbox.CheckImageRef("ref", ref); err != nil {
		return err
	}
	c, err := s.images()
	if err != nil {
		return err
	}
	if err := c.Push(ctx, name, ref, progress); err != nil {
		return imageErr(err, "push of %q to %q failed", text.Truncate(name, 128), text.Truncate(ref, 128))
	}
	return nil
}

// ImageUsage is the cache's size and budget.
func (s *Service) ImageUsage(ctx context.Context) (image.Usage, error) {
	c, err := s.images()
	if err != nil {
		return image.Usage{}, err
	}
	return c.Usage(ctx)
}

// CommitPauseBound bounds how long a commit keeps a sandbox paused: the read of its writable
// layer (at most image.DefaultMaxLayerBytes, 16 GiB; measured at about 0.4 s per 100 MiB). Past
// it the sandbox is resumed and the commit fails (nothing is made).
const CommitPauseBound = 5 * time.Minute

// resumeTimeout bounds the Resume that follows a commit's read, on a context of its own: it
// runs even when the caller has gone.
const resumeTimeout = 30 * time.Second

// Commit turns a running sandbox's writable root layer into a new image on top of its image,
// named name (NAME[:TAG], a local name; the tag defaults to latest), and records a "commit"
// event. The new image's config is its parent's: the sandbox's env, which may hold
// credentials, is never part of it. The sandbox is paused (runtime.Pauser: every process,
// its agent included, frozen) while its layer is read, as docker commit does by default, so
// no file is caught half-written; it is resumed once the layer is read, whatever happens, and
// at the latest after CommitPauseBound. Nothing calls the agent meanwhile. A runtime that
// cannot pause has its layer read live (the event says "paused: false"). A sandbox of the
// host image is UNSUPPORTED_OPERATION: commit needs a sandbox created from an OCI image.
func (s *Service) Commit(ctx context.Context, id, name string) (image.Image, error) {
	if err := sandboxid.Check(id); err != nil {
		return image.Image{}, err
	}
	if err := sandbox.CheckImageName("name", name); err != nil {
		return image.Image{}, err
	}
	c, err := s.images()
	if err != nil {
		return image.Image{}, err
	}
	unlock := s.core.Lock(id) // no destroy while the layer is read
	defer unlock()
	sb, err := s.store.GetSandbox(ctx, id)
	if err != nil {
		return image.Image{}, err
	}
	if sb.ImageDigest == "" {
		return image.Image{}, errcode.New(errcode.UnsupportedOp, "sandbox %s runs image %q: commit needs a sandbox created from an OCI image (sandbox_create with image, e.g. python:3.12-slim)", id, sb.Image).
			With("image", sb.Image)
	}
	if sb.State != sandbox.StateRunning {
		return image.Image{}, errcode.New(errcode.SandboxNotRunning, "sandbox %s is %s; only a running sandbox can be committed", id, sb.State).With("state", string(sb.State))
	}
	rt, err := s.core.RuntimeOf(sb)
	if err != nil {
		return image.Image{}, err
	}
	cm, ok := rt.(runtime.Committer)
	if !ok {
		return image.Image{}, errcode.New(errcode.UnsupportedOp, "runtime %s cannot read a sandbox's writable layer, so sandbox %s cannot be committed", sb.Runtime, id)
	}
	base, err := c.Get(ctx, sb.ImageDigest)
	if err != nil {
		return image.Image{}, err
	}
	layer, err := cm.WritableLayer(ctx, id)
	if err != nil {
		return image.Image{}, err
	}
	began := time.Now()
	p, err := s.pauseForCommit(ctx, rt, sb)
	if err != nil {
		return image.Image{}, err
	}
	defer p.resume()
	img, err := c.Commit(p.ctx, base, layer, name, nil)
	p.resume()
	if err != nil {
		if p.overran() {
			return image.Image{}, errcode.New(errcode.UnsupportedOp, "the writable layer of sandbox %s was not read within %s, the bound on how long a commit pauses a sandbox; "+
				"the sandbox was resumed and nothing was committed: remove what it need not keep (caches, build outputs) and retry", id, time.Duration(commitPauseBound.Load()))
		}
		if cerr := ctx.Err(); cerr != nil {
			return image.Image{}, cerr
		}
		return image.Image{}, err
	}
	pausedFor := p.duration()
	s.log.Info("sandbox committed", "sandbox_id", id, "name", name, "digest", img.Digest, "parent", base.Digest,
		"paused", p.paused, "paused_for", pausedFor, "took", time.Since(began))
	how := fmt.Sprintf("paused: true for %s", pausedFor.Round(time.Millisecond))
	if !p.paused {
		how = "paused: false, read live: " + p.why
	}
	sb, err = s.store.GetSandbox(ctx, id)
	if err != nil {
		s.log.Warn("record commit event", "sandbox_id", id, "err", err) // the image exists
		return *img, nil
	}
	sb.Version++
	sb.UpdatedAt = s.core.Now().Truncate(time.Millisecond)
	ev := sandbox.Event{SandboxID: id, Type: "commit", From: sb.State, To: sb.State, At: sb.UpdatedAt,
		Reason: text.Truncate(fmt.Sprintf("committed as %s (%s) on %s; %s", name, img.Digest, base.Digest, how), 1024)}
	if err := s.store.UpdateSandbox(ctx, sb, ev); err != nil {
		s.log.Warn("record commit event", "sandbox_id", id, "err", err) // the image exists
	} else {
		s.core.Published()
	}
	one := []image.Image{*img}
	if err := s.fillInUse(ctx, one); err != nil {
		return *img, nil
	}
	return one[0], nil
}
