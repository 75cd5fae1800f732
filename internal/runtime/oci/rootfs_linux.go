package oci

// The root file system of one sandbox: an overlay (overlay_linux.go) mounted by the host at
// sandboxes/<id>/rootfs, whose writable layer is disk/rootfs/upper on the sandbox's own disk
// (so it counts against disk_mb) and whose lower layers are the image's: the shared skeleton
// rootfs/host for image "host", or the unpacked layers of an OCI image (Spec.Rootfs). Image
// host's host directories (/usr, real /bin-style dirs, /etc/ssl/certs, /etc/alternatives) are
// each an overlay of their own at sandboxes/<id>/binds/<name> (lower: the host's directory;
// upper: disk/rootfs/binds/<name>/upper), bound read-write over the root.
//
// Owners. Under runc and crun the lowers are id-mapped clones through the sandbox's own
// mapping: a layer file of host uid n reads as base+n, which is n in the sandbox's user
// namespace; the upper holds base+n files as the sandbox writes them. Under gVisor the lowers
// are raw (the sentry shows the ids its gofer reports) and the upper is reached through the
// disk's id-mapped view, so that its files are base+n on the disk there too.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/runtime"
)

// rootfsRecordName is the sandbox's writable layer as WritableLayer reports it, in its dir.
const rootfsRecordName = "rootfs.json"

// rootfsRecord is what WritableLayer needs of a sandbox after a restart.
type rootfsRecord struct {
	Upper   string        `json:"upper"`
	IDMap   runtime.IDMap `json:"idmap"`
	Exclude []string      `json:"exclude"`
}

// validateRootfs checks an OCI image's Spec.Rootfs: 1..MaxRootfsLayers absolute paths of
// existing directories.
func validateRootfs(rf *runtime.Rootfs) error {
	if rf == nil {
		return nil
	}
	if n := len(rf.Layers); n < 1 || n > runtime.MaxRootfsLayers {
		return errcode.New(errcode.InvalidArgument, "rootfs layers: %d given; an image needs between 1 and %d layers", n, runtime.MaxRootfsLayers)
	}
	for i, l := range rf.Layers {
		if !filepath.IsAbs(l) || filepath.Clean(l) != l || strings.ContainsAny(l, ",:\x00") {
			return errcode.New(errcode.InvalidArgument, "rootfs layer %d %q must be a clean absolute path without ',' or ':'", i, l)
		}
		fi, err := os.Stat(l)
		if err != nil || !fi.IsDir() {
			return errcode.New(errcode.InvalidArgument, "rootfs layer %d %q is not an existing directory", i, l)
		}
	}
	if strings.ContainsRune(rf.User, 0) || strings.ContainsRune(rf.Workdir, 0) {
		return errcode.New(errcode.InvalidArgument, "rootfs user and workdir must not contain NUL")
	}
	if rf.Workdir != "" && !path.IsAbs(rf.Workdir) {
		return errcode.New(errcode.InvalidArgument, "rootfs workdir %q must be an absolute path", rf.Workdir)
	}
	return nil
}

// mountSandboxRootfs mounts sandbox dir's root at dir/rootfs over lowers and, for image host,
// an overlay of each of hostBinds (hostBindOverlays), makes the mount points s binds that the
// image lacks, and records the writable layer. The disk (and, under gVisor with an id range,
// its view) must be mounted.
func (r *Runtime) mountSandboxRootfs(dir string, lowers []string, hostBinds []bindMount, skeleton bool, m runtime.IDMap, userns *usernsAhead, s *specs.Spec) error {
	disk := filepath.Join(dir, diskMountName)
	layerDir := filepath.Join(disk, diskRootfsDir)
	upper, work := filepath.Join(layerDir, "upper"), filepath.Join(layerDir, "work")
	for _, d := range []string{layerDir, upper, work} {
		if err := os.Mkdir(d, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
	}
	// The sandbox's root owns them (through the disk's view, under gVisor, they are root's);
	// the upper's root is the merged root's, 0755.
	for _, d := range []string{layerDir, upper, work} {
		if err := os.Lchown(d, int(m.UIDBase), int(m.GIDBase)); err != nil {
			return err
		}
	}
	if err := os.Chmod(upper, 0o755); err != nil {
		return err
	}
	// Not nosuid where the sandbox has a user namespace: an image's setuid binaries work inside
	// (up to the sandbox's own root), and no host user reaches the merged root (the sandbox's
	// directory is its root's, 0700: closeSandboxDir). gVisor honours no setuid bit inside, and
	// its lowers carry the image's own ids (a setuid-root file is host root's): nosuid.
	o := overlayConfig{Lowers: lowers, Upper: upper, Work: work, Target: filepath.Join(dir, rootfsMountName), AttachDir: filepath.Join(dir, lowerDirName),
		NoSuid: !r.flavor.mapsIDs()}
	owner := m // who the sandbox's root is through the overlay (host ids)
	if r.flavor.mapsIDs() {
		o.LowerMap = m
		fd, err := userns.get()
		if err != nil {
			return err
		}
		o.Userns = fd
	} else if m.Count > 0 {
		view := filepath.Join(dir, viewMountName, diskRootfsDir)
		o.Upper, o.Work = filepath.Join(view, "upper"), filepath.Join(view, "work")
		owner = runtime.IDMap{} // through the view, base reads as 0
	}
	if err := mountOverlay(o); err != nil {
		return err
	}
	if err := mountHostBindOverlays(dir, hostBinds, m, o.LowerMap, o.Userns, !r.flavor.mapsIDs() && m.Count > 0); err != nil {
		return err
	}
	// The skeleton of image host has every mount point (buildRootfs): only list them.
	exclude, err := makeMountPoints(o.Target, s, owner, !skeleton)
	if err != nil {
		return err
	}
	b, err := json.Marshal(rootfsRecord{Upper: upper, IDMap: m, Exclude: exclude})
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, rootfsRecordName), b, 0o600)
}

// hostBindName is the name of host directory dst's overlay in the sandbox's binds/ directory
// and on its disk: usr, bin, etc-ssl-certs…
func hostBindName(dst string) string {
	return strings.ReplaceAll(strings.Trim(path.Clean(dst), "/"), "/", "-")
}

// hostBindOverlays is what image host's sandbox dir binds instead of the host's directories
// binds: each its own overlay at dir/binds/<name>, bound read-write (mountHostBindOverlays).
func hostBindOverlays(dir string, binds []bindMount) []bindMount {
	out := make([]bindMount, 0, len(binds))
	for _, b := range binds {
		out = append(out, bindMount{Source: filepath.Join(dir, bindsDirName, hostBindName(b.Destination)), Destination: b.Destination, Writable: true})
	}
	return out
}

// mountHostBindOverlays mounts, for each host directory of binds, an overlay at
// dir/binds/<name> whose lower is the host directory (id-mapped through lowerMap and userns
// when lowerMap has a count, raw otherwise) and whose upper and work are
// disk/rootfs/binds/<name>/{upper,work} on the sandbox's disk (through its id-mapped view with
// viewUpper, gVisor): what the sandbox's root writes to /usr lands on its own disk, never in
// the host's /usr. The upper's root takes the host directory's mode and (mapped) owner, so the
// merged directory looks like the host's. The overlays are nosuid.
func mountHostBindOverlays(dir string, binds []bindMount, m, lowerMap runtime.IDMap, userns int, viewUpper bool) error {
	if len(binds) == 0 {
		return nil
	}
	disk := filepath.Join(dir, diskMountName, diskRootfsDir, bindsDirName)
	if err := os.Mkdir(disk, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	if err := os.Lchown(disk, int(m.UIDBase), int(m.GIDBase)); err != nil {
		return err
	}
	if err := os.Mkdir(filepath.Join(dir, bindsDirName), 0o711); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	for _, b := range binds {
		src, err := filepath.EvalSymlinks(b.Source)
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Stat(src, &st); err != nil {
			return fmt.Errorf("stat %s: %w", src, err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			return fmt.Errorf("host bind %s is not a directory", src)
		}
		name := hostBindName(b.Destination)
		layer := filepath.Join(disk, name)
		upper, work := filepath.Join(layer, "upper"), filepath.Join(layer, "work")
		for _, d := range []string{layer, upper, work} {
			if err := os.Mkdir(d, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
				return err
			}
		}
		uid, gid := m.UIDBase, m.GIDBase
		if m.Count > 0 && st.Uid < m.Count && st.Gid < m.Count {
			uid, gid = m.UIDBase+st.Uid, m.GIDBase+st.Gid
		}
		for _, d := range []string{layer, work} {
			if err := os.Lchown(d, int(m.UIDBase), int(m.GIDBase)); err != nil {
				return err
			}
		}
		if err := os.Lchown(upper, int(uid), int(gid)); err != nil {
			return err
		}
		if err := os.Chmod(upper, os.FileMode(st.Mode&0o777)|modeBits(st.Mode)); err != nil {
			return err
		}
		o := overlayConfig{Lowers: []string{src}, LowerMap: lowerMap, Userns: userns, Upper: upper, Work: work,
			Target: filepath.Join(dir, bindsDirName, name), AttachDir: filepath.Join(dir, lowerDirName), AttachPrefix: name + "-", NoSuid: true}
		if viewUpper {
			view := filepath.Join(dir, viewMountName, diskRootfsDir, bindsDirName, name)
			o.Upper, o.Work = filepath.Join(view, "upper"), filepath.Join(view, "work")
		}
		if err := mountOverlay(o); err != nil {
			return fmt.Errorf("overlay of the host's %s: %w", b.Destination, err)
		}
	}
	return nil
}

// modeBits are the sticky, setgid and setuid bits of a stat mode as an os.FileMode.
func modeBits(mode uint32) os.FileMode {
	var fm os.FileMode
	if mode&unix.S_ISVTX != 0 {
		fm |= os.ModeSticky
	}
	if mode&unix.S_ISGID != 0 {
		fm |= os.ModeSetgid
	}
	if mode&unix.S_ISUID != 0 {
		fm |= os.ModeSetuid
	}
	return fm
}

// usernsAhead is the user namespace of a sandbox's lowers, made in the background while create
// does other work (making one costs a process: about 15 ms on a loaded host).
type usernsAhead struct {
	done chan struct{}
	fd   int
	err  error
}

// startUserns starts making the user namespace of m's mapping; nil when there is none to make.
func (r *Runtime) startUserns(m runtime.IDMap) *usernsAhead {
	if !r.overlay || !r.flavor.mapsIDs() || m.Count == 0 {
		return nil
	}
	u := &usernsAhead{done: make(chan struct{}), fd: -1}
	go func() {
		defer close(u.done)
		u.fd, u.err = usernsFDMapping(0, m.UIDBase, 0, m.GIDBase, m.Count)
	}()
	return u
}

// get waits for the namespace: its fd (-1 for a nil u), owned by u.
func (u *usernsAhead) get() (int, error) {
	if u == nil {
		return -1, nil
	}
	<-u.done
	return u.fd, u.err
}

// close waits for the namespace and closes it.
func (u *usernsAhead) close() {
	if fd, err := u.get(); err == nil && fd > 0 {
		unix.Close(fd)
	}
}

// makeMountPoints creates in the merged root at target the mount points of s that are missing
// (a directory, or an empty file for a file bind), owned by the sandbox's root (owner's base),
// and returns every mount destination: what agentbox puts in the root, never an image's own.
// Without create it only lists them.
// Paths resolve inside target (os.Root): an image's symlink cannot lead them out of it. A mount
// point that cannot be made there (an image's symlink pointing out of its root) is left to the
// OCI runtime, which resolves it inside the root too.
func makeMountPoints(target string, s *specs.Spec, owner runtime.IDMap, create bool) ([]string, error) {
	var root *os.Root
	if create {
		var err error
		if root, err = os.OpenRoot(target); err != nil {
			return nil, err
		}
		defer root.Close()
	}
	var exclude []string
	for _, mnt := range s.Mounts {
		dst := path.Clean(mnt.Destination)
		exclude = append(exclude, dst)
		rel := strings.TrimPrefix(dst, "/")
		if rel == "" || root == nil {
			continue
		}
		if _, err := root.Lstat(rel); err == nil {
			continue
		}
		isFile := false
		if mnt.Type == "bind" {
			if fi, err := os.Stat(mnt.Source); err == nil && !fi.IsDir() {
				isFile = true
			}
		}
		if err := makeOwned(root, rel, isFile, owner); err != nil {
			return nil, fmt.Errorf("make the mount point %s in the sandbox's root: %w", dst, err)
		}
	}
	exclude = append(exclude, guestDir)
	slices.Sort(exclude)
	return slices.Compact(exclude), nil
}

// makeOwned makes rel (and its missing parents) in root, each new one owned by owner's base.
func makeOwned(root *os.Root, rel string, isFile bool, owner runtime.IDMap) error {
	parts := strings.Split(rel, "/")
	for i := range parts {
		p := strings.Join(parts[:i+1], "/")
		if _, err := root.Lstat(p); err == nil {
			continue
		}
		var err error
		if i == len(parts)-1 && isFile {
			var f *os.File
			if f, err = root.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644); err == nil {
				err = f.Close()
			}
		} else {
			err = root.Mkdir(p, 0o755)
		}
		if err != nil {
			return err
		}
		if owner.Count > 0 {
			if err := root.Lchown(p, int(owner.UIDBase), int(owner.GIDBase)); err != nil {
				return err
			}
		}
	}
	return nil
}

// WritableLayer returns sandbox id's writable root layer: disk/rootfs/upper on its disk, the
// id range its files carry, and the paths agentbox put in the root (runtime.Committer).
func (r *Runtime) WritableLayer(ctx context.Context, id string) (runtime.WritableLayer, error) {
	if err := checkID(id); err != nil {
		return runtime.WritableLayer{}, err
	}
	b, err := os.ReadFile(filepath.Join(r.sandboxDir(id), rootfsRecordName))
	if errors.Is(err, fs.ErrNotExist) {
		return runtime.WritableLayer{}, errcode.New(errcode.SandboxNotFound, "sandbox %s has no writable root layer in runtime %s", id, r.name)
	}
	if err != nil {
		return runtime.WritableLayer{}, errcode.Wrap(errcode.RuntimeUnavailable, err, "cannot read the writable layer of sandbox %s", id)
	}
	var rec rootfsRecord
	if err := json.Unmarshal(b, &rec); err != nil {
		return runtime.WritableLayer{}, errcode.Wrap(errcode.RuntimeUnavailable, err, "cannot read the writable layer of sandbox %s", id)
	}
	if !r.rootfsMounted(id) {
		return runtime.WritableLayer{}, errcode.New(errcode.SandboxNotRunning, "the root of sandbox %s is not mounted", id)
	}
	return runtime.WritableLayer{Dir: rec.Upper, IDMap: rec.IDMap, Exclude: rec.Exclude}, nil
}

// rootfsMounted reports whether sandbox id's merged root is mounted.
func (r *Runtime) rootfsMounted(id string) bool {
	target := filepath.Join(r.sandboxDir(id), rootfsMountName)
	mps, err := mountPoints()
	if err != nil {
		return false
	}
	for _, d := range r.sandboxesDirs() {
		if slices.Contains(mps, filepath.Join(d, id, rootfsMountName)) {
			return true
		}
	}
	return slices.Contains(mps, target)
}
