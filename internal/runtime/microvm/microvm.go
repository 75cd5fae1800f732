// Package microvm is the vm runtime: every sandbox is a QEMU microVM (`-M microvm`) with a
// kernel of its own, booted from Debian's cloud kernel and an initramfs whose /init is the guest
// agent binary (vminit), the image's root file system as a read-only ext4 disk under a writable
// overlay on the sandbox's own disk, and the guest protocol spoken over a virtio-serial port.
// QEMU runs unprivileged, with `-sandbox on`, in the sandbox's cgroup, with KVM where a probe
// boot proves /dev/kvm works and TCG (software emulation) otherwise. It has no NIC: network
// "none" only.
package microvm

import (
	"log/slog"
	"regexp"
)

// Name is the runtime's name (`--runtime vm`, isolation "vm").
const Name = "vm"

// Accelerators (Config.Accel).
const (
	AccelAuto = "auto"
	AccelKVM  = "kvm"
	AccelTCG  = "tcg"
)

// DefaultCache is where hack/vm-deps.sh (make deps) unpacks Debian's cloud kernel.
const DefaultCache = "/var/cache/agentbox/vm"

// DefaultKernel is the kernel used when Config.Kernel is "".
const DefaultKernel = DefaultCache + "/current/vmlinuz"

// Config configures the vm runtime.
type Config struct {
	// Root is the runtime's own state root (absolute; at most 66 bytes, so that a VM's sockets
	// fit a unix socket path): sandboxes/<id> holds each VM's disk, record and sockets, and
	// cache/ the initramfs and image disks built at first use.
	Root string
	// Kernel is the guest kernel (a bzImage); "" is DefaultKernel. Its modules are looked up
	// in ModulesDir, default the directory "modules" beside it.
	Kernel     string
	ModulesDir string
	// Accel is AccelAuto (KVM when a probe boot works, else TCG), AccelKVM or AccelTCG.
	Accel string
	// GuestBinary is the static agent binary, the initramfs's /init.
	GuestBinary string
	// QEMU is the emulator's executable; "" is qemu-system-x86_64 from PATH.
	QEMU string
	// CgroupParent is the cgroup (one path component under the cgroup v2 root) each VM gets
	// <CgroupParent>/<id> in; two runtimes on one host must not share it.
	CgroupParent string
	// UID and GID run the QEMU of a sandbox whose Spec has no IDMap (default 65534: nobody),
	// as doctor's test boot does; a sandbox with an id range (every one the control plane
	// creates) runs its QEMU as the range's base uid and gid instead. QEMU never runs as root.
	UID, GID uint32
	Logger   *slog.Logger
}

var parentPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)

// maxRootLen keeps Root + "/sandboxes/sb-xxxxxxxxxxxx/run/agent.sock" within 107 bytes.
const maxRootLen = 107 - len("/sandboxes/sb-000000000000/run/agent.sock")
