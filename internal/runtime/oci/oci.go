// Package oci runs sandboxes as OCI containers through an OCI runtime's command line: runc,
// crun and gVisor's runsc (Flavor) share one code path with small per-flavour differences
// (flavor_linux.go): the bundle layout under the runtime's Root, the shared read-only root file
// system, the hardened spec, and lifecycle through the runtime's create, start, kill, delete,
// state and list commands. The guest agent is the container's init, listening on a unix socket
// that the host reaches through the bundle's run/ directory.
//
// Layout under Config.Root:
//
//	state/                 the OCI runtime's --root
//	bin/agentbox           the agent binary (agentbox-guest) every sandbox binds (userns_linux.go)
//	rootfs/host/           the shared read-only skeleton of image "host", prepared once: the
//	                       lower layer of its sandboxes' root overlays
//	disk-templates/        one formatted ext4 image per disk size, copied by every create
//	netns/<id>             network egress on runc and crun: the sandbox's network namespace,
//	                       bind-mounted (netns_linux.go)
//	sandboxes/<id>/        config.json, init.pid, disk.img (the sandbox's disk: sparse ext4 of
//	                       disk_mb MiB on a loop device), run -> disk/run; network egress:
//	                       resolv.conf, etc-agentbox/ca-bundle.pem
//	sandboxes/<id>/disk/   the disk's mount: run/ (at /.agentbox/run; agent.sock), workspace/,
//	                       home/, root/ (at /root), guest.log (the agent's stdout and stderr);
//	                       rootfs/upper and rootfs/work (the root's writable layer);
//	                       see disk_linux.go
//	sandboxes/<id>/rootfs  the sandbox's root: an overlay of its image's layers under
//	                       disk/rootfs/upper (rootfs_linux.go, overlay_linux.go); lower/N the
//	                       id-mapped lowers attached for it; rootfs.json its writable layer
//
// Root, bin/, rootfs/ and sandboxes/ are 0711: in a user namespace the sandbox's root, an
// unprivileged host user, must search them (userns_linux.go). The sandbox's run/ and root/
// belong to its root, workspace/ and home/ to its agent user, in its range of host ids.
package oci

import (
	"log/slog"
	"regexp"

	"github.com/agentbox/agentbox/internal/sandboxid"
)

// Flavor is which OCI runtime a Runtime drives.
type Flavor string

const (
	// FlavorRunc is runc: namespaces and cgroups on the host kernel.
	FlavorRunc Flavor = "runc"
	// FlavorCrun is crun: the same isolation as runc, in C. On a cgroup v1 "hybrid" host whose
	// cgroup2 hierarchy has controllers, crun 1.8 refuses to start; its commands then run in a
	// private mount namespace where that hierarchy's cgroup.controllers reads empty.
	FlavorCrun Flavor = "crun"
	// FlavorGVisor is gVisor's runsc: a user-space kernel between the workload and the host.
	FlavorGVisor Flavor = "gvisor"
)

// Config configures an OCI runtime.
type Config struct {
	// Name is the runtime's name as agentbox reports it; default the Flavor's name.
	Name string
	// Flavor is the OCI runtime driven; default runc, or the flavour Name names ("crun";
	// "gvisor" or "runsc").
	Flavor Flavor
	// Binary is the OCI runtime's executable: a path, or a name looked up in PATH; default
	// runc, crun or runsc by Flavor.
	Binary string
	// Root is the runtime's own state root, an absolute path. It must be short: the agent's
	// socket, Root + "/sandboxes/<id>/run/agent.sock", must fit a unix socket path (107 bytes),
	// so Root may be at most 66 bytes.
	Root string
	// GuestBinary is the absolute path of the agent binary (the lean agentbox-guest, or any
	// agentbox binary: both have the guest command), bound read-only into every sandbox and run
	// there as `agentbox guest`. It must be statically linked.
	GuestBinary string
	// CgroupParent is the cgroup under which every sandbox gets <CgroupParent>/<id> in each
	// hierarchy; default "agentbox-" and 8 hex digits of Root's path (statedir.Identity), one
	// of its own per root. List reports, and Delete removes, every sandbox-shaped cgroup under
	// it: two runtimes on one host (a server and a test, two servers) must not share a
	// CgroupParent, or one sweeps the other's sandboxes (a server holds a host lock on its
	// parents for its life: internal/hostlock).
	CgroupParent string
	// Subreaper makes this process a child subreaper (prctl PR_SET_CHILD_SUBREAPER) so that
	// sandbox inits, orphaned when the runtime's create command exits, are reparented to it
	// and reaped by Stop and Delete at once, instead of by PID 1 (which may reap late, or
	// never in a container without an init). It changes this whole process: a server sets it
	// once.
	Subreaper bool
	// Logger receives debug logs of every runtime command; nil discards.
	Logger *slog.Logger
}

// validID is sandboxid.Valid: every host resource is named from an id that passes it.
func validID(id string) bool { return sandboxid.Valid(id) }

// parentPattern is the shape of Config.CgroupParent: one path component.
var parentPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)

// LegacyCgroupParent is the cgroup parent every server shared by default before the default
// was derived from the state dir: a server whose store still has sandboxes there keeps it
// (cmd/agentbox adopts them rather than leaving them behind).
const LegacyCgroupParent = "agentbox"

// maxRootLen keeps Root + "/sandboxes/sb-xxxxxxxxxxxx/run/agent.sock" within 107 bytes.
const maxRootLen = 107 - len("/sandboxes/sb-000000000000/run/agent.sock")
