package mcpserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/gate"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/version"
)

// handler is a typed tool handler: it returns the structured result and its text rendering.
type handler[In, Out any] func(ctx context.Context, req *mcp.CallToolRequest, in In) (Out, string, error)

// addTool registers a tool whose input and output schemas come from In and Out. tweak, if
// non-nil, adjusts the input schema (minimums, enums) before it is published.
func addTool[In, Out any](s *Server, t *mcp.Tool, tweak func(*jsonschema.Schema), h handler[In, Out]) {
	in := schemaFor[In]()
	if tweak != nil {
		tweak(in)
	}
	t.InputSchema = in
	t.OutputSchema = outputSchema[Out]()
	check := resolveInput(t.Name, in)
	s.mcp.AddTool(t, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		var args In
		if err := decodeArgs(t.Name, check, req.Params.Arguments, &args); err != nil {
			if len(s.opts.Gate) > 0 {
				s.opts.Gate.Observe(s.gateCall(ctx, t.Name, req), err) // recorded, never acted on
			}
			return errorResult(err), nil
		}
		exit, err := s.enterGate(ctx, t.Name, req)
		if err != nil {
			return errorResult(err), nil
		}
		out, text, err := h(ctx, req, args)
		if nerr := exit(err); nerr != nil && err == nil {
			s.log.Warn("a tool call is not acknowledged: its audit record is not durable", "tool", t.Name, "err", nerr)
			err = nerr // no call is acknowledged without its record
		}
		if err != nil {
			if errcode.Of(err) == errcode.Internal && ctx.Err() == nil {
				s.log.Error("tool failed", "tool", t.Name, "err", err)
			}
			return errorResult(err), nil
		}
		content := []mcp.Content{&mcp.TextContent{Text: text}}
		if x, ok := any(out).(interface{ extraContent() []mcp.Content }); ok {
			content = append(content, x.extraContent()...) // run_python's inline images (snippet.go)
		}
		return &mcp.CallToolResult{Content: content, StructuredContent: out}, nil
	})
}

// enterGate passes a call through Options.Gate (scopes, approvals, the audit log) before it
// acts; exit gets its outcome and returns the error that replaces it when the call could not
// be recorded (gate.Call.NotRecorded).
func (s *Server) enterGate(ctx context.Context, tool string, req *mcp.CallToolRequest) (exit func(error) error, err error) {
	if len(s.opts.Gate) == 0 {
		return func(error) error { return nil }, nil
	}
	c := s.gateCall(ctx, tool, req)
	ex, err := s.opts.Gate.Enter(ctx, c)
	if err != nil {
		return nil, err
	}
	return func(outcome error) error { ex(outcome); return c.NotRecorded }, nil
}

// gateCall describes a tool call for the gates.
func (s *Server) gateCall(ctx context.Context, tool string, req *mcp.CallToolRequest) *gate.Call {
	c := &gate.Call{Surface: gate.SurfaceMCP, Tool: tool, Action: tool, Args: req.Params.Arguments, Started: time.Now()}
	if caller, ok := gate.CallerFrom(ctx); ok {
		c.Caller = caller
	} else {
		// No HTTP request carried an identity: the stdio process's own session.
		c.Surface = gate.SurfaceMCPStdio
		c.Caller = gate.Caller{ID: s.processOwner, Name: "stdio", Scope: "admin", Principal: gate.AdminPrincipal}
	}
	var a struct {
		SandboxID string `json:"sandbox_id"`
	}
	if json.Unmarshal(req.Params.Arguments, &a) == nil {
		c.SandboxID = a.SandboxID
	}
	if tok := req.Params.GetProgressToken(); tok != nil && req.Session != nil {
		var n atomic.Int64
		c.Progress = func(msg string) {
			if err := req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: tok, Progress: float64(n.Add(1)), Message: msg}); err != nil && ctx.Err() == nil {
				s.log.Debug("progress notification failed", "err", err)
			}
		}
	}
	if req.Session != nil {
		if p := req.Session.InitializeParams(); p != nil && p.Capabilities != nil && p.Capabilities.Elicitation != nil {
			c.Elicit = func(ctx context.Context, message string) (bool, string, error) {
				res, err := req.Session.Elicit(ctx, &mcp.ElicitParams{Message: message})
				if err != nil {
					return false, "", err
				}
				return res.Action == "accept", "", nil
			}
		}
	}
	return c
}

// ToolError is the structured content of a failed call: {"error": {"code", "message", "details"}}.
type ToolError struct {
	Code    errcode.Code   `json:"code"`
	Message string         `json:"message"`
	Details map[string]any `json:"details,omitempty"`
}

// errorResult translates err into a tool result with isError, the code in structured content,
// and "CODE: message" as text.
func errorResult(err error) *mcp.CallToolResult {
	te := ToolError{Code: errcode.Of(err), Message: errcode.Message(err)}
	if e, ok := errcode.As(err); ok {
		te.Details = e.Details
	}
	if errors.Is(err, context.Canceled) && te.Code == errcode.Internal {
		te.Message = "the call was cancelled"
	}
	return &mcp.CallToolResult{
		IsError:           true,
		Content:           []mcp.Content{&mcp.TextContent{Text: string(te.Code) + ": " + te.Message}},
		StructuredContent: map[string]any{"error": te},
	}
}

func ptr[T any](v T) *T { return &v }

// Descriptions of the errors a tool can return, for tool descriptions.
const (
	errNotFound   = "SANDBOX_NOT_FOUND (wrong or forgotten id: stop, check sandbox_list)"
	errNotRunning = "SANDBOX_NOT_RUNNING (it was destroyed, expired or failed: stop using it and create a new one; if its state is creating, wait and retry)"
	errInvalid    = "INVALID_ARGUMENT (fix the argument the message names)"
)

// errorsDoc lists a tool's errors.
func errorsDoc(items ...string) string {
	return `Errors (isError, structured content {"error": {"code", "message"}}): ` + strings.Join(items, "; ") + "."
}

func (s *Server) addTools() {
	s.addMetricsTools()  // metrics: sandbox_metrics
	s.addImageTools()    // images: image_list, image_pull, sandbox_commit
	s.addRunTools()      // durable runs (runs.go): run, run_*, agent_*, batch_get
	s.addAPICallTool()   // the raw API tool (apicall.go): api_call
	s.addSQLTool()       // execute_sql (sql.go)
	s.addSnippetTools()  // data-assistant tools (snippet.go): run_python, run_shell
	s.addCodeTools()     // the stateful interpreter (code.go): run_code, code_context_create
	s.addFetchMetrics()  // fetch_metrics.go
	s.addRemoteTools()   // joined machines (remote.go): remote_exec, remote_screenshot
	s.addMachineTools()  // joined machines (machines.go): machine_list, machine_status
	s.addRelayTools()    // the file relay (blobs.go): remote_pull, remote_push
	s.addSnapshotTools() // snapshots.go: sandbox_snapshot, snapshot_list, snapshot_delete, sandbox_fork, sandbox_sleep, sandbox_wake, sandbox_diff
	addTool(s, &mcp.Tool{
		Name:  "sandbox_create",
		Title: "Create a sandbox",
		Description: `Create a fresh, isolated Linux sandbox and return it running. Call this first; pass the returned sandbox_id to every other tool.
The sandbox has the host's tools read-only (sh, coreutils, git, python3, …), a writable /workspace (the default working directory) and /home/agent, a /tmp, and by default NO network: nothing can be downloaded inside it (bring files in with file_write) unless you pass network.
All arguments are optional: image (default "host": the host's own /usr; or any OCI image reference as Docker users write it: "python:3.12-slim", "node:22", "ghcr.io/org/img:tag", "name@sha256:…", or a name sandbox_commit made; pulled if not cached, see image_list and image_pull; the sandbox's root is then the image's, writable, with its Env, WorkingDir and User), runtime, cpu (cores, default 1), memory_mb (default 512), disk_mb, ttl_seconds (lifetime, default 1800 = 30 min, at most the server's max TTL, usually 86400), env (variables for every command), labels, requirements ({"isolation": "process"|"kernel"|"vm", "network": "none"|"egress"}: minimum guarantees; the call fails rather than fall back to weaker isolation; a network policy picks a runtime offering egress by itself).
network: "none" (default) or {"allow": ["pypi.org", "files.pythonhosted.org", "*.github.com"], "deny": [...]}: only those hosts are reachable (HTTP_PROXY is set for every command, so pip, npm, git and curl work); a refused request gets a 403 whose body names the rule, and sandbox_network_update changes the policy live (only on sandboxes created with a policy, even an empty allow list). secrets: {"NAME": {"from": "env:VAR" or "file:/path", "hosts": ["api.example.com"], "body": false}}: the sandbox sees NAME=<placeholder>; the real value is swapped in by agentbox's proxy on requests to those hosts only (the server must allow the source: --secret-env, --secret-dir).
snapshot: a snapshot_id (sandbox_snapshot, snapshot_list): start from that saved state instead of an image (its files, and its processes when its kind is files+memory; image, runtime and disk_mb are the snapshot's). auto_wake: true lets exec and file calls wake the sandbox if it was put to sleep (sandbox_sleep); ttl_while_sleeping: true lets its TTL run on while it sleeps (default: sleeping time does not count).
Reply: {sandbox_id, state: "running", image, image_digest (OCI images), runtime, isolation, cpu, memory_mb, disk_mb, created_at, expires_at, expires_in_seconds, from_snapshot, from_pool, …}.
Keep ttl_seconds honest: ask for about as long as the task needs; sandbox_extend adds time. Call sandbox_destroy when done.
` + errorsDoc("CAPACITY_UNAVAILABLE (the server is full: destroy sandboxes you no longer need, or wait for others to finish, then retry)",
			"RUNTIME_UNAVAILABLE (this server cannot provide the runtime or requirements asked for: stop, or ask for less)",
			"IMAGE_NOT_FOUND (no such image in the registry or cache: check the reference)", "IMAGE_PULL_FAILED (the registry could not be reached or refused: retry later)", errInvalid),
		Annotations: &mcp.ToolAnnotations{Title: "Create a sandbox", DestructiveHint: ptr(false), OpenWorldHint: ptr(false)},
	}, func(in *jsonschema.Schema) {
		in.Properties["requirements"].Properties["isolation"].Enum = []any{"process", "kernel", "vm"}
		in.Properties["requirements"].Properties["network"].Enum = []any{"none", "egress"}
		tweakCreateNetwork(in) // network
	}, s.sandboxCreate)

	addTool(s, &mcp.Tool{
		Name:  "sandbox_list",
		Title: "List my sandboxes",
		Description: `List the sandboxes this MCP server created that it still holds, oldest first. Takes no arguments.
Reply: {sandboxes: [{sandbox_id, state, expires_in_seconds, …}], count}. A sandbox that has finished (destroyed, failed, lost or expired) appears once more with its final state and a reason, then drops out of the list.
Use it to find a sandbox_id you lost track of, or to see what to destroy. The list is never cut short.`,
		Annotations: &mcp.ToolAnnotations{Title: "List my sandboxes", ReadOnlyHint: true, IdempotentHint: false, OpenWorldHint: ptr(false)},
	}, nil, s.sandboxList)

	addTool(s, &mcp.Tool{
		Name:  "sandbox_get",
		Title: "Get a sandbox",
		Description: `Get one sandbox's current record. Arguments: sandbox_id (required).
Reply: {sandbox_id, state, image, runtime, isolation, cpu, memory_mb, disk_mb, created_at, expires_at, expires_in_seconds, reason (why it ended, for finished sandboxes)}. Only state "running" accepts exec and file tools.
` + errorsDoc(errNotFound, errInvalid),
		Annotations: &mcp.ToolAnnotations{Title: "Get a sandbox", ReadOnlyHint: true, IdempotentHint: true, OpenWorldHint: ptr(false)},
	}, nil, s.sandboxGet)

	addTool(s, &mcp.Tool{
		Name:  "sandbox_destroy",
		Title: "Destroy a sandbox",
		Description: `Destroy a sandbox: kill everything in it and delete its files. Arguments: sandbox_id (required). Destroying a destroyed sandbox is a no-op that succeeds.
Reply: the sandbox record with state "destroyed". Copy out anything you need first (file_read).
Call it as soon as you no longer need a sandbox: capacity is shared with other agents.
` + errorsDoc(errNotFound, errInvalid),
		Annotations: &mcp.ToolAnnotations{Title: "Destroy a sandbox", DestructiveHint: ptr(true), IdempotentHint: true, OpenWorldHint: ptr(false)},
	}, nil, s.sandboxDestroy)

	addTool(s, &mcp.Tool{
		Name:  "sandbox_extend",
		Title: "Extend a sandbox's lifetime",
		Description: `Push a running sandbox's expiry further. Arguments: sandbox_id (required), ttl_seconds (required: seconds to add; the new expiry is capped at the server's max TTL from now).
Reply: the sandbox record with the new expires_at and expires_in_seconds.
Extend by about what the remaining work needs; do not keep sandboxes alive "just in case".
` + errorsDoc(errNotFound, errNotRunning, errInvalid),
		Annotations: &mcp.ToolAnnotations{Title: "Extend a sandbox's lifetime", IdempotentHint: false, DestructiveHint: ptr(false), OpenWorldHint: ptr(false)},
	}, nil, s.sandboxExtend)

	s.addExecTool()
	s.addWatchTools() // watch, watch_fleet (watch.go)
	s.addFileTools()
	s.addJobTools()
	s.addNetworkTools()   // network: sandbox_network_update, sandbox_connections, sandbox_secret_calls, sandbox_expose, sandbox_unexpose
	s.addPoolTools()      // warm pools (pools.go): pool_set, pool_list, pool_delete
	s.addRemoteJobTools() // remote jobs (remotejobs.go): remote_job_*

	addTool(s, &mcp.Tool{
		Name:  "health",
		Title: "Server health and capacity",
		Description: `Check the agentbox server in one call. Takes no arguments.
Reply: {status: "ok", version, control_plane, runtimes: [{name, available, isolation ("process", "kernel" or "vm"), images, network_modes, reason}], capacity: {max_sandboxes, live, free, cpu_budget, cpu_used, cpu_free, memory_budget_mb, memory_used_mb, memory_free_mb, disk_budget_mb, disk_used_mb, disk_free_mb, overcommit, host_memory_available_mb, host_memory_reserve_mb, host_disk_free_mb, host_disk_reserve_mb, pools (the warm pools, as pool_list), max_pooled}, sandboxes (the same list as sandbox_list), count}.
Use it before creating sandboxes with special requirements, or when sandbox_create reports CAPACITY_UNAVAILABLE.`,
		Annotations: &mcp.ToolAnnotations{Title: "Server health and capacity", ReadOnlyHint: true, OpenWorldHint: ptr(false)},
	}, nil, s.health)
}

// SandboxInfo is a sandbox as tools and resources report it.
type SandboxInfo struct {
	SandboxID        string            `json:"sandbox_id" jsonschema:"The sandbox's id (sb- and 12 hex digits); pass it as sandbox_id to the other tools."`
	State            string            `json:"state" jsonschema:"creating, running, sleeping (sandbox_sleep: wake it with sandbox_wake), stopping, destroyed, failed or lost. Only running accepts exec and file tools."`
	Image            string            `json:"image" jsonschema:"Root filesystem image: host or the OCI image reference it was created with."`
	ImageDigest      string            `json:"image_digest,omitempty" jsonschema:"For an OCI image, the digest the sandbox is pinned to (sha256:…)."`
	Runtime          string            `json:"runtime" jsonschema:"Runtime that runs the sandbox."`
	Isolation        string            `json:"isolation" jsonschema:"Isolation level: process, kernel or vm."`
	CPU              float64           `json:"cpu" jsonschema:"CPU limit in cores."`
	MemoryMB         int64             `json:"memory_mb" jsonschema:"Memory limit in MiB."`
	DiskMB           int64             `json:"disk_mb" jsonschema:"Disk size in MiB."`
	EnvNames         []string          `json:"env_names,omitempty" jsonschema:"Names of the environment variables given at creation, sorted (their values are never echoed back)."`
	Labels           map[string]string `json:"labels,omitempty" jsonschema:"Labels given at creation."`
	CreatedAt        time.Time         `json:"created_at" jsonschema:"Creation time (RFC 3339)."`
	ExpiresAt        time.Time         `json:"expires_at" jsonschema:"When the sandbox is destroyed unless extended (RFC 3339)."`
	ExpiresInSeconds int64             `json:"expires_in_seconds" jsonschema:"Seconds until expiry; 0 once it has ended."`
	Reason           string            `json:"reason,omitempty" jsonschema:"Why a finished sandbox ended (destroyed on request, ttl expired, failed or lost)."`
	Network          *PolicyIn         `json:"network,omitempty" jsonschema:"The sandbox's egress policy; absent: network none (no network at all)."`
	// snapshots, sleep and pools
	FromSnapshot     string    `json:"from_snapshot,omitempty" jsonschema:"The snapshot the sandbox was made from (sandbox_create snapshot, sandbox_fork)."`
	AutoWake         bool      `json:"auto_wake,omitempty" jsonschema:"An exec or file call while it sleeps wakes it first."`
	TTLWhileSleeping bool      `json:"ttl_while_sleeping,omitempty" jsonschema:"Its TTL keeps running while it sleeps (default: sleeping time does not count)."`
	OnExpiry         string    `json:"on_expiry,omitempty" jsonschema:"sleep: it sleeps when its TTL runs out instead of being destroyed."`
	SleptAt          time.Time `json:"slept_at,omitzero" jsonschema:"When it went to sleep (state sleeping)."`
	FromPool         bool      `json:"from_pool,omitempty" jsonschema:"It was claimed from a warm pool of ready sandboxes rather than started for this create."`
}

func (s *Server) info(sb sandbox.Sandbox) SandboxInfo {
	in := SandboxInfo{SandboxID: sb.ID, State: string(sb.State), Image: sb.Image, ImageDigest: sb.ImageDigest, Runtime: sb.Runtime,
		Isolation: sb.Isolation, CPU: sb.CPU, MemoryMB: sb.MemoryMB, DiskMB: sb.DiskMB, EnvNames: sb.EnvVarNames(),
		Labels: sb.Labels, CreatedAt: sb.CreatedAt, ExpiresAt: sb.ExpiresAt, Reason: sb.Error,
		FromSnapshot: sb.FromSnapshot, AutoWake: sb.AutoWake, TTLWhileSleeping: sb.TTLWhileSleeping, OnExpiry: sb.OnExpiry, SleptAt: sb.SleptAt, FromPool: sb.FromPool}
	if p := sb.Network.Policy; p != nil {
		in.Network = &PolicyIn{Allow: nonNil(p.Allow), Deny: nonNil(p.Deny)}
	}
	if !finished(sb.State) {
		in.ExpiresInSeconds = max(0, int64(time.Until(sb.ExpiresAt).Seconds()))
	}
	return in
}

// withReason fills Reason for a finished sandbox from its last recorded transition.
func (s *Server) withReason(ctx context.Context, in SandboxInfo) SandboxInfo {
	if in.Reason != "" || !finished(sandbox.State(in.State)) {
		return in
	}
	var last sandbox.Event
	for after := int64(0); ; {
		evs, err := s.b.Events(ctx, sandbox.EventFilter{SandboxID: in.SandboxID, AfterSeq: after, Limit: sandbox.MaxList})
		if err != nil || len(evs) == 0 {
			break
		}
		last, after = evs[len(evs)-1], evs[len(evs)-1].Seq
		if len(evs) < sandbox.MaxList {
			break
		}
	}
	in.Reason = last.Reason
	return in
}

func finished(st sandbox.State) bool {
	return st == sandbox.StateDestroyed || st == sandbox.StateFailed || st == sandbox.StateLost
}

// Requirements are minimum guarantees a sandbox must have.
type Requirements struct {
	Isolation string `json:"isolation,omitempty" jsonschema:"Minimum isolation: process (namespaces and cgroups on the host kernel), kernel (a separate kernel such as gVisor) or vm (a virtual machine). Creation fails rather than fall back to weaker isolation."`
	Network   string `json:"network,omitempty" jsonschema:"Network mode the sandbox needs: egress (a runtime that can carry a network policy; a create with network {allow: [...]} needs it anyway) or none (any runtime)."`
}

// CreateIn are sandbox_create's arguments.
type CreateIn struct {
	Image          string            `json:"image,omitempty" jsonschema:"Root filesystem image: host (the default: the host's /usr) or an OCI image reference (python:3.12-slim, ghcr.io/org/img:tag, name@sha256:<64 hex>, or a name sandbox_commit made), pulled if not cached. The root is writable either way."`
	Runtime        string            `json:"runtime,omitempty" jsonschema:"Runtime by name (see health); default the server's default runtime."`
	CPU            float64           `json:"cpu,omitempty" jsonschema:"CPU limit in cores, fractions allowed (0.01 to 1024); default 1. The sandbox starts under this limit: below 0.1 a create takes seconds."`
	MemoryMB       int64             `json:"memory_mb,omitempty" jsonschema:"Memory limit in MiB; default 512."`
	DiskMB         int64             `json:"disk_mb,omitempty" jsonschema:"Disk size in MiB; default 1024."`
	TTLSeconds     int64             `json:"ttl_seconds,omitempty" jsonschema:"Lifetime in seconds; default 1800, at most the server's max TTL (usually 86400). The sandbox is destroyed when it expires."`
	Env            map[string]string `json:"env,omitempty" jsonschema:"Environment variables for every command in the sandbox."`
	Labels         map[string]string `json:"labels,omitempty" jsonschema:"Free-form labels to recognise the sandbox by."`
	Requirements   *Requirements     `json:"requirements,omitempty" jsonschema:"Minimum guarantees (isolation, network); the call fails if no runtime meets them."`
	IdempotencyKey string            `json:"idempotency_key,omitempty" jsonschema:"A key of your choice (at most 256 bytes) that makes retrying safe: a create with a key this client already used returns the sandbox the first one made instead of a second one."`
	// network (network.go): the published schema is networkSchema's oneOf.
	Network any                 `json:"network,omitempty"`
	Secrets map[string]SecretIn `json:"secrets,omitempty" jsonschema:"Secrets by environment variable name: {\"OPENAI_API_KEY\": {\"from\": \"env:OPENAI_API_KEY\", \"hosts\": [\"api.openai.com\"]}}. The sandbox sees NAME=<placeholder>; agentbox's proxy swaps in the real value only on requests to the secret's hosts (which the network policy must allow). The value never enters the sandbox."`
	// snapshots and sleep (snapshots.go)
	Snapshot         string `json:"snapshot,omitempty" jsonschema:"Start from this snapshot (a snapshot_id from sandbox_snapshot or snapshot_list) instead of an image: its files, and its running processes when its kind is files+memory. The image, runtime and disk_mb are the snapshot's; do not pass others."`
	AutoWake         bool   `json:"auto_wake,omitempty" jsonschema:"When the sandbox sleeps (sandbox_sleep), an exec or file call wakes it first instead of failing with SANDBOX_NOT_RUNNING."`
	TTLWhileSleeping bool   `json:"ttl_while_sleeping,omitempty" jsonschema:"Let the TTL keep running while the sandbox sleeps (default: sleeping time does not count against ttl_seconds)."`
	OnExpiry         string `json:"on_expiry,omitempty" jsonschema:"What happens when the TTL runs out: destroy (the default) or sleep (the sandbox sleeps instead, as sandbox_sleep does, and a wake gives it ttl_seconds again; needs a runtime that takes snapshots)."`
}

func (s *Server) sandboxCreate(ctx context.Context, call *mcp.CallToolRequest, in CreateIn) (SandboxInfo, string, error) {
	s.pruneSessions()
	if s.held.full() {
		return SandboxInfo{}, "", errcode.New(errcode.CapacityUnavailable, "this MCP server already tracks %d sandboxes; destroy the ones you no longer need (sandbox_list shows them) and retry", maxHeld)
	}
	req := sandbox.CreateRequest{Image: in.Image, Runtime: in.Runtime, CPU: in.CPU, MemoryMB: in.MemoryMB,
		DiskMB: in.DiskMB, TTLSeconds: in.TTLSeconds, Env: in.Env, Labels: in.Labels, IdempotencyKey: in.IdempotencyKey,
		Snapshot: in.Snapshot, AutoWake: in.AutoWake, TTLWhileSleeping: in.TTLWhileSleeping, OnExpiry: in.OnExpiry}
	if in.Requirements != nil {
		req.Requirements = sandbox.Requirements{Isolation: in.Requirements.Isolation, Network: in.Requirements.Network}
	}
	nw, err := networkArg(in.Network) // network
	if err != nil {
		return SandboxInfo{}, "", err
	}
	req.Network, req.Secrets = nw, secretsArg(in.Secrets)
	owner, session := s.ownerOf(ctx, call.Session)
	stop := s.pullProgress(&ctx, call, req.Image) // images (images.go)
	sb, err := s.b.Create(sandbox.WithOwner(ctx, owner), req)
	stop()
	if err != nil {
		return SandboxInfo{}, "", err
	}
	s.held.add(owner, session, sb.ID)
	out := s.info(sb)
	return out, fmt.Sprintf("Created %s: %s. Next: exec or file_write with sandbox_id %q; sandbox_destroy when done.", sb.ID, summary(out), sb.ID), nil
}

// SandboxIDIn is the argument of tools that act on one sandbox.
type SandboxIDIn struct {
	SandboxID string `json:"sandbox_id" jsonschema:"The sandbox's id, e.g. sb-0123456789ab (from sandbox_create or sandbox_list)."`
}

func (s *Server) sandboxGet(ctx context.Context, call *mcp.CallToolRequest, in SandboxIDIn) (SandboxInfo, string, error) {
	sb, err := s.b.Get(ctx, in.SandboxID)
	if err != nil {
		return SandboxInfo{}, "", err
	}
	out := s.withReason(ctx, s.info(sb))
	owner, _ := s.ownerOf(ctx, call.Session)
	s.held.seen(owner, sb)
	return out, summaryLine(out), nil
}

func (s *Server) sandboxDestroy(ctx context.Context, call *mcp.CallToolRequest, in SandboxIDIn) (SandboxInfo, string, error) {
	sb, err := s.b.Destroy(ctx, in.SandboxID)
	if err != nil {
		return SandboxInfo{}, "", err
	}
	owner, _ := s.ownerOf(ctx, call.Session)
	s.held.seen(owner, sb)
	out := s.info(sb)
	return out, fmt.Sprintf("Destroyed %s; its processes and files are gone.", sb.ID), nil
}

// ExtendIn are sandbox_extend's arguments.
type ExtendIn struct {
	SandboxID  string `json:"sandbox_id" jsonschema:"The sandbox's id, e.g. sb-0123456789ab (from sandbox_create or sandbox_list)."`
	TTLSeconds int64  `json:"ttl_seconds" jsonschema:"Seconds to add to the expiry, at least 1; the result is capped at the server's max TTL from now."`
}

func (s *Server) sandboxExtend(ctx context.Context, _ *mcp.CallToolRequest, in ExtendIn) (SandboxInfo, string, error) {
	sb, err := s.b.Extend(ctx, in.SandboxID, in.TTLSeconds)
	if err != nil {
		return SandboxInfo{}, "", err
	}
	out := s.info(sb)
	return out, fmt.Sprintf("%s now expires at %s (in %s).", sb.ID, out.ExpiresAt.Format(time.RFC3339), time.Duration(out.ExpiresInSeconds)*time.Second), nil
}

// SandboxList is the reply of sandbox_list and the content of agentbox://sandboxes.
type SandboxList struct {
	Sandboxes []SandboxInfo `json:"sandboxes" jsonschema:"The sandboxes this server created and still holds, oldest first; finished ones appear once more, then drop out."`
	Count     int           `json:"count" jsonschema:"Number of entries."`
}

// NoArgs is the input of tools that take no arguments.
type NoArgs struct{}

func (s *Server) sandboxList(ctx context.Context, call *mcp.CallToolRequest, _ NoArgs) (SandboxList, string, error) {
	l, err := s.heldList(ctx, call.Session)
	if err != nil {
		return SandboxList{}, "", err
	}
	return l, renderList(l), nil
}

// RuntimeInfo is one runtime as health reports it.
type RuntimeInfo struct {
	Name         string   `json:"name" jsonschema:"Runtime name, for sandbox_create's runtime argument."`
	Available    bool     `json:"available" jsonschema:"Whether it can create sandboxes on this host now."`
	Isolation    string   `json:"isolation" jsonschema:"process, kernel or vm."`
	Version      string   `json:"version,omitempty" jsonschema:"Runtime version."`
	Images       []string `json:"images" jsonschema:"Images it can run."`
	NetworkModes []string `json:"network_modes" jsonschema:"Network modes it can give a sandbox."`
	Reason       string   `json:"reason,omitempty" jsonschema:"Why it is unavailable."`
}

// CapacityInfo is how much of the server's bounds live sandboxes use.
type CapacityInfo struct {
	MaxSandboxes   int     `json:"max_sandboxes" jsonschema:"Most live sandboxes at once."`
	Live           int     `json:"live" jsonschema:"Live sandboxes now (all clients)."`
	Free           int     `json:"free" jsonschema:"Sandboxes that can still be created."`
	CPUBudget      float64 `json:"cpu_budget" jsonschema:"Sum of live sandboxes' cpu allowed; 0 = unbounded."`
	CPUUsed        float64 `json:"cpu_used" jsonschema:"Sum of live sandboxes' cpu."`
	CPUFree        float64 `json:"cpu_free" jsonschema:"Cores still allocatable; -1 = unbounded."`
	MemoryBudgetMB int64   `json:"memory_budget_mb" jsonschema:"Sum of live sandboxes' memory_mb allowed; 0 = unbounded."`
	MemoryUsedMB   int64   `json:"memory_used_mb" jsonschema:"Sum of live sandboxes' memory_mb."`
	MemoryFreeMB   int64   `json:"memory_free_mb" jsonschema:"MiB still allocatable; -1 = unbounded."`
	DiskBudgetMB   int64   `json:"disk_budget_mb" jsonschema:"Sum of live sandboxes' disk_mb allowed; 0 = unbounded."`
	DiskUsedMB     int64   `json:"disk_used_mb" jsonschema:"Sum of live sandboxes' disk_mb."`
	DiskFreeMB     int64   `json:"disk_free_mb" jsonschema:"Disk MiB still allocatable; -1 = unbounded."`
	Overcommit     float64 `json:"overcommit,omitempty" jsonschema:"How far the budgets let limits exceed the host's cores, memory and disk (1 = hard reservations)."`
	// What the host really has free, which admission keeps above a reserve.
	HostMemoryAvailableMB int64 `json:"host_memory_available_mb,omitempty" jsonschema:"Memory the host has available now (MiB)."`
	HostMemoryReserveMB   int64 `json:"host_memory_reserve_mb,omitempty" jsonschema:"Memory admission keeps for the host (MiB)."`
	HostDiskFreeMB        int64 `json:"host_disk_free_mb,omitempty" jsonschema:"Disk the state directory's file system has free now (MiB)."`
	HostDiskReserveMB     int64 `json:"host_disk_reserve_mb,omitempty" jsonschema:"Disk admission keeps for the host (MiB)."`
	// Warm pools (pools.go): their sandboxes count in live and the budgets.
	Pools     []PoolInfo `json:"pools,omitempty" jsonschema:"Warm pools: target size, ready, starting, hits and misses (pool_list)."`
	MaxPooled int        `json:"max_pooled,omitempty" jsonschema:"Bound on the sum of the pools' sizes."`
}

func capacityInfo(c sandbox.Capacity) CapacityInfo {
	ci := CapacityInfo{MaxSandboxes: c.MaxSandboxes, Live: c.Live, Free: c.Free, CPUBudget: c.CPUBudget,
		CPUUsed: c.CPUUsed, CPUFree: -1, MemoryBudgetMB: c.MemoryBudgetMB, MemoryUsedMB: c.MemoryUsedMB, MemoryFreeMB: -1,
		DiskBudgetMB: c.DiskBudgetMB, DiskUsedMB: c.DiskUsedMB, DiskFreeMB: -1, Overcommit: c.Overcommit,
		HostMemoryAvailableMB: c.MemoryAvailableMB, HostMemoryReserveMB: c.MemoryReserveMB,
		HostDiskFreeMB: c.DiskFreeMB, HostDiskReserveMB: c.DiskReserveMB, MaxPooled: c.MaxPooled}
	for _, p := range c.Pools { // warm pools
		ci.Pools = append(ci.Pools, poolInfo(p))
	}
	if c.CPUBudget > 0 {
		ci.CPUFree = max(0, c.CPUBudget-c.CPUUsed)
	}
	if c.MemoryBudgetMB > 0 {
		ci.MemoryFreeMB = max(0, c.MemoryBudgetMB-c.MemoryUsedMB)
	}
	if c.DiskBudgetMB > 0 {
		ci.DiskFreeMB = max(0, c.DiskBudgetMB-c.DiskUsedMB)
	}
	return ci
}

// HealthOut is health's reply.
type HealthOut struct {
	Status       string        `json:"status" jsonschema:"ok when the control plane answers."`
	Version      string        `json:"version" jsonschema:"agentbox version."`
	ControlPlane string        `json:"control_plane" jsonschema:"Where the sandboxes live."`
	Runtimes     []RuntimeInfo `json:"runtimes" jsonschema:"Runtimes with their isolation level."`
	Capacity     CapacityInfo  `json:"capacity" jsonschema:"Bounds used and free."`
	Sandboxes    []SandboxInfo `json:"sandboxes" jsonschema:"The same list as sandbox_list."`
	Count        int           `json:"count" jsonschema:"Number of entries in sandboxes."`
}

func (s *Server) health(ctx context.Context, call *mcp.CallToolRequest, _ NoArgs) (HealthOut, string, error) {
	c, err := s.b.Capacity(ctx)
	if err != nil {
		return HealthOut{}, "", err
	}
	l, err := s.heldList(ctx, call.Session)
	if err != nil {
		return HealthOut{}, "", err
	}
	out := HealthOut{Status: "ok", Version: version.Version, ControlPlane: s.opts.ControlPlane,
		Capacity: capacityInfo(c), Sandboxes: l.Sandboxes, Count: l.Count, Runtimes: []RuntimeInfo{}}
	for _, r := range s.b.Runtimes() {
		out.Runtimes = append(out.Runtimes, RuntimeInfo{Name: r.Name, Available: r.Available, Isolation: string(r.Isolation),
			Version: r.Version, Images: nonNil(r.Images), NetworkModes: nonNil(r.NetworkModes), Reason: r.Reason})
	}
	return out, renderHealth(out), nil
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}
