package sandbox

import (
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/image"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/sandboxid"
	"github.com/agentbox/agentbox/internal/text"
)

// Limits on create arguments.
const (
	MinMemoryMB = 16
	MaxMemoryMB = 1 << 20
	MaxCPU      = 1024
	MinDiskMB   = 16
	MaxDiskMB   = 1 << 22
	MaxEnv      = 256
	MaxLabels   = 64
	MaxKeyLen   = 256
	maxValLen   = 8 << 10
)

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
	// against Runtime when it is not (runtimes.go).
	Requirements Requirements `json:"requirements,omitzero"`
	// IdempotencyKey makes a retried create return the sandbox the first one made: keys are
	// scoped to the caller's owner (WithOwner) and kept as long as the sandbox's record.
	IdempotencyKey string `json:"idempotency_key,omitempty"`
	// Network is "none" (the default) or an egress policy (network.go).
	Network *Network `json:"network,omitempty"`
	// Secrets are swapped in at the egress proxy, never put in the sandbox (network.go).
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

// What happens to a sandbox when its TTL runs out (Sandbox.OnExpiry).
const (
	OnExpiryDestroy = "destroy" // the default: it is destroyed
	OnExpirySleep   = "sleep"   // it sleeps (a files snapshot, or files and memory where the runtime keeps memory)
)

func (s *Service) validateCreate(req *CreateRequest) (runtime.Runtime, error) {
	if req.Image == "" {
		req.Image = s.cfg.DefaultImage
	}
	if req.Image != image.Host {
		if err := CheckImageRef("image", req.Image); err != nil {
			return nil, err
		}
	}
	rt, err := s.pickRuntime(req)
	if err != nil {
		return nil, err
	}
	caps := rt.Capabilities()
	if req.Image != image.Host && s.cfg.Images == nil && !caps.PullsImages() {
		return nil, errcode.New(errcode.InvalidArgument, "image %q: this server has no image cache, so only image %q is available", text.Truncate(req.Image, 128), image.Host)
	}
	if kind := imageKind(req.Image); !caps.TakesImage(kind) {
		if kind == runtime.ImageOCI {
			return nil, errcode.New(errcode.InvalidArgument, "image %q is an OCI image, which runtime %s does not run (it runs: %s); %s",
				text.Truncate(req.Image, 128), req.Runtime, strings.Join(caps.Images, ", "), s.imageHint())
		}
		return nil, errcode.New(errcode.InvalidArgument, "image %q is not available on runtime %s; available images: %s", text.Truncate(req.Image, 128), req.Runtime, strings.Join(caps.Images, ", "))
	}
	switch {
	case req.CPU < 0 || req.CPU > MaxCPU:
		return nil, errcode.New(errcode.InvalidArgument, "cpu must be between 0.01 and %d cores (fractions allowed); got %g", MaxCPU, req.CPU)
	case req.CPU > 0 && req.CPU < 0.01:
		return nil, errcode.New(errcode.InvalidArgument, "cpu must be at least 0.01 cores; got %g", req.CPU)
	case req.MemoryMB < 0 || (req.MemoryMB > 0 && req.MemoryMB < MinMemoryMB) || req.MemoryMB > MaxMemoryMB:
		return nil, errcode.New(errcode.InvalidArgument, "memory_mb must be between %d and %d; got %d", MinMemoryMB, MaxMemoryMB, req.MemoryMB)
	case req.DiskMB < 0 || (req.DiskMB > 0 && req.DiskMB < MinDiskMB) || req.DiskMB > MaxDiskMB:
		return nil, errcode.New(errcode.InvalidArgument, "disk_mb must be between %d and %d; got %d", MinDiskMB, MaxDiskMB, req.DiskMB)
	case req.TTLSeconds < 0 || req.TTLSeconds > int64(s.cfg.MaxTTL/time.Second):
		return nil, errcode.New(errcode.InvalidArgument, "ttl_seconds must be between 1 and %d (the server's max TTL); got %d", int64(s.cfg.MaxTTL/time.Second), req.TTLSeconds)
	case len(req.Env) > MaxEnv:
		return nil, errcode.New(errcode.InvalidArgument, "env has %d entries; at most %d are allowed", len(req.Env), MaxEnv)
	case len(req.Labels) > MaxLabels:
		return nil, errcode.New(errcode.InvalidArgument, "labels has %d entries; at most %d are allowed", len(req.Labels), MaxLabels)
	}
	if err := ValidateEnv("env", req.Env); err != nil {
		return nil, err
	}
	if err := s.validateOnExpiry(req, rt); err != nil {
		return nil, err
	}
	for k, v := range req.Labels {
		if k == "" || len(k) > MaxKeyLen || len(v) > maxValLen || strings.ContainsAny(k, "=,\x00") || strings.ContainsRune(v, 0) {
			return nil, errcode.New(errcode.InvalidArgument, "label %q is invalid: keys must be 1-%d characters without '=', ',' or NUL, values at most %d bytes without NUL", k, MaxKeyLen, maxValLen)
		}
	}
	if req.CPU == 0 {
		req.CPU = s.cfg.DefaultCPU
	}
	if req.MemoryMB == 0 {
		req.MemoryMB = s.cfg.DefaultMemMB
	}
	if req.DiskMB == 0 {
		req.DiskMB = s.cfg.DefaultDiskMB
	}
	if req.TTLSeconds == 0 {
		req.TTLSeconds = int64(s.cfg.DefaultTTL / time.Second)
	}
	return rt, nil
}

// validateOnExpiry checks req's on_expiry against rt: sleeping at expiry needs a runtime that
// can save a sandbox, and is the opposite of a TTL that runs on while asleep. "destroy" is
// stored as the default, "".
func (s *Service) validateOnExpiry(req *CreateRequest, rt runtime.Runtime) error {
	switch req.OnExpiry {
	case "", OnExpiryDestroy:
		req.OnExpiry = ""
		return nil
	case OnExpirySleep:
	default:
		return errcode.New(errcode.InvalidArgument, "on_expiry must be %q (the default) or %q; got %q", OnExpiryDestroy, OnExpirySleep, text.Truncate(req.OnExpiry, 64))
	}
	if req.TTLWhileSleeping {
		return errcode.New(errcode.InvalidArgument, "on_expiry %q and ttl_while_sleeping contradict each other (a sandbox that sleeps at its expiry would be destroyed at once); drop one", OnExpirySleep)
	}
	if _, ok := rt.(runtime.Snapshotter); !ok || !slices.Contains(rt.Capabilities().Snapshots, runtime.SnapshotFiles) || s.cfg.SnapshotDir == "" {
		return errcode.New(errcode.InvalidArgument, "on_expiry %q needs a runtime that can save a sandbox, and runtime %s on this server cannot; pick another runtime or leave on_expiry out", OnExpirySleep, rt.Name()).
			With("runtime", rt.Name())
	}
	return nil
}

// ValidateLabels applies create's rule for labels to those of another request (a snapshot's,
// a fork's), naming its field.
func ValidateLabels(field string, labels map[string]string) error {
	if len(labels) > MaxLabels {
		return errcode.New(errcode.InvalidArgument, "%s has %d entries; at most %d are allowed", field, len(labels), MaxLabels)
	}
	for k, v := range labels {
		if k == "" || len(k) > MaxKeyLen || len(v) > maxValLen || strings.ContainsAny(k, "=,\x00") || strings.ContainsRune(v, 0) {
			return errcode.New(errcode.InvalidArgument, "%s: label %q is invalid: keys must be 1-%d characters without '=', ',' or NUL, values at most %d bytes without NUL", field, text.Truncate(k, 64), MaxKeyLen, maxValLen)
		}
	}
	return nil
}

// ValidateEnv checks environment variables: POSIX-ish names, no NUL.
func ValidateEnv(field string, env map[string]string) error {
	for k, v := range env {
		if !ValidEnvName(k) {
			return errcode.New(errcode.InvalidArgument, "%s: %q is not a valid variable name (letters, digits and _, not starting with a digit)", field, k)
		}
		if strings.ContainsRune(v, 0) || len(v) > maxValLen*4 {
			return errcode.New(errcode.InvalidArgument, "%s: value of %s must not contain NUL and be at most %d bytes", field, k, maxValLen*4)
		}
	}
	return nil
}

// ValidEnvName reports whether k is a POSIX-ish variable name: letters, digits and _, not
// starting with a digit, at most MaxKeyLen.
func ValidEnvName(k string) bool {
	if k == "" || len(k) > MaxKeyLen {
		return false
	}
	for i, c := range k {
		if c == '_' || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (i > 0 && c >= '0' && c <= '9') {
			continue
		}
		return false
	}
	return true
}

func (s *Service) runtimeNames() []string {
	var names []string
	for n := range s.local.runtimes {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// checkID refuses a malformed id (sandboxid.Check).
func checkID(id string) error { return sandboxid.Check(id) }

func checkPath(path string) error {
	if path == "" {
		return errcode.New(errcode.InvalidArgument, "path is required (absolute, or relative to /workspace)")
	}
	if strings.ContainsRune(path, 0) {
		return errcode.New(errcode.InvalidArgument, "path contains a NUL byte")
	}
	if len(path) > 4096 {
		return errcode.New(errcode.InvalidArgument, "path is %d bytes; at most 4096 are allowed", len(path))
	}
	return nil
}
