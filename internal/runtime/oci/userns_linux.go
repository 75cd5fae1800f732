package oci

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/hostinfo"
	"github.com/agentbox/agentbox/internal/runtime"
)

// User namespaces. runc and crun give every sandbox a user namespace that maps its ids 0-65535
// to the range of host ids the control plane allocated to it (runtime.Spec.IDMap): root inside
// is an unprivileged host user, no two sandboxes share an id, and the agent user (1000 inside)
// owns the sandbox's workspace and home as base+1000 on the host. gVisor's runsc of this era
// cannot apply the spec's mappings (its gofer then fails on the host's root-owned rootfs); its
// sentry already runs as nobody in a user namespace of its own, and its sandbox's files get the
// range through an id-mapped view of the disk (idmap_linux.go).
//
// In a user namespace the runtime's init resolves the rootfs and every bind source as the
// sandbox's root, an unprivileged host user: every directory above them must be searchable by
// others (o+x). The runtime's Root, rootfs/ and sandboxes/ are 0711 (their listings stay
// private); probeUserNamespaces checks Root's ancestors, and the guest binary is installed
// under Root (bin/agentbox) so that it is reachable wherever the server's binary lives.

// Hardening entries of user namespaces.
const (
	usernsHardening       = "userns:per-sandbox-id-range"
	gvisorUsernsHardening = "userns:gvisor-sentry-as-nobody"
	// execUserHardening: commands run as the unprivileged agent user unless a request says root.
	execUserHardening = "exec-user:agent"
)

// minIDCount is the smallest id range a sandbox can run with: its image has users up to nobody
// (65534), and the agent's exec tags are gids 50000-59999.
const minIDCount = 65536

// mapsIDs reports whether the flavour applies the spec's user namespace mappings.
func (f Flavor) mapsIDs() bool { return f != FlavorGVisor }

// probeUserNamespaces decides whether this runtime gives sandboxes user namespaces and checks
// what they need of the host; it returns why the runtime cannot work, or "". A host without user
// namespaces runs sandboxes without (Capabilities and Hardening say so).
func (r *Runtime) probeUserNamespaces() string {
	if !r.flavor.mapsIDs() {
		// gVisor: the sandbox's files get the range through an id-mapped view of its disk.
		if err := os.MkdirAll(r.root, 0o700); err != nil {
			return fmt.Sprintf("cannot create %s: %v", r.root, err)
		}
		if reason := probeIDMappedMounts(r.root); reason != "" {
			r.log.Warn("id-mapped mounts do not work on this host: the files of gVisor sandboxes belong to host uids 0 and 1000", "reason", reason)
			return ""
		}
		r.caps.IDMappedFiles = true
		return ""
	}
	if !hostinfo.UserNamespaces() {
		r.log.Warn("user namespaces are unavailable on this host: root in a sandbox is root on the host's kernel (with reduced capabilities); `agentbox doctor` says how to enable them")
		return ""
	}
	for dir := filepath.Dir(r.root); ; dir = filepath.Dir(dir) {
		fi, err := os.Stat(dir)
		if err == nil && fi.Mode().Perm()&0o001 == 0 {
			return fmt.Sprintf("sandboxes run as unprivileged host users (user namespaces), which must be able to search %s to reach the runtime's root %s: run chmod o+x %s (it lists nothing), or use a state dir below searchable directories",
				dir, r.root, dir)
		}
		if dir == "/" || dir == "." {
			break
		}
	}
	r.caps.UserNamespaces = true
	return ""
}

// usernsHardeningEntries is what Hardening reports about users.
func (r *Runtime) usernsHardeningEntries() []string {
	h := []string{execUserHardening}
	switch {
	case r.caps.UserNamespaces:
		h = append(h, usernsHardening)
	case !r.flavor.mapsIDs():
		h = append(h, gvisorUsernsHardening)
		if r.caps.IDMappedFiles {
			h = append(h, idmapHardening)
		}
	}
	return h
}

// checkIDMap refuses a spec whose id map this runtime cannot apply.
func (r *Runtime) checkIDMap(m runtime.IDMap) error {
	if m.Count == 0 {
		return nil
	}
	if !r.caps.TakesIDRange() {
		return errcode.New(errcode.InvalidArgument, "runtime %s gives sandboxes no user namespace; create the sandbox without an id range", r.name)
	}
	if m.Count < minIDCount || uint64(m.UIDBase)+uint64(m.Count) > 1<<32-1 || uint64(m.GIDBase)+uint64(m.Count) > 1<<32-1 {
		return errcode.New(errcode.InvalidArgument, "id range %d+%d / %d+%d is invalid: it needs at least %d ids, below 2^32-1", m.UIDBase, m.Count, m.GIDBase, m.Count, minIDCount)
	}
	return nil
}

// idMappings is the spec's mappings for m: ids 0..Count-1 inside to the range; nil without one
// or when the flavour does not map ids.
func (f Flavor) idMappings(m runtime.IDMap) (uids, gids []specs.LinuxIDMapping) {
	if m.Count == 0 || !f.mapsIDs() {
		return nil, nil
	}
	return []specs.LinuxIDMapping{{ContainerID: 0, HostID: m.UIDBase, Size: m.Count}},
		[]specs.LinuxIDMapping{{ContainerID: 0, HostID: m.GIDBase, Size: m.Count}}
}

// ownWritableBinds gives the sandbox's users the directories that s binds writable, wherever
// they live on the host (the sandbox's disk, or not): the agent's socket directory (the agent
// binds its socket there) and /root to root inside, /workspace and /home/agent to the agent user. With an id
// map these are host ids base and base+1000; without, 0 and 1000. Create calls it once the
// directories exist and the spec is built, before the container is created.
func ownWritableBinds(s *specs.Spec, m runtime.IDMap) error {
	uid, gid := int(m.UIDBase), int(m.GIDBase) // root inside; 0 without a map
	owners := map[string][2]int{
		guestRunDir:  {uid, gid},
		rootHome:     {uid, gid},
		workspaceDir: {uid + agentUID, gid + agentGID},
		agentHome:    {uid + agentUID, gid + agentGID},
	}
	for _, mnt := range s.Mounts {
		o, ok := owners[mnt.Destination]
		if !ok || mnt.Type != "bind" {
			continue
		}
		if err := os.Lchown(mnt.Source, o[0], o[1]); err != nil {
			return fmt.Errorf("give %s (bound at %s) to host uid %d: %w", mnt.Source, mnt.Destination, o[0], err)
		}
	}
	return nil
}

// closeDisk makes the disk's mount root 0700, owned by the sandbox's root (host root without a
// map), so that other host users cannot reach anything on it.
func closeDisk(disk string, m runtime.IDMap) error {
	if err := os.Lchown(disk, int(m.UIDBase), int(m.GIDBase)); err != nil {
		return err
	}
	return os.Chmod(disk, 0o700)
}

// searchableDirs are the directories under Root that sandboxes' unprivileged root must search.
func (r *Runtime) searchableDirs() []string {
	return []string{r.root, filepath.Join(r.root, "rootfs"), filepath.Join(r.root, "sandboxes"), filepath.Join(r.root, "bin"), r.nullDir()}
}

// makeSearchable makes Root and the directories under it that sandboxes reach 0711: searchable,
// not listable.
func (r *Runtime) makeSearchable() error {
	for _, d := range r.searchableDirs() {
		if err := os.MkdirAll(d, 0o711); err != nil {
			return err
		}
		if err := os.Chmod(d, 0o711); err != nil {
			return err
		}
	}
	return nil
}

// installGuest puts the guest binary at Root/bin/agentbox, readable and executable by everyone,
// and returns that path: a hard link when the binary is on Root's file system and already
// world-executable, else a copy. A new install replaces the old by rename; running sandboxes
// keep the binary they bound.
func (r *Runtime) installGuest() (string, error) {
	src := r.guestBinary
	dst := filepath.Join(r.root, "bin", "agentbox")
	tmp := dst + ".tmp-" + strconv.Itoa(os.Getpid())
	_ = os.Remove(tmp)
	fi, err := os.Stat(src)
	if err != nil {
		return "", err
	}
	linked := fi.Mode().Perm()&0o005 == 0o005 && os.Link(src, tmp) == nil
	if !linked {
		if err := copyExecutable(src, tmp); err != nil {
			_ = os.Remove(tmp)
			return "", err
		}
	}
	if err := os.Rename(tmp, dst); err != nil {
		_ = os.Remove(tmp)
		return "", err
	}
	return dst, nil
}

func copyExecutable(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Chmod(0o755); err != nil { // whatever the umask
		out.Close()
		return err
	}
	return out.Close()
}

// viewBinds points the spec's binds of the sandbox's disk (dir/disk/...) at its id-mapped view
// (dir/view/...), once the disk is mounted there.
func viewBinds(s *specs.Spec, dir string) {
	disk, view := filepath.Join(dir, diskMountName), filepath.Join(dir, viewMountName)
	for i, mnt := range s.Mounts {
		if mnt.Type == "bind" && strings.HasPrefix(mnt.Source, disk+"/") {
			s.Mounts[i].Source = view + strings.TrimPrefix(mnt.Source, disk)
		}
	}
}
