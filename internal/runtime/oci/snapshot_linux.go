package oci

// Files snapshots (runtime.Snapshotter). A snapshot is a directory the control plane made, on
// the file system of Root, holding:
//
//	disk.img       the sandbox's disk image, sparse (a reflink where the file system has them,
//	               else its data extents only: cloneSparse)
//	snapshot.json  runtime.SnapshotInfo, written last: a directory without it holds nothing usable
//
// Consistency: the sandbox is frozen (Pause, with its marker so that a server killed meanwhile
// leaves it to Adopt to thaw), its disk's file system is synced (syncfs: every write a process
// made is on the image, none half-made), the image is copied, and the sandbox is thawed. With
// Release (sleep) the sandbox is stopped, its overlays and disk unmounted and the loop device
// detached, and the image is moved (renamed) into the snapshot: nothing is copied.
//
// A sandbox made from a snapshot (Spec.Snapshot; diskFromSnapshot) gets a sparse copy of the
// image (or, InPlace, a hard link to it), mounted as a fresh disk is; if its id range differs
// from the snapshot's, every inode's owner in the old range is moved to the same offset in
// the new one (shiftIDs).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/runtime"
)

var _ runtime.Snapshotter = (*Runtime)(nil)

// idmapRecordName, in a sandbox's dir, is the sandbox's id range (runtime.IDMap as JSON), written
// at create: Snapshot records it as the range the saved files carry.
const idmapRecordName = "idmap.json"

// snapshotResumeTimeout bounds the Resume after a snapshot's copy (on a context that outlives
// the caller's: a cancelled snapshot must never leave the sandbox frozen).
const snapshotResumeTimeout = 30 * time.Second

// defaultMemorySnapshotReason is MemorySnapshotReason of runc and crun until a CRIU probe says
// more, and gvisorMemorySnapshotReason gVisor's until its checkpoint is built
// (checkpoint_linux.go).
const (
	defaultMemorySnapshotReason = "memory snapshots of runc and crun sandboxes need CRIU checkpoint/restore of user-namespaced containers, which agentbox does not drive on this host; take a files snapshot (memory: false)"
	gvisorMemorySnapshotReason  = "memory snapshots of gVisor sandboxes (runsc checkpoint/restore) are not built in this agentbox; take a files snapshot (memory: false)"
)

// memoryReasonFor is the flavour's MemorySnapshotReason as New sets it.
func memoryReasonFor(f Flavor) string {
	if f == FlavorGVisor {
		return gvisorMemorySnapshotReason
	}
	return defaultMemorySnapshotReason
}

// Snapshot saves running sandbox id into dir (runtime.Snapshotter): its disk, copied while the
// sandbox is frozen, or moved with opts.Release once it is stopped.
func (r *Runtime) Snapshot(ctx context.Context, id, dir string, opts runtime.SnapshotOptions) (info runtime.SnapshotInfo, err error) {
	if err := checkID(id); err != nil {
		return info, err
	}
	if err := checkSnapshotDir(dir); err != nil {
		return info, err
	}
	if err := r.checkAvailable(); err != nil {
		return info, err
	}
	if !r.stateExists(id) {
		return info, errcode.New(errcode.SandboxNotFound, "sandbox %s does not exist in runtime %s", id, r.name)
	}
	st, err := r.State(ctx, id)
	if err != nil {
		return info, err
	}
	if st != runtime.StatusRunning {
		return info, errcode.New(errcode.SandboxNotRunning, "sandbox %s is %s, not running: only a running sandbox can be snapshotted", id, st)
	}
	if opts.Memory {
		return r.saveMemory(ctx, id, dir, opts)
	}
	sdir := r.sandboxDir(id)
	img := filepath.Join(sdir, diskImageName)
	var ist unix.Stat_t
	if err := unix.Lstat(img, &ist); err != nil || ist.Mode&unix.S_IFMT != unix.S_IFREG {
		return info, errcode.New(errcode.SandboxNotRunning, "sandbox %s has no disk in runtime %s", id, r.name)
	}
	info = runtime.SnapshotInfo{Kind: runtime.SnapshotFiles, DiskMB: ist.Size >> 20, IDMap: r.sandboxIDMap(id)}
	moved := false
	defer func() {
		if err != nil && !moved {
			clearDir(dir) // nothing usable is left: no snapshot.json, no half image
		}
		if err != nil && moved {
			// The sandbox is gone and its disk is here: left for an operator, but without
			// snapshot.json it is no snapshot (the control plane removes the directory).
			r.log.Error("releasing snapshot failed after the disk was moved; the directory holds no snapshot", "sandbox_id", id, "dir", dir, "err", err)
		}
	}()
	began := time.Now()
	dst := filepath.Join(dir, diskImageName)
	if opts.Release {
		moved, err = r.releaseInto(ctx, id, dst)
	} else {
		err = r.copyFrozen(ctx, id, img, dst, ist.Size, nil)
	}
	if err != nil {
		return runtime.SnapshotInfo{}, err
	}
	if err := syncPath(dst); err != nil {
		return runtime.SnapshotInfo{}, errcode.Wrap(errcode.RuntimeUnavailable, err, "cannot write the snapshot of sandbox %s to disk", id)
	}
	info.SizeBytes = allocatedBytes(dir)
	if err := writeSnapshotInfo(dir, info); err != nil {
		return runtime.SnapshotInfo{}, errcode.Wrap(errcode.RuntimeUnavailable, err, "cannot record the snapshot of sandbox %s", id)
	}
	r.log.Debug("snapshot", "sandbox_id", id, "release", opts.Release, "size_bytes", info.SizeBytes, "took", time.Since(began))
	return info, nil
}

// memorySnapshotReason is Capabilities().MemorySnapshotReason, or a default text.
func (r *Runtime) memorySnapshotReason() string {
	if r.caps.MemorySnapshotReason != "" {
		return r.caps.MemorySnapshotReason
	}
	return memoryReasonFor(r.flavor)
}

// copyFrozen copies the disk image img (size bytes) of sandbox id to dst while the sandbox is
// paused and its file system synced; it always resumes the sandbox. frozen, when not nil, runs
// first while the sandbox is paused (a memory checkpoint of the same instant as the copy).
func (r *Runtime) copyFrozen(ctx context.Context, id, img, dst string, size int64, frozen func() error) (err error) {
	if err := r.Pause(ctx, id); err != nil {
		return err
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), snapshotResumeTimeout)
		defer cancel()
		if rerr := r.Resume(rctx, id); rerr != nil {
			r.log.Error("resume after a snapshot", "sandbox_id", id, "err", rerr)
			if err == nil {
				err = rerr
			}
		}
	}()
	if frozen != nil {
		if err := frozen(); err != nil {
			return err
		}
	}
	if err := syncFS(filepath.Join(r.sandboxDir(id), diskMountName)); err != nil {
		return errcode.Wrap(errcode.RuntimeUnavailable, err, "cannot sync the disk of sandbox %s", id)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := cloneSparse(img, dst, size); err != nil {
		return errcode.Wrap(errcode.RuntimeUnavailable, err, "cannot copy the disk of sandbox %s", id)
	}
	return nil
}

// releaseInto stops sandbox id, unmounts its overlays and disk (the order Delete uses), moves
// the image to dst, and deletes the rest of the sandbox.
// It reports whether the image was moved.
func (r *Runtime) releaseInto(ctx context.Context, id, dst string) (bool, error) {
	if err := r.Stop(ctx, id); err != nil {
		return false, err
	}
	return r.releaseStopped(ctx, id, dst)
}

// releaseStopped is releaseInto of a sandbox whose processes are gone (a checkpoint that ended
// it: checkpoint_linux.go).
func (r *Runtime) releaseStopped(ctx context.Context, id, dst string) (bool, error) {
	sdir := r.sandboxDir(id)
	disk, img := filepath.Join(sdir, diskMountName), filepath.Join(sdir, diskImageName)
	// Every write of the stopped sandbox reaches the image now, through the host's mount: a
	// copy of that mount in another mount namespace (one made while the disk was mounted: a
	// concurrent create's, an `ip netns exec`) keeps the file system alive after our unmount,
	// and nothing would flush it then.
	if isMountPoint(disk) {
		if err := syncFS(disk); err != nil {
			return false, errcode.Wrap(errcode.RuntimeUnavailable, err, "cannot sync the disk of sandbox %s", id)
		}
	}
	if err := unmountRootfs(sdir); err != nil {
		return false, errcode.Wrap(errcode.RuntimeUnavailable, err, "cannot unmount the root file system of sandbox %s; retry", id)
	}
	if err := r.removeDisk(ctx, id); err != nil {
		return false, err
	}
	// removeDisk gives up waiting on a busy loop device (such a copy of the mount). The image
	// is then not moved: the file system still open on it would write its superblock when its
	// last holder lets go, into a disk a wake may have mounted by then. It was synced with no
	// writer left, so a copy of it is the sandbox's disk, whole.
	held := ""
	for _, l := range loopDevices() {
		if sandboxOf(l.Backing, r.sandboxesDirs()) == id {
			held = l.Dev
		}
	}
	if held != "" {
		var st unix.Stat_t
		if err := unix.Stat(img, &st); err != nil {
			return false, errcode.Wrap(errcode.RuntimeUnavailable, err, "cannot read the disk of sandbox %s", id)
		}
		r.log.Info("disk still held by a copy of its mount elsewhere: copying it into the snapshot instead of moving it", "sandbox_id", id, "loop", held)
		if err := cloneSparse(img, dst, st.Size); err != nil {
			_ = os.Remove(dst)
			return false, errcode.Wrap(errcode.RuntimeUnavailable, err, "cannot copy the disk of sandbox %s into the snapshot", id)
		}
	} else if err := os.Rename(img, dst); err != nil {
		return false, errcode.Wrap(errcode.RuntimeUnavailable, err, "cannot move the disk of sandbox %s into the snapshot", id)
	}
	if err := r.Delete(ctx, id); err != nil {
		// The snapshot is whole; the sweep retries what is left of the sandbox (List shows it).
		r.log.Warn("delete after a releasing snapshot", "sandbox_id", id, "err", err)
	}
	return true, nil
}

// checkSnapshotDir checks that dir is an absolute path of an existing empty directory.
func checkSnapshotDir(dir string) error {
	if !filepath.IsAbs(dir) || filepath.Clean(dir) != dir {
		return errcode.New(errcode.InvalidArgument, "snapshot directory %q must be a clean absolute path", dir).With("argument", "dir")
	}
	f, err := os.Open(dir)
	if err != nil {
		return errcode.New(errcode.InvalidArgument, "snapshot directory %s must exist: %v", dir, err).With("argument", "dir")
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || !fi.IsDir() {
		return errcode.New(errcode.InvalidArgument, "snapshot directory %s is not a directory", dir).With("argument", "dir")
	}
	if names, _ := f.Readdirnames(1); len(names) > 0 {
		return errcode.New(errcode.InvalidArgument, "snapshot directory %s must be empty", dir).With("argument", "dir")
	}
	return nil
}

// clearDir removes what is in dir, leaving dir.
func clearDir(dir string) {
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		_ = os.RemoveAll(filepath.Join(dir, e.Name()))
	}
}

// syncFS flushes the file system holding dir (syncfs(2)).
func syncFS(dir string) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Syncfs(fd)
}

// syncPath fsyncs file p.
func syncPath(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// allocatedBytes is the host space the regular files directly in dir take.
func allocatedBytes(dir string) int64 {
	ents, _ := os.ReadDir(dir)
	var n int64
	for _, e := range ents {
		var st unix.Stat_t
		if unix.Lstat(filepath.Join(dir, e.Name()), &st) == nil {
			n += st.Blocks * 512
		}
	}
	return n
}

// writeSnapshotInfo writes dir/snapshot.json atomically and durably (file, then directory).
func writeSnapshotInfo(dir string, info runtime.SnapshotInfo) error {
	b, err := json.Marshal(info)
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, "."+runtime.SnapshotInfoFile+".tmp")
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if serr := f.Sync(); err == nil {
		err = serr
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, runtime.SnapshotInfoFile))
	}
	if err != nil {
		_ = os.Remove(tmp)
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// readSnapshotInfo reads dir/snapshot.json.
func readSnapshotInfo(dir string) (runtime.SnapshotInfo, error) {
	var info runtime.SnapshotInfo
	b, err := os.ReadFile(filepath.Join(dir, runtime.SnapshotInfoFile))
	if err != nil {
		return info, err
	}
	if len(b) > 64<<10 {
		return info, errors.New("snapshot.json is too large")
	}
	err = json.Unmarshal(b, &info)
	return info, err
}

// recordIDMap writes the sandbox's id range into its dir (idmapRecordName).
func recordIDMap(dir string, m runtime.IDMap) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, idmapRecordName), b, 0o600)
}

// sandboxIDMap is the id range sandbox id was created with: its idmap.json, else (a sandbox of
// an earlier server) its rootfs.json's; none (Count 0) when neither says.
func (r *Runtime) sandboxIDMap(id string) runtime.IDMap {
	var m runtime.IDMap
	if b, err := os.ReadFile(filepath.Join(r.sandboxDir(id), idmapRecordName)); err == nil && json.Unmarshal(b, &m) == nil {
		return m
	}
	var rec rootfsRecord
	if b, err := os.ReadFile(filepath.Join(r.sandboxDir(id), rootfsRecordName)); err == nil && json.Unmarshal(b, &rec) == nil {
		return rec.IDMap
	}
	return runtime.IDMap{}
}

// checkSnapshotSource validates spec.Snapshot and returns the disk size the sandbox gets.
func (r *Runtime) checkSnapshotSource(spec runtime.Spec) (int64, error) {
	src := spec.Snapshot
	if src.Memory {
		if err := r.restoreMemory(src); err != nil {
			return 0, err
		}
	}
	if src.Info.Kind != runtime.SnapshotFiles && src.Info.Kind != runtime.SnapshotFilesMemory {
		return 0, errcode.New(errcode.InvalidArgument, "snapshot kind %q is not %q or %q", src.Info.Kind, runtime.SnapshotFiles, runtime.SnapshotFilesMemory).With("argument", "snapshot")
	}
	if src.Info.DiskMB < minDiskMB || src.Info.DiskMB > maxDiskMB {
		return 0, errcode.New(errcode.InvalidArgument, "snapshot disk_mb %d must be between %d and %d", src.Info.DiskMB, minDiskMB, maxDiskMB).With("argument", "snapshot")
	}
	if spec.DiskMB != 0 && spec.DiskMB != src.Info.DiskMB {
		return 0, errcode.New(errcode.InvalidArgument, "disk_mb %d must equal the snapshot's disk_mb %d (or be 0)", spec.DiskMB, src.Info.DiskMB).With("argument", "disk_mb")
	}
	if !filepath.IsAbs(src.Dir) || filepath.Clean(src.Dir) != src.Dir {
		return 0, errcode.New(errcode.InvalidArgument, "snapshot directory %q must be a clean absolute path", src.Dir).With("argument", "snapshot")
	}
	if _, err := os.Stat(filepath.Join(src.Dir, runtime.SnapshotInfoFile)); err != nil {
		return 0, errcode.New(errcode.InvalidArgument, "snapshot directory %s holds no complete snapshot (no %s)", src.Dir, runtime.SnapshotInfoFile).With("argument", "snapshot")
	}
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(src.Dir, diskImageName), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size != src.Info.DiskMB<<20 {
		return 0, errcode.New(errcode.InvalidArgument, "snapshot directory %s holds no disk image of %d MiB", src.Dir, src.Info.DiskMB).With("argument", "snapshot")
	}
	if src.Info.IDMap.Count > 0 && spec.IDMap.Count > 0 && src.Info.IDMap.Count > spec.IDMap.Count {
		return 0, errcode.New(errcode.InvalidArgument, "the snapshot's files span %d ids; the sandbox's range has only %d", src.Info.IDMap.Count, spec.IDMap.Count).With("argument", "id_map")
	}
	return src.Info.DiskMB, nil
}

// diskFromSnapshot gives the sandbox in dir the disk of snapshot src: a sparse copy of its
// image (InPlace: a hard link, never a rename, so the snapshot stays whole), mounted as makeDisk
// mounts a fresh one, with its files moved into m's id range, and what the snapshot's agent
// left that a new agent must not see removed.
func (r *Runtime) diskFromSnapshot(ctx context.Context, dir string, src *runtime.SnapshotSource, m runtime.IDMap) error {
	img := filepath.Join(dir, diskImageName)
	from := src.Info.IDMap
	shift := from.UIDBase != m.UIDBase || from.GIDBase != m.GIDBase
	if src.InPlace && !shift {
		err := os.Link(filepath.Join(src.Dir, diskImageName), img)
		if errors.Is(err, unix.EXDEV) { // another file system after all: copy
			err = cloneSparse(filepath.Join(src.Dir, diskImageName), img, src.Info.DiskMB<<20)
		}
		if err != nil {
			_ = os.Remove(img)
			return fmt.Errorf("link the snapshot's disk: %w", err)
		}
	} else {
		// A shift rewrites the image: an in-place one would change the snapshot (and a crash
		// in the middle would leave it half-shifted), so it is copied.
		if err := cloneSparse(filepath.Join(src.Dir, diskImageName), img, src.Info.DiskMB<<20); err != nil {
			_ = os.Remove(img)
			return fmt.Errorf("copy the snapshot's disk: %w", err)
		}
	}
	if err := mountDisk(dir); err != nil {
		return err
	}
	disk := filepath.Join(dir, diskMountName)
	// The old agent's socket and log: the new agent binds its own socket and writes its own log.
	for _, p := range []string{filepath.Join(disk, "run", "agent.sock"), filepath.Join(disk, "guest.log")} {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	if shift {
		began := time.Now()
		n, err := shiftIDs(ctx, disk, from, m)
		if err != nil {
			return fmt.Errorf("move the snapshot's files into the sandbox's id range: %w", err)
		}
		took := time.Since(began)
		r.log.Debug("shifted the ids of a snapshot's files", "inodes", n, "took", took, "per_second", int(float64(n)/max(took.Seconds(), 1e-9)))
	}
	return nil
}
