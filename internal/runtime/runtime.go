// Package runtime is the contract between the control plane and the things that run sandboxes
// (OCI runtimes now; microVMs and Kubernetes later). A Runtime does lifecycle only; everything
// inside a sandbox goes through the guest agent, whose client a Runtime hands back.
// runtimetest holds the suite every implementation must pass.
package runtime

import (
	"context"

	"github.com/agentbox/agentbox/internal/guest"
)

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
	// Images the runtime can run ("host" today).
	Images []string `json:"images"`
	// Network modes the runtime can give a sandbox ("none" today).
	NetworkModes []string `json:"network_modes"`
	// Hardening lists what the runtime enforces on every sandbox, machine-readably.
	Hardening []string `json:"hardening,omitempty"`
	// UserNamespaces is whether the runtime gives each sandbox a user namespace mapping its ids
	// to the range of host ids in Spec (root inside is then an unprivileged user outside).
	UserNamespaces bool `json:"user_namespaces"`
	// IDMappedFiles is whether the sandbox's files are the range's ids on the host even though
	// its processes are not in a user namespace (gVisor: the sentry's own user namespace holds
	// them, and the disk is seen through an id-mapped mount).
	IDMappedFiles bool `json:"id_mapped_files,omitempty"`
}

// TakesIDRange reports whether sandboxes of the runtime need a range of host ids (Spec.IDMap).
func (c Capabilities) TakesIDRange() bool { return c.UserNamespaces || c.IDMappedFiles }

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
}

// Runner is a Runtime that can also create and start a sandbox in one step, cheaper than Create
// then Start (an OCI runtime is invoked once instead of twice).
type Runner interface {
	Run(ctx context.Context, spec Spec) error
}

// CreateAndStart creates and starts a sandbox: with Run where rt is a Runner, else with Create
// then Start. It does not wait for the agent.
func CreateAndStart(ctx context.Context, rt Runtime, spec Spec) error {
	if r, ok := rt.(Runner); ok {
		return r.Run(ctx, spec)
	}
	if err := rt.Create(ctx, spec); err != nil {
		return err
	}
	return rt.Start(ctx, spec.ID)
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
	Name() string
	Capabilities() Capabilities
	// Create prepares and creates the sandbox without starting its workload.
	Create(ctx context.Context, spec Spec) error
	// Start starts the sandbox's init (the guest agent). It does not wait for the agent.
	Start(ctx context.Context, id string) error
	// Stop kills every process of the sandbox.
	Stop(ctx context.Context, id string) error
	// Delete removes the sandbox and all its host resources; deleting an absent sandbox is nil.
	Delete(ctx context.Context, id string) error
	// State reports the sandbox's status; an unknown id is StatusAbsent with a nil error.
	State(ctx context.Context, id string) (Status, error)
	// List returns the ids of every sandbox this runtime holds any host resource for,
	// including half-created and orphaned ones, so reconcile can sweep them.
	List(ctx context.Context) ([]string, error)
	// Guest returns a client for the sandbox's guest agent.
	Guest(ctx context.Context, id string) (*guest.Client, error)
}
