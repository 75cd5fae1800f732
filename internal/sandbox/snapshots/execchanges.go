package snapshots

import (
	"context"
	"errors"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/fsdiff"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// exec's changes and checkpoint, as flash_exec has them.
//
// changes: a manifest of the sandbox's writable trees (path, type, size, mode, owner, mtime,
// ctime, inode; no content) is taken before the command and after it, and what differs is the
// result's changes (deletions included), in path order, at most MaxExecChanges
// (changes_truncated says more changed). The manifest holds at most MaxDiffEntries paths: a
// sandbox holding more before the command is INVALID_ARGUMENT naming changes (the command is
// not run); one that grew past it during the command gets changes_truncated with no list.
// Metadata catches every write that changes size, mtime or ctime; a process that restores
// all three (touch -d) hides its change, as with rsync's quick check.
//
// The core calls exec (its Exec hook) before the command and the finish it returns after.
//
// checkpoint: after the command has run (whatever its exit), Service.Snapshot takes a files
// snapshot; its id is the result's snapshot_id. A failed snapshot does not lose the command's
// outcome: the result says why in checkpoint_error.

// MaxExecChanges is the most changes an exec result lists.
const MaxExecChanges = 1000

// execChanges is what an exec with changes took before its command.
type execChanges struct {
	trees  []fsdiff.Tree
	before *fsdiff.Manifest
}

// exec is the Exec hook: with changes it takes the manifest before the command; with changes or
// checkpoint it returns what fills the result after it.
func (s *Service) exec(ctx context.Context, sb sandbox.Sandbox, req sandbox.ExecRequest) (func(context.Context, *sandbox.ExecResult) error, error) {
	if !req.Changes && !req.Checkpoint {
		return nil, nil
	}
	var ch *execChanges
	if req.Changes {
		var err error
		if ch, err = s.beginExecChanges(ctx, sb); err != nil {
			return nil, err
		}
	}
	return func(ctx context.Context, res *sandbox.ExecResult) error { return s.finishExec(ctx, sb, req, ch, res) }, nil
}

// beginExecChanges takes the manifest before the command.
func (s *Service) beginExecChanges(ctx context.Context, sb sandbox.Sandbox) (*execChanges, error) {
	trees, release, err := s.sandboxSide(ctx, sb)
	if err != nil {
		return nil, err
	}
	release()
	m, err := s.manifest(ctx, trees)
	var le *fsdiff.LimitError
	if errors.As(err, &le) {
		return nil, errcode.New(errcode.InvalidArgument, "changes: sandbox %s holds more than %d paths in its writable trees, more than exec's changes can track; run without changes and use sandbox_diff", sb.ID, le.Max).With("argument", "changes")
	}
	if err != nil {
		return nil, diffError(sb.ID, err)
	}
	return &execChanges{trees: trees, before: m}, nil
}

func (s *Service) manifest(ctx context.Context, trees []fsdiff.Tree) (*fsdiff.Manifest, error) {
	release, err := s.diffs.acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	return fsdiff.BuildManifest(ctx, trees, "", fsdiff.Limits{MaxEntries: MaxDiffEntries})
}

// finishExec fills res's changes and snapshot_id after the command ran.
func (s *Service) finishExec(ctx context.Context, sb sandbox.Sandbox, req sandbox.ExecRequest, ch *execChanges, res *sandbox.ExecResult) error {
	if ch != nil {
		after, err := s.manifest(ctx, ch.trees)
		var le *fsdiff.LimitError
		switch {
		case errors.As(err, &le):
			res.ChangesTruncated = true
			res.Changes = []sandbox.DiffChange{}
		case err != nil:
			return diffError(sb.ID, err)
		default:
			cs, trunc := fsdiff.CompareManifests(ch.before, after, MaxExecChanges)
			res.Changes = make([]sandbox.DiffChange, 0, len(cs))
			for _, c := range cs {
				res.Changes = append(res.Changes, sandbox.DiffChange{Path: c.Path, Change: c.Change, Type: c.Type, Size: c.Size, Mode: c.Mode, Target: c.Target})
			}
			res.ChangesTruncated = trunc
		}
	}
	if req.Checkpoint {
		snap, err := s.Snapshot(ctx, sb.ID, sandbox.SnapshotRequest{})
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			res.CheckpointError = errcode.Message(err)
		} else {
			res.SnapshotID = snap.ID
		}
	}
	return nil
}
