package wire

import (
	"time"
)

// DiffChange is one path that differs.
type DiffChange struct {
	Path   string `json:"path"`
	Change string `json:"change"` // ChangeAdded, ChangeModified, ChangeDeleted
	// Type is "file", "dir", "symlink" or "other" ("unknown" for a deletion seen only as an
	// overlay whiteout: what was deleted is the image's); Size and Mode are the new side's (the
	// old side's for a deletion). Mode is octal with type bits removed ("0644", "4755").
	Type string `json:"type"`
	Size int64  `json:"size"`
	Mode string `json:"mode"`
	// Target is a symlink's target (new side).
	Target string `json:"target,omitempty"`
}

// DiffRequest names what a diff compares a sandbox with: exactly one of OtherSandboxID
// and SnapshotID, or neither (the sandbox's image: everything the sandbox wrote).
type DiffRequest struct {
	OtherSandboxID string `json:"other_sandbox_id,omitempty"`
	SnapshotID     string `json:"snapshot_id,omitempty"`
	// Cursor continues a paged listing (DiffResult.NextCursor); Limit bounds a page of changes
	// (default 1000, at most 10000).
	Cursor string `json:"cursor,omitempty"`
	Limit  int    `json:"limit,omitempty"`
	// MaxDiffBytes bounds the unified diff of text files (default 64 KiB, at most 1 MiB);
	// 0 takes the default; Unified false leaves it out.
	MaxDiffBytes int64 `json:"max_diff_bytes,omitempty"`
	NoUnified    bool  `json:"no_unified,omitempty"`
}

// DiffResult is a page of a diff.
type DiffResult struct {
	SandboxID string `json:"sandbox_id"`
	// Against says what was compared with: "sandbox:<id>", "snapshot:<id>" or "image:<ref>".
	Against    string       `json:"against"`
	Changes    []DiffChange `json:"changes"`
	NextCursor string       `json:"next_cursor,omitempty"`
	// Diff is a unified diff of the page's changed text files, at most MaxDiffBytes;
	// DiffTruncated says it was cut (or that binary or large files were left out: Skipped).
	Diff          string   `json:"diff,omitempty"`
	DiffTruncated bool     `json:"diff_truncated,omitempty"`
	Skipped       []string `json:"skipped,omitempty"`
	// ContentFallback says the bound on content read per diff was reached, so some files of
	// equal size and metadata were compared by mtime instead of content.
	ContentFallback bool `json:"content_fallback,omitempty"`
}

// Snapshot is a snapshot as replies carry it: its state is creating before the runtime saved
// anything, ready once it has (never its secrets' references or its id base).
type Snapshot struct {
	ID        string        `json:"snapshot_id"`
	SandboxID string        `json:"sandbox_id"`
	State     SnapshotState `json:"state"`
	// Kind is what was captured: runtime.SnapshotFiles or runtime.SnapshotFilesMemory.
	Kind      string `json:"kind"`
	Purpose   string `json:"purpose"`
	SizeBytes int64  `json:"size_bytes"`
	// The snapshotted sandbox's shape: a sandbox made from the snapshot gets it.
	Runtime     string            `json:"runtime"`
	Image       string            `json:"image"`
	ImageDigest string            `json:"image_digest,omitempty"`
	CPU         float64           `json:"cpu"`
	MemoryMB    int64             `json:"memory_mb"`
	DiskMB      int64             `json:"disk_mb"`
	Network     *Network          `json:"network,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Node        string            `json:"node,omitempty"`
	CreatedAt   time.Time         `json:"created_at"`
	Error       string            `json:"error,omitempty"`
}

// SnapshotRequest is the body of POST /v1/sandboxes/{id}/snapshots.
type SnapshotRequest struct {
	// Memory asks for memory and processes too (runtime.SnapshotFilesMemory); a runtime that
	// cannot is UNSUPPORTED_OPERATION with the reason, never a files-only snapshot.
	Memory bool              `json:"memory,omitempty"`
	Labels map[string]string `json:"labels,omitempty"`
}

// ForkRequest (POST /v1/sandboxes/{id}/fork) asks for Count new sandboxes from a snapshot of a sandbox.
type ForkRequest struct {
	// Count is 1–MaxForkCount (0: 1).
	Count int `json:"count,omitempty"`
	// SnapshotID names an existing snapshot of the sandbox; "" takes one now (with Memory).
	SnapshotID string `json:"snapshot_id,omitempty"`
	Memory     bool   `json:"memory,omitempty"`
	// TTLSeconds and Labels are each fork's (0: the server's default TTL; labels are the
	// source's overlaid by these).
	TTLSeconds int64             `json:"ttl_seconds,omitempty"`
	Labels     map[string]string `json:"labels,omitempty"`
}
