//go:build linux

package fake

import (
	"context"
	"os"
	"path/filepath"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/runtime"
)

// OpFiles is SandboxFiles and SnapshotFiles, for SetFault and Calls.
const OpFiles Op = "files"

var _ runtime.FilesReader = (*Runtime)(nil)

// SandboxFiles returns the fake sandbox's trees (runtime.FilesReader): its workspace as
// /workspace and, for a sandbox of an OCI image, its upper directory (WritableLayer) as the
// layer of /. They are the live directories; the id range is the one Spec.IDMap gave (the fake
// applies none, so files carry this process's ids).
func (r *Runtime) SandboxFiles(ctx context.Context, id string) (runtime.Files, error) {
	if err := r.begin(ctx, OpFiles, id); err != nil {
		return runtime.Files{}, err
	}
	if err := checkID(id); err != nil {
		return runtime.Files{}, err
	}
	r.mu.Lock()
	sb := r.sandboxes[id]
	var st runtime.Status
	var idm runtime.IDMap
	if sb != nil {
		st, idm = sb.status, sb.idMap
	}
	r.mu.Unlock()
	if sb == nil {
		return runtime.Files{}, errcode.New(errcode.SandboxNotFound, "sandbox %s does not exist in runtime %s", id, r.name)
	}
	if st != runtime.StatusRunning {
		return runtime.Files{}, errcode.New(errcode.SandboxNotRunning, "sandbox %s is %s", id, st)
	}
	return runtime.Files{Trees: filesTrees(r.sandboxDir(id), "workspace", UpperDir), IDMap: idm}, nil
}

// SnapshotFiles returns the trees of a fake snapshot directory (its saved disk, DiskDir: the
// workspace and the upper directory) in place: the fake mounts nothing, so release does
// nothing. A directory without runtime.SnapshotInfoFile is SNAPSHOT_NOT_FOUND.
func (r *Runtime) SnapshotFiles(ctx context.Context, dir string, info runtime.SnapshotInfo) (runtime.Files, func() error, error) {
	if err := r.begin(ctx, OpFiles, ""); err != nil {
		return runtime.Files{}, nil, err
	}
	if !filepath.IsAbs(dir) || filepath.Clean(dir) != dir {
		return runtime.Files{}, nil, errcode.New(errcode.InvalidArgument, "snapshot directory %q must be a clean absolute path", dir).With("argument", "dir")
	}
	if _, err := os.Stat(filepath.Join(dir, runtime.SnapshotInfoFile)); err != nil {
		return runtime.Files{}, nil, errcode.New(errcode.SnapshotNotFound, "snapshot directory %s holds no complete snapshot", dir)
	}
	return runtime.Files{Trees: filesTrees(filepath.Join(dir, DiskDir), "workspace", UpperDir), IDMap: info.IDMap},
		func() error { return nil }, nil
}

// filesTrees lists the trees under base that exist.
func filesTrees(base, workspace, upper string) []runtime.FileTree {
	trees := []runtime.FileTree{{Path: "/workspace", Dir: filepath.Join(base, workspace)}}
	if fi, err := os.Lstat(filepath.Join(base, upper)); err == nil && fi.IsDir() {
		trees = append(trees, runtime.FileTree{Path: "/", Dir: filepath.Join(base, upper), Layer: true,
			Exclude: []string{"/.agentbox", "/tmp"}}) // as WritableLayer's
	}
	return trees
}
