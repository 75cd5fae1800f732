package mcpserver

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/sandbox/pools"
)

// Warm pools: pool_set, pool_list, pool_delete.

// PoolBackend is what the pool tools need from the control plane: the warm pools feature
// (*pools.Service) of an in-process backend's core, or a remote backend's pool calls. A backend
// with neither answers UNSUPPORTED_OPERATION.
type PoolBackend interface {
	SetPool(ctx context.Context, p sandbox.Pool) (sandbox.PoolStatus, error)
	ListPools(ctx context.Context) ([]sandbox.PoolStatus, error)
	DeletePool(ctx context.Context, name string) error
}

// PoolSetIn is pool_set's arguments.
type PoolSetIn struct {
	Name     string  `json:"name" jsonschema:"The pool's name: 1-63 characters of a-z, 0-9, - and _. Setting an existing pool replaces its shape and size."`
	Image    string  `json:"image,omitempty" jsonschema:"Image of the pool's sandboxes (default: the server's, as sandbox_create)."`
	Runtime  string  `json:"runtime,omitempty" jsonschema:"Runtime (default: the server's)."`
	CPU      float64 `json:"cpu,omitempty" jsonschema:"CPU limit in cores (default: the server's)."`
	MemoryMB int64   `json:"memory_mb,omitempty" jsonschema:"Memory limit in MiB (default: the server's)."`
	DiskMB   int64   `json:"disk_mb,omitempty" jsonschema:"Disk size in MiB (default: the server's)."`
	Network  string  `json:"network,omitempty" jsonschema:"none (the default) or egress: sandboxes with the egress proxy ready, for creates with a network policy; each claimant's allow/deny policy and secrets apply when it claims one."`
	Size     *int    `json:"size" jsonschema:"How many ready sandboxes the pool keeps: 0 (parks it) to the server's bound on pooled sandboxes (max_pooled in pool_list; all pools together)."`
}

// PoolInfo is a pool as the pool tools report it.
type PoolInfo struct {
	Name      string    `json:"name" jsonschema:"The pool's name."`
	Image     string    `json:"image" jsonschema:"Image of its sandboxes."`
	Runtime   string    `json:"runtime" jsonschema:"Runtime of its sandboxes."`
	CPU       float64   `json:"cpu" jsonschema:"CPU limit in cores."`
	MemoryMB  int64     `json:"memory_mb" jsonschema:"Memory limit in MiB."`
	DiskMB    int64     `json:"disk_mb" jsonschema:"Disk size in MiB."`
	Network   string    `json:"network" jsonschema:"none or egress."`
	Size      int       `json:"size" jsonschema:"How many ready sandboxes it keeps (the target)."`
	Ready     int       `json:"ready" jsonschema:"Ready sandboxes it holds now."`
	Starting  int       `json:"starting" jsonschema:"Sandboxes being started for it now."`
	Hits      int64     `json:"hits" jsonschema:"Creates of its shape that claimed a ready sandbox (since the server started)."`
	Misses    int64     `json:"misses" jsonschema:"Creates of its shape that found none ready and started one."`
	LastError string    `json:"last_error,omitempty" jsonschema:"Why refilling it keeps failing, while it does."`
	UpdatedAt time.Time `json:"updated_at" jsonschema:"When it was last set (RFC 3339)."`
}

func poolInfo(p sandbox.PoolStatus) PoolInfo {
	return PoolInfo{Name: p.Name, Image: p.Image, Runtime: p.Runtime, CPU: p.CPU, MemoryMB: p.MemoryMB, DiskMB: p.DiskMB,
		Network: p.Network, Size: p.Size, Ready: p.Ready, Starting: p.Starting, Hits: p.Hits, Misses: p.Misses,
		LastError: p.LastError, UpdatedAt: p.UpdatedAt}
}

// PoolListOut is pool_list's reply.
type PoolListOut struct {
	Pools     []PoolInfo `json:"pools" jsonschema:"Every pool, by name."`
	Count     int        `json:"count" jsonschema:"Number of pools."`
	MaxPooled int        `json:"max_pooled" jsonschema:"The server's bound on the sum of all pools' sizes."`
}

// PoolNameIn is pool_delete's arguments.
type PoolNameIn struct {
	Name string `json:"name" jsonschema:"The pool's name."`
}

// PoolDeleteOut is pool_delete's reply.
type PoolDeleteOut struct {
	Name    string `json:"name" jsonschema:"The pool's name."`
	Deleted bool   `json:"deleted" jsonschema:"true."`
}

const poolClaimDoc = `A sandbox_create whose shape (image, runtime, cpu, memory_mb, disk_mb after defaults; network: none matches a pool of network none, any allow/deny policy a pool of network egress) equals a pool's takes one of its ready sandboxes instead of starting one (its reply says from_pool: true): it gets the caller's env, labels, TTL, idempotency key, and for egress its network policy and secrets, and is never handed to anyone else afterwards. Creates from a snapshot or with auto_wake or ttl_while_sleeping always start a sandbox. Pooled sandboxes count against capacity but are nobody's: sandbox_list does not show them.`

func (s *Server) addPoolTools() {
	addTool(s, &mcp.Tool{
		Name:  "pool_set",
		Title: "Create or resize a warm pool",
		Description: `Keep ready sandboxes of one shape so that creating one takes milliseconds. Arguments: name (required), size (required), image, runtime, cpu, memory_mb, disk_mb, network (as sandbox_create; omitted fields take the server's defaults).
` + poolClaimDoc + `
The server refills the pool in the background (one sandbox at a time, after interactive creates). Setting an existing pool replaces its shape and size: sandboxes of the old shape, or beyond the new size, are destroyed.
Reply: {name, image, runtime, cpu, memory_mb, disk_mb, network, size, ready, starting, hits, misses, last_error, updated_at}.
` + errorsDoc(errInvalid, "RUNTIME_UNAVAILABLE (that runtime is not configured)"),
		Annotations: &mcp.ToolAnnotations{Title: "Create or resize a warm pool", IdempotentHint: true, DestructiveHint: ptr(true), OpenWorldHint: ptr(false)},
	}, nil, s.poolSet)

	addTool(s, &mcp.Tool{
		Name:  "pool_list",
		Title: "List warm pools",
		Description: `The server's warm pools. Takes no arguments.
Reply: {pools: [{name, image, runtime, cpu, memory_mb, disk_mb, network, size (target), ready, starting, hits, misses, last_error, updated_at}], count, max_pooled}.
` + poolClaimDoc,
		Annotations: &mcp.ToolAnnotations{Title: "List warm pools", ReadOnlyHint: true, OpenWorldHint: ptr(false)},
	}, nil, s.poolList)

	addTool(s, &mcp.Tool{
		Name:  "pool_delete",
		Title: "Delete a warm pool",
		Description: `Delete a warm pool; its ready sandboxes are destroyed in the background (sandboxes already claimed from it are not touched). Arguments: name (required).
Reply: {name, deleted: true}.
` + errorsDoc("POOL_NOT_FOUND (no pool of that name: see pool_list)", errInvalid),
		Annotations: &mcp.ToolAnnotations{Title: "Delete a warm pool", IdempotentHint: false, DestructiveHint: ptr(true), OpenWorldHint: ptr(false)},
	}, nil, s.poolDelete)
}

func (s *Server) pools() (PoolBackend, error) {
	if pb, ok := s.b.(PoolBackend); ok {
		return pb, nil
	}
	if c, ok := s.b.(interface{ Core() *sandbox.Core }); ok { // in process: the core's pools feature
		core := c.Core()
		return pools.New(core, core.Store()), nil
	}
	return nil, errcode.New(errcode.UnsupportedOp, "this server's control plane has no warm pools")
}

func (s *Server) poolSet(ctx context.Context, _ *mcp.CallToolRequest, in PoolSetIn) (PoolInfo, string, error) {
	pb, err := s.pools()
	if err != nil {
		return PoolInfo{}, "", err
	}
	if in.Size == nil {
		return PoolInfo{}, "", errcode.New(errcode.InvalidArgument, "size is required: how many ready sandboxes the pool keeps (0 keeps none)")
	}
	st, err := pb.SetPool(ctx, sandbox.Pool{Name: in.Name, Image: in.Image, Runtime: in.Runtime, CPU: in.CPU,
		MemoryMB: in.MemoryMB, DiskMB: in.DiskMB, Network: in.Network, Size: *in.Size})
	if err != nil {
		return PoolInfo{}, "", err
	}
	p := poolInfo(st)
	return p, fmt.Sprintf("Pool %s keeps %d ready sandboxes of %s on %s (%g cpu, %d MiB memory, %d MiB disk); %d ready now.",
		p.Name, p.Size, p.Image, p.Runtime, p.CPU, p.MemoryMB, p.DiskMB, p.Ready), nil
}

func (s *Server) poolList(ctx context.Context, _ *mcp.CallToolRequest, _ NoArgs) (PoolListOut, string, error) {
	pb, err := s.pools()
	if err != nil {
		return PoolListOut{}, "", err
	}
	list, err := pb.ListPools(ctx)
	if err != nil {
		return PoolListOut{}, "", err
	}
	c, err := s.b.Capacity(ctx)
	if err != nil {
		return PoolListOut{}, "", err
	}
	out := PoolListOut{Pools: []PoolInfo{}, MaxPooled: c.MaxPooled}
	var b strings.Builder
	fmt.Fprintf(&b, "%d pools (all together at most %d sandboxes).", len(list), c.MaxPooled)
	for _, p := range list {
		out.Pools = append(out.Pools, poolInfo(p))
		fmt.Fprintf(&b, "\n%s: %d/%d ready (%s, %s), %d hits, %d misses", p.Name, p.Ready, p.Size, p.Image, p.Runtime, p.Hits, p.Misses)
		if p.LastError != "" {
			fmt.Fprintf(&b, "; refill failing: %s", p.LastError)
		}
	}
	out.Count = len(out.Pools)
	return out, b.String(), nil
}

func (s *Server) poolDelete(ctx context.Context, _ *mcp.CallToolRequest, in PoolNameIn) (PoolDeleteOut, string, error) {
	pb, err := s.pools()
	if err != nil {
		return PoolDeleteOut{}, "", err
	}
	if err := pb.DeletePool(ctx, in.Name); err != nil {
		return PoolDeleteOut{}, "", err
	}
	return PoolDeleteOut{Name: in.Name, Deleted: true}, fmt.Sprintf("Pool %s deleted; its ready sandboxes are being destroyed.", in.Name), nil
}
