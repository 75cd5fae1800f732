package wire

// RuntimeList is the reply of GET /v1/runtimes: the runtimes the server offers and its default.
type RuntimeList struct {
	Default  string         `json:"default"`
	Runtimes []Capabilities `json:"runtimes"`
}

// Capabilities is what a runtime declares after probing the server's host (the runtime
// package's Capabilities, as replies carry it).
type Capabilities struct {
	Name      string `json:"name"`
	Available bool   `json:"available"`
	Reason    string `json:"reason,omitempty"` // why not available
	Version   string `json:"version,omitempty"`
	// Isolation is process, kernel or vm.
	Isolation string `json:"isolation"`
	// CgroupMode is "v1", "hybrid" or "v2".
	CgroupMode string `json:"cgroup_mode,omitempty"`
	// Images the runtime can run ("host", and the OCI image kinds it takes).
	Images []string `json:"images"`
	// OCIImageReason says why a runtime that could take OCI images does not on this host.
	OCIImageReason string `json:"oci_image_reason,omitempty"`
	// NetworkModes the runtime can give a sandbox.
	NetworkModes []string `json:"network_modes"`
	// EgressReason says why a runtime does not offer egress.
	EgressReason string `json:"egress_reason,omitempty"`
	// TransparentEgressReason says why a runtime does not give the transparent egress path here.
	TransparentEgressReason string `json:"transparent_egress_reason,omitempty"`
	// Hardening lists what the runtime enforces on every sandbox.
	Hardening []string `json:"hardening,omitempty"`
	// UserNamespaces is whether each sandbox gets a user namespace.
	UserNamespaces bool `json:"user_namespaces"`
	// IDMappedFiles is whether the sandbox's files are its id range's on the host without a
	// user namespace.
	IDMappedFiles bool `json:"id_mapped_files,omitempty"`
	// HostIDPerSandbox is whether each sandbox's host-side processes (a vm sandbox's QEMU) run
	// as the base uid and gid of its own id range.
	HostIDPerSandbox bool `json:"host_id_per_sandbox,omitempty"`
	// Snapshots lists the snapshot kinds the runtime can take.
	Snapshots []string `json:"snapshots,omitempty"`
	// MemorySnapshotReason says why memory snapshots are not available on this host.
	MemorySnapshotReason string `json:"memory_snapshot_reason,omitempty"`
}
