package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"regexp"
)

// SnapshotStore is what the snapshot operations need of durable state (table snapshots).
// internal/store.Store includes it; storetest/snapshots.go is its shared suite.
//
// A snapshot record does not belong to its sandbox's record: a user snapshot outlives the
// sandbox it was taken of (create --snapshot and fork read only the snapshot), so pruning a
// sandbox's record leaves its snapshots.
type SnapshotStore interface {
	// CreateSnapshot inserts sn (Version 1, a valid snapshot id) if the record of sn.SandboxID
	// exists (else SANDBOX_NOT_FOUND); an existing id is a CONFLICT.
	CreateSnapshot(ctx context.Context, sn Snapshot) error
	// UpdateSnapshot writes every field of sn if the stored version is sn.Version-1 (else
	// CONFLICT, changing nothing); an unknown id is SNAPSHOT_NOT_FOUND.
	UpdateSnapshot(ctx context.Context, sn Snapshot) error
	// GetSnapshot returns the snapshot with id; unknown is SNAPSHOT_NOT_FOUND naming the id.
	GetSnapshot(ctx context.Context, id string) (Snapshot, error)
	// ListSnapshots returns the snapshots f selects, oldest first (created_at, then id),
	// starting after the snapshot f.After names, at most f.Limit (0: DefaultSnapshotList; more
	// than MaxSnapshotList is INVALID_ARGUMENT). An After that names no snapshot is
	// INVALID_ARGUMENT.
	ListSnapshots(ctx context.Context, f SnapshotFilter) ([]Snapshot, error)
	// DeleteSnapshot removes the record; an unknown id is SNAPSHOT_NOT_FOUND.
	DeleteSnapshot(ctx context.Context, id string) error
	// SnapshotBytes returns the sum of size_bytes of the ready snapshots of purpose user: what
	// the snapshot budget counts.
	SnapshotBytes(ctx context.Context) (int64, error)
}

// Bounds of snapshot listings.
const (
	DefaultSnapshotList = 100
	MaxSnapshotList     = 1000
)

var snapshotIDPattern = regexp.MustCompile(`^snap-[0-9a-f]{12}$`)

// NewSnapshotID returns a fresh snapshot id: "snap-" and 12 lowercase hex digits.
func NewSnapshotID() string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return "snap-" + hex.EncodeToString(b[:])
}

// ValidSnapshotID reports whether id has the shape NewSnapshotID produces.
func ValidSnapshotID(id string) bool { return snapshotIDPattern.MatchString(id) }

// Valid reports whether s is a known snapshot state.
func (s SnapshotState) Valid() bool {
	switch s {
	case SnapshotCreating, SnapshotReady, SnapshotFailed, SnapshotDeleting:
		return true
	}
	return false
}
