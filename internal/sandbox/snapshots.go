package sandbox

import (
	"context"

	"github.com/agentbox/agentbox/internal/errcode"
)

// The snapshot, fork, sleep and wake operations (issue 15). Stubs until the control plane's
// side lands: every one is UNSUPPORTED_OPERATION.

func notYet(op string) error {
	return errcode.New(errcode.UnsupportedOp, "%s is not available on this server yet", op)
}

// Snapshot saves sandbox id's files (and memory, with req.Memory) as a new snapshot.
func (s *Service) Snapshot(ctx context.Context, id string, req SnapshotRequest) (Snapshot, error) {
	return Snapshot{}, notYet("sandbox_snapshot")
}

// ListSnapshots lists ready and in-flight snapshots, oldest first.
func (s *Service) ListSnapshots(ctx context.Context, f SnapshotFilter) ([]Snapshot, error) {
	return nil, notYet("snapshot_list")
}

// GetSnapshot returns one snapshot; an unknown id is SNAPSHOT_NOT_FOUND.
func (s *Service) GetSnapshot(ctx context.Context, id string) (Snapshot, error) {
	return Snapshot{}, notYet("snapshot_get")
}

// DeleteSnapshot deletes a snapshot and its files.
func (s *Service) DeleteSnapshot(ctx context.Context, id string) error {
	return notYet("snapshot_delete")
}

// Fork makes req.Count sandboxes from a snapshot of sandbox id.
func (s *Service) Fork(ctx context.Context, id string, req ForkRequest) (ForkResult, error) {
	return ForkResult{}, notYet("sandbox_fork")
}

// Sleep and Wake: sleep.go.
