package wire

import (
	"time"
)

// Image is one image in the cache, pinned by its manifest digest.
type Image struct {
	// Ref is the reference it was pulled, imported or committed as, normalised
	// ("docker.io/library/python:3.12-slim"); Names are every reference that names it.
	Ref   string   `json:"ref"`
	Names []string `json:"names,omitempty"`
	// Digest is the manifest's digest ("sha256:…"): what a sandbox record pins.
	Digest string `json:"digest"`
	// ID is the config's digest.
	ID       string       `json:"id"`
	Platform string       `json:"platform"` // "linux/amd64"
	Layers   []ImageLayer `json:"layers"`
	Config   ImageConfig  `json:"config"`
	Created  time.Time    `json:"created,omitzero"`
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

// ImageLayer is one layer of an image.
type ImageLayer struct {
	Digest    string `json:"digest"`  // the blob's digest (compressed, as in the manifest)
	DiffID    string `json:"diff_id"` // the uncompressed tar's digest: the unpacked directory's name
	Size      int64  `json:"size"`    // compressed
	MediaType string `json:"media_type,omitempty"`
}

// ImageConfig is what agentbox honours of the image's config.
type ImageConfig struct {
	Env        []string `json:"env,omitempty"`
	WorkingDir string   `json:"working_dir,omitempty"`
	User       string   `json:"user,omitempty"`
	// Entrypoint and Cmd are recorded, never run: the agent is PID 1.
	Entrypoint []string          `json:"entrypoint,omitempty"`
	Cmd        []string          `json:"cmd,omitempty"`
	Labels     map[string]string `json:"labels,omitempty"`
}

// ImageUsage is the cache's size and budget (doctor, metrics).
type ImageUsage struct {
	Dir         string `json:"dir"`
	Images      int    `json:"images"`
	Layers      int    `json:"layers"`
	Bytes       int64  `json:"bytes"`
	BudgetBytes int64  `json:"budget_bytes"`
}

// ImageProgress reports a pull, import or push as it goes; Layer "" is the whole image.
type ImageProgress struct {
	Ref     string `json:"ref"`
	Layer   string `json:"layer,omitempty"` // a layer's digest
	Phase   string `json:"phase"`           // "resolving", "downloading", "unpacking", "done", "cached", "pushing"
	Done    int64  `json:"done"`            // bytes
	Total   int64  `json:"total"`           // bytes, 0 if unknown
	Message string `json:"message,omitempty"`
}

// PruneReport is what Prune removed.
type PruneReport struct {
	Removed     []string `json:"removed"` // image references or digests
	FreedBytes  int64    `json:"freed_bytes"`
	CacheBytes  int64    `json:"cache_bytes"`
	BudgetBytes int64    `json:"budget_bytes"`
}
