package oci

// The overlay mount of a sandbox's root. The host mounts it at sandboxes/<id>/rootfs with the
// new mount API (fsopen, fsconfig, fsmount, move_mount): an upper and work directory on the
// sandbox's disk over the read-only lower layers. A lower may be an id-mapped clone of a layer
// directory (open_tree OPEN_TREE_CLONE, mount_setattr MOUNT_ATTR_IDMAP), handed to overlayfs
// by file descriptor ("lowerdir+" with FSCONFIG_SET_FD, Linux 6.13 and later), or, where the
// kernel refuses a descriptor, attached under sandboxes/<id>/lower/N and named by path. The
// clones are detached mounts: once overlayfs holds them, closing them leaves nothing in the
// host's mount table but the overlay itself.

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/runtime"
)

const (
	// rootfsMountName is the merged root's mount point in the sandbox's dir (spec Root.Path).
	rootfsMountName = "rootfs"
	// lowerDirName holds the attached lowers (lower/0, lower/1, …) when the kernel takes no
	// descriptor for a lower layer.
	lowerDirName = "lower"
	// diskRootfsDir is the writable layer's directory on the disk: upper/ and work/ in it.
	diskRootfsDir = "rootfs"
	// bindsDirName holds, in the sandbox's dir, the merged overlays of image host's host
	// directories (binds/usr, binds/etc-ssl-certs…), and, in diskRootfsDir, their writable
	// layers (rootfs/binds/usr/upper and work…).
	bindsDirName = "binds"
)

// overlayConfig is one overlay mount.
type overlayConfig struct {
	// Lowers are host directories, lowest first.
	Lowers []string
	// LowerMap id-maps every lower (through it a file of host uid n is base+n); Count 0: none.
	LowerMap runtime.IDMap
	// Userns, when above 0, is an open user namespace of LowerMap's mapping (the caller made
	// it ahead, in parallel with other work); else mountOverlay makes one.
	Userns int
	// Upper and Work are the writable layer's directories (Work empty, on Upper's mount).
	Upper, Work string
	// Target is the mount point.
	Target string
	// AttachDir is where lowers are attached when the kernel takes no descriptor for them,
	// as AttachPrefix followed by the layer's index.
	AttachDir, AttachPrefix string
	// NoSuid mounts the overlay nosuid (the host's directories of image host: their setuid
	// binaries read as the sandbox's root through the id map, and must never run as it).
	NoSuid bool
}

// lowersByFD is whether overlayfs here takes id-mapped lowers by descriptor: 0 unknown, 1 yes,
// 2 no (this kernel's overlayfs cannot clone a detached mount: "failed to clone lowerpath").
var lowersByFD atomic.Int32

// mountOverlay mounts o. On failure nothing of it stays mounted (attached lowers included).
func mountOverlay(o overlayConfig) error {
	if o.LowerMap.Count == 0 || lowersByFD.Load() == 2 {
		return mountOverlayOnce(o, false)
	}
	err := mountOverlayOnce(o, true)
	if err == nil {
		lowersByFD.Store(1)
		return nil
	}
	if lowersByFD.Load() == 1 {
		return err
	}
	if err2 := mountOverlayOnce(o, false); err2 != nil {
		return fmt.Errorf("%w (by descriptor: %v)", err2, err)
	}
	lowersByFD.Store(2)
	return nil
}

// mountOverlayOnce mounts o with its id-mapped lowers passed by descriptor (byFD) or attached
// under o.AttachDir.
func mountOverlayOnce(o overlayConfig, byFD bool) (err error) {
	fsfd, err := unix.Fsopen("overlay", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return fmt.Errorf("fsopen overlay: %w", err)
	}
	defer unix.Close(fsfd)
	fail := func(what string, err error) error {
		if msg := fsLog(fsfd); msg != "" {
			return fmt.Errorf("%s: %w (%s)", what, err, msg)
		}
		return fmt.Errorf("%s: %w", what, err)
	}
	userns := -1
	if o.LowerMap.Count > 0 && o.Userns > 0 {
		userns = o.Userns
	} else if o.LowerMap.Count > 0 {
		// One user namespace for every lower of this mount: the sandbox's own mapping.
		if userns, err = usernsFDMapping(0, o.LowerMap.UIDBase, 0, o.LowerMap.GIDBase, o.LowerMap.Count); err != nil {
			return err
		}
		defer unix.Close(userns)
	}
	var attached []string
	defer func() {
		if err != nil {
			for _, p := range slices.Backward(attached) {
				_ = unix.Unmount(p, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
			}
		}
	}()
	// lowerdir+ appends below what is there: the topmost layer comes first.
	for i := len(o.Lowers) - 1; i >= 0; i-- {
		layer := o.Lowers[i]
		if userns < 0 {
			if err := unix.FsconfigSetString(fsfd, "lowerdir+", layer); err != nil {
				return fail("add lower layer "+layer, err)
			}
			continue
		}
		tree, err := idmappedClone(layer, userns)
		if err != nil {
			return err
		}
		if byFD {
			err = unix.FsconfigSetFd(fsfd, "lowerdir+", tree)
			unix.Close(tree)
			if err != nil {
				return fail("add lower layer "+layer+" by descriptor", err)
			}
			continue
		}
		p := filepath.Join(o.AttachDir, o.AttachPrefix+strconv.Itoa(i))
		err = attachTree(tree, p)
		unix.Close(tree)
		if err != nil {
			return err
		}
		attached = append(attached, p)
		if err := unix.FsconfigSetString(fsfd, "lowerdir+", p); err != nil {
			return fail("add lower layer "+p, err)
		}
	}
	for _, kv := range [][2]string{{"upperdir", o.Upper}, {"workdir", o.Work}} {
		if err := unix.FsconfigSetString(fsfd, kv[0], kv[1]); err != nil {
			return fail("set "+kv[0]+" "+kv[1], err)
		}
	}
	if err := unix.FsconfigCreate(fsfd); err != nil {
		return fail("create the overlay", err)
	}
	// nodev: the layers' whiteouts are 0:0 character devices, and no device of an image may
	// be opened through its root. Not nosuid: setuid binaries of an image work inside.
	attrs := unix.MOUNT_ATTR_NODEV
	if o.NoSuid {
		attrs |= unix.MOUNT_ATTR_NOSUID
	}
	mfd, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, attrs)
	if err != nil {
		return fail("fsmount the overlay", err)
	}
	defer unix.Close(mfd)
	if err := os.Mkdir(o.Target, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	if err := unix.MoveMount(mfd, "", unix.AT_FDCWD, o.Target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("mount the overlay at %s: %w", o.Target, err)
	}
	return nil
}

// idmappedClone returns a detached, read-only clone of the mount at dir whose ids go through
// userns.
func idmappedClone(dir string, userns int) (int, error) {
	tree, err := unix.OpenTree(unix.AT_FDCWD, dir, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_SYMLINK_NOFOLLOW)
	if err != nil {
		return -1, fmt.Errorf("open_tree %s: %w", dir, err)
	}
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP | unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NODEV, Userns_fd: uint64(userns)}
	if err := unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH, &attr); err != nil {
		unix.Close(tree)
		return -1, fmt.Errorf("id-map a clone of %s: %w", dir, err)
	}
	return tree, nil
}

// attachTree mounts the detached tree at p (made 0700).
func attachTree(tree int, p string) error {
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return err
	}
	if err := os.Mkdir(p, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	if err := unix.MoveMount(tree, "", unix.AT_FDCWD, p, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("attach a lower layer at %s: %w", p, err)
	}
	return nil
}

// fsLog drains the messages the kernel left on a file system context (overlayfs says there why
// it refuses a layer), bounded.
func fsLog(fsfd int) string {
	var msgs []string
	buf := make([]byte, 1024)
	for range 16 {
		n, err := unix.Read(fsfd, buf)
		if err != nil || n <= 0 {
			break
		}
		msgs = append(msgs, strings.TrimSpace(string(buf[:n])))
	}
	return strings.Join(msgs, "; ")
}

// unmountRootfs unmounts the sandbox's merged root and the overlays of image host's host
// directories (dir/binds/*), then their attached lowers. Absent mounts are fine; a busy one is
// detached (the kernel frees it when its last user goes).
func unmountRootfs(dir string) error {
	targets := []string{filepath.Join(dir, rootfsMountName)}
	if ents, err := os.ReadDir(filepath.Join(dir, bindsDirName)); err == nil {
		for _, e := range ents {
			targets = append(targets, filepath.Join(dir, bindsDirName, e.Name()))
		}
	}
	if ents, err := os.ReadDir(filepath.Join(dir, lowerDirName)); err == nil {
		for _, e := range ents {
			targets = append(targets, filepath.Join(dir, lowerDirName, e.Name()))
		}
	}
	for _, p := range targets {
		for range 64 { // a mount point may hold stacked mounts
			err := unix.Unmount(p, unix.UMOUNT_NOFOLLOW)
			if errors.Is(err, unix.EBUSY) {
				err = unix.Unmount(p, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
			}
			if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
				break // not a mount point (any more)
			}
			if err != nil {
				return fmt.Errorf("unmount %s: %w", p, err)
			}
		}
	}
	return nil
}

// probeOverlay says why this runtime's sandboxes cannot get an overlay root here, or "".
func (r *Runtime) probeOverlay() string {
	if err := os.MkdirAll(r.root, 0o700); err != nil {
		return err.Error()
	}
	return probeOverlay(r.root, !r.flavor.mapsIDs() && r.caps.IDMappedFiles)
}

// ProbeOverlay says why this host cannot give sandboxes an overlay root whose lower layers are
// id-mapped ("" when it can): it mounts an overlay of an id-mapped tmpfs lower under dir and
// checks that a file of host uid 0 in the lower reads as base through the overlay and that a
// write lands in the upper. `agentbox doctor` shows the reason; a runtime whose probe fails in
// New reports it as Capabilities.OCIImageReason (and lacks runtime.ImageOCI).
func ProbeOverlay(dir string) string { return probeOverlay(dir, false) }

// probeOverlay is ProbeOverlay; with mappedUpper (gVisor) the lower is raw and the upper is
// reached through an id-mapped view instead, and a write must land as base on the upper's
// file system.
func probeOverlay(dir string, mappedUpper bool) string {
	probe, err := os.MkdirTemp(dir, ".overlay-probe-")
	if err != nil {
		return err.Error()
	}
	defer os.RemoveAll(probe)
	if err := unix.Mount("tmpfs", probe, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size=256k,mode=0700"); err != nil {
		return fmt.Sprintf("mount a tmpfs: %v", err)
	}
	defer unix.Unmount(probe, unix.MNT_DETACH)
	lower, upper, work, merged := filepath.Join(probe, "l"), filepath.Join(probe, "u"), filepath.Join(probe, "w"), filepath.Join(probe, "m")
	for _, d := range []string{lower, upper, work} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return err.Error()
		}
	}
	if err := os.WriteFile(filepath.Join(lower, "f"), []byte("x"), 0o644); err != nil {
		return err.Error()
	}
	m := runtime.IDMap{UIDBase: 1 << 20, GIDBase: 1 << 20, Count: minIDCount}
	o := overlayConfig{Lowers: []string{lower}, LowerMap: m, Upper: upper, Work: work, Target: merged, AttachDir: filepath.Join(probe, lowerDirName)}
	wantLower, what := m.UIDBase, "overlayfs over id-mapped lower layers"
	if mappedUpper {
		for _, d := range []string{probe, upper, work} {
			if err := os.Lchown(d, int(m.UIDBase), int(m.GIDBase)); err != nil {
				return err.Error()
			}
		}
		view := filepath.Join(probe, viewMountName)
		if err := mountIDMappedView(probe, view, m); err != nil {
			return fmt.Sprintf("id-mapped view: %v", err)
		}
		defer unix.Unmount(view, unix.MNT_DETACH)
		o.LowerMap = runtime.IDMap{}
		o.Upper, o.Work = filepath.Join(view, "u"), filepath.Join(view, "w")
		wantLower, what = 0, "overlayfs with an id-mapped upper layer"
	}
	if err := mountOverlay(o); err != nil {
		return fmt.Sprintf("%s: %v", what, err)
	}
	defer unmountRootfs(probe)
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(merged, "f"), &st); err != nil {
		return err.Error()
	}
	if st.Uid != wantLower || st.Gid != wantLower {
		return fmt.Sprintf("%s: a lower file of uid 0 reads as %d:%d through the overlay, want %d", what, st.Uid, st.Gid, wantLower)
	}
	if err := os.WriteFile(filepath.Join(merged, "g"), nil, 0o644); err != nil {
		return fmt.Sprintf("%s: write through the overlay: %v", what, err)
	}
	if err := unix.Lstat(filepath.Join(upper, "g"), &st); err != nil {
		return fmt.Sprintf("%s: a write through the overlay is not in its upper layer: %v", what, err)
	}
	if mappedUpper && st.Uid != m.UIDBase {
		return fmt.Sprintf("%s: root's write through the overlay is uid %d in the upper layer, want %d", what, st.Uid, m.UIDBase)
	}
	return ""
}
