package oci

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/runtime"
)

// Id-mapped disks. gVisor's processes live inside its sentry (which runs as nobody in a user
// namespace of its own); its gofer, host root, does their file operations. Without more, what a
// gVisor sandbox writes would belong to host uids 0 and 1000. So a gVisor sandbox's binds come
// from an id-mapped view of its disk (mount_setattr MOUNT_ATTR_IDMAP): through the view a file
// that is base+n on the disk is n, and what the gofer creates or chowns to n is base+n on the
// disk. The files of a gVisor sandbox thus belong to its own id range, as under runc.

// viewMountName is the id-mapped view of the disk in the sandbox's dir.
const viewMountName = "view"

// idmapHardening is gVisor's Hardening entry for the id-mapped disk.
const idmapHardening = "userns:per-sandbox-id-range(files:idmapped-disk)"

// usernsFD returns an open user namespace whose uid and gid maps turn host ids 0..Count-1 into
// m's range (the "inside" of the namespace is the range): the idmap of a view in which the
// disk's base+n reads as n. A short-lived child process (cat, blocked on a pipe) holds the
// namespace while it is opened; the namespace lives on in the fd.
func usernsFD(m runtime.IDMap) (int, error) {
	return usernsFDMapping(m.UIDBase, 0, m.GIDBase, 0, m.Count)
}

// usernsFDMapping returns an open user namespace whose ids uidIn.. (gidIn..) are host ids
// uidOut.. (gidOut..), count of each.
func usernsFDMapping(uidIn, uidOut, gidIn, gidOut, count uint32) (int, error) {
	cat, err := exec.LookPath("cat")
	if err != nil {
		return -1, err
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		return -1, err
	}
	defer pw.Close()
	cmd := exec.Command(cat)
	cmd.Stdin = pr
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: int(uidIn), HostID: int(uidOut), Size: int(count)}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: int(gidIn), HostID: int(gidOut), Size: int(count)}},
		Pdeathsig:   syscall.SIGKILL,
	}
	if err := cmd.Start(); err != nil {
		pr.Close()
		return -1, fmt.Errorf("start a process in a new user namespace: %w", err)
	}
	pr.Close()
	fd, openErr := unix.Open("/proc/"+strconv.Itoa(cmd.Process.Pid)+"/ns/user", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	pw.Close()    // cat sees EOF and exits
	go cmd.Wait() // reaped in the background: cat's exit takes milliseconds nobody waits for
	if openErr != nil {
		return -1, fmt.Errorf("open the user namespace: %w", openErr)
	}
	return fd, nil
}

// mountIDMappedView mounts at view (made 0700) a view of the mount at src through which src's
// ids base+n read as n and ids n written become base+n.
func mountIDMappedView(src, view string, m runtime.IDMap) error {
	userns, err := usernsFD(m)
	if err != nil {
		return err
	}
	defer unix.Close(userns)
	tree, err := unix.OpenTree(unix.AT_FDCWD, src, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_SYMLINK_NOFOLLOW)
	if err != nil {
		return fmt.Errorf("open_tree %s: %w", src, err)
	}
	defer unix.Close(tree)
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP, Userns_fd: uint64(userns)}
	if err := unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH, &attr); err != nil {
		return fmt.Errorf("id-map the mount of %s: %w", src, err)
	}
	if err := os.Mkdir(view, 0o700); err != nil && !os.IsExist(err) {
		return err
	}
	if err := unix.MoveMount(tree, "", unix.AT_FDCWD, view, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("mount the id-mapped view at %s: %w", view, err)
	}
	return nil
}

// probeIDMappedMounts checks that this host can give a mount an id map: it maps a tmpfs under
// dir and checks that a file the host writes as uid 1000 through the view is base+1000 below.
// It returns why not, or "".
func probeIDMappedMounts(dir string) string {
	probe, err := os.MkdirTemp(dir, ".idmap-probe-")
	if err != nil {
		return err.Error()
	}
	defer os.RemoveAll(probe)
	src, view := filepath.Join(probe, "src"), filepath.Join(probe, "view")
	if err := os.Mkdir(src, 0o700); err != nil {
		return err.Error()
	}
	if err := unix.Mount("tmpfs", src, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=64k,mode=0700"); err != nil {
		return fmt.Sprintf("mount a tmpfs: %v", err)
	}
	defer unix.Unmount(src, unix.MNT_DETACH)
	m := runtime.IDMap{UIDBase: 1 << 20, GIDBase: 1 << 20, Count: minIDCount}
	if err := os.Lchown(src, int(m.UIDBase), int(m.GIDBase)); err != nil {
		return err.Error()
	}
	if err := mountIDMappedView(src, view, m); err != nil {
		return err.Error()
	}
	defer unix.Unmount(view, unix.MNT_DETACH)
	f := filepath.Join(view, "f")
	if err := os.WriteFile(f, nil, 0o600); err != nil {
		return fmt.Sprintf("write through the view: %v", err)
	}
	if err := os.Lchown(f, agentUID, agentGID); err != nil {
		return fmt.Sprintf("chown through the view: %v", err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(src, "f"), &st); err != nil {
		return err.Error()
	}
	if st.Uid != m.UIDBase+agentUID || st.Gid != m.GIDBase+agentGID {
		return fmt.Sprintf("a file chowned to %d through the view is %d:%d below it, want %d", agentUID, st.Uid, st.Gid, m.UIDBase+agentUID)
	}
	return ""
}
