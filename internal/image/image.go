// Package image is agentbox's OCI image cache: it pulls images from registries (with
// go-containerregistry), imports `docker save` and OCI-layout tarballs, unpacks each layer
// once into a content-addressed directory in overlayfs's format (shared read-only by every
// sandbox of the image), commits a sandbox's writable layer as a new image, pushes images,
// and keeps the cache within a budget by collecting, least recently used first, what no live
// sandbox uses. Unpacking distrusts the layer: digests are verified, and entries that would
// escape the layer's directory, device nodes and absurd sizes are refused or neutralised.
package image

import (
	"context"
	"io"
	"log/slog"
	"time"

	"github.com/agentbox/agentbox/internal/runtime"
)

// Host is the built-in image: the host's own /usr under a minimal root. It is never pulled.
const Host = "host"

// Image is one image in the cache, pinned by its manifest digest.
type Image struct {
	// Ref is the reference it was pulled, imported or committed as, normalised
	// ("docker.io/library/python:3.12-slim"); Names are every reference that names it.
	Ref   string   `json:"ref"`
	Names []string `json:"names,omitempty"`
	// Digest is the manifest's digest ("sha256:…"): what a sandbox record pins.
	Digest string `json:"digest"`
	// ID is the config's digest.
	ID       string    `json:"id"`
	Platform string    `json:"platform"` // "linux/amd64"
	Layers   []Layer   `json:"layers"`
	Config   Config    `json:"config"`
	Created  time.Time `json:"created,omitzero"`
	// Size is the unpacked size of its layers; DiskBytes what its files take in the cache
	// (blobs and unpacked layers, shared layers counted in each image).
	Size      int64     `json:"size"`
	DiskBytes int64     `json:"disk_bytes"`
	PulledAt  time.Time `json:"pulled_at,omitzero"`
	LastUsed  time.Time `json:"last_used,omitzero"`
	// Committed: made by sandbox commit (Parent is the image it was committed on).
	Committed bool   `json:"committed,omitempty"`
	Parent    string `json:"parent,omitempty"`
	// InUse counts live sandboxes using it (filled by List and Inspect when the store knows).
	InUse int `json:"in_use"`
}

// Layer is one layer of an image.
type Layer struct {
	Digest    string `json:"digest"`  // the blob's digest (compressed, as in the manifest)
	DiffID    string `json:"diff_id"` // the uncompressed tar's digest: the unpacked directory's name
	Size      int64  `json:"size"`    // compressed
	MediaType string `json:"media_type,omitempty"`
}

// Config is what agentbox honours of the image's config.
type Config struct {
	Env        []string `json:"env,omitempty"`
	WorkingDir string   `json:"working_dir,omitempty"`
	User       string   `json:"user,omitempty"`
	// Entrypoint and Cmd are recorded, never run: the agent is PID 1.
	Entrypoint []string          `json:"entrypoint,omitempty"`
	Cmd        []string          `json:"cmd,omitempty"`
	Labels     map[string]string `json:"labels,omitempty"`
}

// Progress reports a pull, import or push as it goes; Layer "" is the whole image.
type Progress struct {
	Ref     string `json:"ref"`
	Layer   string `json:"layer,omitempty"` // a layer's digest
	Phase   string `json:"phase"`           // "resolving", "downloading", "unpacking", "done", "cached", "pushing"
	Done    int64  `json:"done"`            // bytes
	Total   int64  `json:"total"`           // bytes, 0 if unknown
	Message string `json:"message,omitempty"`
}

// ProgressFunc receives Progress; it must not block (it is called from the pull's goroutines,
// at most a few times a second per layer).
type ProgressFunc func(Progress)

// RegistryAuth is a credential the operator gives the server for one registry host
// (--registry-auth host=user:password): it wins over the default keychain.
type RegistryAuth struct {
	Host     string
	Username string
	Password string
}

// Options configure a Store.
type Options struct {
	Logger *slog.Logger
	// BudgetBytes bounds the cache (blobs and unpacked layers); past it, what no live sandbox
	// uses is collected, least recently used first. 0: no bound.
	BudgetBytes int64
	// Auth are the operator's registry credentials; the default keychain
	// (~/.docker/config.json and its credential helpers) is used for any other registry.
	Auth []RegistryAuth
	// Insecure are registry hosts reached over plain HTTP (a registry on a loopback address
	// always is, as Docker does).
	Insecure []string
	// Platform is the platform picked from a multi-arch index ("linux/amd64"; "" = the host's).
	Platform string
	// InUse returns the manifest digests live sandboxes use (the control plane's records):
	// never collected. nil: nothing is.
	InUse func(ctx context.Context) (map[string]int, error)
	// MaxImageBytes bounds one image's unpacked size (default 32 GiB); MaxLayerBytes one
	// layer's (default 16 GiB).
	MaxImageBytes int64
	MaxLayerBytes int64
}

// PruneReport is what Prune removed.
type PruneReport struct {
	Removed     []string `json:"removed"` // image references or digests
	FreedBytes  int64    `json:"freed_bytes"`
	CacheBytes  int64    `json:"cache_bytes"`
	BudgetBytes int64    `json:"budget_bytes"`
}

// Usage is the cache's size and budget (doctor, metrics).
type Usage struct {
	Dir         string `json:"dir"`
	Images      int    `json:"images"`
	Layers      int    `json:"layers"`
	Bytes       int64  `json:"bytes"`
	BudgetBytes int64  `json:"budget_bytes"`
}

// Lease keeps an image from being collected until Release (between resolving an image for a
// create and the sandbox's record naming its digest).
type Lease interface{ Release() }

// Cache is the image cache as the control plane and the surfaces use it. *Store implements it.
type Cache interface {
	// Resolve returns the image ref names, pulling it if it is not cached (a digest reference
	// or a tag the cache has is used as is: creating from a cached tag never re-pulls), with a
	// lease the caller releases once its record pins the digest. Concurrent calls for an image
	// not yet present cause one pull.
	Resolve(ctx context.Context, ref string, progress ProgressFunc) (*Image, Lease, error)
	// Pull fetches ref from its registry even if a tag is cached (a moved tag is re-pinned;
	// sandboxes keep the digest they have).
	Pull(ctx context.Context, ref string, progress ProgressFunc) (*Image, error)
	// Get returns a cached image by reference or digest, never pulling (FILE_NOT_FOUND-like
	// IMAGE_NOT_FOUND when absent).
	Get(ctx context.Context, refOrDigest string) (*Image, error)
	// LayerDirs are the unpacked directories of img's layers, lowest first, for runtime.Rootfs;
	// it marks the image used now.
	LayerDirs(ctx context.Context, img *Image) ([]string, error)
	List(ctx context.Context) ([]Image, error)
	// Remove untags ref (and deletes the image when no name is left); an image a live sandbox
	// uses is CONFLICT unless force (then only the name goes).
	Remove(ctx context.Context, ref string, force bool) ([]string, error)
	// Prune removes every image no live sandbox uses (all: also tagged ones; else only
	// untagged ones and what the budget needs), and unreferenced layers.
	Prune(ctx context.Context, all bool) (PruneReport, error)
	// Import reads a `docker save` or OCI-layout tarball and adds its images.
	Import(ctx context.Context, r io.Reader, progress ProgressFunc) ([]Image, error)
	// Push pushes the cached image name to ref in a registry.
	Push(ctx context.Context, name, ref string, progress ProgressFunc) error
	// Commit adds a layer made from a sandbox's writable layer on top of base and names the
	// new image name (NAME[:TAG], a local name).
	Commit(ctx context.Context, base *Image, layer runtime.WritableLayer, name string, cfg *Config) (*Image, error)
	Usage(ctx context.Context) (Usage, error)
}
