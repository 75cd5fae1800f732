package oci

// Files snapshots (runtime.Snapshotter). A snapshot is a directory the control plane made, on
// the file system of Root, holding:
//
//	disk.img       the sandbox's disk image, sparse (a reflink where the file system has them,
//	               else its data extents only, written with direct I/O: copyImage)
//	snapshot.json  runtime.SnapshotInfo, written last: a directory without it holds nothing usable
//
// Consistency: the sandbox is frozen (its cgroup's freezer, or Pause; the pause marker first,
// so that a server killed meanwhile leaves it to Adopt to thaw), its disk's file system is
// synced (syncfs: every write a process made is on the image, none half-made), the image is
// copied, and the sandbox is thawed while the copy is fsynced. With Release (sleep) the
// sandbox is stopped, its overlays and disk unmounted and the loop device detached, and the
// image is moved (renamed) into the snapshot: nothing is copied. Snapshot returns once the
// image and snapshot.json are on the host's device.
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
	"slices"
	"strconv"
	"strings"
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
	if opts.Memory {
		if err := r.checkRunning(ctx, id); err != nil {
			return info, err
		}
		return r.saveMemory(ctx, id, dir, opts)
	}
	steps := newStepTimer()
	running := func() error { return r.checkRunning(ctx, id) }
	// A release (which stops the sandbox) asks the runtime first whether it runs; a copy asks
	// once the sandbox is thawed, while the copy is fsynced (a process of the runtime costs
	// tens of milliseconds on a loaded host; asked while the cgroup is frozen, the runtime
	// would call a created sandbox paused, and so running), and a copy of a sandbox that turns
	// out not to be running is discarded.
	if opts.Release {
		if err := running(); err != nil {
			return info, err
		}
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
	syncDst := func() error {
		if err := syncPath(dst); err != nil {
			return errcode.Wrap(errcode.RuntimeUnavailable, err, "cannot write the snapshot of sandbox %s to disk", id)
		}
		return nil
	}
	if opts.Release {
		// The disk is made durable while the sandbox still runs: a write the host could not
		// place (a full file system) fails the sleep here, the sandbox running on, and not
		// after the release has stopped it.
		if serr := syncPath(img); serr != nil {
			return runtime.SnapshotInfo{}, errcode.Wrap(errcode.RuntimeUnavailable, serr, "cannot sync the disk of sandbox %s before it sleeps; it runs on", id)
		}
		if moved, err = r.releaseInto(ctx, id, dst); err == nil {
			steps.mark("release")
			err = syncDst()
		}
	} else {
		// A pre-flush of data the sandbox has written but its file system not yet placed: the
		// syncfs in the frozen window then writes only what was written since. (Its error is
		// left to that syncfs, the one that counts. A clean disk is not pre-flushed: the flush
		// of the host's device that a syncfs ends with would be paid twice for nothing.)
		if disk := filepath.Join(sdir, diskMountName); pendingWrites(disk) {
			_ = syncFS(disk)
			steps.mark("preflush")
		}
		// The copy is made durable while the sandbox resumes (it is no longer read).
		err = r.copyFrozenThen(ctx, id, img, dst, ist.Size, nil, syncDst, running, steps)
		if err != nil && errcode.Of(err) != errcode.SandboxNotRunning {
			if rerr := running(); rerr != nil {
				err = rerr // the more precise cause (a pause of a stopped sandbox fails)
			}
		}
	}
	if err != nil {
		return runtime.SnapshotInfo{}, err
	}
	steps.mark("fsync")
	info.SizeBytes = allocatedBytes(dir)
	if err := writeSnapshotInfo(dir, info); err != nil {
		return runtime.SnapshotInfo{}, errcode.Wrap(errcode.RuntimeUnavailable, err, "cannot record the snapshot of sandbox %s", id)
	}
	steps.mark("record")
	r.log.Debug("snapshot", "sandbox_id", id, "release", opts.Release, "size_bytes", info.SizeBytes, "took", time.Since(began), "steps", steps.String())
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
func (r *Runtime) copyFrozen(ctx context.Context, id, img, dst string, size int64, frozen func() error) error {
	return r.copyFrozenThen(ctx, id, img, dst, size, frozen, nil, nil, newStepTimer())
}

// copyFrozenThen is copyFrozen; then, when not nil, runs after the copy at the same time as the
// resume (work on the copy that no longer needs the sandbox frozen), and thawed, when not nil,
// after the resume (a check that needs the sandbox thawed); all must succeed, and thawed's
// error comes first. steps records how long each step took.
func (r *Runtime) copyFrozenThen(ctx context.Context, id, img, dst string, size int64, frozen, then, thawed func() error, steps *stepTimer) (err error) {
	thaw := func(ctx context.Context) error { return r.Resume(ctx, id) }
	if frozen == nil {
		thaw, err = r.pauseForCopy(ctx, id)
	} else {
		// A memory checkpoint: the runtime's own pause, which its checkpoint expects.
		err = r.Pause(ctx, id)
	}
	if err != nil {
		return err
	}
	steps.mark("pause")
	resumed := false
	resume := func() error {
		resumed = true
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), snapshotResumeTimeout)
		defer cancel()
		if err := thaw(rctx); err != nil {
			r.log.Error("resume after a snapshot", "sandbox_id", id, "err", err)
			return err
		}
		return nil
	}
	defer func() {
		if !resumed {
			if rerr := resume(); err == nil {
				err = rerr
			}
		}
	}()
	if frozen != nil {
		if err := frozen(); err != nil {
			return err
		}
		steps.mark("frozen")
	}
	if err := syncFS(filepath.Join(r.sandboxDir(id), diskMountName)); err != nil {
		return errcode.Wrap(errcode.RuntimeUnavailable, err, "cannot sync the disk of sandbox %s", id)
	}
	steps.mark("syncfs")
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := copyImage(img, dst, size); err != nil {
		return errcode.Wrap(errcode.RuntimeUnavailable, err, "cannot copy the disk of sandbox %s", id)
	}
	steps.mark("copy")
	var thenErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		if then != nil {
			thenErr = then()
		}
	}()
	rerr := resume()
	if rerr == nil && thawed != nil {
		rerr = thawed()
	}
	<-done
	steps.mark("resume+then")
	if rerr != nil {
		return rerr
	}
	return thenErr
}

// pendingWrites reports whether the ext4 file system mounted at dir may hold written data not
// yet on its device: its delayed-allocation blocks (ext4's sysfs), or true when that is not
// known. Rewrites of blocks already placed are not counted (the frozen syncfs writes them).
func pendingWrites(dir string) bool {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return true
	}
	dev, err := os.Readlink(fmt.Sprintf("/sys/dev/block/%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev)))
	if err != nil {
		return true
	}
	b, err := os.ReadFile(filepath.Join("/sys/fs/ext4", filepath.Base(dev), "delayed_allocation_blocks"))
	if err != nil {
		return true
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return err != nil || n > 0
}

// checkRunning asks the runtime whether sandbox id is running: nil, or SANDBOX_NOT_RUNNING
// (or the runtime's error).
func (r *Runtime) checkRunning(ctx context.Context, id string) error {
	st, err := r.State(ctx, id)
	if err != nil {
		return err
	}
	if st != runtime.StatusRunning {
		return errcode.New(errcode.SandboxNotRunning, "sandbox %s is %s, not running: only a running sandbox can be snapshotted", id, st)
	}
	return nil
}

// stepTimer records how long the steps of an operation took, for its debug log.
type stepTimer struct {
	last  time.Time
	parts []string
}

func newStepTimer() *stepTimer { return &stepTimer{last: time.Now()} }

// mark records the time since the previous mark as step name's.
func (t *stepTimer) mark(name string) {
	now := time.Now()
	t.parts = append(t.parts, fmt.Sprintf("%s=%.1fms", name, float64(now.Sub(t.last).Microseconds())/1000))
	t.last = now
}

func (t *stepTimer) String() string { return strings.Join(t.parts, " ") }

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
		if err := copyImage(img, dst, st.Size); err != nil {
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
	steps := newStepTimer()
	defer func() { r.log.Debug("disk from a snapshot", "dir", dir, "steps", steps.String()) }()
	img := filepath.Join(dir, diskImageName)
	from := src.Info.IDMap
	shift := from.UIDBase != m.UIDBase || from.GIDBase != m.GIDBase
	if src.InPlace && !shift {
		err := os.Link(filepath.Join(src.Dir, diskImageName), img)
		if errors.Is(err, unix.EXDEV) { // another file system after all: copy
			err = copyImage(filepath.Join(src.Dir, diskImageName), img, src.Info.DiskMB<<20)
		}
		if err != nil {
			_ = os.Remove(img)
			return fmt.Errorf("link the snapshot's disk: %w", err)
		}
	} else {
		// A shift rewrites the image: an in-place one would change the snapshot (and a crash
		// in the middle would leave it half-shifted), so it is copied.
		release, err := acquireForkCopy(ctx)
		if err != nil {
			return err
		}
		steps.mark("wait")
		err = copyImage(filepath.Join(src.Dir, diskImageName), img, src.Info.DiskMB<<20)
		release()
		if err != nil {
			_ = os.Remove(img)
			return fmt.Errorf("copy the snapshot's disk: %w", err)
		}
	}
	steps.mark("copy")
	if err := mountDisk(dir); err != nil {
		return err
	}
	steps.mark("mount")
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
		steps.mark("shift")
		r.log.Debug("shifted the ids of a snapshot's files", "inodes", n, "took", took, "per_second", int(float64(n)/max(took.Seconds(), 1e-9)))
	}
	return nil
}

// A files snapshot of a runc or crun sandbox freezes the sandbox's cgroup itself, as `runc
// pause` does, without starting a process of the runtime each way (each costs tens of
// milliseconds on a loaded host): the same pausedMarker is written first, so that a server
// killed meanwhile leaves the sandbox to Adopt (resumeIfPaused: `runc resume` thaws a cgroup
// frozen so, the runtime reading its status from the freezer). gVisor's pause is not a
// cgroup freeze (runsc stops the sentry's tasks), and a sandbox whose init is not found in the
// freezer cgroup (a runtime run without cgroups) is paused through the runtime.
const (
	// freezeTimeout bounds the wait for every task of a cgroup to freeze; beyond it the cgroup
	// is thawed and the runtime's own pause (which retries harder) is used.
	freezeTimeout = 2 * time.Second
	// freezePoll is the interval between reads of the freezer's state.
	freezePoll = 200 * time.Microsecond
)

// cgroupFreezer is one sandbox's freezer: v1 freezer.state or v2 cgroup.freeze.
type cgroupFreezer struct {
	dir string
	v2  bool
}

// freezerOf returns sandbox id's cgroup freezer, if the sandbox's init (pid) is in it.
func (r *Runtime) freezerOf(id string, pid int) (cgroupFreezer, bool) {
	if r.flavor == FlavorGVisor || pid <= 0 {
		return cgroupFreezer{}, false
	}
	for _, mnt := range r.cgroupMounts {
		dir := filepath.Join(mnt, cgroupPath(r.cgroupParent, id))
		f := cgroupFreezer{dir: dir}
		if _, err := os.Stat(filepath.Join(dir, "freezer.state")); err != nil {
			if _, err := os.Stat(filepath.Join(dir, "cgroup.freeze")); err != nil {
				continue
			}
			f.v2 = true
		}
		b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
		if err != nil || !slices.Contains(strings.Fields(string(b)), strconv.Itoa(pid)) {
			continue
		}
		return f, true
	}
	return cgroupFreezer{}, false
}

// set freezes (or thaws) the cgroup and, freezing, waits until every task is frozen.
func (f cgroupFreezer) set(ctx context.Context, freeze bool) error {
	file, val := filepath.Join(f.dir, "freezer.state"), "THAWED"
	if f.v2 {
		file, val = filepath.Join(f.dir, "cgroup.freeze"), "0"
	}
	if freeze {
		val = map[bool]string{false: "FROZEN", true: "1"}[f.v2]
	}
	if err := os.WriteFile(file, []byte(val), 0); err != nil {
		return err
	}
	if !freeze {
		return nil
	}
	deadline := time.Now().Add(freezeTimeout)
	for i := 1; ; i++ {
		if f.isFrozen() {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cgroup %s did not freeze within %s", f.dir, freezeTimeout)
		}
		if !f.v2 && i%25 == 0 {
			_ = os.WriteFile(file, []byte(val), 0) // as runc does: a task can escape one write
		}
		time.Sleep(freezePoll)
	}
}

// isFrozen reports whether every task of the cgroup is frozen.
func (f cgroupFreezer) isFrozen() bool {
	if f.v2 {
		b, err := os.ReadFile(filepath.Join(f.dir, "cgroup.events"))
		return err == nil && slices.Contains(strings.Split(string(b), "\n"), "frozen 1")
	}
	b, err := os.ReadFile(filepath.Join(f.dir, "freezer.state"))
	return err == nil && strings.TrimSpace(string(b)) == "FROZEN"
}

// pauseForCopy freezes sandbox id for a files snapshot's copy (its cgroup's freezer, else
// Pause) and returns what thaws it.
func (r *Runtime) pauseForCopy(ctx context.Context, id string) (resume func(context.Context) error, err error) {
	ref, _ := r.initOf(id)
	f, ok := r.freezerOf(id, ref.pid)
	if !ok {
		if err := r.Pause(ctx, id); err != nil {
			return nil, err
		}
		return func(ctx context.Context) error { return r.Resume(ctx, id) }, nil
	}
	marker := filepath.Join(r.sandboxDir(id), pausedMarker)
	if err := os.WriteFile(marker, nil, 0o600); err != nil {
		return nil, errcode.Wrap(errcode.RuntimeUnavailable, err, "cannot mark sandbox %s paused", id)
	}
	thaw := func(tctx context.Context) error {
		if err := f.set(tctx, false); err != nil {
			return errcode.Wrap(errcode.RuntimeUnavailable, err, "cannot thaw sandbox %s", id)
		}
		_ = os.Remove(marker)
		return nil
	}
	if err := f.set(ctx, true); err != nil {
		r.log.Warn("freezing the cgroup failed; pausing through the runtime", "sandbox_id", id, "err", err)
		if terr := thaw(ctx); terr != nil {
			return nil, terr
		}
		if err := r.Pause(ctx, id); err != nil {
			return nil, err
		}
		return func(ctx context.Context) error { return r.Resume(ctx, id) }, nil
	}
	return thaw, nil
}
