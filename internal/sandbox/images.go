package sandbox

import (
	"context"
	"fmt"
	"io"
	"maps"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/image"
	"github.com/agentbox/agentbox/internal/runtime"
)

// Images: a sandbox's image is "host" (the default) or an OCI image reference, resolved through
// Config.Images (an image.Cache) before the sandbox's record is written, so that the record pins
// the image's manifest digest (Sandbox.ImageDigest) and a failed pull leaves nothing behind. The
// service also fronts the cache for the surfaces (REST, MCP, CLI), which never hold it
// themselves: ListImages and InspectImage add how many live sandboxes use each image.

// MaxImageRefLen bounds an image reference (Docker's bound on a name is 255; a tag adds 128
// and a digest 72).
const MaxImageRefLen = 512

// maxImageEnv bounds how many of an image config's Env entries a sandbox takes.
const maxImageEnv = 1024

// The grammar of a reference, as Docker's distribution/reference writes it.
var imageRefRE = func() *regexp.Regexp {
	const (
		alnum      = `[a-z0-9]+`
		sep        = `(?:[._]|__|-+)`
		component  = alnum + `(?:` + sep + alnum + `)*`
		domainPart = `(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])`
		domain     = `(?:` + domainPart + `(?:\.` + domainPart + `)*|\[[0-9a-fA-F:]+\])(?::[0-9]+)?`
		tag        = `[\w][\w.-]{0,127}`
		digest     = `sha256:[0-9a-f]{64}|sha512:[0-9a-f]{128}`
	)
	return regexp.MustCompile(`^(?:(` + domain + `)/)?(` + component + `(?:/` + component + `)*)(?::(` + tag + `))?(?:@(` + digest + `))?$`)
}()

var digestRE = regexp.MustCompile(`^(?:sha256:[0-9a-f]{64}|sha512:[0-9a-f]{128})$`)

// CheckImageRef returns nil if ref is an image reference as Docker users write them
// ("python:3.12-slim", "ghcr.io/org/img:tag", "localhost:5000/x@sha256:…"), else
// INVALID_ARGUMENT naming field and the syntax.
func CheckImageRef(field, ref string) error {
	if ref == "" || len(ref) > MaxImageRefLen || !imageRefRE.MatchString(ref) {
		return errcode.New(errcode.InvalidArgument, "%s %q is not an image reference: write NAME[:TAG] or NAME@sha256:<64 hex digits> "+
			"(e.g. python:3.12-slim, ghcr.io/org/image:tag; names are lowercase), at most %d characters, or use image %q",
			field, truncate(ref, 128), MaxImageRefLen, image.Host)
	}
	if m := imageRefRE.FindStringSubmatch(ref); len(m[2]) > 255 {
		return errcode.New(errcode.InvalidArgument, "%s %q: the repository name is %d characters; at most 255 are allowed", field, truncate(ref, 128), len(m[2]))
	}
	return nil
}

// CheckImageName returns nil if name is a local image name NAME[:TAG] for a commit (no digest:
// the commit makes the digest), else INVALID_ARGUMENT naming field.
func CheckImageName(field, name string) error {
	if err := CheckImageRef(field, name); err != nil {
		return err
	}
	if strings.Contains(name, "@") || name == image.Host {
		return errcode.New(errcode.InvalidArgument, "%s %q must be NAME[:TAG] (e.g. my-template:v1), without a digest and not %q", field, truncate(name, 128), image.Host)
	}
	return nil
}

// checkImageRefOrDigest accepts a reference or a bare digest (what Get, Remove and Push take).
func checkImageRefOrDigest(field, ref string) error {
	if digestRE.MatchString(ref) {
		return nil
	}
	return CheckImageRef(field, ref)
}

// imageKind is the Capabilities.Images entry a runtime needs for image ref.
func imageKind(ref string) string {
	if ref == "" || ref == image.Host {
		return image.Host
	}
	return runtime.ImageOCI
}

// CheckImages returns nil if the server has an image cache, else UNSUPPORTED_OPERATION saying
// so (for a surface to refuse before it commits to a streamed reply).
func (s *Service) CheckImages() error {
	_, err := s.images()
	return err
}

// images returns the cache, or UNSUPPORTED_OPERATION when the server has none.
func (s *Service) images() (image.Cache, error) {
	if s.cfg.Images == nil {
		return nil, errcode.New(errcode.UnsupportedOp, "this server has no image cache: only image %q is available (agentbox serve and agentbox mcp have one under <state>/images)", image.Host)
	}
	return s.cfg.Images, nil
}

type pullProgressKey struct{}

// WithPullProgress returns ctx carrying f: a Create on it that pulls its image reports the
// pull's progress to f (which must not block; a ProgressQueue's Put does not).
func WithPullProgress(ctx context.Context, f image.ProgressFunc) context.Context {
	return context.WithValue(ctx, pullProgressKey{}, f)
}

// PullProgressFrom returns the ProgressFunc WithPullProgress put in ctx, or nil.
func PullProgressFrom(ctx context.Context) image.ProgressFunc {
	f, _ := ctx.Value(pullProgressKey{}).(image.ProgressFunc)
	return f
}

// pinnedImage is an image resolved for a create: held by a lease until the sandbox's record
// names its digest.
type pinnedImage struct {
	img    *image.Image
	rootfs *runtime.Rootfs
	env    map[string]string
	lease  image.Lease
	once   sync.Once
}

func (p *pinnedImage) release() {
	if p != nil && p.lease != nil {
		p.once.Do(p.lease.Release)
	}
}

// resolveImage resolves ref (pulling it if the cache lacks it) and prepares what the runtime
// needs. On an error nothing is held.
func (s *Service) resolveImage(ctx context.Context, ref string) (_ *pinnedImage, err error) {
	c, err := s.images()
	if err != nil {
		return nil, err
	}
	img, lease, err := c.Resolve(ctx, ref, PullProgressFrom(ctx))
	if err != nil {
		return nil, imageErr(err, "image %q could not be resolved", truncate(ref, 128))
	}
	p := &pinnedImage{img: img, lease: lease}
	defer func() {
		if err != nil {
			p.release()
		}
	}()
	if err := ctx.Err(); err != nil {
		return nil, err // the caller hung up during the pull: nothing is recorded
	}
	layers, err := c.LayerDirs(ctx, img)
	if err != nil {
		return nil, imageErr(err, "the layers of image %q (%s) are not usable", truncate(ref, 128), img.Digest)
	}
	if len(layers) > runtime.MaxRootfsLayers {
		return nil, errcode.New(errcode.InvalidArgument, "image %q has %d layers; at most %d are supported", truncate(ref, 128), len(layers), runtime.MaxRootfsLayers)
	}
	p.rootfs = &runtime.Rootfs{Layers: layers, User: img.Config.User, Workdir: img.Config.WorkingDir}
	p.env = s.imageEnv(img)
	return p, nil
}

// imageErr keeps a typed error as it is and makes an untyped one IMAGE_PULL_FAILED.
func imageErr(err error, format string, args ...any) error {
	if _, ok := errcode.As(err); ok {
		return err
	}
	return errcode.Wrap(errcode.ImagePullFailed, err, format+"; see the server log", args...)
}

// imageEnv is the image config's Env (KEY=VAL) as a map: entries without '=', with a name that
// is not a variable's or with NUL are skipped, as are those past maxImageEnv.
func (s *Service) imageEnv(img *image.Image) map[string]string {
	env := map[string]string{}
	skipped := 0
	for i, kv := range img.Config.Env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || i >= maxImageEnv || !validEnvName(k) || strings.ContainsRune(v, 0) || len(v) > maxValLen*4 {
			skipped++
			continue
		}
		env[k] = v
	}
	if skipped > 0 {
		s.log.Warn("image env entries skipped", "image", img.Digest, "skipped", skipped)
	}
	return env
}

// specEnv is a sandbox's base environment: the image's Env, then (egress sandboxes) the proxy's
// variables, then the create's env, each winning over the ones before.
func specEnv(imgEnv, egressEnv, createEnv map[string]string) map[string]string {
	if len(imgEnv) == 0 && egressEnv == nil {
		return createEnv
	}
	env := maps.Clone(imgEnv)
	if env == nil {
		env = map[string]string{}
	}
	maps.Copy(env, egressEnv)
	maps.Copy(env, createEnv)
	return env
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
	if err := CheckImageRef("ref", ref); err != nil {
		return image.Image{}, err
	}
	c, err := s.images()
	if err != nil {
		return image.Image{}, err
	}
	img, err := c.Pull(ctx, ref, progress)
	if err != nil {
		return image.Image{}, imageErr(err, "pull of %q failed", truncate(ref, 128))
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
	if err := CheckImageRef("ref", ref); err != nil {
		return err
	}
	c, err := s.images()
	if err != nil {
		return err
	}
	if err := c.Push(ctx, name, ref, progress); err != nil {
		return imageErr(err, "push of %q to %q failed", truncate(name, 128), truncate(ref, 128))
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
	if err := checkID(id); err != nil {
		return image.Image{}, err
	}
	if err := CheckImageName("name", name); err != nil {
		return image.Image{}, err
	}
	c, err := s.images()
	if err != nil {
		return image.Image{}, err
	}
	unlock := s.lock(id) // no destroy while the layer is read
	defer unlock()
	sb, err := s.store.GetSandbox(ctx, id)
	if err != nil {
		return image.Image{}, err
	}
	if sb.ImageDigest == "" {
		return image.Image{}, errcode.New(errcode.UnsupportedOp, "sandbox %s runs image %q: commit needs a sandbox created from an OCI image (sandbox_create with image, e.g. python:3.12-slim)", id, sb.Image).
			With("image", sb.Image)
	}
	if sb.State != StateRunning {
		return image.Image{}, errcode.New(errcode.SandboxNotRunning, "sandbox %s is %s; only a running sandbox can be committed", id, sb.State).With("state", string(sb.State))
	}
	rt, err := s.runtimeOf(sb)
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
	sb.UpdatedAt = s.now().UTC().Truncate(time.Millisecond)
	ev := Event{SandboxID: id, Type: "commit", From: sb.State, To: sb.State, At: sb.UpdatedAt,
		Reason: truncate(fmt.Sprintf("committed as %s (%s) on %s; %s", name, img.Digest, base.Digest, how), 1024)}
	if err := s.store.UpdateSandbox(ctx, sb, ev); err != nil {
		s.log.Warn("record commit event", "sandbox_id", id, "err", err) // the image exists
	} else {
		s.bus.publish()
	}
	one := []image.Image{*img}
	if err := s.fillInUse(ctx, one); err != nil {
		return *img, nil
	}
	return one[0], nil
}

// MaxProgressPending bounds the distinct layers a ProgressQueue holds between takes.
const MaxProgressPending = 256

// ProgressQueue carries an image operation's progress from its callback (which must not block)
// to a consumer that may be slow (an HTTP stream, MCP notifications, a terminal): it keeps only
// the newest Progress of each layer not yet taken, in order of first arrival, so memory is
// bounded by the number of layers and a slow consumer sees fewer, newer reports, never stale
// ones. It is safe for concurrent use.
type ProgressQueue struct {
	mu      sync.Mutex
	pending map[string]int // layer → index in order
	order   []image.Progress
	wake    chan struct{}
	dropped int
}

// NewProgressQueue returns an empty queue.
func NewProgressQueue() *ProgressQueue {
	return &ProgressQueue{pending: map[string]int{}, wake: make(chan struct{}, 1)}
}

// Put records p (an image.ProgressFunc); it never blocks.
func (q *ProgressQueue) Put(p image.Progress) {
	q.mu.Lock()
	if i, ok := q.pending[p.Layer]; ok {
		q.order[i] = p
	} else if len(q.order) < MaxProgressPending {
		q.pending[p.Layer] = len(q.order)
		q.order = append(q.order, p)
	} else {
		q.dropped++
	}
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// Ready is signalled after a Put.
func (q *ProgressQueue) Ready() <-chan struct{} { return q.wake }

// Take returns what is pending, oldest layer first, and empties the queue.
func (q *ProgressQueue) Take() []image.Progress {
	q.mu.Lock()
	defer q.mu.Unlock()
	out := q.order
	q.order = nil
	clear(q.pending)
	return out
}

// Pump calls send with every report Put until stop is closed, then with what is left, and
// returns; send runs on the caller's goroutine only (never concurrently with itself).
func (q *ProgressQueue) Pump(stop <-chan struct{}, send func(image.Progress)) {
	for {
		select {
		case <-q.wake:
			for _, p := range q.Take() {
				send(p)
			}
		case <-stop:
			for _, p := range q.Take() {
				send(p)
			}
			return
		}
	}
}
