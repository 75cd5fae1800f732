package oci

// The sandbox's disk. Everything a sandbox can write outside memory — /workspace, /home/agent,
// the agent's run/ directory and the agent's log — lives on one sparse ext4 image of disk_mb
// MiB, attached to a loop device and mounted on the host at sandboxes/<id>/disk, so that a full
// disk is ENOSPC inside the sandbox and never more than disk_mb on the host. (Project quotas
// would be cheaper, but this kernel has none for ext4 or xfs.)
//
// Every piece is named from the id, so List and Delete find it without any record:
//
//	sandboxes/<id>/disk.img  the image, sparse
//	sandboxes/<id>/disk/     its mount point: workspace/, home/, run/, root/, guest.log
//	sandboxes/<id>/run       a symlink to disk/run (keeps the agent's socket path short)
//	/dev/loopN               whose /sys/block/loopN/loop/backing_file is sandboxes/<id>/disk.img
//
// Speed: running mkfs.ext4 for every create costs about 4 ms for 1 GiB (10% of a create), so
// each size is formatted once, directories included, into a template under disk-templates/ and
// copied: a reflink where the host's file system has them, else only the template's data
// extents (120 KiB, 0.2 ms for 1 GiB). The loop device is set up with one LOOP_CONFIGURE ioctl
// and the file system mounted with mount(2): no losetup or mount processes.

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/runtime"
)

const (
	// diskImageName is the image in the sandbox dir (diskMountName, in spec.go, its mount point).
	diskImageName = "disk.img"
	// DefaultDiskMB is the disk of a sandbox whose Spec.DiskMB is 0.
	DefaultDiskMB = 1024
	// minDiskMB and maxDiskMB bound Spec.DiskMB (the control plane's own bounds).
	minDiskMB = 16
	maxDiskMB = 1 << 22
	// maxDiskTemplates bounds the formatted templates kept (one per size asked for).
	maxDiskTemplates = 8
	// diskTemplateVersion names templates made with mkfsArgs and diskDirs; change it with them.
	diskTemplateVersion = "v2"
	// loopRelease bounds how long Delete waits for a detached loop device to let go of its file
	// (a lazily unmounted disk on a loaded host can hold it for seconds).
	loopRelease = 10 * time.Second
	// mountFlags are the host mount's flags; the binds into the sandbox repeat nosuid, nodev.
	mountFlags = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOATIME
	// mountData: never zero inode tables in the background (it would allocate the whole
	// sparse image's tables on the host for nothing).
	mountData = "noinit_itable"
)

// mkfsArgs format a template: 4 KiB blocks, an inode per 8 KiB (131072 per GiB: room for
// node_modules), no blocks reserved for root (the agent user gets all of disk_mb), no journal
// (a sandbox's disk does not outlive its host: nothing to replay), no blocks reserved for
// growing it online (resize_inode: 512 KiB of a 1 GiB template, copied by every create), and
// lazily initialised metadata so that the image stays sparse.
var mkfsArgs = []string{"-q", "-F", "-t", "ext4", "-b", "4096", "-i", "8192", "-I", "256", "-m", "0",
	"-O", "^has_journal,^resize_inode", "-E", "lazy_itable_init=1,nodiscard,root_owner=0:0", "-L", "agentbox"}

// diskDirs are the directories every disk starts with (mkfs.ext4 -d formats them into the
// template), owned as they are without a user namespace; ownWritableBinds re-owns them for one.
var diskDirs = []struct {
	Name     string
	Mode     os.FileMode
	UID, GID int
}{
	{"run", 0o700, 0, 0}, {"root", 0o700, 0, 0},
	{"workspace", 0o755, agentUID, agentGID}, {"home", 0o755, agentUID, agentGID},
}

// findMkfs returns the path of mkfs.ext4, also outside PATH (a server started with a minimal
// PATH lacks /usr/sbin).
func findMkfs() (string, error) {
	if p, err := exec.LookPath("mkfs.ext4"); err == nil {
		return p, nil
	}
	for _, p := range []string{"/usr/sbin/mkfs.ext4", "/sbin/mkfs.ext4"} {
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			return p, nil
		}
	}
	return "", errors.New("mkfs.ext4 not found (apt-get install e2fsprogs)")
}

// probeDisk says why sandbox disks cannot be made on this host, or "".
func probeDisk() (mkfs string, reason string) {
	mkfs, err := findMkfs()
	if err != nil {
		return "", "sandbox disks need " + err.Error()
	}
	f, err := os.OpenFile("/dev/loop-control", os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", fmt.Sprintf("sandbox disks need loop devices: %v (modprobe loop)", err)
	}
	f.Close()
	return mkfs, ""
}

// diskTemplates keeps one formatted image per size, made on first use.
type diskTemplates struct {
	dir  string
	mkfs string

	mu      sync.Mutex
	entries map[int64]*diskTemplate
	cleaned bool
}

type diskTemplate struct {
	done chan struct{} // closed once path or err is set
	path string
	err  error
	used time.Time
}

func newDiskTemplates(dir, mkfs string) *diskTemplates {
	return &diskTemplates{dir: dir, mkfs: mkfs, entries: map[int64]*diskTemplate{}}
}

// get returns the template of sizeMB, formatting it if needed. Concurrent callers for one size
// wait for one mkfs.
func (d *diskTemplates) get(ctx context.Context, sizeMB int64) (string, error) {
	d.mu.Lock()
	if !d.cleaned {
		// Templates of an earlier server (or mkfsArgs) are not trusted: start afresh.
		_ = os.RemoveAll(d.dir)
		if err := os.MkdirAll(d.dir, 0o700); err != nil {
			d.mu.Unlock()
			return "", err
		}
		d.cleaned = true
	}
	e, ok := d.entries[sizeMB]
	if ok {
		e.used = time.Now()
		d.mu.Unlock()
		select {
		case <-e.done:
			return e.path, e.err
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
	e = &diskTemplate{done: make(chan struct{}), used: time.Now()}
	d.entries[sizeMB] = e
	d.evictLocked()
	d.mu.Unlock()

	e.path, e.err = d.build(ctx, sizeMB)
	close(e.done)
	if e.err != nil {
		d.forget(sizeMB, e)
	}
	return e.path, e.err
}

// forget drops a template (failed, or found missing) so that the next get makes it again.
func (d *diskTemplates) forget(sizeMB int64, e *diskTemplate) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.entries[sizeMB] == e {
		delete(d.entries, sizeMB)
	}
}

// evictLocked removes the least recently used finished templates beyond maxDiskTemplates. A
// copy that loses the race to the removal fails with ENOENT and asks again.
func (d *diskTemplates) evictLocked() {
	for len(d.entries) > maxDiskTemplates {
		var oldest int64 = -1
		for size, e := range d.entries {
			select {
			case <-e.done:
			default:
				continue
			}
			if oldest < 0 || e.used.Before(d.entries[oldest].used) {
				oldest = size
			}
		}
		if oldest < 0 {
			return
		}
		if p := d.entries[oldest].path; p != "" {
			_ = os.Remove(p)
		}
		delete(d.entries, oldest)
	}
}

func (d *diskTemplates) build(ctx context.Context, sizeMB int64) (string, error) {
	final := filepath.Join(d.dir, fmt.Sprintf("ext4-%s-%dm.img", diskTemplateVersion, sizeMB))
	tmp, err := os.CreateTemp(d.dir, ".build-*")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name())
	err = tmp.Truncate(sizeMB << 20)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", err
	}
	stage, err := os.MkdirTemp(d.dir, ".stage-*")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(stage)
	for _, dd := range diskDirs {
		p := filepath.Join(stage, dd.Name)
		if err := os.Mkdir(p, dd.Mode); err != nil {
			return "", err
		}
		if err := os.Chmod(p, dd.Mode); err != nil { // past the umask
			return "", err
		}
		if err := os.Lchown(p, dd.UID, dd.GID); err != nil {
			return "", err
		}
	}
	cctx, cancel := context.WithTimeout(ctx, commandTimeout)
	defer cancel()
	args := append(append([]string(nil), mkfsArgs...), "-d", stage, tmp.Name())
	out, err := exec.CommandContext(cctx, d.mkfs, args...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("mkfs.ext4 of a %d MiB image: %v: %s", sizeMB, err, strings.TrimSpace(string(out)))
	}
	if err := os.Rename(tmp.Name(), final); err != nil {
		return "", err
	}
	return final, nil
}

// cloneSparse copies the image src of size bytes to the new file dst: a reflink where the file
// system can, else the data extents only, so that dst is as sparse as src.
func cloneSparse(src, dst string, size int64) (err error) {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := out.Close(); err == nil {
			err = cerr
		}
	}()
	if unix.IoctlFileClone(int(out.Fd()), int(in.Fd())) == nil {
		return nil
	}
	if err := out.Truncate(size); err != nil {
		return err
	}
	ifd, ofd := int(in.Fd()), int(out.Fd())
	for off := int64(0); off < size; {
		data, err := unix.Seek(ifd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			return nil // only a hole is left
		}
		if err != nil {
			return fmt.Errorf("seek data in %s: %w", src, err)
		}
		hole, err := unix.Seek(ifd, data, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("seek hole in %s: %w", src, err)
		}
		roff, woff := data, data
		for roff < hole {
			n, err := unix.CopyFileRange(ifd, &roff, ofd, &woff, int(hole-roff), 0)
			if err != nil {
				return fmt.Errorf("copy %s to %s: %w", src, dst, err)
			}
			if n == 0 {
				return fmt.Errorf("copy %s to %s: short copy at %d", src, dst, roff)
			}
		}
		off = hole
	}
	return nil
}

// attachLoop binds image to a free loop device with LOOP_CONFIGURE and returns the device's
// path and an open descriptor of it. The device clears itself (autoclear) when its last user
// goes: the caller keeps the descriptor until the file system is mounted, so that a crash in
// between leaves no device behind. Direct I/O keeps the image's blocks out of the host's page
// cache (the sandbox's own page cache already holds them), which is also several times faster.
// With readOnly the device is read-only (LO_FLAGS_READ_ONLY) over a read-only descriptor.
func attachLoop(image string, readOnly bool) (string, *os.File, error) {
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", nil, err
	}
	defer ctl.Close()
	mode := os.O_RDWR
	if readOnly {
		mode = os.O_RDONLY
	}
	backing, err := os.OpenFile(image, mode|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", nil, err
	}
	defer backing.Close()
	flags := uint32(unix.LO_FLAGS_AUTOCLEAR | unix.LO_FLAGS_DIRECT_IO)
	if readOnly {
		flags |= unix.LO_FLAGS_READ_ONLY
	}
	var lastErr error
	for range 64 {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return "", nil, fmt.Errorf("LOOP_CTL_GET_FREE: %w", err)
		}
		dev, f, err := openLoop(n)
		if err != nil {
			return "", nil, err
		}
		cfg := unix.LoopConfig{Fd: uint32(backing.Fd()), Size: 4096}
		cfg.Info.Flags = flags
		copy(cfg.Info.File_name[:len(cfg.Info.File_name)-1], image)
		err = unix.IoctlLoopConfigure(int(f.Fd()), &cfg)
		if err == nil {
			return dev, f, nil
		}
		f.Close()
		lastErr = fmt.Errorf("LOOP_CONFIGURE %s: %w", dev, err)
		switch {
		case errors.Is(err, unix.EBUSY):
			// Another process took the device between GET_FREE and CONFIGURE.
		case errors.Is(err, unix.EINVAL) && flags&unix.LO_FLAGS_DIRECT_IO != 0:
			flags &^= unix.LO_FLAGS_DIRECT_IO // a backing file system without direct I/O
		default:
			return "", nil, lastErr
		}
	}
	return "", nil, lastErr
}

// openLoop opens /dev/loopN, making the node from sysfs when no devtmpfs or udev made it.
func openLoop(n int) (string, *os.File, error) {
	dev := "/dev/loop" + strconv.Itoa(n)
	f, err := os.OpenFile(dev, os.O_RDWR|unix.O_CLOEXEC, 0)
	if errors.Is(err, fs.ErrNotExist) {
		b, rerr := os.ReadFile(fmt.Sprintf("/sys/block/loop%d/dev", n))
		maj, mnr, ok := strings.Cut(strings.TrimSpace(string(b)), ":")
		if rerr == nil && ok {
			ma, _ := strconv.ParseUint(maj, 10, 32)
			mi, _ := strconv.ParseUint(mnr, 10, 32)
			_ = unix.Mknod(dev, unix.S_IFBLK|0o660, int(unix.Mkdev(uint32(ma), uint32(mi))))
			f, err = os.OpenFile(dev, os.O_RDWR|unix.O_CLOEXEC, 0)
		}
	}
	if err != nil {
		return "", nil, err
	}
	return dev, f, nil
}

// makeDisk gives the sandbox in dir its disk: the image from the template of sizeMB, a loop
// device, the ext4 mount at dir/disk (mode 0711: the runtime and, under a user namespace, the
// sandbox's root must traverse it). Delete undoes it.
func (r *Runtime) makeDisk(ctx context.Context, dir string, sizeMB int64) (err error) {
	img := filepath.Join(dir, diskImageName)
	_, end := runtime.Step(ctx, runtime.StepDiskCopy)
	defer func() { end(err) }()
	for attempt := 0; ; attempt++ {
		tmpl, err := r.disks.get(ctx, sizeMB)
		if err != nil {
			return fmt.Errorf("disk template: %w", err)
		}
		err = cloneSparse(tmpl, img, sizeMB<<20)
		if err == nil {
			break
		}
		_ = os.Remove(img)
		if !errors.Is(err, fs.ErrNotExist) || attempt > 0 {
			return fmt.Errorf("copy the disk template: %w", err)
		}
		r.disks.mu.Lock()
		if e := r.disks.entries[sizeMB]; e != nil && e.path == tmpl {
			delete(r.disks.entries, sizeMB) // evicted or removed under us: make it again
		}
		r.disks.mu.Unlock()
	}
	end(nil)
	_, end = runtime.Step(ctx, runtime.StepDiskMount)
	return mountDisk(dir)
}

// mountDisk attaches the sandbox's image (dir/disk.img) to a loop device and mounts it at
// dir/disk, mode 0711.
func mountDisk(dir string) error {
	img := filepath.Join(dir, diskImageName)
	dev, lf, err := attachLoop(img, false)
	if err != nil {
		return fmt.Errorf("attach %s to a loop device: %w", img, err)
	}
	defer lf.Close() // after the mount, which holds the device from then on
	mnt := filepath.Join(dir, diskMountName)
	if err := os.Mkdir(mnt, 0o700); err != nil {
		return err
	}
	if err := unix.Mount(dev, mnt, "ext4", mountFlags, mountData); err != nil {
		return fmt.Errorf("mount %s on %s: %w", dev, mnt, err)
	}
	return os.Chmod(mnt, 0o711)
}

// loopDevice is an attached loop device.
type loopDevice struct {
	Dev     string // /dev/loopN
	Backing string // its backing file's path, without the kernel's " (deleted)"
}

// loopDevices lists the attached loop devices from sysfs. Detached devices stay in
// /sys/block (a busy host may have hundreds), so this reads each one's backing_file directly
// rather than globbing: about 1 ms for 200 devices.
func loopDevices() []loopDevice {
	ents, _ := os.ReadDir("/sys/block")
	var out []loopDevice
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), "loop") {
			continue
		}
		if backing, ok := loopBacking(e.Name()); ok {
			out = append(out, loopDevice{Dev: "/dev/" + e.Name(), Backing: backing})
		}
	}
	return out
}

// loopBacking returns the backing file of loop device name ("loop3"), if it is attached.
func loopBacking(name string) (string, bool) {
	b, err := os.ReadFile("/sys/block/" + name + "/loop/backing_file")
	if err != nil {
		return "", false // detached (the loop/ attributes exist only while attached)
	}
	return strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), " (deleted)"), true
}

// mountPoints lists this mount namespace's mount points (the host's, for the server), unescaped.
func mountPoints() ([]string, error) {
	infos, err := mountinfo.GetMounts(nil)
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(infos))
	for _, m := range infos {
		out = append(out, m.Mountpoint)
	}
	return out, nil
}

// DisksMiB is the host space the disk images of this runtime's sandboxes occupy: their
// allocated blocks, not their sparse size. A server adds it back to the free space it sees at
// start, since the disk_mb of the sandboxes it adopts is counted against its budget in full.
func (r *Runtime) DisksMiB(ctx context.Context) (int64, error) {
	imgs, err := filepath.Glob(filepath.Join(r.root, "sandboxes", "*", diskImageName))
	if err != nil {
		return 0, errcode.Wrap(errcode.Internal, err, "cannot list the sandboxes' disks")
	}
	var bytes int64
	for _, img := range imgs {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		var st unix.Stat_t
		if unix.Lstat(img, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFREG {
			bytes += st.Blocks * 512
		}
	}
	return bytes >> 20, nil
}

// sandboxesDirs are the paths of Root/sandboxes as the kernel may report them: as configured,
// and with symlinks resolved (mountinfo and backing_file hold resolved paths).
func (r *Runtime) sandboxesDirs() []string {
	d := filepath.Join(r.root, "sandboxes")
	dirs := []string{d}
	if real, err := filepath.EvalSymlinks(d); err == nil && real != d {
		dirs = append(dirs, real)
	}
	return dirs
}

// sandboxOf returns the id whose sandbox dir holds p (p under one of dirs), or "".
func sandboxOf(p string, dirs []string) string {
	for _, d := range dirs {
		if rest, ok := strings.CutPrefix(p, d+"/"); ok {
			id, _, _ := strings.Cut(rest, "/")
			if validID(id) {
				return id
			}
		}
	}
	return ""
}

// diskHolders returns the ids holding a mount or a loop device under Root/sandboxes.
func (r *Runtime) diskHolders() ([]string, error) {
	dirs := r.sandboxesDirs()
	var ids []string
	mps, err := mountPoints()
	if err != nil {
		return nil, err
	}
	for _, mp := range mps {
		if id := sandboxOf(mp, dirs); id != "" {
			ids = append(ids, id)
		}
	}
	for _, l := range loopDevices() {
		if id := sandboxOf(l.Backing, dirs); id != "" {
			ids = append(ids, id)
		}
	}
	return ids, nil
}

// removeDisk unmounts everything mounted under the sandbox's dir (lazily when busy) and
// detaches every loop device whose backing file is there (LOOP_CLR_FD), then waits a little for
// the devices to let go. It leaves the files to the caller, which must not remove dir when this
// fails: that would delete through a mount.
func (r *Runtime) removeDisk(ctx context.Context, id string) error {
	var prefixes []string
	for _, d := range r.sandboxesDirs() {
		prefixes = append(prefixes, filepath.Join(d, id))
	}
	under := func(p string) bool {
		for _, pre := range prefixes {
			if p == pre || strings.HasPrefix(p, pre+"/") {
				return true
			}
		}
		return false
	}
	for round := 0; ; round++ {
		mps, err := mountPoints()
		if err != nil {
			return errcode.Wrap(errcode.RuntimeUnavailable, err, "cannot read the mount table")
		}
		var mine []string
		for _, mp := range mps {
			if under(mp) {
				mine = append(mine, mp)
			}
		}
		if len(mine) == 0 {
			break
		}
		if round == 8 {
			return errcode.Wrap(errcode.RuntimeUnavailable, fmt.Errorf("still mounted: %s", strings.Join(mine, ", ")), "the disk of sandbox %s is still mounted after unmounting it; retry", id)
		}
		sort.Slice(mine, func(i, j int) bool { return len(mine[i]) > len(mine[j]) }) // deepest first
		for _, mp := range mine {
			err := unix.Unmount(mp, unix.UMOUNT_NOFOLLOW)
			if errors.Is(err, unix.EBUSY) {
				// Someone still uses it: detach it now; the kernel frees it when they let go.
				err = unix.Unmount(mp, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
			}
			if err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
				return errcode.Wrap(errcode.RuntimeUnavailable, fmt.Errorf("unmount %s: %w", mp, err), "cannot unmount the disk of sandbox %s; retry", id)
			}
			r.log.Debug("unmounted", "sandbox_id", id, "mount", mp)
		}
	}
	// One scan finds the devices (the disk's own clears itself once unmounted: autoclear);
	// then only those are watched until they let go of the file.
	var left []string
	for _, l := range loopDevices() {
		if !under(l.Backing) {
			continue
		}
		// On a busy device LOOP_CLR_FD sets autoclear and returns at once: the device goes
		// when its last user does.
		if err := clearLoop(l.Dev); err != nil {
			return errcode.Wrap(errcode.RuntimeUnavailable, fmt.Errorf("detach %s (%s): %w", l.Dev, l.Backing, err), "cannot detach the disk of sandbox %s from its loop device; retry", id)
		}
		r.log.Debug("detached loop device", "sandbox_id", id, "dev", l.Dev)
		left = append(left, l.Dev)
	}
	deadline := time.Now().Add(loopRelease)
	for {
		left = slices.DeleteFunc(left, func(dev string) bool {
			backing, ok := loopBacking(filepath.Base(dev))
			return !ok || !under(backing)
		})
		if len(left) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			// Still in use somewhere; the sweep finds the id again (List reports it) and retries.
			r.log.Warn("loop device still busy after detach; it goes when its last user does", "sandbox_id", id, "devices", left)
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// clearLoop detaches a loop device; an already free one is fine.
func clearLoop(dev string) error {
	f, err := os.OpenFile(dev, os.O_RDWR|unix.O_CLOEXEC, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	err = unix.IoctlSetInt(int(f.Fd()), unix.LOOP_CLR_FD, 0)
	if errors.Is(err, unix.ENXIO) {
		return nil
	}
	return err
}

// checkDiskSpace refuses a disk larger than the free space of the host file system holding
// Root: a sparse image promising more than exists would let the sandbox fill the host.
func (r *Runtime) checkDiskSpace(sizeMB int64) error {
	var st unix.Statfs_t
	if err := unix.Statfs(r.root, &st); err != nil {
		return errcode.Wrap(errcode.RuntimeUnavailable, err, "cannot read the free space of the %s runtime's file system", r.name)
	}
	free := int64(st.Bavail) * int64(st.Bsize) >> 20
	if sizeMB > free {
		return errcode.New(errcode.CapacityUnavailable, "disk_mb %d is more than the %d MiB free on the host's file system; ask for less, or free space on the host", sizeMB, free).
			With("disk_mb", sizeMB).With("free_mb", free)
	}
	return nil
}
