package oci

// FilesReader: a sandbox's files as the host sees them, for diffs. A running sandbox's are on its
// mounted disk; a snapshot's disk image is attached read-only (LO_FLAGS_READ_ONLY) and mounted
// ro,nodev,nosuid,noexec at Root/snapmounts/<random> until released. New removes what a crash
// left there (sweepSnapMounts). Snapmounts are not under Root/sandboxes: List never takes one
// for a sandbox.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/runtime"
)

var _ runtime.FilesReader = (*Runtime)(nil)

// snapMountsName is the directory under Root holding the mounts of snapshots being read.
const snapMountsName = "snapmounts"

// snapMountFlags are a snapshot's mount's flags: nothing on it runs, nothing is written.
const snapMountFlags = unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC | unix.MS_NOATIME

// SandboxFiles returns running sandbox id's trees on its disk (runtime.FilesReader).
func (r *Runtime) SandboxFiles(ctx context.Context, id string) (runtime.Files, error) {
	if err := checkID(id); err != nil {
		return runtime.Files{}, err
	}
	if !r.stateExists(id) {
		return runtime.Files{}, errcode.New(errcode.SandboxNotFound, "sandbox %s does not exist in runtime %s", id, r.name)
	}
	disk := filepath.Join(r.sandboxDir(id), diskMountName)
	if !isMountPoint(disk) {
		return runtime.Files{}, errcode.New(errcode.SandboxNotRunning, "the disk of sandbox %s is not mounted", id)
	}
	return runtime.Files{Trees: r.diskTrees(disk), IDMap: r.sandboxIDMap(id)}, nil
}

// diskTrees are the trees on a sandbox's disk mounted at disk: workspace, home, root's home,
// and the writable layers of the root and of image host's host directories that exist.
func (r *Runtime) diskTrees(disk string) []runtime.FileTree {
	trees := []runtime.FileTree{
		{Path: "/workspace", Dir: filepath.Join(disk, "workspace")},
		{Path: "/home/agent", Dir: filepath.Join(disk, "home")},
		{Path: "/root", Dir: filepath.Join(disk, "root")},
	}
	upper := filepath.Join(disk, diskRootfsDir, "upper")
	if isDir(upper) {
		trees = append(trees, runtime.FileTree{Path: "/", Dir: upper, Layer: true})
	}
	for _, b := range r.layout.Binds {
		up := filepath.Join(disk, diskRootfsDir, bindsDirName, hostBindName(b.Destination), "upper")
		if isDir(up) {
			trees = append(trees, runtime.FileTree{Path: b.Destination, Dir: up, Layer: true})
		}
	}
	return trees
}

func isDir(p string) bool {
	var st unix.Stat_t
	return unix.Lstat(p, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR
}

func isMountPoint(p string) bool {
	ok, err := mountinfo.Mounted(p)
	return err == nil && ok
}

// SnapshotFiles mounts the disk of the snapshot in dir read-only and returns its trees; release
// unmounts it, detaches its loop device and removes the mount point, once (runtime.FilesReader).
func (r *Runtime) SnapshotFiles(ctx context.Context, dir string, info runtime.SnapshotInfo) (runtime.Files, func() error, error) {
	if err := r.checkAvailable(); err != nil {
		return runtime.Files{}, nil, err
	}
	if !filepath.IsAbs(dir) || filepath.Clean(dir) != dir {
		return runtime.Files{}, nil, errcode.New(errcode.InvalidArgument, "snapshot directory %q must be a clean absolute path", dir).With("argument", "dir")
	}
	if _, err := os.Stat(filepath.Join(dir, runtime.SnapshotInfoFile)); err != nil {
		return runtime.Files{}, nil, errcode.New(errcode.SnapshotNotFound, "snapshot directory %s holds no complete snapshot", dir)
	}
	img := filepath.Join(dir, diskImageName)
	var st unix.Stat_t
	if err := unix.Lstat(img, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return runtime.Files{}, nil, errcode.New(errcode.SnapshotNotFound, "snapshot directory %s holds no disk image", dir)
	}
	base := filepath.Join(r.root, snapMountsName)
	if err := os.MkdirAll(base, 0o700); err != nil {
		return runtime.Files{}, nil, errcode.Wrap(errcode.RuntimeUnavailable, err, "cannot make the snapshots' mount directory")
	}
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	mnt := filepath.Join(base, hex.EncodeToString(rnd[:]))
	if err := os.Mkdir(mnt, 0o700); err != nil {
		return runtime.Files{}, nil, errcode.Wrap(errcode.RuntimeUnavailable, err, "cannot make a mount point for a snapshot")
	}
	dev, lf, err := attachLoop(img, true)
	if err != nil {
		_ = os.Remove(mnt)
		return runtime.Files{}, nil, errcode.Wrap(errcode.RuntimeUnavailable, err, "cannot attach the snapshot's disk in %s", dir)
	}
	err = unix.Mount(dev, mnt, "ext4", snapMountFlags, "")
	lf.Close() // the mount holds the device; autoclear frees it at the unmount (or now, unmounted)
	if err != nil {
		_ = os.Remove(mnt)
		return runtime.Files{}, nil, errcode.Wrap(errcode.RuntimeUnavailable, fmt.Errorf("mount %s on %s: %w", dev, mnt, err), "cannot mount the snapshot's disk in %s", dir)
	}
	var once sync.Once
	var relErr error
	release := func() error {
		once.Do(func() { relErr = unmountSnap(mnt) })
		return relErr
	}
	return runtime.Files{Trees: r.diskTrees(mnt), IDMap: info.IDMap}, release, nil
}

// unmountSnap unmounts a snapshot's mount (lazily when busy) and removes the mount point;
// absent is fine. Its loop device clears itself once the mount is gone (autoclear): it is never
// detached by number, which another disk may have taken by then.
func unmountSnap(mnt string) error {
	for range 16 { // stacked mounts, if any
		err := unix.Unmount(mnt, unix.UMOUNT_NOFOLLOW)
		if errors.Is(err, unix.EBUSY) {
			err = unix.Unmount(mnt, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
		}
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
			break
		}
		if err != nil {
			return fmt.Errorf("unmount %s: %w", mnt, err)
		}
	}
	if err := os.Remove(mnt); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// sweepSnapMounts removes the snapshot mounts a crashed server left (New).
func (r *Runtime) sweepSnapMounts() {
	base := filepath.Join(r.root, snapMountsName)
	ents, err := os.ReadDir(base)
	if err != nil {
		return
	}
	for _, e := range ents {
		if err := unmountSnap(filepath.Join(base, e.Name())); err != nil {
			r.log.Warn("cannot remove a leftover snapshot mount", "mount", e.Name(), "err", err)
		} else {
			r.log.Info("removed a leftover snapshot mount", "mount", e.Name())
		}
	}
}
