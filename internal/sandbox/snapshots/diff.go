package snapshots

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/fsdiff"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/sandboxid"
)

// Bounds of a diff.
const (
	DefaultDiffLimit    = 1000
	MaxDiffLimit        = 10000
	DefaultMaxDiffBytes = fsdiff.DefaultDiffBytes
	MaxMaxDiffBytes     = fsdiff.MaxMaxDiffBytes
	// MaxDiffEntries is the most paths a diff examines on each side; past it the diff is
	// OUTPUT_LIMIT_EXCEEDED.
	MaxDiffEntries = fsdiff.DefaultMaxEntries
	// maxConcurrentDiffs bounds the diffs (and exec changes manifests) walking at once; a
	// further one waits up to diffWait, then is CAPACITY_UNAVAILABLE.
	maxConcurrentDiffs = 2
	diffWait           = 10 * time.Second
	maxCursorBytes     = 4096
)

// diffGate bounds the walks running at once; its zero value is ready.
type diffGate struct {
	once sync.Once
	sem  chan struct{}
}

func (g *diffGate) acquire(ctx context.Context) (func(), error) {
	g.once.Do(func() { g.sem = make(chan struct{}, maxConcurrentDiffs) })
	t := time.NewTimer(diffWait)
	defer t.Stop()
	select {
	case g.sem <- struct{}{}:
		return func() { <-g.sem }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-t.C:
		return nil, errcode.New(errcode.CapacityUnavailable, "%d diffs are already walking sandbox files on this server; retry shortly", maxConcurrentDiffs)
	}
}

// validateDiff checks a DiffRequest and fills its defaults.
func validateDiff(req *sandbox.DiffRequest) error {
	if req.OtherSandboxID != "" && req.SnapshotID != "" {
		return errcode.New(errcode.InvalidArgument, "give at most one of other_sandbox_id and snapshot_id (neither compares with the sandbox's image)").With("argument", "snapshot_id")
	}
	if req.OtherSandboxID != "" {
		if err := sandboxid.Check(req.OtherSandboxID); err != nil {
			return errcode.New(errcode.InvalidArgument, "other_sandbox_id: %s", errcode.Message(err)).With("argument", "other_sandbox_id")
		}
	}
	if req.SnapshotID != "" {
		if err := checkSnapshotID("snapshot_id", req.SnapshotID); err != nil {
			return errcode.New(errcode.InvalidArgument, "%s", errcode.Message(err)).With("argument", "snapshot_id")
		}
	}
	if req.Limit < 0 || req.Limit > MaxDiffLimit {
		return errcode.New(errcode.InvalidArgument, "limit must be between 1 and %d (0: %d); got %d", MaxDiffLimit, DefaultDiffLimit, req.Limit).With("argument", "limit")
	}
	if req.Limit == 0 {
		req.Limit = DefaultDiffLimit
	}
	if req.MaxDiffBytes < 0 || req.MaxDiffBytes > MaxMaxDiffBytes {
		return errcode.New(errcode.InvalidArgument, "max_diff_bytes must be between 1 and %d (0: %d); got %d", MaxMaxDiffBytes, DefaultMaxDiffBytes, req.MaxDiffBytes).With("argument", "max_diff_bytes")
	}
	if req.MaxDiffBytes == 0 {
		req.MaxDiffBytes = DefaultMaxDiffBytes
	}
	if len(req.Cursor) > maxCursorBytes || strings.ContainsRune(req.Cursor, 0) || (req.Cursor != "" && !strings.HasPrefix(req.Cursor, "/")) {
		return errcode.New(errcode.InvalidArgument, "cursor must be a next_cursor a previous page returned (an absolute path of at most %d bytes)", maxCursorBytes).With("argument", "cursor")
	}
	return nil
}

// Diff compares sandbox id's files (the new side) with another sandbox's, a snapshot's, or its
// image's (the old side): what id added, modified and deleted relative to it, in path order,
// a page at a time. A running sandbox is read live, not paused (a file being written while the
// diff runs may show half-made); a sleeping one through its sleep snapshot. Against the image,
// everything in the sandbox's writable trees is a change (the image's own files are not read).
func (s *Service) Diff(ctx context.Context, id string, req sandbox.DiffRequest) (sandbox.DiffResult, error) {
	if err := sandboxid.Check(id); err != nil {
		return sandbox.DiffResult{}, err
	}
	if err := validateDiff(&req); err != nil {
		return sandbox.DiffResult{}, err
	}
	sb, err := s.store.GetSandbox(ctx, id)
	if err != nil {
		return sandbox.DiffResult{}, err
	}
	release, err := s.diffs.acquire(ctx)
	if err != nil {
		return sandbox.DiffResult{}, err
	}
	defer release()
	newSide, closeNew, err := s.sandboxSide(ctx, sb)
	if err != nil {
		return sandbox.DiffResult{}, err
	}
	defer closeNew()
	var oldSide []fsdiff.Tree
	res := sandbox.DiffResult{SandboxID: id, Against: "image:" + sb.Image}
	switch {
	case req.OtherSandboxID != "":
		other, err := s.store.GetSandbox(ctx, req.OtherSandboxID)
		if err != nil {
			return sandbox.DiffResult{}, err
		}
		side, closeOld, err := s.sandboxSide(ctx, other)
		if err != nil {
			return sandbox.DiffResult{}, err
		}
		defer closeOld()
		oldSide, res.Against = side, "sandbox:"+other.ID
	case req.SnapshotID != "":
		side, closeOld, err := s.snapshotSide(ctx, req.SnapshotID)
		if err != nil {
			return sandbox.DiffResult{}, err
		}
		defer closeOld()
		oldSide, res.Against = side, "snapshot:"+req.SnapshotID
	}
	fr, err := fsdiff.Diff(ctx, oldSide, newSide, fsdiff.Options{Cursor: req.Cursor, Limit: req.Limit,
		Unified: !req.NoUnified, MaxDiffBytes: req.MaxDiffBytes})
	if err != nil {
		return sandbox.DiffResult{}, diffError(id, err)
	}
	res.Changes = make([]sandbox.DiffChange, 0, len(fr.Changes))
	for _, c := range fr.Changes {
		res.Changes = append(res.Changes, sandbox.DiffChange{Path: c.Path, Change: c.Change, Type: c.Type, Size: c.Size, Mode: c.Mode, Target: c.Target})
	}
	res.NextCursor, res.Diff, res.DiffTruncated, res.Skipped = fr.NextCursor, fr.Diff, fr.DiffTruncated, fr.Skipped
	res.ContentFallback = fr.ContentFallback
	return res, nil
}

// diffError maps a walk's failure to an errcode.
func diffError(id string, err error) error {
	var le *fsdiff.LimitError
	switch {
	case errors.As(err, &le):
		return errcode.New(errcode.OutputLimitExceeded, "the diff of sandbox %s stopped: %s", id, le.Error()).With("max_entries", le.Max)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return err
	case errcode.Of(err) != errcode.Internal:
		return err
	}
	return errcode.Wrap(errcode.Internal, err, "cannot compare the files of sandbox %s", id)
}

// filesReader returns rt as a FilesReader, or UNSUPPORTED_OPERATION.
func filesReader(rt runtime.Runtime, what string) (runtime.FilesReader, error) {
	fr, ok := rt.(runtime.FilesReader)
	if !ok {
		return nil, errcode.New(errcode.UnsupportedOp, "runtime %s cannot show %s's files to the host, so it cannot be diffed", rt.Name(), what)
	}
	return fr, nil
}

// volatileMounts are mounted in every sandbox over its root (memory or kernel file systems):
// a root layer holds at most their empty mount points, never the sandbox's files.
var volatileMounts = []string{"/dev", "/proc", "/sys", "/tmp"}

// treesOf converts a runtime's Files to fsdiff trees (owners relative to the id range's base;
// the runtime's mount points, and the volatile mounts in a root layer, left out).
func treesOf(f runtime.Files) []fsdiff.Tree {
	out := make([]fsdiff.Tree, 0, len(f.Trees))
	for _, t := range f.Trees {
		ex := slices.Clone(t.Exclude)
		if t.Path == "/" && t.Layer {
			ex = append(ex, volatileMounts...)
		}
		out = append(out, fsdiff.Tree{Path: t.Path, Dir: t.Dir, Layer: t.Layer, UIDBase: f.IDMap.UIDBase, GIDBase: f.IDMap.GIDBase, Exclude: ex})
	}
	return out
}

func noRelease() {}

// sandboxSide returns a sandbox's trees: a running one's live, a sleeping one's from its
// sleep snapshot.
func (s *Service) sandboxSide(ctx context.Context, sb sandbox.Sandbox) ([]fsdiff.Tree, func(), error) {
	switch sb.State {
	case sandbox.StateRunning:
	case sandbox.StateSleeping:
		if sb.SleepSnapshot == "" {
			return nil, nil, errcode.New(errcode.SandboxNotRunning, "sandbox %s is sleeping but names no sleep snapshot; wake it and retry", sb.ID).With("state", string(sb.State))
		}
		return s.snapshotSide(ctx, sb.SleepSnapshot)
	default:
		return nil, nil, errcode.New(errcode.SandboxNotRunning, "sandbox %s is %s; only a running or sleeping sandbox's files can be diffed", sb.ID, sb.State).With("state", string(sb.State))
	}
	rt, err := s.core.RuntimeOf(sb)
	if err != nil {
		return nil, nil, err
	}
	fr, err := filesReader(rt, "sandbox "+sb.ID)
	if err != nil {
		return nil, nil, err
	}
	f, err := fr.SandboxFiles(ctx, sb.ID)
	if err != nil {
		return nil, nil, err
	}
	return treesOf(f), noRelease, nil
}

// snapshotSide mounts a ready snapshot's files (read-only) through its runtime, pinned (a
// delete is CONFLICT) until the returned func releases them.
func (s *Service) snapshotSide(ctx context.Context, id string) (_ []fsdiff.Tree, _ func(), err error) {
	unpin := s.state.pin(id)
	defer func() {
		if err != nil {
			unpin()
		}
	}()
	snap, err := s.GetSnapshot(ctx, id) // after the pin: a delete that began before it shows here
	if err != nil {
		return nil, nil, err
	}
	if snap.State != sandbox.SnapshotReady {
		return nil, nil, errcode.New(errcode.Conflict, "snapshot %s is %s, not ready", snap.ID, snap.State).With("state", string(snap.State))
	}
	rt, err := s.core.RuntimeOf(sandbox.Sandbox{ID: snap.SandboxID, Runtime: snap.Runtime, Node: snap.Node})
	if err != nil {
		return nil, nil, err
	}
	fr, err := filesReader(rt, "snapshot "+snap.ID)
	if err != nil {
		return nil, nil, err
	}
	dir := s.core.SnapshotDir(snap.ID)
	info, err := diffSnapshotInfo(dir)
	if err != nil {
		return nil, nil, errcode.Wrap(errcode.SnapshotNotFound, err, "the files of snapshot %s are not on this server", snap.ID)
	}
	f, rel, err := fr.SnapshotFiles(ctx, dir, info)
	if err != nil {
		return nil, nil, err
	}
	return treesOf(f), func() {
		if err := rel(); err != nil {
			s.log.Warn("diff: release a snapshot's files", "snapshot_id", snap.ID, "err", err)
		}
		unpin()
	}, nil
}

// diffSnapshotInfo reads dir's SnapshotInfoFile (what the runtime wrote when it completed the
// snapshot), bounded.
func diffSnapshotInfo(dir string) (runtime.SnapshotInfo, error) {
	f, err := os.Open(filepath.Join(dir, runtime.SnapshotInfoFile))
	if err != nil {
		return runtime.SnapshotInfo{}, err
	}
	defer f.Close()
	var info runtime.SnapshotInfo
	b, err := io.ReadAll(io.LimitReader(f, 64<<10))
	if err != nil {
		return info, err
	}
	return info, json.Unmarshal(b, &info)
}
