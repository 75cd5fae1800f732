package sandbox

import (
	"time"

	"github.com/agentbox/agentbox/internal/egress"
)

// StateSleeping is a sandbox saved to a snapshot (Sleep) and holding no memory, CPU or process
// until Wake restores it under the same id. It counts against the live bound and the disk budget
// (its snapshot is on disk), not the CPU and memory budgets.
const StateSleeping State = "sleeping"

// SnapshotState is a snapshot record's lifecycle state: creating → ready, or → failed; a
// deleted snapshot's record is removed once its files are.
type SnapshotState string

const (
	SnapshotCreating SnapshotState = "creating"
	SnapshotReady    SnapshotState = "ready"
	SnapshotFailed   SnapshotState = "failed"
	SnapshotDeleting SnapshotState = "deleting"
)

// Snapshot purposes.
const (
	// SnapshotPurposeUser: taken by sandbox_snapshot (or for a fork); listed, deleted by its
	// caller, retired under the snapshot budget.
	SnapshotPurposeUser = "user"
	// SnapshotPurposeSleep: a sleeping sandbox's state; it belongs to the sandbox (never listed
	// apart from it, deleted by its wake or its destroy, never retired).
	SnapshotPurposeSleep = "sleep"
)

// Snapshot is the durable record of one snapshot (store table snapshots): written, state
// creating, before the runtime saves anything, ready once it has.
type Snapshot struct {
	ID        string        `json:"snapshot_id"`
	SandboxID string        `json:"sandbox_id"`
	State     SnapshotState `json:"state"`
	// Kind is what was captured: runtime.SnapshotFiles or runtime.SnapshotFilesMemory.
	Kind      string `json:"kind"`
	Purpose   string `json:"purpose"`
	SizeBytes int64  `json:"size_bytes"`
	// The snapshotted sandbox's shape: a sandbox made from the snapshot gets it.
	Runtime     string   `json:"runtime"`
	Image       string   `json:"image"`
	ImageDigest string   `json:"image_digest,omitempty"`
	CPU         float64  `json:"cpu"`
	MemoryMB    int64    `json:"memory_mb"`
	DiskMB      int64    `json:"disk_mb"`
	Network     *Network `json:"network,omitempty"`
	// Secrets are the source's secret references (names, placeholders, "env:VAR"; never
	// values): a sandbox made from the snapshot gets them unless its create names its own.
	Secrets []egress.Secret `json:"-"`
	// IDBase is the first host id the saved files carry (0: none).
	IDBase    int64             `json:"-"`
	Labels    map[string]string `json:"labels,omitempty"`
	Node      string            `json:"node,omitempty"`
	CreatedAt time.Time         `json:"created_at"`
	Error     string            `json:"error,omitempty"`
	Version   int64             `json:"-"`
	// Principal is the principal of the sandbox snapshotted (Sandbox.Principal), recorded by
	// the store when the snapshot is; never in replies.
	Principal string `json:"-"`
}

// SnapshotRequest asks Service.Snapshot for a snapshot.
type SnapshotRequest struct {
	// Memory asks for memory and processes too (runtime.SnapshotFilesMemory); a runtime that
	// cannot is UNSUPPORTED_OPERATION with the reason, never a files-only snapshot.
	Memory bool              `json:"memory,omitempty"`
	Labels map[string]string `json:"labels,omitempty"`
}

// SnapshotFilter selects snapshots for ListSnapshots.
type SnapshotFilter struct {
	SandboxID string
	// After is a cursor: the snapshot_id of the last one of the previous page.
	After string
	Limit int // default 100, at most 1000
	// Purpose selects one purpose ("" all); States selects states (none: all).
	Purpose string
	States  []SnapshotState
	// Principal selects one principal's snapshots ("" all).
	Principal string
}

// Bounds of forks.
const (
	MaxForkCount = 20
)

// ForkRequest asks Service.Fork for Count new sandboxes from a snapshot of a sandbox.
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

// ForkResult is what Fork made.
type ForkResult struct {
	SnapshotID string    `json:"snapshot_id"`
	Kind       string    `json:"kind"`
	Sandboxes  []Sandbox `json:"sandboxes"`
}

// Change kinds of a DiffChange.
const (
	ChangeAdded    = "added"
	ChangeModified = "modified"
	ChangeDeleted  = "deleted"
)

// DiffRequest names what Service.Diff compares a sandbox with: exactly one of OtherSandboxID
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
