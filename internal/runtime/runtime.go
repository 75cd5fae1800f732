// Package runtime is the contract between the control plane and the things that run sandboxes
// (OCI runtimes now; microVMs and Kubernetes later). A Runtime does lifecycle only; everything
// inside a sandbox goes through the guest agent, which a Runtime tells the control plane how to
// reach (Agent: a Dialer; the guest package speaks the protocol over it). Optional interfaces
// (Runner, Adopter, Waiter, DiskAccounter, MetricsReader, Committer, Pauser, Closer) add what
// only some runtimes do.
// runtimetest holds the suite every implementation must pass; fake is an in-process runtime
// without containers for the control plane's tests.
package runtime

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
)

// Dialer opens a byte stream to a sandbox's agent. It is safe for concurrent use and may be
// called for every request; each call is a new connection.
type Dialer func(ctx context.Context) (net.Conn, error)

// Handle is a runtime's opaque, persisted reference to one sandbox: what the runtime needs to
// find the sandbox again and tell it from a later one of the same id or a reused host pid. The
// control plane stores it on the sandbox's record and hands it back on Adopt; "" is valid (a
// runtime that needs nothing, or a record from before handles).
type Handle string

// Isolation is the strength of the boundary between a workload and the host.
type Isolation string

const (
	// IsolationProcess: namespaces and cgroups on the host kernel (runc, crun).
	IsolationProcess Isolation = "process"
	// IsolationKernel: a separate kernel between workload and host (gVisor).
	IsolationKernel Isolation = "kernel"
	// IsolationVM: a hardware virtual machine.
	IsolationVM Isolation = "vm"
)

// Capabilities is what a runtime declares after probing the host.
type Capabilities struct {
	Name      string    `json:"name"`
	Available bool      `json:"available"`
	Reason    string    `json:"reason,omitempty"` // why not available
	Version   string    `json:"version,omitempty"`
	Isolation Isolation `json:"isolation"`
	// CgroupMode is "v1", "hybrid" or "v2".
	CgroupMode string `json:"cgroup_mode,omitempty"`
	// Images the runtime can run: "host", and ImageOCI when it takes Spec.Rootfs (an OCI
	// image's unpacked layers), or ImageRef when its backend pulls Spec.Image itself.
	Images []string `json:"images"`
	// OCIImageReason says why a runtime that could take ImageOCI does not on this host (no
	// overlayfs with id-mapped lower layers, say); "" otherwise. `agentbox doctor` shows it.
	OCIImageReason string `json:"oci_image_reason,omitempty"`
	// Network modes the runtime can give a sandbox (NetworkNone, NetworkEgress).
	NetworkModes []string `json:"network_modes"`
	// EgressReason says why a runtime does not offer NetworkEgress (kubernetes: its agent's
	// egress listeners are not wired to the server's proxy); "" for one that does.
	EgressReason string `json:"egress_reason,omitempty"`
	// TransparentEgressReason says why a runtime that gives NetworkEgress sandboxes the
	// transparent path elsewhere (runc, crun) does not on this host (Hardening then lacks
	// HardeningTransparentEgress; the proxy path still works); "" otherwise.
	TransparentEgressReason string `json:"transparent_egress_reason,omitempty"`
	// Hardening lists what the runtime enforces on every sandbox, machine-readably.
	Hardening []string `json:"hardening,omitempty"`
	// UserNamespaces is whether the runtime gives each sandbox a user namespace mapping its ids
	// to the range of host ids in Spec (root inside is then an unprivileged user outside).
	UserNamespaces bool `json:"user_namespaces"`
	// IDMappedFiles is whether the sandbox's files are the range's ids on the host even though
	// its processes are not in a user namespace (gVisor: the sentry's own user namespace holds
	// them, and the disk is seen through an id-mapped mount).
	IDMappedFiles bool `json:"id_mapped_files,omitempty"`
	// HostIDPerSandbox is whether the runtime runs each sandbox's host-side processes (a vm
	// sandbox's QEMU) as the base uid and gid of the sandbox's range, so that no two sandboxes
	// share a host uid even though their own ids live in a guest kernel.
	HostIDPerSandbox bool `json:"host_id_per_sandbox,omitempty"`
	// Snapshots lists the snapshot kinds the runtime can take (Snapshotter): SnapshotFiles,
	// and SnapshotFilesMemory where it can also save and restore memory and processes.
	Snapshots []string `json:"snapshots,omitempty"`
	// MemorySnapshotReason says why a runtime that lists SnapshotFiles cannot take
	// SnapshotFilesMemory on this host (Debian's CRIU 3.17 fails `criu check` on kernels
	// ≥ 6.13, say); "" when it can or takes no snapshots. `agentbox doctor` shows it.
	MemorySnapshotReason string `json:"memory_snapshot_reason,omitempty"`
}

// TakesIDRange reports whether sandboxes of the runtime need a range of host ids (Spec.IDMap).
func (c Capabilities) TakesIDRange() bool {
	return c.UserNamespaces || c.IDMappedFiles || c.HostIDPerSandbox
}

// IDMap maps a sandbox's user and group ids 0..Count-1 to host ids UIDBase.. and GIDBase...
type IDMap struct {
	UIDBase uint32
	GIDBase uint32
	Count   uint32
}

// Spec is what a runtime needs to create a sandbox.
type Spec struct {
	// ID is the sandbox id; host resources are named from it.
	ID    string
	Image string
	// CPU in cores (fractional); 0 means unlimited.
	CPU      float64
	MemoryMB int64
	// DiskMB bounds everything the sandbox can write outside memory (its workspace, home and
	// any other writable layer) and the size of any one file; 0 means the runtime's default.
	DiskMB    int64
	PidsLimit int64
	// Env is the base environment of every process in the sandbox.
	Env map[string]string
	// IDMap is the sandbox's range of host ids, allocated by the control plane for a runtime
	// whose Capabilities say TakesIDRange; the zero value (Count 0) means none.
	IDMap IDMap
	// Network is the sandbox's network mode, one of the runtime's Capabilities.NetworkModes;
	// "" means NetworkNone. A runtime refuses any other with INVALID_ARGUMENT (CheckNetwork).
	Network string
	// CABundle is, for NetworkEgress, the PEM bundle the sandbox trusts (the host's roots and
	// agentbox's egress CA), put read-only at CABundlePath; nil: none.
	CABundle []byte
	// Rootfs is, for an OCI image (Image is then its reference), the image's unpacked layers;
	// nil for the "host" image. Either way the root is writable: a per-sandbox layer on the
	// sandbox's disk over the shared read-only layers.
	Rootfs *Rootfs
	// Snapshot, when set, is where the sandbox's disk (and, with Memory, its processes) come
	// from instead of a fresh disk: a directory a Snapshotter wrote. DiskMB must equal the
	// snapshot's; the rest of the spec (image, rootfs, env, limits) must be the snapshotted
	// sandbox's except for ID, IDMap, Env and CPU/MemoryMB (which a memory restore refuses to
	// change: INVALID_ARGUMENT).
	Snapshot *SnapshotSource
}

// Snapshot kinds (Capabilities.Snapshots, SnapshotInfo.Kind).
const (
	// SnapshotFiles: the sandbox's disk (workspace, home, root's home, the writable root layer,
	// the agent's job logs); processes and memory (/tmp and /dev/shm are memory) are not kept.
	SnapshotFiles = "files"
	// SnapshotFilesMemory: the disk and the memory and processes of every task in the sandbox;
	// a sandbox made from it continues where the snapshot was taken.
	SnapshotFilesMemory = "files+memory"
)

// SnapshotInfoFile is the file in a snapshot's directory that marks it complete (SnapshotInfo
// as JSON).
const SnapshotInfoFile = "snapshot.json"

// SnapshotOptions says what Snapshotter.Snapshot saves and what becomes of the sandbox.
type SnapshotOptions struct {
	// Memory asks for SnapshotFilesMemory; a runtime that cannot take it is
	// UNSUPPORTED_OPERATION with MemorySnapshotReason, and saves nothing.
	Memory bool
	// Release stops the sandbox once it is saved and deletes every host resource of it but the
	// snapshot (sleep): the disk is moved into the snapshot rather than copied (after the
	// sandbox is stopped and its disk unmounted). Without it the sandbox runs on (it is frozen
	// only while its state is saved).
	Release bool
}

// SnapshotInfo is what a snapshot holds.
type SnapshotInfo struct {
	Kind string `json:"kind"` // SnapshotFiles or SnapshotFilesMemory
	// SizeBytes is the host space the snapshot's files take (allocated, not apparent).
	SizeBytes int64 `json:"size_bytes"`
	// DiskMB is the size of the saved disk; a sandbox made from it has this disk_mb.
	DiskMB int64 `json:"disk_mb"`
	// IDMap is the id range the saved files carry on the host (Count 0: none).
	IDMap IDMap `json:"id_map"`
}

// SnapshotSource is a snapshot a create starts from (Spec.Snapshot).
type SnapshotSource struct {
	// Dir is the directory Snapshotter.Snapshot wrote.
	Dir string
	// Info is what Snapshot returned for it.
	Info SnapshotInfo
	// Memory restores the saved processes (Info.Kind must be SnapshotFilesMemory); without it
	// the sandbox boots a fresh agent on the saved disk.
	Memory bool
	// InPlace uses Dir's disk as the sandbox's own instead of a copy (wake: the snapshot is
	// used once): a hard link, no data copied. Dir stays whole whatever happens to the create
	// (a failure, a crash), and the caller deletes it once the sandbox runs; until then the
	// sandbox must not be given to anyone.
	InPlace bool
}

// Snapshotter is a runtime that can save a sandbox to a directory and create sandboxes from
// one (Spec.Snapshot). The control plane owns the directories (it makes each one, empty, on the
// same file system as the runtime's state, and removes it); the runtime owns what is in them.
type Snapshotter interface {
	// Snapshot saves running sandbox id into dir, writing dir/SnapshotInfoFile (the returned
	// SnapshotInfo as JSON) last: a dir without it holds no usable snapshot (a crash in the
	// middle), and one with it is complete. The saved files are consistent: every write
	// a process made before the call is in them, and none is caught half-made (the sandbox is
	// frozen while its disk is read). On failure dir holds nothing usable and the sandbox runs
	// on as before (with Release: it is running unless its own failure stopped it). An unknown
	// sandbox is SANDBOX_NOT_FOUND, a stopped one SANDBOX_NOT_RUNNING.
	Snapshot(ctx context.Context, id, dir string, opts SnapshotOptions) (SnapshotInfo, error)
}

// ImageOCI is the Capabilities.Images entry of a runtime that takes Spec.Rootfs.
const ImageOCI = "oci"

// ImageRef is the Capabilities.Images entry of a runtime that takes an OCI image as its
// reference (Spec.Image) and has its backend resolve and pull it (Kubernetes: the kubelet):
// the control plane neither pulls nor unpacks it, and Spec.Rootfs is nil.
const ImageRef = "ref"

// TakesImage reports whether a runtime of c runs an image of kind ("host" or ImageOCI): an
// ImageOCI image also runs on a runtime that takes ImageRef.
func (c Capabilities) TakesImage(kind string) bool {
	return slices.Contains(c.Images, kind) || (kind == ImageOCI && slices.Contains(c.Images, ImageRef))
}

// PullsImages reports whether the runtime's backend resolves image references itself
// (ImageRef) rather than taking the control plane's unpacked layers.
func (c Capabilities) PullsImages() bool {
	return slices.Contains(c.Images, ImageRef) && !slices.Contains(c.Images, ImageOCI)
}

// Rootfs is an OCI image's root file system as the runtime mounts it.
type Rootfs struct {
	// Layers are host directories of unpacked layers, lowest first, in overlayfs's format
	// (whiteouts are 0:0 character devices, opaque directories carry trusted.overlay.opaque).
	// Their files carry the image's own ids (0..65535 on the host): the runtime shows them to
	// the sandbox as its own ids without changing them. They are shared and never written.
	Layers []string
	// User runs commands that name none: "" (root), a name in the image's /etc/passwd, a uid,
	// or uid:gid (the image config's User).
	User string
	// Workdir is the default working directory ("": /workspace).
	Workdir string
}

// MaxRootfsLayers bounds Rootfs.Layers (overlayfs stacks at most 500; images rarely pass 50).
const MaxRootfsLayers = 128

// WritableLayer is a sandbox's writable root layer as found on the host: an overlayfs upper
// directory on the sandbox's disk.
type WritableLayer struct {
	// Dir is the upper directory (whiteouts as 0:0 character devices, trusted.overlay.opaque).
	Dir string
	// IDMap is the id range its files carry on the host: a file of uid base+n is n in the
	// sandbox (Count 0: ids are as in the sandbox).
	IDMap IDMap
	// Exclude are paths in the sandbox that agentbox made or bound in (mount points, the
	// agent's files): never part of a commit.
	Exclude []string
}

// Committer is implemented by a runtime whose sandboxes' writable layers the host can read
// (runc, crun, gVisor: all on the sandbox's disk). The layer is live: a caller that needs a
// consistent copy reads it while the sandbox's processes are frozen (Pauser) or stopped.
type Committer interface {
	WritableLayer(ctx context.Context, id string) (WritableLayer, error)
}

// Pauser is implemented by a runtime that can freeze every process of a sandbox and thaw them
// again (runc and crun through the cgroup freezer, gVisor by stopping its sentry's tasks). A
// commit pauses the sandbox while it reads the writable layer, so that no file is caught
// half-written. While a sandbox is paused its agent is frozen too: nothing may call the agent
// between Pause and Resume (the call would hang until Resume).
type Pauser interface {
	// Pause freezes sandbox id's processes and returns once they are frozen: every write they
	// made before is visible to the host's reads of the sandbox's files. Pausing a paused
	// sandbox is nil. An unknown sandbox is SANDBOX_NOT_FOUND, a stopped one SANDBOX_NOT_RUNNING.
	Pause(ctx context.Context, id string) error
	// Resume thaws what Pause froze; resuming a sandbox that is not paused is nil. An unknown
	// sandbox is SANDBOX_NOT_FOUND.
	Resume(ctx context.Context, id string) error
}

// NetworkNone is the network mode of a sandbox with a loopback interface and nothing else.
const NetworkNone = "none"

// NetworkEgress is the network mode of a sandbox whose egress goes through its agent to
// agentbox's egress proxy: loopback only, /etc/resolv.conf naming 127.0.0.1, CABundle at
// CABundlePath, and, where the runtime declares HardeningTransparentEgress, every IPv4
// address routed to the sandbox's loopback (set up by the host before the sandbox's
// processes start), so that the agent's listeners on 0.0.0.0:80 and :443 receive
// connections to any address with their original destination as the local address.
const NetworkEgress = "egress"

// CABundlePath is where a NetworkEgress sandbox finds its CA bundle.
const CABundlePath = "/etc/agentbox/ca-bundle.pem"

// MaxCABundleBytes bounds Spec.CABundle (a host's roots are a few hundred KiB).
const MaxCABundleBytes = 4 << 20

// CheckCABundle returns nil if a Spec.CABundle of this size is accepted, else INVALID_ARGUMENT
// naming the bound. A bundle is used only in mode NetworkEgress; other modes ignore it.
func CheckCABundle(b []byte) error {
	if len(b) > MaxCABundleBytes {
		return errcode.New(errcode.InvalidArgument, "ca_bundle is %d bytes; it must be at most %d bytes", len(b), MaxCABundleBytes)
	}
	return nil
}

// HardeningTransparentEgress is the Capabilities.Hardening entry of a runtime that gives
// NetworkEgress sandboxes the transparent path.
const HardeningTransparentEgress = "transparent_egress"

// CheckNetwork returns nil if mode ("" meaning NetworkNone) is one of supported, else an
// INVALID_ARGUMENT error naming the supported modes (details: supported_network_modes).
func CheckNetwork(mode string, supported []string) error {
	if mode == "" {
		mode = NetworkNone
	}
	if slices.Contains(supported, mode) {
		return nil
	}
	return errcode.New(errcode.InvalidArgument, "network mode %q is not supported by this runtime; supported network modes: %s",
		mode, strings.Join(supported, ", ")).With("supported_network_modes", slices.Clone(supported))
}

// Runner is a Runtime that can also create and start a sandbox in one step, cheaper than Create
// then Start (an OCI runtime is invoked once instead of twice).
type Runner interface {
	// Run is Create then Start in one step, with Create's contract (nothing left on failure).
	Run(ctx context.Context, spec Spec) (Handle, error)
}

// CreateAndStart creates and starts a sandbox: with Run where rt is a Runner, else with Create
// then Start. It does not wait for the agent. The Handle is the sandbox's, for the control plane
// to persist; on an error it is "" and the caller deletes the sandbox (Start's failure leaves
// the created sandbox).
func CreateAndStart(ctx context.Context, rt Runtime, spec Spec) (Handle, error) {
	if r, ok := rt.(Runner); ok {
		return r.Run(ctx, spec)
	}
	h, err := rt.Create(ctx, spec)
	if err != nil {
		return "", err
	}
	if err := rt.Start(ctx, spec.ID); err != nil {
		return "", err
	}
	return h, nil
}

// Adopter is a Runtime with per-sandbox host duties beyond what its host state records (gVisor's
// OOM guard, say): a restarted server's reconcile calls Adopt for every live sandbox it keeps.
type Adopter interface {
	// Adopt checks that sandbox id is still the one h refers to and restores its per-sandbox
	// host duties. It is idempotent. An absent sandbox is SANDBOX_NOT_FOUND; one whose init has
	// exited, or is not the process h names (a reused pid), is SANDBOX_NOT_RUNNING.
	Adopt(ctx context.Context, id string, h Handle) error
}

// Waiter is a Runtime that can wait for a sandbox's death, so that it is noticed when it
// happens and not at the next call.
type Waiter interface {
	// Wait blocks until the sandbox's init has exited (nil) or ctx ends (ctx.Err()). An absent
	// or stopped sandbox returns nil at once; so does one whose init is not the process it
	// created (its pid was reused).
	Wait(ctx context.Context, id string) error
}

// ExitReporter is a Runtime that can say why a sandbox's init ended behind its back (a VM's
// kernel panic, with its console's last lines): the control plane puts it in the lost event.
type ExitReporter interface {
	// ExitReason is a short, single-paragraph account of why sandbox id's init ended, "" when
	// the runtime cannot tell (or the sandbox runs). The text comes partly from inside the
	// sandbox (a console): the caller bounds and cleans it.
	ExitReason(ctx context.Context, id string) string
}

// OOMCounter is a Runtime whose sandboxes' agents cannot see their own memory cgroup (gVisor:
// the sandbox's memory is its sentry's, on the host), so a command the host's OOM killer ended
// would look merely SIGKILLed: the control plane reads the count before and after an exec.
type OOMCounter interface {
	// OOMKills is how many times the host's OOM killer has killed a process of sandbox id's
	// cgroup (the sentry's helpers included); ok is false where the runtime cannot tell (a
	// runc sandbox's agent reads its own cgroup instead).
	OOMKills(ctx context.Context, id string) (n int64, ok bool)
}

// DiskAccounter is a Runtime whose sandboxes' disks take host space.
type DiskAccounter interface {
	// DisksMiB is the host space (allocated, not apparent) the sandboxes' disks occupy.
	DisksMiB(ctx context.Context) (int64, error)
}

// MetricsReader is a Runtime that can measure a live sandbox's resource use (cgroups, disk).
type MetricsReader interface {
	// Metrics samples sandbox id now. A group the runtime cannot measure is nil, never zero
	// made up; if it can measure nothing the error is UNSUPPORTED_OPERATION. An unknown or
	// stopped sandbox is SANDBOX_NOT_FOUND or SANDBOX_NOT_RUNNING.
	Metrics(ctx context.Context, id string) (Metrics, error)
}

// Metrics is one sample of a sandbox's resource use. Limits of 0 mean unlimited.
type Metrics struct {
	SampledAt time.Time      `json:"sampled_at"`
	CPU       *CPUMetrics    `json:"cpu,omitempty"`
	Memory    *MemoryMetrics `json:"memory,omitempty"`
	Pids      *PidsMetrics   `json:"pids,omitempty"`
	Disk      *DiskMetrics   `json:"disk,omitempty"`
	// Unsupported names the groups (cpu, memory, pids, disk) the runtime cannot measure.
	Unsupported []string `json:"unsupported,omitempty"`
}

// CPUMetrics is CPU time used since the sandbox started and its limit.
type CPUMetrics struct {
	UsageSeconds float64 `json:"usage_seconds"`
	LimitCores   float64 `json:"limit_cores"` // 0: unlimited
}

// MemoryMetrics is memory in use (without reclaimable page cache), the limit, the page cache,
// and how many times the kernel's OOM killer killed a process of the sandbox.
type MemoryMetrics struct {
	UsedBytes  int64 `json:"used_bytes"`
	LimitBytes int64 `json:"limit_bytes"` // 0: unlimited
	CacheBytes int64 `json:"cache_bytes"`
	OOMEvents  int64 `json:"oom_events"`
}

// PidsMetrics is how many tasks (processes and threads) the sandbox holds and its limit.
type PidsMetrics struct {
	Current int64 `json:"current"`
	Limit   int64 `json:"limit"` // 0: unlimited
}

// DiskMetrics is the space used on the sandbox's own disk and its size.
type DiskMetrics struct {
	UsedBytes  int64 `json:"used_bytes"`
	TotalBytes int64 `json:"total_bytes"` // 0: not bounded by the runtime
}

// Closer is a Runtime with host-wide resources beyond its sandboxes (a cgroup parent, a pinned
// namespace). Close releases them; sandboxes keep running for a restarted server to adopt.
type Closer interface {
	Close(ctx context.Context) error
}

// AgentPeerError is why a Dialer refused a connection: the process holding the sandbox's agent
// socket is not the sandbox's agent (root inside the sandbox replaced the socket with its own
// listener). A Dialer returns it wrapped in an errcode.Error (SANDBOX_NOT_RUNNING) and never
// hands such a connection to the caller, so no reply of the impostor reaches the control plane.
type AgentPeerError struct {
	// ID is the sandbox's id.
	ID string
	// PeerPID is the host pid holding the socket's other end, WantPID the one that should
	// (the sandbox's init, or the process the runtime knows the agent's socket belongs to).
	PeerPID, WantPID int32
}

func (e *AgentPeerError) Error() string {
	return fmt.Sprintf("sandbox %s: its agent socket is held by another process (host pid %d), not the sandbox's agent (host pid %d)",
		e.ID, e.PeerPID, e.WantPID)
}

// Status is a container's state as the runtime sees it.
type Status string

const (
	StatusAbsent  Status = "absent"
	StatusCreated Status = "created"
	StatusRunning Status = "running"
	StatusStopped Status = "stopped"
)

// Runtime manages sandboxes' lifecycle on one kind of backend.
//
// All methods are safe for concurrent use on different ids. Delete is idempotent and removes
// every host resource named from the id (container, cgroups, mounts, directories).
type Runtime interface {
	// Name is the runtime's name as the control plane and its callers know it ("runc").
	Name() string
	// Capabilities is what the runtime declares after probing the host; it does no I/O.
	Capabilities() Capabilities
	// Create prepares and creates the sandbox without starting its workload and returns its
	// Handle. On failure nothing of the sandbox is left. A spec the runtime cannot honour
	// (image, network mode, limits) is INVALID_ARGUMENT.
	Create(ctx context.Context, spec Spec) (Handle, error)
	// Start starts the sandbox's init (the guest agent). It does not wait for the agent.
	Start(ctx context.Context, id string) error
	// Stop kills every process of the sandbox and waits until they are gone; stopping a
	// stopped sandbox is nil.
	Stop(ctx context.Context, id string) error
	// Delete removes the sandbox and all its host resources; deleting an absent sandbox is nil.
	Delete(ctx context.Context, id string) error
	// State reports the sandbox's status; an unknown id is StatusAbsent with a nil error.
	State(ctx context.Context, id string) (Status, error)
	// List returns the ids of every sandbox this runtime holds any host resource for,
	// including half-created and orphaned ones, so reconcile can sweep them.
	List(ctx context.Context) ([]string, error)
	// Agent returns how to reach the sandbox's agent: a Dialer for guest.NewClient. Where the
	// runtime can tell, every dial checks that the other end is the sandbox's own agent and
	// fails with an *AgentPeerError in its chain when it is not. An unknown id is
	// SANDBOX_NOT_FOUND; the agent of a sandbox not (yet) running does not answer the dial.
	Agent(ctx context.Context, id string) (Dialer, error)
}

// FileTree is one directory of a sandbox's files as the host sees it.
type FileTree struct {
	// Path is where the tree is in the sandbox ("/workspace", "/home/agent", "/root", or "/"
	// for the writable root layer).
	Path string
	// Dir is the host directory holding it.
	Dir string
	// Layer says Dir is an overlayfs upper: a 0:0 character device is a deletion (whiteout)
	// and a directory with trusted.overlay.opaque=y hides what is below it. Trees nested in
	// a layer's Path (/workspace in /) are listed apart and win over the layer.
	Layer bool
	// Exclude are in-sandbox paths under Path that the tree holds only as mount points (the
	// runtime made them for its mounts: /proc, the agent's binary, ...): a diff skips them and
	// what is below them.
	Exclude []string
}

// Files is what a FilesReader shows of a sandbox or a snapshot: its trees, read-only to the
// caller, and the id range the files carry on the host.
type Files struct {
	Trees []FileTree
	IDMap IDMap
}

// FilesReader is a runtime whose sandboxes' (and snapshots') files the host can read in place
// (a diff walks them; nothing is copied).
type FilesReader interface {
	// SandboxFiles returns running sandbox id's trees (live: a caller wanting a consistent
	// view pauses it). An unknown sandbox is SANDBOX_NOT_FOUND.
	SandboxFiles(ctx context.Context, id string) (Files, error)
	// SnapshotFiles mounts the files of a snapshot that Snapshot wrote to dir read-only
	// (nodev, nosuid, noexec) and returns them with release, which unmounts them; a mount
	// left by a crash is removed when the runtime is next made (New).
	SnapshotFiles(ctx context.Context, dir string, info SnapshotInfo) (f Files, release func() error, err error)
}
