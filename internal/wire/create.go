package wire

// CreateRequest asks for a sandbox. Zero values take the service's defaults.
type CreateRequest struct {
	Image      string            `json:"image,omitempty"`
	Runtime    string            `json:"runtime,omitempty"`
	CPU        float64           `json:"cpu,omitempty"`
	MemoryMB   int64             `json:"memory_mb,omitempty"`
	DiskMB     int64             `json:"disk_mb,omitempty"`
	TTLSeconds int64             `json:"ttl_seconds,omitempty"`
	Env        map[string]string `json:"env,omitempty"`
	Labels     map[string]string `json:"labels,omitempty"`
	// Requirements pick a runtime that satisfies them when Runtime is empty, and are checked
	// against Runtime when it is not.
	Requirements Requirements `json:"requirements,omitzero"`
	// IdempotencyKey makes a retried create return the sandbox the first one made: keys are
	// scoped to the caller's owner and kept as long as the sandbox's record.
	IdempotencyKey string `json:"idempotency_key,omitempty"`
	// Network is "none" (the default) or an egress policy.
	Network *Network `json:"network,omitempty"`
	// Secrets are swapped in at the egress proxy, never put in the sandbox.
	Secrets map[string]SecretSpec `json:"secrets,omitempty"`
	// Snapshot makes the sandbox from a snapshot (its files, and its memory where captured)
	// instead of the image: the shape (image, runtime, disk_mb; cpu and memory_mb with memory)
	// is the snapshot's, and asking for another is INVALID_ARGUMENT.
	Snapshot string `json:"snapshot,omitempty"`
	// AutoWake, TTLWhileSleeping and OnExpiry: see Sandbox.
	AutoWake         bool   `json:"auto_wake,omitempty"`
	TTLWhileSleeping bool   `json:"ttl_while_sleeping,omitempty"`
	OnExpiry         string `json:"on_expiry,omitempty"`
}

// Requirements constrain which runtime may run a sandbox. The zero value accepts the server's
// default runtime.
type Requirements struct {
	// Isolation is the weakest boundary acceptable between the sandbox's code and the host:
	// "process" (namespaces and cgroups on the host's kernel: runc, crun), "kernel" (a separate
	// kernel between the code and the host: gVisor) or "vm" (a hardware virtual machine). A
	// runtime that gives less is never chosen.
	Isolation string `json:"isolation,omitempty"`
	// Network is the network mode the sandbox needs: "egress" (a runtime that can give a
	// sandbox a network policy: runtime.NetworkEgress) or "none" (every runtime). A create with
	// a network policy needs "egress" without saying so.
	Network string `json:"network,omitempty"`
}

// SecretSpec is one entry of a create's "secrets": the sandbox sees NAME=<placeholder>; the
// proxy swaps in the value From resolves to ("env:VAR" or "file:/path") on requests to Hosts.
type SecretSpec struct {
	From  string   `json:"from"`
	Hosts []string `json:"hosts"`
	// Body swaps the placeholder in request bodies too, not only in headers.
	Body bool `json:"body,omitempty"`
}
