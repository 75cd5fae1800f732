//go:build linux

package fake

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/runtime"
)

// The fake's snapshots (runtime.Snapshotter). A snapshot's directory holds DiskDir, a copy of
// the sandbox's disk (its workspace and, for an OCI image, its upper directory and rootfs
// record), and runtime.SnapshotInfoFile, written last. A create from it (Spec.Snapshot) copies
// DiskDir back (InPlace: hard links, no data copied, the snapshot left whole). The fake keeps
// no memory or processes: with Config.MemorySnapshots it declares SnapshotFilesMemory all the
// same, for control-plane tests, saves the files only and restarts a fresh agent on restore.

// Ops of snapshots, for SetFault and Calls. OpSnapshotInfo runs after the files are saved and
// before SnapshotInfoFile is written: a fault there (or a test stopping there) is a snapshot
// cut off in its middle.
const (
	OpSnapshot     Op = "snapshot"
	OpSnapshotInfo Op = "snapshot_info"
)

// DiskDir is the directory, in a snapshot's directory, holding the saved disk.
const DiskDir = "disk"

// memoryReason is the fake's Capabilities.MemorySnapshotReason without Config.MemorySnapshots.
const memoryReason = "the fake runtime keeps no memory or processes (its commands run on the host)"

var _ runtime.Snapshotter = (*Runtime)(nil)

func (r *Runtime) snapshotKinds() []string {
	if r.memSnaps {
		return []string{runtime.SnapshotFiles, runtime.SnapshotFilesMemory}
	}
	return []string{runtime.SnapshotFiles}
}

// diskEntries are what of a fake sandbox's directory its disk is (the rest is its socket and
// its CA bundle, made anew by every create).
var diskEntries = []string{"workspace", UpperDir, RootfsFile}

// Snapshot copies sandbox id's disk into dir and writes dir/SnapshotInfoFile last. With Release
// it stops the sandbox, moves its disk into dir and deletes the sandbox.
func (r *Runtime) Snapshot(ctx context.Context, id, dir string, opts runtime.SnapshotOptions) (runtime.SnapshotInfo, error) {
	if err := r.begin(ctx, OpSnapshot, id); err != nil {
		return runtime.SnapshotInfo{}, err
	}
	if err := checkID(id); err != nil {
		return runtime.SnapshotInfo{}, err
	}
	kind := runtime.SnapshotFiles
	if opts.Memory {
		if !r.memSnaps {
			return runtime.SnapshotInfo{}, errcode.New(errcode.UnsupportedOp, "runtime %s cannot snapshot memory: %s", r.name, memoryReason)
		}
		kind = runtime.SnapshotFilesMemory
	}
	sb := r.get(id)
	if sb == nil {
		return runtime.SnapshotInfo{}, errcode.New(errcode.SandboxNotFound, "sandbox %s does not exist in runtime %s", id, r.name)
	}
	if st, _ := r.stateNoFault(id); st != runtime.StatusRunning {
		return runtime.SnapshotInfo{}, errcode.New(errcode.SandboxNotRunning, "sandbox %s of runtime %s is %s, not running", id, r.name, st)
	}
	if ents, err := os.ReadDir(dir); err != nil || len(ents) > 0 {
		return runtime.SnapshotInfo{}, errcode.New(errcode.InvalidArgument, "snapshot directory %s must exist and be empty (%d entries, %v)", dir, len(ents), err)
	}
	disk := filepath.Join(dir, DiskDir)
	fail := func(err error) (runtime.SnapshotInfo, error) {
		_ = os.RemoveAll(disk)
		return runtime.SnapshotInfo{}, err
	}
	if err := os.Mkdir(disk, 0o700); err != nil {
		return fail(errcode.Wrap(errcode.RuntimeUnavailable, err, "cannot write snapshot of sandbox %s", id))
	}
	if opts.Release {
		r.stop(context.WithoutCancel(ctx), id)
	}
	for _, name := range diskEntries {
		src := filepath.Join(sb.dir, name)
		if _, err := os.Lstat(src); errors.Is(err, fs.ErrNotExist) {
			continue
		}
		var err error
		if opts.Release {
			err = os.Rename(src, filepath.Join(disk, name))
		} else {
			err = copyTree(ctx, src, filepath.Join(disk, name), false)
		}
		if err != nil {
			return fail(errcode.Wrap(errcode.RuntimeUnavailable, err, "cannot save the disk of sandbox %s", id))
		}
	}
	if err := r.begin(ctx, OpSnapshotInfo, id); err != nil {
		return fail(err)
	}
	size, err := allocated(ctx, disk)
	if err != nil {
		return fail(errcode.Wrap(errcode.RuntimeUnavailable, err, "cannot measure the snapshot of sandbox %s", id))
	}
	r.mu.Lock()
	info := runtime.SnapshotInfo{Kind: kind, SizeBytes: size, DiskMB: sb.diskMB, IDMap: sb.idMap}
	r.mu.Unlock()
	b, err := json.Marshal(info)
	if err != nil {
		return fail(err)
	}
	if err := writeFileSync(filepath.Join(dir, runtime.SnapshotInfoFile), b); err != nil {
		return fail(errcode.Wrap(errcode.RuntimeUnavailable, err, "cannot write the snapshot of sandbox %s", id))
	}
	if opts.Release {
		if err := r.remove(context.WithoutCancel(ctx), id); err != nil {
			return info, err
		}
	}
	return info, nil
}

// ReadSnapshotInfo reads dir/SnapshotInfoFile; a directory without it is no snapshot
// (INVALID_ARGUMENT).
func ReadSnapshotInfo(dir string) (runtime.SnapshotInfo, error) {
	var info runtime.SnapshotInfo
	b, err := os.ReadFile(filepath.Join(dir, runtime.SnapshotInfoFile))
	if err != nil {
		return info, errcode.Wrap(errcode.InvalidArgument, err, "%s holds no complete snapshot", dir)
	}
	if err := json.Unmarshal(b, &info); err != nil {
		return info, errcode.Wrap(errcode.InvalidArgument, err, "%s: %s is not a snapshot's record", dir, runtime.SnapshotInfoFile)
	}
	return info, nil
}

// restoreSnapshot fills new sandbox dir from the snapshot src (create's half of Spec.Snapshot).
func (r *Runtime) restoreSnapshot(dir string, spec runtime.Spec) error {
	src := spec.Snapshot
	if !filepath.IsAbs(src.Dir) {
		return errcode.New(errcode.InvalidArgument, "snapshot directory %q is not an absolute path", src.Dir)
	}
	if src.Info.Kind != runtime.SnapshotFiles && src.Info.Kind != runtime.SnapshotFilesMemory {
		return errcode.New(errcode.InvalidArgument, "snapshot kind %q is unknown (want %s or %s)", src.Info.Kind, runtime.SnapshotFiles, runtime.SnapshotFilesMemory)
	}
	if src.Memory && !r.memSnaps {
		return errcode.New(errcode.UnsupportedOp, "runtime %s cannot restore memory: %s", r.name, memoryReason)
	}
	info, err := ReadSnapshotInfo(src.Dir)
	if err != nil {
		return err
	}
	if src.Memory && info.Kind != runtime.SnapshotFilesMemory {
		return errcode.New(errcode.InvalidArgument, "snapshot %s holds no memory (kind %s); create from it without memory", src.Dir, info.Kind)
	}
	if spec.DiskMB != 0 && info.DiskMB != 0 && spec.DiskMB != info.DiskMB {
		return errcode.New(errcode.InvalidArgument, "disk_mb %d differs from the snapshot's %d", spec.DiskMB, info.DiskMB)
	}
	disk := filepath.Join(src.Dir, DiskDir)
	for _, name := range diskEntries {
		from := filepath.Join(disk, name)
		if _, err := os.Lstat(from); errors.Is(err, fs.ErrNotExist) {
			continue
		}
		to := filepath.Join(dir, name)
		if _, err := os.Lstat(to); err == nil {
			if name == RootfsFile {
				continue // the create's own record of its rootfs
			}
			if err := os.RemoveAll(to); err != nil { // the create's fresh, empty one
				return err
			}
		}
		if err := copyTree(context.Background(), from, to, src.InPlace); err != nil {
			return err
		}
	}
	return nil
}

// copyTree copies the tree at src to dst (which must not exist), keeping modes and symlinks;
// with link, regular files are hard links. Sockets and devices are left out.
func copyTree(ctx context.Context, src, dst string, link bool) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		to := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			return os.Mkdir(to, info.Mode().Perm())
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return os.Symlink(target, to)
		case d.Type().IsRegular():
			if link {
				return os.Link(p, to)
			}
			return copyFile(p, to, info.Mode().Perm())
		}
		return nil // sockets, fifos, devices: not part of a disk
	})
}

func copyFile(src, dst string, mode fs.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

func writeFileSync(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// allocated is the space the regular files under dir take (allocated blocks).
func allocated(ctx context.Context, dir string) (int64, error) {
	var n int64
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		var st unix.Stat_t
		if d.Type().IsRegular() && unix.Lstat(p, &st) == nil {
			n += st.Blocks * 512
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("measure %s: %w", dir, err)
	}
	return n, nil
}
