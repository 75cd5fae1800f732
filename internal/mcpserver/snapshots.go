package mcpserver

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentbox/agentbox/internal/authz"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/sandbox/snapshots"
)

// Snapshots, fork, sleep, wake and diff: sandbox_snapshot, snapshot_list,
// snapshot_delete, sandbox_fork, sandbox_sleep, sandbox_wake, sandbox_diff.

// SnapshotBackend is what the snapshot, fork and diff tools need (Options.Snapshots): the
// control plane's *snapshots.Service. Sleep and wake are the Backend's (the lifecycle core's).
type SnapshotBackend interface {
	Snapshot(ctx context.Context, id string, req sandbox.SnapshotRequest) (sandbox.Snapshot, error)
	ListSnapshots(ctx context.Context, f sandbox.SnapshotFilter) ([]sandbox.Snapshot, error)
	DeleteSnapshot(ctx context.Context, id string) error
	Fork(ctx context.Context, id string, req sandbox.ForkRequest) (sandbox.ForkResult, error)
	Diff(ctx context.Context, id string, req sandbox.DiffRequest) (sandbox.DiffResult, error)
}

// SleepBackend is what sandbox_sleep and sandbox_wake need of the control plane (part of
// Backend).
type SleepBackend interface {
	Sleep(ctx context.Context, id string) (sandbox.Sandbox, error)
	Wake(ctx context.Context, id string) (sandbox.Sandbox, error)
}

// snapshotsOf is Options.Snapshots, else the snapshots feature over b's sandbox core; nil
// when b has none (a Backend without a *sandbox.Service behind it: the tools then answer
// UNSUPPORTED_OPERATION).
func snapshotsOf(b Backend, sb SnapshotBackend) SnapshotBackend {
	if sb != nil {
		return sb
	}
	if c, ok := b.(interface{ Core() *sandbox.Core }); ok {
		core := c.Core()
		return snapshots.New(core, core.Store())
	}
	return nil
}

// snapshots is the snapshot tools' backend, or UNSUPPORTED_OPERATION.
func (s *Server) snapshots() (SnapshotBackend, error) {
	if s.snaps == nil {
		return nil, errcode.New(errcode.UnsupportedOp, "snapshots are not available on this MCP server")
	}
	return s.snaps, nil
}

// Bounds of the snapshot tools (the REST API's: internal/api/snapshots.go).
const (
	DefaultSnapshotPage = 100
	MaxSnapshotPage     = 1000
	MaxDiffPage         = 10000
	MaxDiffBytes        = 1 << 20
	// MaxDiffText bounds the text rendering's list of changes (the structured reply has all
	// of the page).
	maxDiffText = 200
)

// SnapshotInfo is a snapshot as the tools report it.
type SnapshotInfo struct {
	SnapshotID string            `json:"snapshot_id" jsonschema:"The snapshot's id; pass it as snapshot_id to sandbox_fork, sandbox_diff, snapshot_delete, or as snapshot to sandbox_create."`
	SandboxID  string            `json:"sandbox_id" jsonschema:"The sandbox it was taken of."`
	Kind       string            `json:"kind" jsonschema:"What was captured: files (the sandbox's disk) or files+memory (its processes too: a sandbox made from it continues where they were). Never claims memory that was not captured."`
	State      string            `json:"state" jsonschema:"creating, ready, failed or deleting; only ready snapshots can be forked or created from."`
	SizeBytes  int64             `json:"size_bytes" jsonschema:"Bytes it takes on the server's disk."`
	Image      string            `json:"image" jsonschema:"The snapshotted sandbox's image."`
	Runtime    string            `json:"runtime" jsonschema:"The snapshotted sandbox's runtime; sandboxes made from it use the same."`
	CPU        float64           `json:"cpu" jsonschema:"The snapshotted sandbox's CPU limit in cores."`
	MemoryMB   int64             `json:"memory_mb" jsonschema:"The snapshotted sandbox's memory limit in MiB."`
	DiskMB     int64             `json:"disk_mb" jsonschema:"The snapshotted sandbox's disk size in MiB."`
	Labels     map[string]string `json:"labels,omitempty" jsonschema:"Labels given to the snapshot."`
	CreatedAt  time.Time         `json:"created_at" jsonschema:"When it was taken (RFC 3339)."`
	Error      string            `json:"error,omitempty" jsonschema:"Why it failed."`
}

func snapshotInfo(sn sandbox.Snapshot) SnapshotInfo {
	return SnapshotInfo{SnapshotID: sn.ID, SandboxID: sn.SandboxID, Kind: sn.Kind, State: string(sn.State), SizeBytes: sn.SizeBytes,
		Image: sn.Image, Runtime: sn.Runtime, CPU: sn.CPU, MemoryMB: sn.MemoryMB, DiskMB: sn.DiskMB, Labels: sn.Labels,
		CreatedAt: sn.CreatedAt, Error: sn.Error}
}

// SnapshotIn are sandbox_snapshot's arguments.
type SnapshotIn struct {
	SandboxID string            `json:"sandbox_id" jsonschema:"The sandbox to snapshot (running)."`
	Memory    bool              `json:"memory,omitempty" jsonschema:"Also capture memory and processes (kind files+memory), where the sandbox's runtime can (gVisor; runc with a working CRIU). Where it cannot the call fails with UNSUPPORTED_OPERATION and the reason: never a silent files-only snapshot. Default false: files only."`
	Labels    map[string]string `json:"labels,omitempty" jsonschema:"Free-form labels for the snapshot."`
}

// SnapshotListIn are snapshot_list's arguments.
type SnapshotListIn struct {
	SandboxID string `json:"sandbox_id,omitempty" jsonschema:"Only this sandbox's snapshots; default: every snapshot you can see."`
	Cursor    string `json:"cursor,omitempty" jsonschema:"Continue a listing: the previous reply's next_cursor."`
	Limit     *int64 `json:"limit,omitempty" jsonschema:"At most this many snapshots, 1-1000 (default 100)."`
}

// SnapshotListOut is snapshot_list's reply.
type SnapshotListOut struct {
	Snapshots  []SnapshotInfo `json:"snapshots" jsonschema:"Snapshots, oldest first."`
	Count      int            `json:"count" jsonschema:"How many are in this page."`
	NextCursor string         `json:"next_cursor,omitempty" jsonschema:"Present when the page was full: pass it as cursor for the next page."`
}

// SnapshotIDIn names one snapshot.
type SnapshotIDIn struct {
	SnapshotID string `json:"snapshot_id" jsonschema:"The snapshot's id (from sandbox_snapshot or snapshot_list)."`
}

// SnapshotDeleteOut is snapshot_delete's reply.
type SnapshotDeleteOut struct {
	SnapshotID string `json:"snapshot_id" jsonschema:"The snapshot deleted."`
	Deleted    bool   `json:"deleted" jsonschema:"True: its record and files are gone."`
}

// ForkIn are sandbox_fork's arguments.
type ForkIn struct {
	SandboxID  string            `json:"sandbox_id" jsonschema:"The sandbox to fork."`
	Count      *int64            `json:"count,omitempty" jsonschema:"How many sandboxes to make, 1-20 (default 1)."`
	SnapshotID string            `json:"snapshot_id,omitempty" jsonschema:"Fork from this existing snapshot of the sandbox (from sandbox_snapshot); default: take one now."`
	Memory     bool              `json:"memory,omitempty" jsonschema:"For a snapshot taken now: capture memory and processes too, so processes running in the sandbox continue in each fork (UNSUPPORTED_OPERATION where the runtime cannot). Not with snapshot_id."`
	TTLSeconds *int64            `json:"ttl_seconds,omitempty" jsonschema:"Each fork's lifetime in seconds, at least 1 (default the server's, usually 1800)."`
	Labels     map[string]string `json:"labels,omitempty" jsonschema:"Labels for the forks, over the source's."`
}

// ForkOut is sandbox_fork's reply.
type ForkOut struct {
	SnapshotID string        `json:"snapshot_id" jsonschema:"The snapshot the forks were made from."`
	Kind       string        `json:"kind" jsonschema:"files or files+memory: what the forks start with."`
	Sandboxes  []SandboxInfo `json:"sandboxes" jsonschema:"The new sandboxes, running, each with its own sandbox_id, disk, TTL and labels."`
	Count      int           `json:"count" jsonschema:"How many were made."`
}

// DiffIn are sandbox_diff's arguments.
type DiffIn struct {
	SandboxID      string `json:"sandbox_id" jsonschema:"The sandbox whose changes to show."`
	OtherSandboxID string `json:"other_sandbox_id,omitempty" jsonschema:"Compare with this sandbox (e.g. a fork's source or a sibling fork). Give at most one of other_sandbox_id and snapshot_id; neither compares with the sandbox's image (everything it wrote)."`
	SnapshotID     string `json:"snapshot_id,omitempty" jsonschema:"Compare with this snapshot (e.g. the one taken before a command)."`
	Cursor         string `json:"cursor,omitempty" jsonschema:"Continue a paged diff: the previous reply's next_cursor."`
	Limit          *int64 `json:"limit,omitempty" jsonschema:"At most this many changes per page, 1-10000 (default 1000)."`
	MaxDiffBytes   *int64 `json:"max_diff_bytes,omitempty" jsonschema:"Bound of the unified diff of changed text files, 1-1048576 bytes (default 65536)."`
	NoUnified      bool   `json:"no_unified,omitempty" jsonschema:"true: only the list of changes, no unified diff."`
}

// ChangeOut is one changed path.
type ChangeOut struct {
	Path   string `json:"path" jsonschema:"The path inside the sandbox."`
	Change string `json:"change" jsonschema:"added, modified or deleted."`
	Type   string `json:"type" jsonschema:"file, dir, symlink or other."`
	Size   int64  `json:"size" jsonschema:"Size in bytes (the new side's; the old side's for a deletion)."`
	Mode   string `json:"mode" jsonschema:"Permission bits in octal, e.g. 0644 or 4755."`
	Target string `json:"target,omitempty" jsonschema:"A symlink's target."`
}

// DiffOut is sandbox_diff's reply.
type DiffOut struct {
	SandboxID     string      `json:"sandbox_id" jsonschema:"The sandbox compared."`
	Against       string      `json:"against" jsonschema:"What it was compared with: sandbox:<id>, snapshot:<id> or image:<ref>."`
	Changes       []ChangeOut `json:"changes" jsonschema:"The paths that differ, in path order (one page)."`
	Count         int         `json:"count" jsonschema:"How many changes are in this page."`
	NextCursor    string      `json:"next_cursor,omitempty" jsonschema:"Present when there are more changes: pass it as cursor."`
	Diff          string      `json:"diff,omitempty" jsonschema:"A unified diff of this page's changed text files, at most max_diff_bytes."`
	DiffTruncated bool        `json:"diff_truncated,omitempty" jsonschema:"The unified diff was cut at max_diff_bytes, or files were left out of it (see skipped)."`
	Skipped       []string    `json:"skipped,omitempty" jsonschema:"Changed files left out of the unified diff (binary or too large); read them with file_read."`
	// ContentFallback: the bound on content read per diff was reached.
	ContentFallback bool `json:"content_fallback,omitempty" jsonschema:"The server's bound on bytes compared per diff was reached: some files of equal size and metadata were compared by modification time, not content."`
}

func changesOut(cs []sandbox.DiffChange) []ChangeOut {
	out := make([]ChangeOut, 0, len(cs))
	for _, c := range cs {
		out = append(out, ChangeOut{Path: c.Path, Change: c.Change, Type: c.Type, Size: c.Size, Mode: c.Mode, Target: c.Target})
	}
	return out
}

// renderChanges is exec's text for its changes (bounded like sandbox_diff's).
func renderChanges(cs []ChangeOut, truncated bool) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\n%d path(s) changed", len(cs))
	for i, c := range cs {
		if i == maxDiffText {
			fmt.Fprintf(&b, "\n… %d more in the structured reply", len(cs)-i)
			break
		}
		fmt.Fprintf(&b, "\n%s %s (%s %s, %d bytes)", changeSign(c.Change), c.Path, c.Type, c.Mode, c.Size)
	}
	if truncated {
		b.WriteString("\n(more changed than listed: sandbox_diff against a snapshot lists them all)")
	}
	return b.String()
}

func changeSign(change string) string {
	return map[string]string{sandbox.ChangeAdded: "A", sandbox.ChangeModified: "M", sandbox.ChangeDeleted: "D"}[change]
}

const (
	errSnapNotFound = "SNAPSHOT_NOT_FOUND (wrong, deleted or failed snapshot_id: check snapshot_list)"
	errSnapUnsup    = "UNSUPPORTED_OPERATION (this server or the sandbox's runtime cannot: the message says why, e.g. memory capture on a runtime without checkpoint support; retry without memory)"
)

func (s *Server) addSnapshotTools() {
	addTool(s, &mcp.Tool{
		Name:  "sandbox_snapshot",
		Title: "Snapshot a sandbox",
		Description: `Save a sandbox's files (its disk) — and, with memory: true where the runtime can, its memory and running processes — as a snapshot the server keeps until snapshot_delete or its retention budget. The sandbox keeps running. Arguments: sandbox_id (required), memory (default false), labels.
Use it before a risky step to keep a point you can return to: sandbox_create with snapshot starts a new sandbox from it, sandbox_fork makes several, sandbox_diff with snapshot_id shows what changed since.
Reply: {snapshot_id, sandbox_id, kind: "files" | "files+memory" (what was really captured), state, size_bytes, created_at, …}.
` + errorsDoc(errNotFound, errNotRunning, errSnapUnsup, "CAPACITY_UNAVAILABLE (the server's snapshot budget is full: snapshot_delete what you no longer need)", errInvalid),
		Annotations: &mcp.ToolAnnotations{Title: "Snapshot a sandbox", DestructiveHint: ptr(false), OpenWorldHint: ptr(false)},
	}, nil, s.sandboxSnapshot)

	addTool(s, &mcp.Tool{
		Name:  "snapshot_list",
		Title: "List snapshots",
		Description: `List snapshots, oldest first, one page at a time. Arguments (all optional): sandbox_id (only that sandbox's), cursor (the previous reply's next_cursor), limit (1-1000, default 100).
Reply: {snapshots: [{snapshot_id, sandbox_id, kind, state, size_bytes, created_at, labels}], count, next_cursor (present when there may be more)}.
` + errorsDoc(errNotFound, errSnapUnsup, errInvalid),
		Annotations: &mcp.ToolAnnotations{Title: "List snapshots", ReadOnlyHint: true, IdempotentHint: true, OpenWorldHint: ptr(false)},
	}, func(in *jsonschema.Schema) {
		in.Properties["limit"].Minimum, in.Properties["limit"].Maximum = ptr(1.0), ptr(float64(MaxSnapshotPage))
	}, s.snapshotList)

	addTool(s, &mcp.Tool{
		Name:  "snapshot_delete",
		Title: "Delete a snapshot",
		Description: `Delete a snapshot and its files, freeing the server's disk. Arguments: snapshot_id (required). Sandboxes already made from it are not affected. A sleeping sandbox's own snapshot cannot be deleted this way (wake or destroy the sandbox).
Reply: {snapshot_id, deleted: true}.
` + errorsDoc(errSnapNotFound, errInvalid),
		Annotations: &mcp.ToolAnnotations{Title: "Delete a snapshot", DestructiveHint: ptr(true), IdempotentHint: false, OpenWorldHint: ptr(false)},
	}, nil, s.snapshotDelete)

	addTool(s, &mcp.Tool{
		Name:  "sandbox_fork",
		Title: "Fork a sandbox",
		Description: `Make count (1-20) new sandboxes that start exactly where a sandbox is: its files at this moment (a snapshot taken now), or at an earlier snapshot_id; with memory: true, running processes continue in every fork. Each fork has its own sandbox_id, disk, TTL and labels; changes in one never show in another or in the source, which keeps running.
Use it to try alternatives in parallel from one prepared state (install dependencies once, then fork and try a different fix in each), or to keep a pristine copy before an experiment. Compare results with sandbox_diff; destroy the forks you no longer need.
Arguments: sandbox_id (required), count, snapshot_id, memory, ttl_seconds, labels.
Reply: {snapshot_id, kind: "files" | "files+memory", sandboxes: [{sandbox_id, state: "running", from_snapshot, …}], count}.
` + errorsDoc(errNotFound, errNotRunning, errSnapNotFound, errSnapUnsup,
			"CAPACITY_UNAVAILABLE (not enough room for count more sandboxes: ask for fewer, or destroy some)", errInvalid),
		Annotations: &mcp.ToolAnnotations{Title: "Fork a sandbox", DestructiveHint: ptr(false), OpenWorldHint: ptr(false)},
	}, func(in *jsonschema.Schema) {
		in.Properties["count"].Minimum, in.Properties["count"].Maximum = ptr(1.0), ptr(float64(sandbox.MaxForkCount))
		in.Properties["ttl_seconds"].Minimum = ptr(1.0)
	}, s.sandboxFork)

	addTool(s, &mcp.Tool{
		Name:  "sandbox_sleep",
		Title: "Put a sandbox to sleep",
		Description: `Park an idle sandbox without losing it: its state is saved (files; memory and processes too where the runtime can), then it stops and releases its memory and CPU; state "sleeping". sandbox_wake brings it back under the same sandbox_id. Arguments: sandbox_id (required).
Use it when you will need a sandbox again later but not now (waiting for a user, a long pause between steps). While it sleeps exec and file tools fail with SANDBOX_NOT_RUNNING (unless it was created with auto_wake, which wakes it on the first call); by default its TTL clock stops while it sleeps (unless created with ttl_while_sleeping).
Reply: the sandbox record, state "sleeping", slept_at. A sleeping sandbox is returned as it is.
` + errorsDoc(errNotFound, errNotRunning, "UNSUPPORTED_OPERATION (this server keeps no snapshots, or the sandbox's runtime cannot save it)", errInvalid),
		Annotations: &mcp.ToolAnnotations{Title: "Put a sandbox to sleep", DestructiveHint: ptr(false), IdempotentHint: true, OpenWorldHint: ptr(false)},
	}, nil, s.sandboxSleep)

	addTool(s, &mcp.Tool{
		Name:  "sandbox_wake",
		Title: "Wake a sleeping sandbox",
		Description: `Restore a sleeping sandbox under the same sandbox_id and return it running. Arguments: sandbox_id (required). Its files are as they were; where memory was captured its processes and jobs continue, else jobs that were running are reported unknown.
Reply: the sandbox record, state "running". Waking a running sandbox returns it as it is.
` + errorsDoc(errNotFound, "SANDBOX_NOT_RUNNING (the sandbox was destroyed, failed, was lost, or its TTL ran out while it slept: create a new one)",
			"CAPACITY_UNAVAILABLE (no room to restore it now: destroy other sandboxes or retry later)", errInvalid),
		Annotations: &mcp.ToolAnnotations{Title: "Wake a sleeping sandbox", DestructiveHint: ptr(false), IdempotentHint: true, OpenWorldHint: ptr(false)},
	}, nil, s.sandboxWake)

	addTool(s, &mcp.Tool{
		Name:  "sandbox_diff",
		Title: "What changed in a sandbox",
		Description: `Show what changed in a sandbox's files: against another sandbox (other_sandbox_id, e.g. a sibling fork), a snapshot (snapshot_id, e.g. one taken before a command), or — with neither — its image (everything it wrote). Use it to see what a command or an agent changed, or to compare two forks' results.
Arguments: sandbox_id (required); at most one of other_sandbox_id, snapshot_id; cursor, limit (1-10000, default 1000), max_diff_bytes (1-1048576, default 65536), no_unified.
Reply: {against, changes: [{path, change: "added" | "modified" | "deleted", type, size, mode, target}], count, next_cursor (more changes: pass it as cursor), diff (a unified diff of changed text files, bounded by max_diff_bytes), diff_truncated, skipped (binary or large files left out of diff)}.
` + errorsDoc(errNotFound, errNotRunning, errSnapNotFound, errSnapUnsup, errInvalid),
		Annotations: &mcp.ToolAnnotations{Title: "What changed in a sandbox", ReadOnlyHint: true, IdempotentHint: true, OpenWorldHint: ptr(false)},
	}, func(in *jsonschema.Schema) {
		in.Properties["limit"].Minimum, in.Properties["limit"].Maximum = ptr(1.0), ptr(float64(MaxDiffPage))
		in.Properties["max_diff_bytes"].Minimum, in.Properties["max_diff_bytes"].Maximum = ptr(1.0), ptr(float64(MaxDiffBytes))
	}, s.sandboxDiff)
}

func (s *Server) sandboxSnapshot(ctx context.Context, _ *mcp.CallToolRequest, in SnapshotIn) (SnapshotInfo, string, error) {
	snaps, err := s.snapshots()
	if err != nil {
		return SnapshotInfo{}, "", err
	}
	sn, err := snaps.Snapshot(ctx, in.SandboxID, sandbox.SnapshotRequest{Memory: in.Memory, Labels: in.Labels})
	if err != nil {
		return SnapshotInfo{}, "", err
	}
	out := snapshotInfo(sn)
	return out, fmt.Sprintf("Snapshot %s of %s: %s, %s, %s. Start from it with sandbox_create snapshot %q or sandbox_fork snapshot_id %q; see what changed since with sandbox_diff snapshot_id %q.",
		out.SnapshotID, out.SandboxID, out.Kind, out.State, mib(out.SizeBytes), out.SnapshotID, out.SnapshotID, out.SnapshotID), nil
}

func (s *Server) snapshotList(ctx context.Context, _ *mcp.CallToolRequest, in SnapshotListIn) (SnapshotListOut, string, error) {
	snaps, err := s.snapshots()
	if err != nil {
		return SnapshotListOut{}, "", err
	}
	limit := int(ptrOr(in.Limit, DefaultSnapshotPage))
	principal, _ := authz.ListPrincipal(ctx) // an admin's lists show every snapshot
	list, err := snaps.ListSnapshots(ctx, sandbox.SnapshotFilter{SandboxID: in.SandboxID, After: in.Cursor, Limit: limit, Principal: principal})
	if err != nil {
		return SnapshotListOut{}, "", err
	}
	if len(list) > limit {
		list = list[:limit]
	}
	out := SnapshotListOut{Snapshots: []SnapshotInfo{}}
	for _, sn := range list {
		out.Snapshots = append(out.Snapshots, snapshotInfo(sn))
	}
	out.Count = len(out.Snapshots)
	if out.Count == limit {
		out.NextCursor = out.Snapshots[out.Count-1].SnapshotID
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d snapshot(s)", out.Count)
	for _, sn := range out.Snapshots {
		fmt.Fprintf(&b, "\n%s of %s: %s, %s, %s, %s", sn.SnapshotID, sn.SandboxID, sn.Kind, sn.State, mib(sn.SizeBytes), sn.CreatedAt.Format(time.RFC3339))
	}
	if out.NextCursor != "" {
		fmt.Fprintf(&b, "\nMore may follow: call again with cursor %q.", out.NextCursor)
	}
	return out, b.String(), nil
}

func (s *Server) snapshotDelete(ctx context.Context, _ *mcp.CallToolRequest, in SnapshotIDIn) (SnapshotDeleteOut, string, error) {
	snaps, err := s.snapshots()
	if err != nil {
		return SnapshotDeleteOut{}, "", err
	}
	if err := snaps.DeleteSnapshot(ctx, in.SnapshotID); err != nil {
		return SnapshotDeleteOut{}, "", err
	}
	return SnapshotDeleteOut{SnapshotID: in.SnapshotID, Deleted: true}, fmt.Sprintf("Deleted snapshot %s.", in.SnapshotID), nil
}

func (s *Server) sandboxFork(ctx context.Context, call *mcp.CallToolRequest, in ForkIn) (ForkOut, string, error) {
	snaps, err := s.snapshots()
	if err != nil {
		return ForkOut{}, "", err
	}
	req := sandbox.ForkRequest{Count: int(ptrOr(in.Count, 1)), SnapshotID: in.SnapshotID, Memory: in.Memory,
		TTLSeconds: ptrOr(in.TTLSeconds, 0), Labels: in.Labels}
	if req.SnapshotID != "" && req.Memory {
		return ForkOut{}, "", errcode.New(errcode.InvalidArgument, "memory applies to a snapshot taken now: give snapshot_id or memory, not both (an existing snapshot's kind says whether it holds memory)")
	}
	s.pruneSessions()
	if s.held.full() {
		return ForkOut{}, "", errcode.New(errcode.CapacityUnavailable, "this MCP server already tracks %d sandboxes; destroy the ones you no longer need (sandbox_list shows them) and retry", maxHeld)
	}
	owner, session := s.ownerOf(ctx, call.Session)
	res, err := snaps.Fork(sandbox.WithOwner(ctx, owner), in.SandboxID, req)
	if err != nil {
		return ForkOut{}, "", err
	}
	out := ForkOut{SnapshotID: res.SnapshotID, Kind: res.Kind, Sandboxes: []SandboxInfo{}}
	ids := make([]string, 0, len(res.Sandboxes))
	for _, sb := range res.Sandboxes {
		s.held.add(owner, session, sb.ID)
		out.Sandboxes = append(out.Sandboxes, s.info(sb))
		ids = append(ids, sb.ID)
	}
	out.Count = len(out.Sandboxes)
	return out, fmt.Sprintf("Forked %s into %d sandbox(es) from snapshot %s (%s): %s. Each is independent; compare them with sandbox_diff and destroy the ones you no longer need.",
		in.SandboxID, out.Count, out.SnapshotID, out.Kind, strings.Join(ids, ", ")), nil
}

func (s *Server) sandboxSleep(ctx context.Context, call *mcp.CallToolRequest, in SandboxIDIn) (SandboxInfo, string, error) {
	sb, err := s.b.Sleep(ctx, in.SandboxID)
	if err != nil {
		return SandboxInfo{}, "", err
	}
	owner, _ := s.ownerOf(ctx, call.Session)
	s.held.seen(owner, sb)
	out := s.info(sb)
	return out, fmt.Sprintf("%s is sleeping: its memory and CPU are released. sandbox_wake %q brings it back.", sb.ID, sb.ID), nil
}

func (s *Server) sandboxWake(ctx context.Context, call *mcp.CallToolRequest, in SandboxIDIn) (SandboxInfo, string, error) {
	sb, err := s.b.Wake(ctx, in.SandboxID)
	if err != nil {
		return SandboxInfo{}, "", err
	}
	owner, _ := s.ownerOf(ctx, call.Session)
	s.held.seen(owner, sb)
	out := s.info(sb)
	return out, fmt.Sprintf("Woke %s: %s.", sb.ID, summary(out)), nil
}

func (s *Server) sandboxDiff(ctx context.Context, _ *mcp.CallToolRequest, in DiffIn) (DiffOut, string, error) {
	snaps, err := s.snapshots()
	if err != nil {
		return DiffOut{}, "", err
	}
	if in.OtherSandboxID != "" && in.SnapshotID != "" {
		return DiffOut{}, "", errcode.New(errcode.InvalidArgument, "give other_sandbox_id or snapshot_id (or neither, to compare with the image), not both")
	}
	req := sandbox.DiffRequest{OtherSandboxID: in.OtherSandboxID, SnapshotID: in.SnapshotID, Cursor: in.Cursor,
		Limit: int(ptrOr(in.Limit, 0)), MaxDiffBytes: ptrOr(in.MaxDiffBytes, 0), NoUnified: in.NoUnified}
	res, err := snaps.Diff(ctx, in.SandboxID, req)
	if err != nil {
		return DiffOut{}, "", err
	}
	out := DiffOut{SandboxID: res.SandboxID, Against: res.Against, Changes: []ChangeOut{}, NextCursor: res.NextCursor,
		Diff: res.Diff, DiffTruncated: res.DiffTruncated, Skipped: res.Skipped}
	out.Changes = changesOut(res.Changes)
	out.ContentFallback = res.ContentFallback
	out.Count = len(out.Changes)
	return out, renderDiff(out), nil
}

// renderDiff is sandbox_diff's text: a line per change (bounded), then the unified diff.
func renderDiff(d DiffOut) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d change(s) in %s against %s", d.Count, d.SandboxID, d.Against)
	for i, c := range d.Changes {
		if i == maxDiffText {
			fmt.Fprintf(&b, "\n… %d more in the structured reply", d.Count-i)
			break
		}
		fmt.Fprintf(&b, "\n%s %s (%s %s, %d bytes)", changeSign(c.Change), c.Path, c.Type, c.Mode, c.Size)
	}
	if d.NextCursor != "" {
		fmt.Fprintf(&b, "\nMore changes: call again with cursor %q.", d.NextCursor)
	}
	if d.Diff != "" {
		b.WriteString("\n\n" + d.Diff)
	}
	if d.DiffTruncated {
		b.WriteString("\n(diff truncated")
		if len(d.Skipped) > 0 {
			fmt.Fprintf(&b, "; left out: %s", strings.Join(d.Skipped, ", "))
		}
		b.WriteString(")")
	}
	return b.String()
}

func ptrOr(p *int64, def int64) int64 {
	if p == nil {
		return def
	}
	return *p
}
