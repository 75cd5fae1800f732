package mcpserver

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/image"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// ImageBackend is what the image tools need from the control plane (Options.Images).
type ImageBackend interface {
	ListImages(ctx context.Context) ([]image.Image, error)
	// PullImage pulls ref; progress (if non-nil) gets reports and must not block.
	PullImage(ctx context.Context, ref string, progress image.ProgressFunc) (image.Image, error)
	Commit(ctx context.Context, id, name string) (image.Image, error)
}

// MaxImageList bounds image_list's reply.
const MaxImageList = 1000

// ImageInfo is an image as the image tools show it.
type ImageInfo struct {
	Ref        string    `json:"ref" jsonschema:"The reference it was pulled, imported or committed as, normalised (docker.io/library/python:3.12-slim)."`
	Names      []string  `json:"names,omitempty" jsonschema:"Every reference that names it."`
	Digest     string    `json:"digest" jsonschema:"The manifest digest (sha256:…): what a sandbox created from it pins. Pass it as image to create from exactly this image."`
	Platform   string    `json:"platform,omitempty" jsonschema:"os/arch, e.g. linux/amd64."`
	Layers     int       `json:"layers" jsonschema:"How many layers it has."`
	SizeBytes  int64     `json:"size_bytes" jsonschema:"Unpacked size of its layers."`
	User       string    `json:"user,omitempty" jsonschema:"The user commands run as unless exec names one (the image config's User)."`
	WorkingDir string    `json:"working_dir,omitempty" jsonschema:"The default working directory (the image config's WorkingDir)."`
	Created    time.Time `json:"created,omitzero" jsonschema:"When the image was built."`
	LastUsed   time.Time `json:"last_used,omitzero" jsonschema:"When a sandbox was last created from it."`
	Committed  bool      `json:"committed,omitempty" jsonschema:"Made by sandbox_commit."`
	Parent     string    `json:"parent,omitempty" jsonschema:"For a committed image, the digest of the image it was committed on."`
	InUse      int       `json:"in_use" jsonschema:"How many live sandboxes use it (such an image is never collected)."`
}

func imageInfo(img image.Image) ImageInfo {
	return ImageInfo{Ref: img.Ref, Names: img.Names, Digest: img.Digest, Platform: img.Platform, Layers: len(img.Layers),
		SizeBytes: img.Size, User: img.Config.User, WorkingDir: img.Config.WorkingDir, Created: img.Created,
		LastUsed: img.LastUsed, Committed: img.Committed, Parent: img.Parent, InUse: img.InUse}
}

// ImageListOut is image_list's reply.
type ImageListOut struct {
	Images  []ImageInfo `json:"images" jsonschema:"The cached images, by reference."`
	Count   int         `json:"count" jsonschema:"How many images are listed."`
	Omitted int         `json:"omitted,omitempty" jsonschema:"Images left out past the bound of 1000."`
}

// ImagePullIn is image_pull's argument.
type ImagePullIn struct {
	Ref string `json:"ref" jsonschema:"An image reference as Docker users write it: python:3.12-slim, ghcr.io/org/image:tag, name@sha256:<64 hex>. Docker Hub is the default registry; a tag defaults to latest."`
}

// CommitIn is sandbox_commit's arguments.
type CommitIn struct {
	SandboxID string `json:"sandbox_id" jsonschema:"The sandbox to commit (created from an OCI image, running)."`
	Name      string `json:"name" jsonschema:"The new image's local name, NAME[:TAG] (lowercase; tag latest by default), e.g. my-env:v1. Create from it with sandbox_create image."`
}

// CommitOut is sandbox_commit's reply.
type CommitOut struct {
	SandboxID string    `json:"sandbox_id" jsonschema:"The sandbox committed."`
	Image     ImageInfo `json:"image" jsonschema:"The new image."`
}

func (s *Server) addImageTools() {
	addTool(s, &mcp.Tool{
		Name:  "image_list",
		Title: "List cached images",
		Description: `List the OCI images in the server's cache (pulled, imported or committed). Takes no arguments.
Reply: {images: [{ref, names, digest, platform, layers, size_bytes, user, working_dir, created, last_used, committed, parent, in_use}], count, omitted}. Create a sandbox from any of them with sandbox_create image (a ref or digest): a cached image is never pulled again.
` + errorsDoc("UNSUPPORTED_OPERATION (this server has no image cache: only image host)"),
		Annotations: &mcp.ToolAnnotations{Title: "List cached images", ReadOnlyHint: true, IdempotentHint: true, OpenWorldHint: ptr(false)},
	}, nil, s.imageList)

	addTool(s, &mcp.Tool{
		Name:  "image_pull",
		Title: "Pull an image",
		Description: `Pull an OCI image from its registry into the server's cache, even if a tag is cached (a moved tag is re-pinned; existing sandboxes keep their digest). Arguments: ref (required).
sandbox_create pulls a missing image by itself; call this to pull ahead of time or to refresh a tag. With a progressToken, notifications/progress report each layer as it downloads and unpacks (message: layer, phase, bytes).
Reply: the image {ref, digest, layers, size_bytes, …}.
` + errorsDoc("IMAGE_NOT_FOUND (no such repository, tag or digest in the registry: check the reference)",
			"IMAGE_PULL_FAILED (the registry could not be reached, refused the credentials, or sent something that failed verification: details.reason; retry later or ask the operator)",
			"UNSUPPORTED_OPERATION (no image cache on this server)", errInvalid),
		Annotations: &mcp.ToolAnnotations{Title: "Pull an image", DestructiveHint: ptr(false), IdempotentHint: true, OpenWorldHint: ptr(true)},
	}, nil, s.imagePull)

	addTool(s, &mcp.Tool{
		Name:  "sandbox_commit",
		Title: "Commit a sandbox as an image",
		Description: `Turn a running sandbox's changes to its root file system (installed packages, edited /etc, files written anywhere but the mounts agentbox binds in: /workspace, /home/agent, /tmp) into a new image on top of the sandbox's own image, stored in the server's cache as name. Arguments: sandbox_id, name (NAME[:TAG], both required).
Then sandbox_create with image name starts new sandboxes from it as fast as from any cached image (a template). The sandbox keeps running. The image never holds the sandbox's env, the agent, /tmp or what agentbox binds in. Only sandboxes created from an OCI image (not image "host") can be committed.
Reply: {sandbox_id, image: {ref, digest, parent, layers, …}}.
` + errorsDoc(errNotFound, errNotRunning, "UNSUPPORTED_OPERATION (the sandbox runs image host, or its runtime cannot read its writable layer: create it from an OCI image)", errInvalid),
		Annotations: &mcp.ToolAnnotations{Title: "Commit a sandbox as an image", DestructiveHint: ptr(false), OpenWorldHint: ptr(false)},
	}, nil, s.sandboxCommit)
}

func (s *Server) imageList(ctx context.Context, _ *mcp.CallToolRequest, _ NoArgs) (ImageListOut, string, error) {
	imgs, err := s.imageBackend().ListImages(ctx)
	if err != nil {
		return ImageListOut{}, "", err
	}
	out := ImageListOut{Images: []ImageInfo{}}
	for i, img := range imgs {
		if i == MaxImageList {
			out.Omitted = len(imgs) - MaxImageList
			break
		}
		out.Images = append(out.Images, imageInfo(img))
	}
	out.Count = len(out.Images)
	var b strings.Builder
	fmt.Fprintf(&b, "%d images", out.Count)
	if out.Omitted > 0 {
		fmt.Fprintf(&b, " (%d more not listed)", out.Omitted)
	}
	for _, im := range out.Images {
		fmt.Fprintf(&b, "\n%s %s %s, %d layers, in use by %d", im.Ref, shortDigest(im.Digest), mib(im.SizeBytes), im.Layers, im.InUse)
	}
	return out, b.String(), nil
}

func shortDigest(d string) string {
	if len(d) > 19 {
		return d[:19]
	}
	return d
}

// progressNotifier forwards an image operation's progress as notifications/progress when the
// call carries a progress token (else progress is nil): progress counts the reports (it only
// grows), the message says which layer, its phase and bytes. stop sends what is pending and
// returns once every notification is sent.
func (s *Server) progressNotifier(ctx context.Context, req *mcp.CallToolRequest) (progress image.ProgressFunc, stop func()) {
	tok := req.Params.GetProgressToken()
	if tok == nil || req.Session == nil {
		return nil, func() {}
	}
	q := sandbox.NewProgressQueue()
	done, pumped := make(chan struct{}), make(chan struct{})
	n := 0
	go func() {
		defer close(pumped)
		q.Pump(done, func(p image.Progress) {
			n++
			err := req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: tok, Progress: float64(n), Message: progressLine(p)})
			if err != nil && ctx.Err() == nil {
				s.log.Debug("progress notification failed", "err", err)
			}
		})
	}()
	var once sync.Once
	return q.Put, func() { once.Do(func() { close(done); <-pumped }) }
}

// pullProgress makes *ctx carry the call's progress notifier for a create of image ref (an OCI
// image may be pulled); the returned func ends it.
func (s *Server) pullProgress(ctx *context.Context, req *mcp.CallToolRequest, ref string) func() {
	if ref == "" || ref == image.Host {
		return func() {}
	}
	p, stop := s.progressNotifier(*ctx, req)
	if p != nil {
		*ctx = sandbox.WithPullProgress(*ctx, p)
	}
	return stop
}

func (s *Server) imagePull(ctx context.Context, req *mcp.CallToolRequest, in ImagePullIn) (ImageInfo, string, error) {
	progress, stop := s.progressNotifier(ctx, req)
	img, err := s.imageBackend().PullImage(ctx, in.Ref, progress)
	stop() // every notification is sent before the result
	if err != nil {
		return ImageInfo{}, "", err
	}
	out := imageInfo(img)
	return out, fmt.Sprintf("Pulled %s (%s): %d layers, %s. Create a sandbox from it with sandbox_create image %q.", out.Ref, out.Digest, out.Layers, mib(out.SizeBytes), in.Ref), nil
}

// progressLine renders one progress report.
func progressLine(p image.Progress) string {
	what := p.Ref
	if p.Layer != "" {
		what = "layer " + shortDigest(p.Layer)
	}
	line := what + " " + p.Phase
	switch {
	case p.Total > 0:
		line += fmt.Sprintf(" %s / %s", mib(p.Done), mib(p.Total))
	case p.Done > 0:
		line += " " + mib(p.Done)
	}
	if p.Message != "" {
		line += ": " + p.Message
	}
	return line
}

func (s *Server) sandboxCommit(ctx context.Context, _ *mcp.CallToolRequest, in CommitIn) (CommitOut, string, error) {
	img, err := s.imageBackend().Commit(ctx, in.SandboxID, in.Name)
	if err != nil {
		return CommitOut{}, "", err
	}
	out := CommitOut{SandboxID: in.SandboxID, Image: imageInfo(img)}
	return out, fmt.Sprintf("Committed %s as %s (%s, on %s). Create sandboxes from it with sandbox_create image %q.",
		in.SandboxID, in.Name, img.Digest, shortDigest(img.Parent), in.Name), nil
}

// noImages answers the image tools of a server without Options.Images.
type noImages struct{}

func (noImages) err() error {
	return errcode.New(errcode.UnsupportedOp, "this MCP server has no image cache: only image %q is available", image.Host)
}

func (n noImages) ListImages(context.Context) ([]image.Image, error) { return nil, n.err() }

func (n noImages) PullImage(context.Context, string, image.ProgressFunc) (image.Image, error) {
	return image.Image{}, n.err()
}

func (n noImages) Commit(context.Context, string, string) (image.Image, error) {
	return image.Image{}, n.err()
}

// imageBackend is Options.Images, or one that refuses every call.
func (s *Server) imageBackend() ImageBackend {
	if s.opts.Images == nil {
		return noImages{}
	}
	return s.opts.Images
}
