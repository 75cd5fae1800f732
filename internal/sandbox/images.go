package sandbox

import (
	"context"
	"maps"
	"regexp"
	"strings"
	"sync"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/image"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/text"
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

// CheckImageRef returns nil if ref is an image reference as Docker users write them
// ("python:3.12-slim", "ghcr.io/org/img:tag", "localhost:5000/x@sha256:…"), else
// INVALID_ARGUMENT naming field and the syntax.
func CheckImageRef(field, ref string) error {
	if ref == "" || len(ref) > MaxImageRefLen || !imageRefRE.MatchString(ref) {
		return errcode.New(errcode.InvalidArgument, "%s %q is not an image reference: write NAME[:TAG] or NAME@sha256:<64 hex digits> "+
			"(e.g. python:3.12-slim, ghcr.io/org/image:tag; names are lowercase), at most %d characters, or use image %q",
			field, text.Truncate(ref, 128), MaxImageRefLen, image.Host)
	}
	if m := imageRefRE.FindStringSubmatch(ref); len(m[2]) > 255 {
		return errcode.New(errcode.InvalidArgument, "%s %q: the repository name is %d characters; at most 255 are allowed", field, text.Truncate(ref, 128), len(m[2]))
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
		return errcode.New(errcode.InvalidArgument, "%s %q must be NAME[:TAG] (e.g. my-template:v1), without a digest and not %q", field, text.Truncate(name, 128), image.Host)
	}
	return nil
}

// imageKind is the Capabilities.Images entry a runtime needs for image ref.
func imageKind(ref string) string {
	if ref == "" || ref == image.Host {
		return image.Host
	}
	return runtime.ImageOCI
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
		return nil, imageErr(err, "image %q could not be resolved", text.Truncate(ref, 128))
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
		return nil, imageErr(err, "the layers of image %q (%s) are not usable", text.Truncate(ref, 128), img.Digest)
	}
	if len(layers) > runtime.MaxRootfsLayers {
		return nil, errcode.New(errcode.InvalidArgument, "image %q has %d layers; at most %d are supported", text.Truncate(ref, 128), len(layers), runtime.MaxRootfsLayers)
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
		if !ok || i >= maxImageEnv || !ValidEnvName(k) || strings.ContainsRune(v, 0) || len(v) > maxValLen*4 {
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

// digestRef is ref pinned to digest: repository@digest.
func digestRef(ref, digest string) string {
	if i := strings.Index(ref, "@"); i >= 0 {
		ref = ref[:i]
	} else if i := strings.LastIndex(ref, ":"); i > strings.LastIndex(ref, "/") {
		ref = ref[:i]
	}
	return ref + "@" + digest
}
